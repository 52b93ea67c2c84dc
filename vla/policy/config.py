"""How a trained network is turned into actions at inference: saved with the checkpoint, overridable.

    policy = load_policy("runs/demo", readout="argmax", temporal_ensemble=False)
    vla-eval --checkpoint runs/demo --policy readout=argmax --policy n_action_steps=4

None of these fields changes training; they are in the run's config (section `policy`) so that the
closed-loop evaluation during training and every later load use the same choice by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

# What a policy can run on (`load_policy(backend=...)`, `--backend`): torch, or the vla-export graphs on
# onnxruntime, fp32 or with the int8 step graph.
BACKENDS = ("torch", "onnxruntime", "onnxruntime-int8")


@dataclass
class PolicyConfig:
    readout: Literal["argmax", "expectation"] = "expectation"  # an action dim's value: best bin's centre, or mean
    temporal_ensemble: bool = True  # each executed action averages every stored chunk's prediction of it (ACT)
    # ensemble weights exp(-coeff * i), i = 0 the oldest prediction: 0 = uniform, > 0 favours the oldest (ACT),
    # < 0 the newest, which lags least (why -1.0: vla/policy/ensemble.py)
    ensemble_coeff: float = -1.0
    n_action_steps: int = 1  # actions of a chunk executed before the policy re-plans (1 = every step)
    kv_cache: bool = True  # streaming KV cache (False: recompute the window every step; same actions; torch only)

    def __post_init__(self):
        if self.n_action_steps < 1:
            raise ValueError(f"n_action_steps={self.n_action_steps} must be >= 1")
        if self.temporal_ensemble and self.n_action_steps > 1:
            raise ValueError(
                f"temporal_ensemble=True needs n_action_steps=1 (got n_action_steps={self.n_action_steps}): "
                "ensembling averages a new prediction into every step"
            )
        if not math.isfinite(self.ensemble_coeff):
            raise ValueError(f"ensemble_coeff={self.ensemble_coeff} must be a finite number")

    def plan_row(self, t: int, planned_at: int | None) -> int:
        """Row of the plan made at step `planned_at` that step `t` executes, or 0: plan anew. Counted in steps
        since the plan was made, so a caller that skips steps (a late controller) never gets a row meant
        for an earlier step."""
        age = -1 if planned_at is None else t - planned_at
        return age if 0 < age < self.n_action_steps else 0
