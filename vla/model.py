"""The policy model: one causally masked token stream through a decoder-only transformer.

Token stream of one sample (a window of K control steps, S tokens per step):

    [instruction: L tokens, right-padded; pad keys masked]
    step t: [image patches: n_cameras * (image_size / patch_size)^2] [proprio: 1] [action slots: chunk * A]
    step t+1: ...

A token's input embedding is its content (patch projection + 2-D patch position + camera, proprio
projection, instruction word + position, or action bin) plus a segment embedding (instruction /
image / proprio / action) plus, for step tokens, an index-within-step embedding. Pre-norm blocks,
a final LayerNorm, and one head to `action_bins` logits shared by all action dims (a slot's dim is
known from its index embedding). Loss: cross-entropy on action slots of real steps only.

Which keys a token sees (`causal_scope`):
- "step" (default): observation tokens (patches, proprio) see the instruction and the earlier tokens
  of their own step; action tokens see the instruction, the observation tokens of every step of the
  window up to their own, and the earlier action tokens of their own step. Everything allowed is
  earlier in the stream, so the mask is causal. Crucially, a token that later steps read (an
  observation token) depends only on its own step and the instruction, at every layer. So its cached
  keys/values are exactly what a from-scratch pass over any later window computes: streaming with
  eviction equals recomputation over the same window after any number of slides. Temporal reasoning
  happens in the action tokens, which read every step's per-layer features.
- "stream": the plain causal mask over the whole stream (every token sees every earlier token). A
  layer >= 2 key of a cached step then carries context from steps that have since been evicted,
  which a recomputation over the window cannot see: streaming equals recomputation only until the
  window first slides (a rolling-buffer approximation, as in sliding-window LLM caches). Kept for
  ablations and for the uncached policy.

Time (`time_encoding`):
- "relative" (default): a learned bias per head and step offset D = t_query - t_key in [0, K-1]
  (T5/ALiBi style, initialized to ALiBi's recency slopes), plus one learned per-head bias on the
  instruction's keys. It is added to the attention scores through the explicit float mask. Outputs
  depend on time only through D, so they are exactly invariant to shifting every step index, and a
  cached key never changes when the window slides. We use a bias rather than RoPE because the
  instruction prefix has no step index: with RoPE, the query-to-instruction score would depend on the
  query's absolute time (instruction keys rotated to step 0), or the prefix would need re-rotating at
  every step to stay relative. A per-head scalar per offset is also cheap: K numbers per head.
- "sinusoidal" / "learned": an absolute encoding of the episode step index added to every step
  token's embedding: fixed sinusoids through a learned linear map (raw sinusoids are tens of times the
  scale of the other embeddings at init and would drown them), or a learned table that clamps to
  `max_episode_steps - 1`. For ablations.
- "none": no time information; the window is a set of steps (the chapter's set-vs-sequence point).

Action decoding (`action_decoding`), slot j of a step predicts action token j:
- "autoregressive": slot 0 holds a learned start embedding, slot j >= 1 the embedding of the bin of
  token j-1 (teacher-forced in training, the previously decoded bin at inference); GPT shift inside
  the step. (The design card had the proprio token predict dim 0; under causal_scope="step" proprio
  cannot see earlier steps, so a dedicated start slot reads out dim 0 instead. Same token count.)
- "parallel": every slot holds a learned query (its segment + index embeddings, no value); all of a
  step's action tokens come out of one forward pass. Past actions are never fed.
Chunking: slot j = c * A + a is dim a of action t + c (chunk-major), targets (B, K, chunk * A).

Inference: `new_cache` / `start` (instruction prefix once) / `step` (append one step, decode its
action tokens) keep a constant-memory KV cache (see `vla/kv_cache.py`); `recompute` decodes the same
window from scratch with no cache and returns the same tokens and logits. Only the action slots'
outputs are ever read, so the last block computes queries, projection and MLP for those rows only
(its keys/values still come from every token): in training, recompute and streaming alike.

Never `is_causal=True`: PyTorch aligns it to the upper left, which is wrong whenever the queries are
fewer than the keys (every cached step). Every call passes an explicit float mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from vla.kv_cache import KVCache

SEG_INSTRUCTION, SEG_IMAGE, SEG_PROPRIO, SEG_ACTION = 0, 1, 2, 3
PAD_ID = 0  # instruction padding id (vla.tokenizers.text.PAD_ID)


@dataclass
class ModelConfig:
    # observation
    image_size: int = 64  # camera image height = width, pixels
    n_cameras: int = 1  # cameras per step; each contributes (image_size / patch_size)^2 patch tokens
    patch_size: int = 16  # ViT patch side, pixels
    patch_embed: Literal["linear", "conv"] = "linear"  # pixels -> d_model: per-patch linear, or stride-conv stem
    keypoints: int = 0  # spatial-softmax keypoint tokens per camera and step (0 = patches only)
    keypoint_channels: int = 32  # hidden channels of the keypoint network, at half the image resolution
    film: bool = False  # condition the conv stem on the instruction (FiLM, as RT-1 does); patch_embed="conv" only
    conv_channels: int = 16  # channels of the conv stem's first stage, doubling per stage (patch_embed="conv")
    proprio_dim: int = 9  # proprioceptive state size P (normalized floats), embedded as one token
    # instruction
    vocab_size: int = 512  # instruction vocabulary size (TextTokenizer.vocab_size), tokens
    instruction_len: int = 16  # L: instruction tokens (padded / truncated), tokens
    # actions
    action_dim: int = 4  # A: action dimensions
    action_bins: int = 256  # discretization bins per action dimension (ActionTokenizer.bins)
    chunk: int = 1  # future actions predicted per step (t .. t+chunk-1) -> chunk * A action slots
    action_decoding: Literal["autoregressive", "parallel"] = "autoregressive"  # see module docstring
    action_readout: Literal["argmax", "expectation"] = "argmax"  # the policy's value: best bin's centre, or mean
    temporal_ensemble: bool = False  # policy: average every stored chunk's prediction for a step (ACT)
    # time and context
    window: int = 8  # K: control steps in the context window (and KV-cache step slots)
    time_encoding: Literal["relative", "sinusoidal", "learned", "none"] = "relative"  # see docstring
    max_episode_steps: int = 1000  # bound for time_encoding="learned" (step indices clamped), steps
    causal_scope: Literal["step", "stream"] = "step"  # which earlier tokens a token sees; see docstring
    # transformer
    d_model: int = 128  # embedding width, features
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads (d_model / n_head features each)
    d_ff: int = 512  # MLP hidden width, features
    aux_dim: int = 0  # auxiliary regression outputs per step from the first action slot (0 = off); training only
    aux_feed: bool = False  # add the auxiliary head's prediction to the proprio token (needs keypoints, aux_dim)
    dropout: float = 0.0  # dropout probability (embeddings, attention, residual branches), training only
    bias: bool = True  # biases in Linear layers and LayerNorms

    def __post_init__(self):
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}")
        if self.patch_embed == "conv" and (self.patch_size < 2 or self.patch_size & (self.patch_size - 1)):
            raise ValueError(f"patch_embed='conv' needs patch_size a power of two >= 2, got {self.patch_size}")
        for name in ("n_cameras", "proprio_dim", "vocab_size", "instruction_len", "action_dim", "chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("window", "max_episode_steps", "d_model", "n_layer", "d_ff", "conv_channels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.film and self.patch_embed != "conv" and not self.keypoints:
            raise ValueError(f"film=True needs patch_embed='conv' or keypoints, got patch_embed={self.patch_embed!r}")
        if self.aux_feed and not self.keypoints:
            raise ValueError("aux_feed=True needs keypoints > 0 (the auxiliary prediction reads the keypoints)")
        if self.action_bins < 2:
            raise ValueError(f"action_bins={self.action_bins} must be >= 2")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")

    @property
    def grid(self) -> int:
        """Patches per image side."""
        return self.image_size // self.patch_size

    @property
    def keypoint_grid(self) -> int:
        """Heat-map side of the keypoint network (half the image, rounded up), pixels."""
        return (self.image_size + 1) // 2

    @property
    def n_image_tokens(self) -> int:
        """Image tokens per step, all cameras: patches, then keypoints, per camera."""
        return self.n_cameras * (self.grid**2 + self.keypoints)

    @property
    def n_obs_tokens(self) -> int:
        """Observation tokens per step: patches + 1 proprio."""
        return self.n_image_tokens + 1

    @property
    def n_action_tokens(self) -> int:
        """Action slots per step: chunk * action_dim."""
        return self.chunk * self.action_dim

    @property
    def tokens_per_step(self) -> int:
        """S."""
        return self.n_obs_tokens + self.n_action_tokens

    @property
    def n_tokens(self) -> int:
        """L + K * S: the stream length of a full window."""
        return self.instruction_len + self.window * self.tokens_per_step


@dataclass
class StepOutput:
    tokens: torch.Tensor  # (B, chunk * A) int64 decoded action bins
    logits: torch.Tensor  # (B, chunk * A, action_bins) the logits each token was decoded from


# ----------------------------------------------------------------------------- blocks


class PatchEmbed(nn.Module):
    """uint8 images -> patch tokens with a learned 2-D (row + column) position and a camera embedding."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        p, d, g = cfg.patch_size, cfg.d_model, cfg.grid
        if cfg.patch_embed == "linear":
            self.proj = nn.Linear(p * p * 3, d, bias=cfg.bias)
        else:
            # A small convolutional stem ("early convolutions help transformers see", Xiao et al. 2021):
            # log2(p) overlapping 3x3 stride-2 stages, channels doubling from conv_channels, ending at
            # d channels on the patch grid. Two coordinate channels (CoordConv) make a feature's position
            # inside its patch explicit, which a 16-pixel patch otherwise has to learn from scratch.
            # With `film`, every hidden stage is scaled and shifted per channel by a function of the
            # instruction (FiLM): the stem can pick out the named colour pixel by pixel, before any
            # attention, which is what makes language-conditioned vision learnable in minutes on a CPU.
            convs, films, c_in, n = [], [], 3 + 2, p.bit_length() - 1
            for i in range(n):
                c_out = d if i == n - 1 else cfg.conv_channels * 2**i
                convs.append(nn.Conv2d(c_in, c_out, kernel_size=3, stride=2, padding=1, bias=cfg.bias))
                if cfg.film and i < n - 1:
                    films.append(nn.Linear(2 * d, 2 * c_out))
                c_in = c_out
            self.proj = nn.ModuleList(convs)
            self.film = nn.ModuleList(films) if cfg.film else None
        self.row = nn.Parameter(torch.zeros(g, d))
        self.col = nn.Parameter(torch.zeros(g, d))
        self.camera = nn.Parameter(torch.zeros(cfg.n_cameras, d))
        if cfg.keypoints:
            # Spatial-softmax keypoints (Levine et al. 2016; robomimic's default readout): a small conv
            # net at half resolution gives M heat maps; each map's softmax-weighted pixel coordinates are
            # where "its" thing is, to a fraction of a pixel. A 16-pixel patch token cannot say where in
            # the patch a 5-pixel block sits; a keypoint token says it directly.
            c, M = cfg.keypoint_channels, cfg.keypoints
            self.kp_convs = nn.ModuleList(
                [nn.Conv2d(3 + 2, c, 3, stride=2, padding=1), nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, M, 1)]
            )
            # With `film` the maps are conditioned on the instruction, so a keypoint can follow "the
            # named block" rather than "the red thing": the transformer then reads it at a fixed slot.
            # Besides scaling hidden channels, the instruction gives each map a query that is matched
            # against every pixel's features (heat = conv(x) + <x, q>): "orange" becomes a direction in
            # feature space, a bilinear link that supervised keypoints learn in a few hundred steps.
            self.kp_film = nn.ModuleList([nn.Linear(2 * d, 2 * c) for _ in range(2)]) if cfg.film else None
            self.kp_query = nn.Linear(2 * d, M * c) if cfg.film else None
            self.kp_sharpness = nn.Parameter(torch.tensor(math.log(20.0)))  # log inverse softmax temperature
            self.kp_proj = nn.Linear(3, d)  # (x, y, strength) -> d
            self.kp_id = nn.Parameter(torch.zeros(M, d))  # which keypoint a token is
            h = cfg.keypoint_grid
            axis = (torch.arange(h) + 0.5) / h * 2 - 1  # pixel centres; -1 / +1 are the image edges
            ys, xs = torch.meshgrid(axis, axis, indexing="ij")
            self.register_buffer("kp_coords", torch.stack([ys.flatten(), xs.flatten()], 1), persistent=False)
        if cfg.patch_embed == "conv" or cfg.keypoints:  # coordinate channels of the conv inputs
            axis = torch.linspace(-0.5, 0.5, cfg.image_size)
            ys, xs = torch.meshgrid(axis, axis, indexing="ij")  # (H, W) each
            self.register_buffer("coords", torch.stack([ys, xs]), persistent=False)  # (2, H, W)

    def forward(self, image: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T, C, H, W, 3) uint8 -> (B, T, C * g * g, d); patches row-major, cameras in order.

        `context` (B, 2d): the instruction summary that conditions the stem when cfg.film."""
        return self.project(image, context) + self.positions()  # (B, T, C*g*g, d)

    def positions(self) -> torch.Tensor:
        """(C * (g*g + M), d): 2-D patch position (row + column) or keypoint id, + camera embedding."""
        pos = (self.row[:, None, :] + self.col[None, :, :]).flatten(0, 1)  # (g*g, d): index r*g + c
        if self.cfg.keypoints:
            pos = torch.cat([pos, self.kp_id], dim=0)  # (g*g + M, d)
        return (self.camera[:, None, :] + pos).flatten(0, 1)  # (C*(g*g + M), d)

    @staticmethod
    def film_gelu(x: torch.Tensor, film: nn.Linear | None, context: torch.Tensor | None) -> torch.Tensor:
        """GELU of feature maps x (N, c, h, w), first scaled and shifted per channel by `film(context)`
        when there is a FiLM layer; context (B, 2d) is shared by the N / B images of each batch row."""
        if film is not None:
            gamma, beta = film(context).repeat_interleave(x.shape[0] // context.shape[0], 0).chunk(2, 1)  # (N, c)
            x = x * (1 + gamma[:, :, None, None]) + beta[:, :, None, None]  # (N, c, h, w)
        return F.gelu(x)

    def keypoints(self, x: torch.Tensor, context: torch.Tensor | None) -> torch.Tensor:
        """(N, 5, H, W) pixels + coordinates -> (N, M, d) keypoint tokens: (x, y, strength) of each map.

        context (B, 2d) conditions the maps when cfg.film (N = B * steps * cameras)."""
        films = self.kp_film if self.kp_film is not None else [None] * (len(self.kp_convs) - 1)
        for conv, film in zip(self.kp_convs[:-1], films, strict=True):
            x = self.film_gelu(conv(x), film, context)  # (N, c, h, w)
        heat = self.kp_convs[-1](x).flatten(2)  # (N, M, h*w)
        if self.kp_query is not None:
            c, M = x.shape[1], heat.shape[1]
            q = self.kp_query(context).view(-1, M, c).repeat_interleave(x.shape[0] // context.shape[0], 0)  # (N, M, c)
            heat = heat + torch.einsum("nmc,ncp->nmp", q, x.flatten(2)) / math.sqrt(c)  # (N, M, h*w)
        att = (heat * self.kp_sharpness.exp()).softmax(-1)  # (N, M, h*w)
        where = att @ self.kp_coords.to(att.dtype)  # (N, M, 2): expected (y, x) in [-1, 1]
        strength = (att * heat).sum(-1, keepdim=True)  # (N, M, 1): how strongly the map fired there
        self.last_where, self.last_att = where, att  # read by the model's auxiliary losses in training
        if self.cfg.aux_dim:  # supervised keypoints: they learn only from the auxiliary target, and the
            where, strength = where.detach(), strength.detach()  # policy reads them as given features
        return self.kp_proj(torch.cat([where, strength], dim=-1))  # (N, M, d)

    def project(self, image: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """Pixels -> patch features, no position: (B, T, C, H, W, 3) uint8 -> (B, T, C*g*g, d)."""
        cfg = self.cfg
        p, B, T = cfg.patch_size, image.shape[0], image.shape[1]
        x = image.to(self.row.dtype) / 255.0 - 0.5  # (B, T, C, H, W, 3) in [-0.5, 0.5]
        if cfg.patch_embed == "conv" or cfg.keypoints:  # conv inputs: pixels + coordinates, built once
            pix = rearrange(x, "b t c h w ch -> (b t c) ch h w")  # (B*T*C, 3, H, W)
            coords = self.coords.to(pix.dtype).expand(pix.shape[0], -1, -1, -1)  # (B*T*C, 2, H, W)
            pix = torch.cat([pix, coords], dim=1)  # (B*T*C, 5, H, W)
        kp = None
        if cfg.keypoints:
            kp = self.keypoints(pix, context)  # (B*T*C, M, d)
            kp = rearrange(kp, "(b t c) m d -> b t c m d", b=B, t=T)  # (B, T, C, M, d)
        if cfg.patch_embed == "linear":
            x = rearrange(x, "b t c (h p1) (w p2) ch -> b t c (h w) (p1 p2 ch)", p1=p, p2=p)  # (B, T, C, g*g, p*p*3)
            x = self.proj(x)  # (B, T, C, g*g, d)
        else:
            x = pix  # (B*T*C, 5, H, W)
            films = self.film if self.film is not None else [None] * (len(self.proj) - 1)
            for conv, film in zip(self.proj[:-1], films, strict=True):
                x = self.film_gelu(conv(x), film, context)  # (B*T*C, c_i, H / 2^(i+1), W / 2^(i+1))
            x = self.proj[-1](x)  # (B*T*C, d, g, g)
            x = rearrange(x, "(b t c) d h w -> b t c (h w) d", b=B, t=T)  # (B, T, C, g*g, d)
        if kp is not None:
            x = torch.cat([x, kp], dim=3)  # (B, T, C, g*g + M, d)
        return x.flatten(2, 3)  # (B, T, C*(g*g + M), d)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.d_model // cfg.n_head
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.last_weights: torch.Tensor | None = None  # (B, H, n, n_keys), set when need_weights

    def forward(self, x, mask, kv=None, pos=0, rows=None, need_weights=False):
        """x (B, n, d); mask (B|1, H|1, n, n_keys) float, 0 / bias where allowed, -inf where not.

        With `kv` (2, B, H, n_cache, hd) the new keys/values are written at [pos, pos + n) and the
        queries attend to the whole buffer (the mask hides empty and stale positions). With `rows`
        (a slice or index tensor) only those queries are computed: (B, r, d) out."""
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
        if need_weights:  # the math path, to expose the attention probabilities
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim)) + mask  # (B, H, n, n_keys)
            self.last_weights = att.softmax(-1)
            y = self.last_weights @ v  # (B, H, n, hd)
        else:
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, H, n, hd)
        y = y.transpose(1, 2).reshape(B, q.shape[2], d)  # (B, n or r, d)
        return self.resid_drop(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, mask, kv=None, pos=0, rows=None, need_weights=False):
        """(B, n, d) -> (B, n, d), or (B, r, d) for the query `rows` only (keys/values from all n)."""
        y = self.attn(self.ln_1(x), mask, kv, pos, rows, need_weights)
        x = (x if rows is None else x[:, rows]) + y
        return x + self.mlp(self.ln_2(x))


def sinusoidal(timestep: torch.Tensor, dim: int) -> torch.Tensor:
    """Transformer sinusoidal encoding of integer step indices: (...) -> (..., dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=timestep.device) / half)  # (half,)
    angles = timestep.float()[..., None] * freqs  # (..., half)
    enc = torch.cat([angles.sin(), angles.cos()], dim=-1)  # (..., 2*half)
    return F.pad(enc, (0, dim - 2 * half))  # (..., dim)


