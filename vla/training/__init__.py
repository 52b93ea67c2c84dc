"""Behaviour cloning: the training config, the loop, and what it writes beside the checkpoint."""
