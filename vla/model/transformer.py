"""The transformer trunk: pre-norm blocks, and the ONE attention rule every pass uses.

Which keys a query sees is decided by `attention_mask` from where each token sits (`TokenCoords`):
the training pass, the from-scratch recompute and the streaming KV-cache step all describe their
queries and keys this way and call it, so the three cannot drift apart.

The rule:
- instruction queries see the earlier instruction tokens (causal), padding keys hidden;
- step queries see every (non-padding) instruction token;
- a step query sees the earlier tokens of its own step (causal within the step);
- an action query sees the observation tokens of earlier steps, and an observation query sees nothing
  of earlier steps. A token that later steps read (an observation token) then depends only on its own
  step and the instruction, at every layer, so its cached keys/values are exactly what a from-scratch
  pass over any later window computes: streaming with eviction equals recomputation. (The plain causal
  mask over the whole stream would not: cached keys would carry context from evicted steps.)
A query always sees itself (no empty rows). Relative time enters as a learned bias per head and step
offset D = t_query - t_key in [0, K-1]; step queries also get a learned per-head bias on instruction keys.

Never `is_causal=True`: PyTorch aligns it to the upper left, which is wrong whenever the queries are
fewer than the keys (every cached step). Every call passes an explicit float mask.

The attention itself is `scaled_dot_product_attention` in training and streaming; `attention_weights` is
the same softmax written out, for the attention maps (`need_weights`) and for the exported step graph
(vla/export/graphs.py), which runs it on batch-free tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from vla.model.config import ModelConfig


@dataclass
class TokenCoords:
    """Where each of n tokens sits; slot -1 marks instruction tokens."""

    pos: torch.Tensor  # (n,) int64 position in the stream / cache buffer (a token sees itself)
    slot: torch.Tensor  # (n,) int64 step slot (window position, or cache ring slot); -1 = instruction
    index: torch.Tensor  # (n,) int64 index within its step (or within the instruction)
    time: torch.Tensor  # (B, n) int64 episode step index (0 for instruction tokens)
    valid: torch.Tensor  # (B, n) bool: False = padding (hidden as a key)

    def select(self, rows: slice) -> TokenCoords:
        """The coordinates of a contiguous run of these tokens (e.g. one step's queries in the cache)."""
        return TokenCoords(self.pos[rows], self.slot[rows], self.index[rows], self.time[:, rows], self.valid[:, rows])


def ring_layout(L: int, K: int, S: int, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pos, slot, index) of the buffer [instruction (L) | slot 0 (S) | ... | slot K-1 (S)], each (L + K*S,)."""
    return (
        torch.arange(L + K * S, device=device),
        torch.cat([torch.full((L,), -1, device=device), torch.arange(K, device=device).repeat_interleave(S)]),
        torch.cat([torch.arange(L, device=device), torch.arange(S, device=device).repeat(K)]),
    )


def ring_coords(layout: tuple, instr_valid, slot_timestep, slot_valid) -> TokenCoords:
    """The buffer's coordinates from its layout and the ring's state: instr_valid (B, L), slot_timestep and
    slot_valid (B, K). Used by `KVCache` (vla/model/kv_cache.py) and the exported graphs (vla/export/graphs.py)."""
    S = (layout[0].shape[0] - instr_valid.shape[1]) // slot_valid.shape[1]
    return TokenCoords(
        pos=layout[0],
        slot=layout[1],
        index=layout[2],
        time=torch.cat([slot_timestep.new_zeros(instr_valid.shape), slot_timestep.repeat_interleave(S, 1)], 1),
        valid=torch.cat([instr_valid, slot_valid.repeat_interleave(S, dim=1)], dim=1),  # (B, L + K*S)
    )


def attention_mask(
    q: TokenCoords,
    k: TokenCoords,
    same_step: torch.Tensor,
    earlier_step: torch.Tensor,
    rel_bias: torch.Tensor | None,
    instr_bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Float mask (B, H|1, n_q, n_k): the time bias where a query may see a key, -inf elsewhere.

    same_step / earlier_step (S, S) bool: within-step rule and the rule towards earlier steps, by index.
    rel_bias (H, K) per head and step offset, instr_bias (H,), both None without relative time."""
    S = same_step.shape[0]
    q_step, k_step = q.slot >= 0, k.slot >= 0  # (n_q,), (n_k,)
    qi, ki = q.index.clamp(max=S - 1)[:, None], k.index.clamp(max=S - 1)[None, :]  # (n_q, 1), (1, n_k)
    instr_rule = ~q_step[:, None] & ~k_step[None, :] & (k.index[None, :] <= q.index[:, None])  # (n_q, n_k)
    to_instr = q_step[:, None] & ~k_step[None, :]  # (n_q, n_k)
    both = q_step[:, None] & k_step[None, :]  # (n_q, n_k)
    same = both & (q.slot[:, None] == k.slot[None, :]) & same_step[qi, ki]  # (n_q, n_k)
    earlier = (q.time[:, :, None] > k.time[:, None, :]) & (both & earlier_step[qi, ki] & (q.slot[:, None] != k.slot))
    allowed = ((instr_rule | to_instr | same) | earlier) & k.valid[:, None, :]  # (B, n_q, n_k)
    allowed = allowed | (q.pos[:, None] == k.pos[None, :])  # a query always sees itself
    if rel_bias is None:
        bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)[:, None]  # (B, 1, n_q, n_k)
    else:
        K = rel_bias.shape[1]
        delta = (q.time[:, :, None] - k.time[:, None, :]).clamp(0, K - 1)  # (B, n_q, n_k)
        # a one-hot product, not rel_bias[:, delta]: the gather's backward is a scatter-add of B*H*n_q*n_k
        # values into H*K cells, which on CPU cost an eighth of a training step; this one is a small matmul
        # (a comparison, not F.one_hot, which checks its input's range with two host reductions per call)
        offsets = torch.arange(K, device=delta.device)  # (K,)
        onehot = ((delta[..., None] == offsets) & both[..., None]).to(rel_bias.dtype)  # (B, n_q, n_k, K)
        bias = torch.einsum("bqkt,ht->bhqk", onehot, rel_bias)  # (B, H, n_q, n_k): step offset bias
        bias = bias + instr_bias[None, :, None, None] * to_instr  # step queries -> instruction keys
        bias = bias.to(dtype)
    return bias.masked_fill(~allowed[:, None], float("-inf"))


