"""ACT's temporal ensembling of action chunks (Zhao et al. 2023), as a small class with `reset()`.

Every control step the policy predicts a chunk of the next `chunk` actions. One chunk's guess can flip
between modes from step to step (up / down at a phase boundary); the mean of the last `chunk` guesses
of the same step does not. The action for step t + j becomes a weighted mean of every stored chunk's
prediction for step t + j, weights exp(-coeff * i) with i = 0 the oldest prediction (ACT's convention;
coeff = 0 is the uniform mean, coeff > 0 favours the oldest as ACT does, coeff < 0 the newest).

The mean lags: an old prediction was made from an older observation. Our default favours the newest
(coeff = -1.0: weights 1, 2.7, 7.4, 20 for four guesses, oldest first). At coeff = -0.5 on an early demo
checkpoint and the same 50 seeds a task, Push rose from 40% (uniform) to 52% and 62% on two seed sets,
PickPlace and Stack kept 90-100%; without any ensembling Push reached 54% but PickPlace fell to 76% and
Stack to 70%, and ACT's direction (coeff = 0.5) took Push to 26%. On the two latest demo checkpoints -1.0
against -0.5 gave Push 80.5% vs 79% and 87% vs 84% (200 seeds 500000+), Stack and PickPlace level (94 / 98%
vs 93 / 99%, 100 seeds each); -2 or no ensembling took Push no further and cost Stack 3-8 points
(docs/benchmarks.md). The gain depends on the network.
"""

from __future__ import annotations

from collections import deque

import numpy as np


def ensemble_weights(n: int, coeff: float) -> np.ndarray:
    """(n,) weights exp(-coeff * i) of n guesses, i = 0 the oldest, scaled so the largest is 1 (no overflow
    for any coefficient)."""
    exponent = -coeff * np.arange(n)  # (n,)
    return np.exp(exponent - exponent.max())


def ensemble_mean(guesses: list[np.ndarray], coeff: float) -> np.ndarray:
    """The weighted mean of n guesses of one action (each (A,), oldest first) -> (A,)."""
    w = ensemble_weights(len(guesses), coeff)  # (n,)
    return (w[:, None] * np.asarray(guesses)).sum(0) / w.sum()


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
            out[j] = ensemble_mean(guesses, self.coeff)
        return out
