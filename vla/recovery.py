"""Where demonstrations leave the expert's path, and drawing those windows more often in training.

With DART labels a demo stores two actions per step: the one executed (the expert's plus noise, a
perturbation burst or a detour) and the expert's own in that state (the label). Their difference,
summed with a decay, says how far the executed motion has taken the robot from where the expert would
have gone: `drift`. DART's noise is zero-mean, so its drift stays small (under 2 action units at the
decay below); a detour or a burst pushes it past 3 for the ticks it lasts and the ~10 after, when the
expert brings the robot back. Those recovery windows are what a cloned policy needs once its own errors
have carried it off the path, and they are rare: 5% of the demo data's steps (all in Push, whose expert
has the detours). Uniform sampling shows each about once in 3200 steps (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np

DECAY = 0.9  # per tick: the drift remembers about the last 10 ticks
OFF_PATH = 3.0  # action units of drift (motion dims, L2) beyond which a step is off the expert's path


def drift(executed: np.ndarray, labels: np.ndarray, motion_dims: int = 3) -> np.ndarray:
    """(T,) before step t: |sum over s < t of DECAY^(t-1-s) (executed[s] - labels[s])| on the motion dims."""
    diff = (np.asarray(executed, np.float64) - np.asarray(labels, np.float64))[:, :motion_dims]  # (T, m)
    out, acc = np.zeros(len(diff)), np.zeros(diff.shape[1])
    for t in range(len(diff)):
        out[t] = np.linalg.norm(acc)
        acc = DECAY * acc + diff[t]
    return out


def off_path(executed: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(T,) bool: the steps whose state the executed actions have carried off the expert's path."""
    return drift(executed, labels) > OFF_PATH
