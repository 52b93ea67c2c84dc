"""Proprioception normalizer: per-dimension mean/std from the dataset (std floored), saved as JSON.

The model embeds the normalized state as one token (a linear layer in `vla.model`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


class ProprioNormalizer:
    """`normalize(x) = (x - mean) / max(std, min_std)` per dimension; numpy or torch in, same out."""

    def __init__(self, mean, std, min_std: float = 1e-2):
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.maximum(np.asarray(std, dtype=np.float32), np.float32(min_std))  # floored
        self.min_std = float(min_std)
        if self.mean.shape != self.std.shape or self.mean.ndim != 1:
            raise ValueError(f"mean {self.mean.shape} and std {self.std.shape} must be equal 1-D shapes")
        self._torch: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

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

    def _stats(self, x):
        if isinstance(x, torch.Tensor):
            key = (x.device, x.dtype)
            if key not in self._torch:
                self._torch[key] = (
                    torch.as_tensor(self.mean, device=x.device, dtype=x.dtype),
                    torch.as_tensor(self.std, device=x.device, dtype=x.dtype),
                )
            return self._torch[key]
        return self.mean, self.std

    def normalize(self, x):
        mean, std = self._stats(x)
        return (x - mean) / std

    def denormalize(self, x):
        mean, std = self._stats(x)
        return x * std + mean

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

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> ProprioNormalizer:
        return cls.from_dict(json.loads(Path(path).read_text()))
