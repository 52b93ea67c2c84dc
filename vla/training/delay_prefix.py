"""Delay-aware training: the chunk's first d actions are given to the model as committed, d random per window step.

How it is trained. With `model.committed_actions: true` a parallel-decoding model has an embedding for
action bins that a slot can hold (off by default; the demo config does not use it). With
`train.delay_aware_max: N` every (window, step) of a batch draws a delay d uniformly from 0..N: its first
d chunk rows (d * A slots) hold their target bins as input, `committed`, and carry no loss (they are given,
not predicted). Slots later in the chunk see them through the causal mask inside the step, so the model
learns to continue a committed prefix; d = 0 keeps ordinary training in the mix, so the same checkpoint
also runs every other strategy.

How it is used. `vla.policy.strategies.DelayAware` hands the policy the actions that will execute while the
inference runs (the current chunk's rows for those ticks); `Policy.act_chunk(obs, committed=...)`
tokenizes them into the first slots and decodes the rest in the same single pass (RTC, arXiv 2506.07339,
for tokens: the frozen prefix instead of inpainting guidance).

How it is tested (tests/test_delay.py): the committed slots change the decoded rest of the chunk of a
trained delay-aware model (it reads them), the returned first rows are the committed actions exactly,
streaming equals recompute with committed slots, and a training run with delay_aware_max > 0 writes a
checkpoint that vla-eval --strategy delay_aware runs.
"""

from __future__ import annotations

import torch


def commit_random_prefix(batch: dict, max_delay: int, chunk: int, gen: torch.Generator) -> dict:
    """Add `committed` (B, T, chunk*A): each step's first d rows of target bins, d ~ U{0..max_delay} per
    (window, step), -1 elsewhere; mark those rows in `action_is_pad` so they carry no loss. CPU tensors."""
    actions = batch["actions"]  # (B, T, chunk*A) int64 target bins
    B, T, CA = actions.shape
    A = CA // chunk
    delay = torch.randint(0, max_delay + 1, (B, T, 1), generator=gen)  # (B, T, 1)
    row = torch.arange(chunk)[None, None, :]  # (1, 1, chunk)
    given = row < delay  # (B, T, chunk): rows that are committed
    pad = batch.get("action_is_pad")
    if pad is not None:
        given = given & ~pad  # a target past the demo's end is no action anyone committed
    slots = given.repeat_interleave(A, dim=2)  # (B, T, chunk*A), chunk-major like the slots
    batch["committed"] = torch.where(slots, actions, torch.full_like(actions, -1))
    batch["action_is_pad"] = given if pad is None else (pad | given)
    return batch
