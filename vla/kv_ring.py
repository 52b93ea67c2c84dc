"""The streaming KV ring's bookkeeping: which slot a step goes to, and what decides that step's mask.

Step n of an episode goes to slot n % K; when the window is full it overwrites the oldest step. A step's
attention mask depends, besides the fixed layout, only on its slot, each slot's step offset from it, which
slots are filled and the instruction's padding (fixed per episode), so an episode's masks repeat with
the ring and are memoized by those. Written once for numpy arrays and CPU torch tensors alike (it imports
neither torch nor onnxruntime): `vla.model.kv_cache.KVCache` (torch) and the onnxruntime backend
(`vla.policy.onnx_policy`) both keep their ring with it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class StepRing:
    """Which of K slots holds which episode step, for B episodes stepping in lockstep."""

    def __init__(self, slot_timestep, slot_valid):
        """slot_timestep (B, K) int64: each slot's episode step; slot_valid (B, K) bool: False = empty. Numpy
        arrays or torch tensors, written in place (the caller's buffers, e.g. read by the model's mask)."""
        self.slot_timestep, self.slot_valid = slot_timestep, slot_valid
        self.n_steps = 0  # steps appended since the last reset (the next step goes to slot n_steps % K)
        self._masks: dict = {}  # this episode's step masks by what decides them

    @property
    def window(self) -> int:
        """K, the number of step slots."""
        return self.slot_valid.shape[1]

    def reset(self) -> None:
        """Forget the episode: every slot empty (the buffers are reused)."""
        self.n_steps = 0
        self._masks.clear()
        self.slot_valid[:] = False
        self.slot_timestep[:] = 0

    def advance(self, timestep) -> int:
        """Claim the slot for a new step at episode step `timestep` (B,); evicts the oldest if full."""
        slot = self.n_steps % self.window
        self.slot_timestep[:, slot] = timestep
        self.slot_valid[:, slot] = True
        self.n_steps += 1
        return slot

    def memo_mask(self, slot: int, timestep, build: Callable[[], object]):
        """The mask of the step just advanced into `slot` at `timestep` (B,): `build()` the first time its
        deciding state is seen in this episode, the stored one after that (host arrays only: reading a
        device tensor to form the key would be a sync)."""
        offsets = np.asarray(timestep[:, None] - self.slot_timestep)  # (B, K)
        key = (slot, offsets.tobytes(), np.asarray(self.slot_valid).tobytes())
        mask = self._masks.get(key)
        if mask is None:
            mask = self._masks[key] = build()
        return mask