def attention_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, floor: float | None = None):
    """softmax(q kᵀ / sqrt(hd) + mask): q (.., H, r, hd), k (.., H, n_k, hd), mask (.., H|1, r, n_k) float
    -> (.., H, r, n_k). With `floor`, scores are first raised to at least their row's maximum - floor:
    masked (-inf) and far-below-the-maximum scores otherwise exponentiate to denormals, which onnxruntime's
    CPU softmax computes several times slower than normal numbers; at 80 below the maximum a key's weight
    is < 2e-35 of the best one's, zero to float precision (the exported graph uses it; `need_weights` does
    not, so a masked key's weight stays exactly 0)."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1])) + mask.to(q.dtype)  # (.., H, r, n_k)
    if floor is not None:
        scores = torch.maximum(scores, scores.amax(-1, keepdim=True) - floor)
    return scores.softmax(-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.d_model // cfg.n_head
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # q, k, v in one matmul
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x, mask, kv=None, pos=0, rows=None, need_weights=False):
        """x (B, n, d); mask (B|1, H|1, n, n_keys) float, 0 / bias where allowed, -inf where not.

        With `kv` (2, B, H, n_cache, hd) the new keys/values are written at [pos, pos + n) and the
        queries attend to the whole buffer (the mask hides empty and stale positions). With `rows`
        (a slice) only those queries are computed: (B, r, d) out. With `need_weights` also returns the
        attention probabilities (B, H, n|r, n_keys) (math path)."""
        B, n, d = x.shape
        qkv = self.c_attn(x).view(B, n, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, n, hd)
        if kv is None:
            q, k, v = qkv[0], qkv[1], qkv[2]  # each (B, H, n, hd)
        else:
            kv[:, :, :, pos : pos + n] = qkv[1:]  # (2, B, H, n, hd) into the cache
            q, k, v = qkv[0].to(kv.dtype), kv[0], kv[1]  # (B, H, n, hd), (B, H, n_cache, hd) x 2
        if rows is not None:
            q, mask = q[:, :, rows], mask[..., rows, :]  # (B, H, r, hd), (.., r, n_keys)
        mask = mask.to(q.dtype)
        weights = None
        if need_weights:  # the math path, to expose the attention probabilities
            weights = attention_weights(q, k, mask)  # (B, H, n, n_keys)
            y = weights @ v  # (B, H, n, hd)
        else:
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, H, n, hd)
        y = y.transpose(1, 2).reshape(B, q.shape[2], d)  # (B, n or r, d)
        return self.resid_drop(self.c_proj(y)), weights


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(cfg.d_ff, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x, mask, kv=None, pos=0, rows=None, need_weights=False):
        """(B, n, d) -> (B, n, d), or (B, r, d) for the query `rows` only (keys/values from all n);
        plus the attention probabilities when `need_weights` (else None)."""
        y, weights = self.attn(self.ln_1(x), mask, kv, pos, rows, need_weights)
        x = (x if rows is None else x[:, rows]) + y
        return x + self.mlp(self.ln_2(x)), weights
