"""Action tokenizer: each action dimension discretized into `bins` tokens; decode = bin centre.

Every mode is a sorted table of `bins` centres per dimension; `encode` maps a value to its nearest
centre (bin edges halfway between centres), `decode` returns the centre. Modes:

- "uniform": centres evenly spaced over [low, high] *including both ends*, so a value at a bound
  decodes exactly to it. Max round-trip error inside the bounds = half the spacing
  (high - low) / (2 (bins - 1)).
- "quantile": centres at the data's quantiles (0 %, ..., 100 %): finer bins where actions are dense.
- "mulaw": uniform in mu-law companded space (`y = sign(x) log(1 + mu|x|) / log(1 + mu)` of x scaled
  to [-1, 1]): fine near the middle of the range, coarse near the bounds.

Bounds (`fit`): the 0.5th/99.5th percentiles per dimension, robust to outliers, *widened to the
action-space limit whenever the data touches it*. Expert actions here are clipped to the Box [-1, 1]
and often saturate; if only a few samples sit at +1 the 99.5th percentile falls short of 1 and every
saturated action would decode to less than full effort. Touching the limit puts the bound (and so a
bin centre) exactly on it.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Mode = Literal["uniform", "quantile", "mulaw"]
MODES = ("uniform", "quantile", "mulaw")


def _mulaw_inv(y: np.ndarray, mu: float) -> np.ndarray:
    return np.sign(y) * np.expm1(np.abs(y) * np.log1p(mu)) / mu


class ActionTokenizer:
    """Per-dimension discretization of continuous actions (A dims) into `bins` tokens each."""

    def __init__(
        self,
        bins: int = 256,
        mode: Mode = "uniform",
        low: list[float] | np.ndarray | None = None,
        high: list[float] | np.ndarray | None = None,
        mu: float = 255.0,
        centres: list[list[float]] | np.ndarray | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"action tokenizer mode {mode!r} is not one of {list(MODES)}")
        if bins < 2:
            raise ValueError(f"action tokenizer needs at least 2 bins, got {bins}")
        self.bins, self.mode, self.mu = int(bins), mode, float(mu)
        self.low = None if low is None else np.asarray(low, dtype=np.float64)
        self.high = None if high is None else np.asarray(high, dtype=np.float64)
        self.centres: np.ndarray | None = None  # (A, bins) float64, sorted per dimension
        if centres is not None:
            self.centres = np.asarray(centres, dtype=np.float64)
        elif self.low is not None and self.high is not None:
            if mode == "quantile":
                raise ValueError("quantile mode needs `centres` (from fit) or data; got only low/high")
            self.centres = self._analytic_centres()

    # ---------------------------------------------------------------- fitting
    def fit(
        self,
        actions: np.ndarray,
        percentiles: tuple[float, float] = (0.5, 99.5),
        limits: tuple[float, float] | None = (-1.0, 1.0),
        touch_tol: float = 1e-6,
    ) -> ActionTokenizer:
        """Fit bounds (and quantile centres) on actions (N, A). `limits` = the action space's Box."""
        a = np.asarray(actions, dtype=np.float64)
        if a.ndim != 2 or a.shape[0] == 0:
            raise ValueError(f"fit expects actions of shape (N, A) with N > 0, got {a.shape}")
        low, high = np.percentile(a, percentiles[0], axis=0), np.percentile(a, percentiles[1], axis=0)
        if limits is not None:
            lo_lim, hi_lim = limits
            low = np.where(a.min(0) <= lo_lim + touch_tol, lo_lim, np.maximum(low, lo_lim))
            high = np.where(a.max(0) >= hi_lim - touch_tol, hi_lim, np.minimum(high, hi_lim))
        span = np.maximum(high - low, 1e-6)  # a constant dimension still gets a valid (tiny) range
        self.low, self.high = low, low + span
        if self.mode == "quantile":
            q = np.linspace(0.0, 1.0, self.bins)
            c = np.quantile(np.clip(a, self.low, self.high), q, axis=0).T  # (A, bins)
            c[:, 0], c[:, -1] = self.low, self.high
            self.centres = np.maximum.accumulate(c, axis=1)
        else:
            self.centres = self._analytic_centres()
        return self

    def _analytic_centres(self) -> np.ndarray:
        grid = np.linspace(-1.0, 1.0, self.bins)  # (bins,) in [-1, 1], both ends included
        if self.mode == "mulaw":
            grid = _mulaw_inv(grid, self.mu)
        low, high = self.low[:, None], self.high[:, None]
        c = low + (grid[None] + 1.0) * 0.5 * (high - low)  # (A, bins)
        c[:, 0], c[:, -1] = self.low, self.high  # exact ends, no rounding drift
        return c

    def _check(self) -> np.ndarray:
        if self.centres is None:
            raise RuntimeError("ActionTokenizer is not fitted: call fit(actions) or load a saved one")
        return self.centres

    @property
    def action_dim(self) -> int:
        return self._check().shape[0]

    # ---------------------------------------------------------------- encode / decode
    def encode(self, actions) -> np.ndarray:
        """Float actions (..., A) -> int64 tokens (..., A): index of the nearest bin centre."""
        c = self._check()
        a = np.asarray(actions, dtype=np.float64)
        if a.shape[-1] != c.shape[0]:
            raise ValueError(f"actions have {a.shape[-1]} dims, tokenizer was fitted on {c.shape[0]}")
        flat = a.reshape(-1, c.shape[0])  # (N, A)
        edges = 0.5 * (c[:, 1:] + c[:, :-1])  # (A, bins - 1): halfway between centres
        tokens = np.empty(flat.shape, dtype=np.int64)
        for d in range(c.shape[0]):
            tokens[:, d] = np.searchsorted(edges[d], flat[:, d], side="left")
        return tokens.reshape(a.shape)

    def decode(self, tokens) -> np.ndarray:
        """Tokens (..., A) -> bin centres (..., A) float32."""
        c = self._check()
        t = np.clip(np.asarray(tokens, dtype=np.int64), 0, self.bins - 1)
        return c[np.arange(c.shape[0]), t].astype(np.float32)

    # ---------------------------------------------------------------- stored with the checkpoint
    def to_dict(self) -> dict:
        self._check()
        d = {"kind": "action", "version": 1, "bins": self.bins, "mode": self.mode, "mu": self.mu}
        d |= {"low": self.low.tolist(), "high": self.high.tolist()}
        if self.mode == "quantile":
            d["centres"] = self.centres.tolist()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ActionTokenizer:
        if d.get("kind") != "action" or d.get("version") != 1:
            raise ValueError(f"not an action tokenizer v1: kind={d.get('kind')!r} version={d.get('version')!r}")
        return cls(d["bins"], d["mode"], d["low"], d["high"], d.get("mu", 255.0), d.get("centres"))

    def __repr__(self) -> str:
        dims = "unfitted" if self.centres is None else f"action_dim={self.action_dim}"
        return f"ActionTokenizer(bins={self.bins}, mode={self.mode!r}, {dims})"
