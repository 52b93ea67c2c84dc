"""The streaming KV cache: the instruction prefix plus a ring of K step slots, preallocated.

Layout of the key/value buffer along the sequence axis (L instruction tokens, S tokens per step):

    [ instruction (L) | slot 0 (S) | slot 1 (S) | ... | slot K-1 (S) ]

Step n of an episode is written to slot n % K. When the window is full the new step overwrites the
oldest one: eviction is free (no copy, no roll) and memory is constant over an episode of any length.
Slots are not in time order, and need not be: attention is a weighted sum over keys, and every key's
mask and time bias are computed from the slot's stored episode step index (`coords`), never from its
position. The model (`ActionTransformer.start/step`) fills the buffer; this object holds it, and its
`StepRing` (vla/kv_ring.py, shared with the onnxruntime backend) knows which slot is next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from vla.kv_ring import StepRing
from vla.model.transformer import TokenCoords, ring_coords, ring_layout


@dataclass
class KVCache:
    """Keys/values of every layer for one batch of episodes that step in lockstep."""

    kv: torch.Tensor  # (n_layer, 2, B, n_head, L + K*S, head_dim): keys [.., 0], values [.., 1]
    instr_valid: torch.Tensor  # (B, L) bool: False = padding key of the instruction
    slot_timestep: torch.Tensor  # (B, K) int64: episode step index held by each slot
    slot_valid: torch.Tensor  # (B, K) bool: False = slot empty (episode younger than K steps)
    instruction_len: int  # L, tokens
    tokens_per_step: int  # S, tokens
    started: bool = False  # has `start` encoded an instruction since the last reset
    film_ctx: object | None = None  # the instruction's FiLM conditioning of the stem (vision.Film), set by start
    _layout: tuple | None = field(default=None, repr=False)  # (pos, slot, index) of the buffer, built once
    ring: StepRing = field(init=False, repr=False)  # which slot holds which step (over slot_timestep/slot_valid)

    def __post_init__(self):
        self.ring = StepRing(self.slot_timestep, self.slot_valid)

    @property
    def n_steps(self) -> int:
        """Steps appended since `start` (the next step goes to slot n_steps % K)."""
        return self.ring.n_steps

    @n_steps.setter
    def n_steps(self, value: int) -> None:  # the CUDA graph replays advance's tensor writes, and counts here
        self.ring.n_steps = value

    @property
    def _masks(self) -> dict:
        """This episode's memoized step masks (the ring's)."""
        return self.ring._masks

    @property
    def window(self) -> int:
        """K, the number of step slots."""
        return self.slot_valid.shape[1]

    @property
    def batch_size(self) -> int:
        return self.slot_valid.shape[0]

    def reset(self) -> None:
        """Forget the episode (the buffers are reused, not reallocated)."""
        self.started, self.film_ctx = False, None
        self.ring.reset()
        self.instr_valid.zero_()

    def advance(self, timestep: torch.Tensor) -> int:
        """Claim the slot for a new step at episode step `timestep` (B,); evicts the oldest if full."""
        return self.ring.advance(timestep)

    def memo_mask(self, slot: int, timestep: torch.Tensor, build: Callable[[TokenCoords], torch.Tensor]):
        """The attention mask of a step in `slot` at `timestep` (B,), `build(self.coords())` when not seen
        before in this episode (vla/kv_ring.py). On CUDA reading the key would be a device sync, so the
        mask is built every step there."""
        if self.kv.device.type != "cpu":
            return build(self.coords())
        return self.ring.memo_mask(slot, timestep, lambda: build(self.coords()))

    def slot_offset(self, slot: int) -> int:
        """Sequence position of the first token of `slot` in the buffer."""
        return self.instruction_len + slot * self.tokens_per_step

    def coords(self) -> TokenCoords:
        """Where every buffer position sits (for the attention rule): instruction, then the K slots. The
        layout part is built once per cache; times and validity are live."""
        if self._layout is None:
            self._layout = ring_layout(self.instruction_len, self.window, self.tokens_per_step, self.kv.device)
        return ring_coords(self._layout, self.instr_valid, self.slot_timestep, self.slot_valid)
