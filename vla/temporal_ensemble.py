"""ACT's temporal ensembling of action chunks (Zhao et al. 2023), as a small class with `reset()`.

Every control step the policy predicts a chunk of the next `chunk` actions. One chunk's guess can flip
between modes from step to step (up / down at a phase boundary); the mean of the last `chunk` guesses
of the same step does not. The action for step t + j becomes a weighted mean of every stored chunk's
prediction for step t + j, weights exp(-coeff * i) with i = 0 the oldest prediction (ACT's convention;
coeff = 0 is the uniform mean).
"""

from __future__ import annotations

from collections import deque

import numpy as np


class TemporalEnsembler:
    def __init__(self, chunk: int, coeff: float = 0.0):
        self.chunk, self.coeff = chunk, coeff
        self._chunks: deque = deque(maxlen=chunk)  # (step it was predicted at, (chunk, A)), newest first

    def reset(self) -> None:
        self._chunks.clear()

    def update(self, t: int, chunk: np.ndarray) -> np.ndarray:
        """Store the chunk predicted at step t (chunk, A); return row j = the ensemble for step t + j."""
        self._chunks.appendleft((t, chunk))
        out = np.empty_like(chunk)
        for j in range(len(chunk)):
            guesses = [c[t + j - s] for s, c in reversed(self._chunks) if t + j - s < len(c)]  # oldest first
            w = np.exp(-self.coeff * np.arange(len(guesses)))  # (n,)
            out[j] = (w[:, None] * np.asarray(guesses)).sum(0) / w.sum()
        return out