# ----------------------------------------------------------------------------- the model


class ActionTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, S, K, H = cfg.d_model, cfg.tokens_per_step, cfg.window, cfg.n_head
        self.patch_embed = PatchEmbed(cfg)
        self.proprio_embed = nn.Linear(cfg.proprio_dim, d, bias=cfg.bias)
        self.instr_embed = nn.Embedding(cfg.vocab_size, d)
        self.instr_pos = nn.Embedding(cfg.instruction_len, d)
        # parallel decoding never feeds action values; its slots are queries (segment + index only)
        self.action_embed = nn.Embedding(cfg.action_bins, d) if cfg.action_decoding == "autoregressive" else None
        self.segment_embed = nn.Embedding(4, d)
        self.index_embed = nn.Embedding(S, d)  # position of a token inside its step's block
        if cfg.time_encoding == "learned":
            self.time_embed = nn.Embedding(cfg.max_episode_steps, d)
        elif cfg.time_encoding == "sinusoidal":  # fixed features, learned linear map (brings them to scale)
            self.time_embed = nn.Linear(d, d, bias=False)
        else:
            self.time_embed = None
        if cfg.time_encoding == "relative":
            self.rel_bias = nn.Parameter(torch.zeros(H, K))  # (H, K): bias for step offset D = 0 .. K-1
            self.instr_bias = nn.Parameter(torch.zeros(H))  # (H,): bias on instruction keys (no time)
        else:
            self.rel_bias = self.instr_bias = None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(d, bias=cfg.bias)
        self.head = nn.Linear(d, cfg.action_bins, bias=cfg.bias)
        self.film_pool = (
            nn.Linear(d, 2, bias=False) if cfg.film else None
        )  # two attention pools, see instruction_context
        # Optional auxiliary readout of privileged state (where the named object and its goal are): a
        # dense localization signal for the visual pathway during training, unused at inference. With
        # keypoints it reads their coordinates (and the proprio) directly through a small MLP, so the
        # signal reaches the keypoint network without first having to teach attention where to look. Not
        # a linear map: from a front camera a lifted block's image row mixes its depth with its height,
        # and only the proprio (gripper closed, hand raised) tells which, a conditional a line can't fit.
        aux_in = 2 * cfg.n_cameras * cfg.keypoints + cfg.proprio_dim if cfg.keypoints else d
        self.aux_head = (
            nn.Sequential(nn.Linear(aux_in, d), nn.GELU(), nn.Linear(d, cfg.aux_dim)) if cfg.aux_dim else None
        )
        # With `aux_feed` that prediction (where the named block and its goal are, relative to the hand)
        # also enters the proprio token at inference: the action is then nearly a function of one token.
        if cfg.aux_feed and not cfg.aux_dim:
            raise ValueError("aux_feed=True needs aux_dim > 0: train with an auxiliary target (data.aux_key)")
        self.aux_embed = nn.Linear(cfg.aux_dim, d, bias=False) if cfg.aux_feed else None

        # static structure of a step (S tokens) and of a full window (L + K*S tokens)
        n_obs = cfg.n_obs_tokens
        seg = torch.full((S,), SEG_ACTION, dtype=torch.long)
        seg[: cfg.n_image_tokens], seg[cfg.n_image_tokens] = SEG_IMAGE, SEG_PROPRIO
        is_action = torch.arange(S) >= n_obs  # (S,)
        same_step = torch.ones(S, S, dtype=torch.bool).tril()  # (S_q, S_k): earlier tokens of one step
        if cfg.causal_scope == "step":
            earlier_step = is_action[:, None] & ~is_action[None, :]  # action queries see observation keys
        else:
            earlier_step = torch.ones(S, S, dtype=torch.bool)
        neg_inf = torch.tensor(float("-inf"))
        self.register_buffer("step_segment", seg, persistent=False)  # (S,)
        self.register_buffer("same_step", same_step, persistent=False)  # (S, S)
        self.register_buffer("earlier_step", earlier_step, persistent=False)  # (S, S)
        self.register_buffer("same_step_add", torch.where(same_step, 0.0, neg_inf), persistent=False)  # (S, S)
        self.register_buffer("earlier_step_add", torch.where(earlier_step, 0.0, neg_inf), persistent=False)
        self.register_buffer("structure", self._structure(K), persistent=False)  # (L+K*S, L+K*S)

        self.apply(self._init_weights)
        # FiLM and the auxiliary readout keep PyTorch's fan-in init: from N(0, 0.02) their signal into the
        # stem starts an order of magnitude weaker, and localization is what the demo budget is short of.
        pe = self.patch_embed
        for module in [
            self.film_pool,
            *(m for m in (self.aux_head or []) if isinstance(m, nn.Linear)),
            self.aux_embed,
            *(getattr(pe, "film", None) or []),
            *(getattr(pe, "kp_film", None) or []),
        ]:
            if module is not None:
                module.reset_parameters()
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # residual projections, GPT-2 scaling
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
        for p in (self.patch_embed.row, self.patch_embed.col, self.patch_embed.camera):
            nn.init.normal_(p, mean=0.0, std=0.02)
        if self.rel_bias is not None:  # ALiBi recency prior: -slope_h * D, slopes 2^(-8 h / H)
            slopes = 2.0 ** (-8.0 * torch.arange(1, H + 1) / H)  # (H,)
            with torch.no_grad():
                self.rel_bias.copy_(-slopes[:, None] * torch.arange(K)[None, :])  # (H, K)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def _structure(self, n_steps: int) -> torch.Tensor:
        """(N, N) bool, N = L + n_steps*S: may query i see key j, before padding. Causal by construction."""
        L, S = self.cfg.instruction_len, self.cfg.tokens_per_step
        N = L + n_steps * S
        allowed = torch.zeros(N, N, dtype=torch.bool)
        allowed[:L, :L] = torch.ones(L, L, dtype=torch.bool).tril()  # instruction: causal
        allowed[L:, :L] = True  # every step token sees the instruction
        step = torch.arange(n_steps).repeat_interleave(S)  # (n_steps*S,) step of each token
        rel = step[:, None] - step[None, :]  # (n_steps*S, n_steps*S): query step - key step
        same = self.same_step.repeat(n_steps, n_steps)  # (n_steps*S, n_steps*S)
        earlier = self.earlier_step.repeat(n_steps, n_steps)  # (n_steps*S, n_steps*S)
        allowed[L:, L:] = torch.where(rel == 0, same, (rel > 0) & earlier)
        return allowed

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def optim_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups (nanoGPT): decay matrices and embeddings (dim >= 2), not biases/norms/time biases."""
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2 and p is not self.rel_bias]
        ids = {id(p) for p in decay}
        return [
            {"params": decay, "weight_decay": weight_decay},
            {"params": [p for p in params if id(p) not in ids], "weight_decay": 0.0},
        ]

    # ------------------------------------------------------------------------- embedding

    def _step_embed(self) -> torch.Tensor:
        """(S, d) segment + index-within-step embedding of each position of a step."""
        return self.segment_embed(self.step_segment) + self.index_embed.weight

    def _time_embed(self, timestep: torch.Tensor) -> torch.Tensor | None:
        """Absolute time encoding (B, T) -> (B, T, 1, d), or None for relative/none."""
        if self.cfg.time_encoding == "sinusoidal":
            return self.time_embed(sinusoidal(timestep, self.cfg.d_model).to(self.index_embed.weight.dtype))[:, :, None]
        if self.cfg.time_encoding == "learned":
            return self.time_embed(timestep.clamp(0, self.cfg.max_episode_steps - 1))[:, :, None]
        return None

    def embed_steps(self, image, proprio, timestep, actions=None, context=None) -> torch.Tensor:
        """Step tokens: image (B,T,C,H,W,3) uint8, proprio (B,T,P), timestep (B,T), actions (B,T,chunk*A)
        int64 bins or None (autoregressive slot j >= 1 then has no value), context (B, d) the
        instruction summary for a FiLM stem -> (B, T, S, d)."""
        cfg = self.cfg
        B, T = timestep.shape
        img = self.patch_embed(image, context)  # (B, T, C*g*g, d) with patch positions and camera
        prop = self.embed_proprio(proprio.to(img.dtype))[:, :, None]  # (B, T, 1, d)
        act = img.new_zeros(B, T, cfg.n_action_tokens, cfg.d_model)  # (B, T, chunk*A, d) no values
        if self.action_embed is not None and actions is not None and cfg.n_action_tokens > 1:
            act[:, :, 1:] = self.action_embed(actions[:, :, :-1])  # slot j holds bin j-1 (GPT shift)
        x = torch.cat([img, prop, act], dim=2) + self._step_embed()  # (B, T, S, d)
        t = self._time_embed(timestep)
        return x if t is None else x + t  # (B, T, S, d)

    def aux_features(self, proprio: torch.Tensor) -> torch.Tensor:
        """What the auxiliary head reads: the keypoints of the last `project` call + proprio (B, T, P)."""
        B, T = proprio.shape[:2]
        where = self.patch_embed.last_where.reshape(B, T, -1)  # (B, T, C*M*2): keypoint coordinates
        return torch.cat([where, proprio.to(where.dtype)], dim=-1)  # (B, T, C*M*2 + P)

    def embed_proprio(self, proprio: torch.Tensor) -> torch.Tensor:
        """(B, T, P) normalized -> (B, T, d); with aux_feed plus the embedded aux prediction (given, not
        trained through: the prediction learns from its own target only)."""
        x = self.proprio_embed(proprio)  # (B, T, d)
        if self.aux_embed is not None:
            x = x + self.aux_embed(self.aux_head(self.aux_features(proprio)).detach())  # (B, T, d)
        return x

    def embed_instruction(self, instruction: torch.Tensor) -> torch.Tensor:
        """(B, L) int64 -> (B, L, d)."""
        seg = self.segment_embed.weight[SEG_INSTRUCTION]  # (d,)
        return self.instr_embed(instruction) + self.instr_pos.weight[: instruction.shape[1]] + seg

    def _instruction_mask(self, instruction: torch.Tensor, dtype) -> torch.Tensor:
        """(B, 1, L, L) float mask of the instruction prefix on its own: causal, padding keys hidden."""
        L = instruction.shape[1]
        valid = instruction != PAD_ID  # (B, L)
        eye = torch.eye(L, dtype=torch.bool, device=instruction.device)
        allowed = (torch.ones_like(eye).tril() & valid[:, None, :]) | eye  # (B, L, L)
        return torch.zeros(allowed.shape, dtype=dtype, device=instruction.device).masked_fill(~allowed, float("-inf"))[
            :, None
        ]

    def instruction_context(self, instruction: torch.Tensor) -> torch.Tensor | None:
        """The instruction summary that conditions a FiLM stem (None without one): (B, L) -> (B, 2d).

        Two learned attention pools over the instruction's token embeddings (word + position). A pool
        can learn "the first colour word" (which block) and another "the second" (which goal) in a
        few hundred steps; a summary of the trunk's deep features of the prefix took far longer."""
        if not self.cfg.film:
            return None
        x = self.embed_instruction(instruction)  # (B, L, d)
        scores = self.film_pool(x).masked_fill((instruction == PAD_ID)[..., None], float("-inf"))  # (B, L, 2)
        pooled = torch.einsum("blq,bld->bqd", scores.softmax(dim=1), x)  # (B, 2, d)
        return pooled.flatten(1)  # (B, 2d)

    def embed(self, batch: dict) -> torch.Tensor:
        """The whole stream: (B, L + T*S, d)."""
        instr = self.embed_instruction(batch["instruction"])  # (B, L, d)
        context = self.instruction_context(batch["instruction"])  # (B, d) or None
        steps = self.embed_steps(batch["image"], batch["proprio"], batch["timestep"], batch.get("actions"), context)
        return torch.cat([instr, steps.flatten(1, 2)], dim=1)  # (B, L + T*S, d)

    # ------------------------------------------------------------------------- full-window pass

    def attention_mask(self, instruction, timestep, step_mask=None) -> torch.Tensor:
        """Float mask (B, H or 1, N, N), N = L + T*S: time bias where allowed, -inf elsewhere."""
        cfg = self.cfg
        B, T = timestep.shape
        L, S = instruction.shape[1], cfg.tokens_per_step
        N = L + T * S
        if instruction.shape[1] != cfg.instruction_len or timestep.shape[1] > cfg.window:
            raise ValueError(f"instruction length {L} / window {T} must be {cfg.instruction_len} / <= {cfg.window}")
        if step_mask is None:
            step_mask = torch.ones(B, T, dtype=torch.bool, device=timestep.device)
        key_valid = torch.cat([instruction != PAD_ID, step_mask.repeat_interleave(S, dim=1)], dim=1)  # (B, N)
        eye = torch.eye(N, dtype=torch.bool, device=timestep.device)  # a query always sees itself: no empty rows
        allowed = (self.structure[:N, :N] & key_valid[:, None, :]) | eye  # (B, N, N)
        dtype = self.index_embed.weight.dtype
        if self.rel_bias is None:
            bias = torch.zeros(B, 1, N, N, dtype=dtype, device=timestep.device)  # (B, 1, N, N)
        else:
            delta = (timestep[:, :, None] - timestep[:, None, :]).clamp(0, cfg.window - 1)  # (B, T, T)
            step_bias = self.rel_bias[:, delta].permute(1, 0, 2, 3)  # (B, H, T, T)
            step_bias = step_bias.repeat_interleave(S, dim=2).repeat_interleave(S, dim=3)  # (B, H, T*S, T*S)
            bias = torch.zeros(B, cfg.n_head, N, N, dtype=dtype, device=timestep.device)  # (B, H, N, N)
            bias[:, :, L:, L:] = step_bias
            bias[:, :, L:, :L] = self.instr_bias[None, :, None, None]  # step queries -> instruction keys
        return bias.masked_fill(~allowed[:, None], float("-inf"))

    def trunk(self, x, mask, rows=None, need_weights: bool = False) -> torch.Tensor:
        """Blocks + final norm over a whole stream: (B, N, d) -> (B, N, d), or (B, r, d) for `rows`.

        Only `rows` (e.g. the action slots) are carried through the last block: the other tokens'
        last-layer outputs are never read, though their keys/values are."""
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, rows=rows if i == len(self.blocks) - 1 else None, need_weights=need_weights)
        return self.ln_f(x)

    def action_rows(self, n_steps: int, device=None) -> torch.Tensor:
        """(n_steps * chunk*A,) stream positions of every action slot, step-major."""
        cfg = self.cfg
        start = cfg.instruction_len + torch.arange(n_steps, device=device) * cfg.tokens_per_step + cfg.n_obs_tokens
        return (start[:, None] + torch.arange(cfg.n_action_tokens, device=device)).flatten()

    def forward(self, batch: dict) -> dict:
        """Training / evaluation pass over windows.

        batch: instruction (B, L) int64, image (B, T, n_cam, H, W, 3) uint8, proprio (B, T, P) float
        (normalized), timestep (B, T) int64, step_mask (B, T) bool (optional, False = left padding),
        actions (B, T, chunk*A) int64 bins (optional; targets, and the inputs of autoregressive slots),
        aux (B, T, aux_dim) float (optional auxiliary regression targets, with cfg.aux_dim > 0),
        keypoint_targets (B, T, n, 2) float (optional image positions for the first n keypoints).
        Returns logits (B, T, chunk*A, bins); with actions also loss (scalar) and accuracy (A,), with
        aux also aux_loss (mean squared error), with keypoint_targets also keypoint_loss (cross-entropy).
        Without actions, autoregressive logits are valid for slot 0 only (use `recompute` to decode)."""
        cfg = self.cfg
        B, T = batch["timestep"].shape
        step_mask = batch.get("step_mask")
        x = self.embed(batch)  # (B, L + T*S, d)
        mask = self.attention_mask(batch["instruction"], batch["timestep"], step_mask)  # (B, H|1, N, N)
        h = self.trunk(x, mask, rows=self.action_rows(T, x.device))  # (B, T*chunk*A, d)
        logits = self.head(h).view(B, T, cfg.n_action_tokens, cfg.action_bins)  # (B, T, chunk*A, bins)
        out = {"logits": logits}
        actions = batch.get("actions")
        if actions is not None:
            w = (torch.ones(B, T, device=logits.device) if step_mask is None else step_mask.float())[..., None]
            ce = F.cross_entropy(logits.flatten(0, 2).float(), actions.flatten(), reduction="none")  # (B*T*CA,)
            ce = ce.view(B, T, cfg.n_action_tokens)  # (B, T, chunk*A)
            n_real = w.sum().clamp(min=1.0)
            out["loss"] = (ce * w).sum() / (n_real * cfg.n_action_tokens)
            hit = (logits.argmax(-1) == actions).float() * w  # (B, T, chunk*A)
            hit = hit.view(B, T, cfg.chunk, cfg.action_dim)  # (B, T, chunk, A)
            out["accuracy"] = hit.sum(dim=(0, 1, 2)) / (n_real * cfg.chunk)  # (A,)
            if self.aux_head is not None and "aux" in batch:
                if cfg.keypoints:
                    feats = self.aux_features(batch["proprio"])  # (B, T, C*M*2 + P)
                else:
                    feats = h.view(B, T, cfg.n_action_tokens, cfg.d_model)[:, :, 0]  # (B, T, d): first action slot
                err = (self.aux_head(feats).float() - batch["aux"].float()) ** 2  # (B, T, aux_dim)
                out["aux_loss"] = (err * w).sum() / (n_real * cfg.aux_dim)
            if "keypoint_targets" in batch:
                ce = self.keypoint_loss(batch["keypoint_targets"])  # (B, T)
                out["keypoint_loss"] = (ce * w[..., 0]).sum() / n_real
        return out

    def keypoint_loss(self, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the first n heat maps of the last `project` call (first camera) against a
        Gaussian of one pixel's width around where the n target points are: targets (B, T, n, 2)
        (row, column) in -1..1 -> (B, T). A dense signal at every pixel, where a coordinate loss only
        nudges the map's centre of mass: keypoints learn to find the named block in minutes, not hours."""
        cfg = self.cfg
        B, T, n = targets.shape[:3]
        if not cfg.keypoints or n > cfg.keypoints:
            raise ValueError(f"{n} keypoint targets need keypoints >= {n}, got keypoints={cfg.keypoints}")
        att = self.patch_embed.last_att.view(B, T, cfg.n_cameras, cfg.keypoints, -1)[:, :, 0, :n]  # (B, T, n, h*w)
        coords = self.patch_embed.kp_coords.to(att.dtype)  # (h*w, 2)
        sigma = 0.8 * 2 / cfg.keypoint_grid  # 0.8 of a heat-map pixel, in -1..1 units
        d2 = ((coords - targets[..., None, :].to(att.dtype)) ** 2).sum(-1)  # (B, T, n, h*w)
        soft = (-d2 / (2 * sigma**2)).softmax(-1)  # (B, T, n, h*w): the target as a distribution
        return -(soft * att.float().clamp_min(1e-9).log()).sum(-1).mean(-1)  # (B, T)

    @torch.no_grad()
    def attention_maps(self, batch: dict) -> list[torch.Tensor]:
        """Per-layer attention probabilities (B, H, N, N) over the whole stream (math path).

        Slice rows with `token_layout`, e.g. `maps[l][0, :, layout["step"].eq(T-1) & ...]`."""
        x = self.embed(batch)
        mask = self.attention_mask(batch["instruction"], batch["timestep"], batch.get("step_mask"))
        self.trunk(x, mask, need_weights=True)
        maps = [b.attn.last_weights for b in self.blocks]
        for b in self.blocks:
            b.attn.last_weights = None
        return maps

    def token_layout(self, n_steps: int | None = None) -> dict[str, torch.Tensor]:
        """Per stream position: segment id, step (-1 = instruction), index within step/instruction."""
        cfg = self.cfg
        n_steps = cfg.window if n_steps is None else n_steps
        L, S = cfg.instruction_len, cfg.tokens_per_step
        seg = torch.cat([torch.full((L,), SEG_INSTRUCTION), self.step_segment.cpu().repeat(n_steps)])
        step = torch.cat([torch.full((L,), -1), torch.arange(n_steps).repeat_interleave(S)])
        index = torch.cat([torch.arange(L), torch.arange(S).repeat(n_steps)])
        return {"segment": seg, "step": step, "index": index}

    # ------------------------------------------------------------------------- decoding

    @staticmethod
    def _choose(logits: torch.Tensor, temperature: float, generator=None) -> torch.Tensor:
        """(B, n, bins) -> (B, n) greedy argmax, or samples at `temperature` > 0."""
        if temperature <= 0.0:
            return logits.argmax(-1)
        probs = (logits.float() / temperature).softmax(-1)  # (B, n, bins)
        flat = torch.multinomial(probs.flatten(0, 1), 1, generator=generator)  # (B*n, 1)
        return flat.view(probs.shape[:2])  # (B, n)

    @torch.inference_mode()
    def recompute(
        self,
        instruction,
        image,
        proprio,
        timestep,
        step_mask=None,
        actions=None,
        temperature: float = 0.0,
        generator=None,
    ) -> StepOutput:
        """Decode the last step's action tokens from scratch (no cache) over the given window.

        Same inputs as `forward` (T <= K steps, oldest first); `actions` (B, T, chunk*A) holds past
        steps' tokens (only read under causal_scope="stream"); the last step's are decoded."""
        cfg = self.cfg
        B, T = timestep.shape
        L, S, n_obs, CA = cfg.instruction_len, cfg.tokens_per_step, cfg.n_obs_tokens, cfg.n_action_tokens
        acts = torch.zeros(B, T, CA, dtype=torch.long, device=timestep.device)  # (B, T, chunk*A)
        if actions is not None:
            acts[:, :-1] = actions[:, :-1]
        mask = self.attention_mask(instruction, timestep, step_mask)  # (B, H|1, N, N)
        instr = self.embed_instruction(instruction)  # (B, L, d)
        context = self.instruction_context(instruction)  # (B, d) or None
        steps = self.embed_steps(image, proprio, timestep, acts, context)  # (B, T, S, d)
        last = L + (T - 1) * S + n_obs  # stream position of the last step's slot 0
        if cfg.action_decoding == "parallel":
            h = self.trunk(torch.cat([instr, steps.flatten(1, 2)], dim=1), mask, rows=slice(last, last + CA))
            logits = self.head(h)  # (B, chunk*A, bins)
            return StepOutput(self._choose(logits, temperature, generator), logits)
        # autoregressive: one full pass per action token; only the last step's slot inputs change
        free = self.embed_steps(image[:, -1:], proprio[:, -1:], timestep[:, -1:], None, context)[:, 0]  # (B, S, d)
        all_logits = []
        for j in range(CA):
            cur = free.clone()  # (B, S, d)
            if j:
                cur[:, n_obs + 1 : n_obs + 1 + j] += self.action_embed(acts[:, -1, :j])  # slot i <- bin i-1
            x = torch.cat([instr, steps[:, :-1].flatten(1, 2), cur], dim=1)  # (B, L + T*S, d)
            logits_j = self.head(self.trunk(x, mask, rows=slice(last + j, last + j + 1)))  # (B, 1, bins)
            acts[:, -1, j] = self._choose(logits_j, temperature, generator)[:, 0]
            all_logits.append(logits_j)
        return StepOutput(acts[:, -1].clone(), torch.cat(all_logits, dim=1))  # (B, CA), (B, CA, bins)

    # ------------------------------------------------------------------------- streaming

    @torch.inference_mode()
    def new_cache(self, batch_size: int, device=None, dtype=None) -> KVCache:
        """Preallocate the KV cache: instruction prefix + K step slots, every layer."""
        cfg = self.cfg
        w = self.index_embed.weight
        device, dtype = device or w.device, dtype or w.dtype
        hd = cfg.d_model // cfg.n_head
        return KVCache(
            kv=torch.zeros(cfg.n_layer, 2, batch_size, cfg.n_head, cfg.n_tokens, hd, device=device, dtype=dtype),
            instr_valid=torch.zeros(batch_size, cfg.instruction_len, dtype=torch.bool, device=device),
            slot_timestep=torch.zeros(batch_size, cfg.window, dtype=torch.long, device=device),
            slot_valid=torch.zeros(batch_size, cfg.window, dtype=torch.bool, device=device),
            instruction_len=cfg.instruction_len,
            tokens_per_step=cfg.tokens_per_step,
        )

    @torch.inference_mode()
    def start(self, cache: KVCache, instruction: torch.Tensor) -> None:
        """Begin an episode: forget the old one and encode the instruction prefix (B, L) once."""
        cfg = self.cfg
        cache.reset()
        B, L = instruction.shape
        if instruction.shape[1] != cfg.instruction_len:
            raise ValueError(f"instruction has {L} tokens, the model expects {cfg.instruction_len}")
        cache.instr_valid.copy_(instruction != PAD_ID)
        mask = self._instruction_mask(instruction, cache.kv.dtype)  # (B, 1, L, L)
        x = self.embed_instruction(instruction)  # (B, L, d)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, cache.kv[i, :, :, :, :L], 0)  # a view: writes land in the buffer
        cache.film_ctx = self.instruction_context(instruction)  # (B, 2d) or None: once per episode
        # per-episode constants of the step path
        n_img = cfg.n_image_tokens
        step_embed = self._step_embed().clone()  # (S, d)
        step_embed[:n_img] += self.patch_embed.positions()  # image rows also carry patch position + camera
        cache.step_embed = step_embed.to(cache.kv.dtype)
        instr_bias = 0.0 if self.instr_bias is None else self.instr_bias[None, :, None, None]  # (1, H, 1, 1)
        instr_add = torch.zeros(B, 1, 1, L, dtype=cache.kv.dtype, device=instruction.device) + instr_bias
        cache.instr_add = instr_add.masked_fill(~cache.instr_valid[:, None, None, :], float("-inf"))

    def _stream_mask(self, cache: KVCache, slot: int, timestep: torch.Tensor) -> torch.Tensor:
        """Mask for the S queries of the step in `slot` over the whole buffer: (B, H|1, S, L + K*S)."""
        cfg = self.cfg
        K, S = cfg.window, cfg.tokens_per_step
        if self.rel_bias is None:
            slot_bias = cache.kv.new_zeros(cache.batch_size, 1, K)  # (B, 1, K)
        else:
            delta = (timestep[:, None] - cache.slot_timestep).clamp_(0, K - 1)  # (B, K): t_query - t_slot
            slot_bias = self.rel_bias[:, delta].transpose(0, 1).to(cache.kv.dtype)  # (B, H, K)
        slot_bias = slot_bias.masked_fill(~cache.slot_valid[:, None, :], float("-inf"))  # empty slots hidden
        # other slots: the earlier-step rule; own slot: causal within the step
        slots = slot_bias[:, :, None, :, None] + self.earlier_step_add[:, None, :]  # (B, H|1, S, K, S)
        slots[:, :, :, slot] = slot_bias[:, :, slot, None, None] + self.same_step_add  # (B, H|1, S, S)
        instr = cache.instr_add.expand(-1, slots.shape[1], S, -1)  # (B, H|1, S, L)
        return torch.cat([instr, slots.flatten(3)], dim=3)  # (B, H|1, S, L + K*S)

    @torch.inference_mode()
    def step(
        self,
        cache: KVCache,
        image: torch.Tensor,
        proprio: torch.Tensor,
        timestep: torch.Tensor,
        temperature: float = 0.0,
        generator=None,
    ) -> StepOutput:
        """One control step: append the step's observation tokens and decode its action tokens.

        image (B, n_cam, H, W, 3) uint8, proprio (B, P) normalized, timestep (B,) episode step index.
        When the window already holds K steps, the oldest is evicted (its slot is overwritten)."""
        cfg = self.cfg
        if cache.step_embed is None:
            raise RuntimeError("call model.start(cache, instruction) before model.step")
        B, n_obs, CA, S = image.shape[0], cfg.n_obs_tokens, cfg.n_action_tokens, cfg.tokens_per_step
        slot = cache.advance(timestep)
        base = cache.slot_offset(slot)  # buffer position of this step's first token
        mask = self._stream_mask(cache, slot, timestep)  # (B, H|1, S, L + K*S)
        t_emb = self._time_embed(timestep[:, None])  # (B, 1, 1, d) or None
        # pass 0: observation tokens + the action slots that need no decoded value
        n0 = S if cfg.action_decoding == "parallel" else n_obs + 1
        img = self.patch_embed.project(image[:, None], cache.film_ctx)[:, 0]  # (B, C*g*g, d)
        prop = self.embed_proprio(proprio[:, None].to(img.dtype))  # (B, 1, d)
        slots = cache.step_embed[n_obs:n0].expand(B, -1, -1)  # (B, n0 - n_obs, d) value-free slots
        x = torch.cat([img + cache.step_embed[: n_obs - 1], prop + cache.step_embed[n_obs - 1], slots], 1)
        x = x if t_emb is None else x + t_emb[:, 0]  # (B, n0, d)
        for i, block in enumerate(self.blocks):
            last = i == cfg.n_layer - 1
            x = block(x, mask[:, :, :n0], cache.kv[i], base, rows=slice(n_obs, n0) if last else None)
        logits = self.head(self.ln_f(x))  # (B, n0 - n_obs, bins)
        tokens = self._choose(logits, temperature, generator)  # (B, n0 - n_obs)
        if cfg.action_decoding == "parallel":
            return StepOutput(tokens, logits)
        # autoregressive: slot j is fed the bin decoded for slot j-1, one pass each
        all_logits, all_tokens = [logits], [tokens]
        for j in range(1, CA):
            pos = n_obs + j  # position of slot j in the step
            x = self.action_embed(tokens) + cache.step_embed[pos]  # (B, 1, d)
            x = x if t_emb is None else x + t_emb[:, 0]
            for i, block in enumerate(self.blocks):
                x = block(x, mask[:, :, pos : pos + 1], cache.kv[i], base + pos)
            logits = self.head(self.ln_f(x))  # (B, 1, bins)
            tokens = self._choose(logits, temperature, generator)  # (B, 1)
            all_logits.append(logits)
            all_tokens.append(tokens)
        return StepOutput(torch.cat(all_tokens, 1), torch.cat(all_logits, 1))  # (B, CA), (B, CA, bins)
