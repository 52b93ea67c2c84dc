"""Proprioception normalizer: per-dimension mean/std from the dataset (std floored), saved with the checkpoint.

The model embeds the normalized state as one token (a linear layer in `vla.model`)."""

from __future__ import annotations

import numpy as np


class ProprioNormalizer:
    """`normalize(x) = (x - mean) / max(std, min_std)` per dimension; numpy in, numpy out."""

    def __init__(self, mean, std, min_std: float = 1e-2):
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.maximum(np.asarray(std, dtype=np.float32), np.float32(min_std))  # floored
        self.min_std = float(min_std)
        if self.mean.shape != self.std.shape or self.mean.ndim != 1:
            raise ValueError(f"mean {self.mean.shape} and std {self.std.shape} must be equal 1-D shapes")

    @classmethod
    def fit(cls, proprio: np.ndarray, min_std: float = 1e-2) -> ProprioNormalizer:
        """Statistics of proprio (N, P). `min_std` (data units) keeps a near-constant dim from exploding."""
        x = np.asarray(proprio, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] == 0:
            raise ValueError(f"fit expects proprio of shape (N, P) with N > 0, got {x.shape}")
        return cls(x.mean(0), x.std(0), min_std)

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    def normalize(self, x) -> np.ndarray:
        return (np.asarray(x) - self.mean) / self.std

    def to_dict(self) -> dict:
        return {
            "kind": "proprio",
            "version": 1,
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "min_std": self.min_std,
        }

    @classmethod
    def from_dict(cls, d: dict) -> ProprioNormalizer:
        if d.get("kind") != "proprio" or d.get("version") != 1:
            raise ValueError(f"not a proprio normalizer v1: kind={d.get('kind')!r} version={d.get('version')!r}")
        return cls(d["mean"], d["std"], d.get("min_std", 1e-2))
