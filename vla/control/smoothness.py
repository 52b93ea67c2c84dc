"""How smooth the executed actions were: mean absolute jerk, and the jump where one chunk hands over to the next.

Both are computed over the motion dims only (a gripper dim is an open/close set-point whose switch is
meant to be a step) in action units, per control tick:
- `jerk`: the mean |third finite difference| of the executed action sequence, a[t] - 3a[t-1] + 3a[t-2] - a[t-3],
  over ticks and motion dims (0 for fewer than 4 ticks).
- `boundary_jump`: the mean |a[t] - a[t-1]| (over motion dims) at the ticks where the executed action's
  source changed: a newer chunk took over, or a hold began or ended (the robot feels both);
  `step_change` is the same figure at every other tick, the baseline to read it against. Jerky chunk
  boundaries show as boundary_jump >> step_change.
"""

from __future__ import annotations

import numpy as np


def smoothness(actions, chunk_ticks, motion_dims=None) -> dict:
    """actions (T, A) executed, chunk_ticks (T,) the observation tick of the chunk each came from (-1 =
    a hold, not from a chunk); motion_dims: indices of the motion dims (default: all but the last)."""
    a = np.asarray(actions, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"actions must be (T, A), got shape {a.shape}")
    dims = list(range(a.shape[1] - 1)) if motion_dims is None else list(motion_dims)
    a = a[:, dims]  # (T, M)
    src = np.asarray(chunk_ticks)
    jerk = float(np.abs(np.diff(a, n=3, axis=0)).mean()) if len(a) >= 4 else 0.0
    step = np.abs(np.diff(a, axis=0)).mean(axis=1) if len(a) >= 2 else np.zeros(0)  # (T-1,): tick t vs t-1
    at_boundary = src[1:] != src[:-1]  # (T-1,): another chunk, or a hold starting or ending
    return {
        "jerk": jerk,
        "boundary_jump": float(step[at_boundary].mean()) if at_boundary.any() else 0.0,
        "step_change": float(step[~at_boundary].mean()) if (~at_boundary).any() else 0.0,
        "boundaries": int(at_boundary.sum()),
    }
