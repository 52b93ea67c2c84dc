"""Tasks of the tabletop suite: each module pairs a task (randomization, success, reward) with its expert."""
