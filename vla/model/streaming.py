"""Decoding one control step: the KV-cache stream (`new_cache`, `start`, `step`) and its reference, `recompute`.

`start` encodes the instruction prefix once; `step` appends one step's tokens to a constant-memory ring of
K step slots (vla/model/kv_cache.py) and decodes the step's action tokens in one pass; `recompute` runs the
same window from scratch through `embed` and `trunk` (the training pass) and returns the same tokens and
logits. The attention rule (vla/model/transformer.py) makes the two equal: a token later steps read depends
only on its own step and the instruction, so its cached keys/values never change when the window slides.

A mixin of `ActionTransformer` (vla/model/network.py), whose embed / mask / blocks / head it calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vla.model.config import PAD_ID
from vla.model.kv_cache import KVCache


@dataclass
class StepOutput:
    tokens: torch.Tensor  # (B, chunk * A) int64 decoded action bins
    logits: torch.Tensor  # (B, chunk * A, action_bins) the logits each token was decoded from


class Streaming:
    """`new_cache` / `start` / `step` / `recompute` of `ActionTransformer`."""

    @torch.inference_mode()
    def recompute(self, instruction, image, proprio, timestep, step_mask=None, committed=None) -> StepOutput:
        """Decode the last step's action tokens from scratch (no cache) over the given window.

        Same inputs as `forward` (T <= K steps, oldest first). `committed` (B, chunk*A): the last step's
        committed bins (-1 = free)."""
        B, T = timestep.shape
        lay = self.layout
        batch = {"instruction": instruction, "image": image, "proprio": proprio, "timestep": timestep}
        if step_mask is not None:
            batch["step_mask"] = step_mask
        if committed is not None:  # only the decoded step has committed slots
            held = torch.full((B, T, lay.n_action_tokens), -1, dtype=torch.long, device=timestep.device)
            held[:, -1] = committed  # (B, T, chunk*A)
            batch["committed"] = held
        x, _ = self.embed(batch)  # (B, L + T*S, d)
        last = self.cfg.instruction_len + (T - 1) * lay.tokens_per_step + lay.n_obs_tokens  # last step's slot 0
        h, _ = self.trunk(x, self.window_mask(batch), rows=slice(last, last + lay.n_action_tokens))  # (B, chunk*A, d)
        logits = self.head(h)  # (B, chunk*A, bins)
        return StepOutput(logits.argmax(-1), logits)  # greedy: (B, chunk*A)

    @torch.inference_mode()
    def new_cache(self, batch_size: int, device=None, dtype=None) -> KVCache:
        """Preallocate the KV cache: instruction prefix + K step slots, every layer."""
        cfg, w = self.cfg, self.index_embed.weight
        device, dtype = device or w.device, dtype or w.dtype
        hd = cfg.d_model // cfg.n_head
        return KVCache(
            kv=torch.zeros(
                cfg.n_layer, 2, batch_size, cfg.n_head, self.layout.n_tokens, hd, device=device, dtype=dtype
            ),  # (n_layer, 2, B, H, L + K*S, hd)
            instr_valid=torch.zeros(batch_size, cfg.instruction_len, dtype=torch.bool, device=device),
            slot_timestep=torch.zeros(batch_size, cfg.window, dtype=torch.long, device=device),
            slot_valid=torch.zeros(batch_size, cfg.window, dtype=torch.bool, device=device),
            instruction_len=cfg.instruction_len,
            tokens_per_step=self.layout.tokens_per_step,
        )

    @torch.inference_mode()
    def start(self, cache: KVCache, instruction: torch.Tensor) -> None:
        """Begin an episode: forget the old one and encode the instruction prefix (B, L) once."""
        B, L = instruction.shape
        if self.cfg.instruction_len != L:
            raise ValueError(f"instruction has {L} tokens, the model expects {self.cfg.instruction_len}")
        cache.reset()
        cache.instr_valid.copy_(instruction != PAD_ID)
        prefix = cache.coords().select(slice(0, L))
        mask = self.mask(prefix, prefix).to(cache.kv.dtype)  # (B, H, L, L)
        x = embedded = self.embed_instruction(instruction)  # (B, L, d)
        for i, block in enumerate(self.blocks):
            x, _ = block(x, mask, cache.kv[i, :, :, :, :L], 0)  # a view: writes land in the buffer
        cache.film_ctx = self.instruction_context(instruction, embedded)  # Film or None: once per episode
        cache.started = True

    @torch.inference_mode()
    def step(self, cache, image, proprio, timestep, committed=None) -> StepOutput:
        """One control step: append the step's tokens to the cache and decode its action tokens.

        image (B, C, H, W, 3) uint8, proprio (B, P) normalized, timestep (B,) episode step index, committed
        (B, chunk*A) bins already decided for this step's slots (-1 = free; with committed_actions).
        When the window already holds K steps, the oldest is evicted (its slot is overwritten)."""
        if not cache.started:
            raise RuntimeError("call model.start(cache, instruction) before model.step")
        n_obs, S = self.layout.n_obs_tokens, self.layout.tokens_per_step
        slot = cache.advance(timestep)
        base = cache.slot_offset(slot)  # buffer position of this step's first token
        mask = cache.memo_mask(slot, timestep, lambda keys: self.mask(keys.select(slice(base, base + S)), keys))
        held = None if committed is None else committed[:, None]  # (B, 1, chunk*A)
        h = self.embed_steps(image[:, None], proprio[:, None], cache.film_ctx, held).x[:, 0]  # (B, S, d)
        for i, block in enumerate(self.blocks):
            rows = slice(n_obs, S) if i == self.cfg.n_layer - 1 else None  # only the action slots leave
            h, _ = block(h, mask, cache.kv[i], base, rows=rows)  # (B, S, d), last block (B, chunk*A, d)
        logits = self.head(self.ln_f(h))  # (B, chunk*A, bins)
        return StepOutput(logits.argmax(-1), logits)  # greedy: (B, chunk*A)
