"""Success rates in simulation, the results report, and attention read-outs."""
