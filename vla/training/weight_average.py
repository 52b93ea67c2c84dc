"""An exponential moving average of the weights (Polyak averaging), the weights a policy is deployed with.

The optimizer's last iterate carries the noise of its last few batches; a cloned policy's closed-loop
success moves by several points between neighbouring checkpoints. The average over the last ~1/(1 - decay)
steps is a smoother function of the data (Diffusion Policy and most behaviour-cloning codebases deploy it).
Training itself is untouched: the average is a shadow the loop updates after each optimizer step, and
the checkpoint's weights are the average while the raw weights travel in the resume state.
"""

from __future__ import annotations

import contextlib

import torch


class WeightAverage:
    """`decay` 0 turns it off: `applied` then changes nothing and `resume_state` is empty."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.updates = 0
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()} if decay else {}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        if not self.decay:
            return
        self.updates += 1
        # Warm up the horizon (1 + n) / (10 + n): early weights are far from the final ones and would
        # otherwise linger in the average for ~1/(1 - decay) steps.
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for name, value in model.state_dict().items():
            if value.is_floating_point():
                self.shadow[name].lerp_(value, 1 - decay)
            else:
                self.shadow[name].copy_(value)

    @contextlib.contextmanager
    def applied(self, model: torch.nn.Module):
        """The model holds the averaged weights inside the block and its own again after it."""
        if not self.decay:
            yield
            return
        raw = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(self.shadow)
        try:
            yield
        finally:
            model.load_state_dict(raw)

    def resume_state(self, model: torch.nn.Module) -> dict:
        """What `--resume` needs beside the checkpoint's (averaged) weights: the raw ones and the count."""
        if not self.decay:
            return {}
        return {"raw_weights": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                "average_updates": self.updates}  # fmt: skip

    def resume(self, model: torch.nn.Module, state: dict) -> None:
        """`model` holds the checkpoint's weights (the average); take them as the shadow and put the raw
        weights back in the model. A run started without averaging resumes its raw weights as the average."""
        if self.decay:
            self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}
            self.updates = int(state.get("average_updates", 0))
        if "raw_weights" in state:  # also when averaging is now off: training goes on from the raw weights
            model.load_state_dict(state["raw_weights"])
