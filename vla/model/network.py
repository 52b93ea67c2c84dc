"""The policy network: one causally masked token stream through a decoder-only transformer.

Token stream of one sample (a window of K control steps, S tokens per step):

    [instruction: L tokens, right-padded; pad keys masked]
    step t: [image: n_cameras * (patches + keypoints)] [proprio: 1] [action slots: chunk * A]
    step t+1: ...

embed -> trunk -> head, in that order, in every pass:
- embed: a token's input is its content (image token, proprio projection, instruction word + position,
  or action bin) plus a segment embedding (instruction / image / proprio / action) plus, for step
  tokens, an index-within-step embedding. `embed_steps` is the only step embedding: training,
  recompute and the streaming step all call it. With `text_encoder` an instruction token's content is a
  frozen pretrained encoder's feature at that token, projected to d (vla/model/text_encoder.py). With
  `vision_encoder` a pretrained image model's feature map gives the patch tokens (vla/model/vision_encoder.py).
- trunk: pre-norm blocks under the one attention rule of `transformer.attention_mask`, a final norm.
  Only the action slots' outputs are ever read, so the last block computes queries, projection and MLP
  for those rows only (its keys/values still come from every token).
- head: one linear map to `action_bins` logits shared by every action dim (a slot's dim is known
  from its index embedding).

Time (`time_encoding`):
- "relative" (default): a learned bias per head and step offset, added through the attention mask
  (T5/ALiBi style, initialized to ALiBi's recency slopes), plus one learned per-head bias on the
  instruction's keys. Outputs depend on time only through offsets, so a cached key never changes when
  the window slides. A bias rather than RoPE because the instruction prefix has no step index.
- "sinusoidal" / "learned": an absolute encoding of the episode step added to every step token (fixed
  sinusoids through a learned linear map, or a learned table clamped to max_episode_steps - 1).
- "none": no time information; the window is a set of steps.

Action decoding (`action_decoding`), slot j of a step predicts action token j:
- "parallel" (default): every slot is a learned query (segment + index embeddings, no value); all of a
  step's action tokens come out of one pass.
- "autoregressive": slot 0 is a learned start query, slot j >= 1 holds the embedding of the bin of
  token j-1 (teacher-forced in training, the decoded bin at inference).
Chunking: slot j = c * A + a is dim a of action t + c (chunk-major), targets (B, K, chunk * A).

Inference: `new_cache` / `start` (the instruction prefix once) / `step` (append one step, decode its
action tokens) keep a constant-memory KV cache (`vla/model/kv_cache.py`); `recompute` decodes the same
window from scratch and returns the same tokens and logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from vla.model import losses
from vla.model.config import (
    PAD_ID,
    SEG_ACTION,
    SEG_IMAGE,
    SEG_INSTRUCTION,
    SEG_PROPRIO,
    DataSpec,
    ModelConfig,
    TokenLayout,
)
from vla.model.kv_cache import KVCache
from vla.model.text_encoder import FrozenTextEncoder
from vla.model.transformer import Block, TokenCoords, attention_mask
from vla.model.vision import PatchEmbed


@dataclass
class StepOutput:
    tokens: torch.Tensor  # (B, chunk * A) int64 decoded action bins
    logits: torch.Tensor  # (B, chunk * A, action_bins) the logits each token was decoded from


@dataclass
class StepEmbedding:
    x: torch.Tensor  # (B, T, S, d) step token inputs
    where: torch.Tensor | None  # (B, T, C, M, 2) keypoint coordinates, or None
    heat: torch.Tensor | None  # (B, T, C, M, h*w) keypoint heat maps, or None
    aux_pred: torch.Tensor | None  # (B, T, aux_dim) auxiliary prediction from the keypoints, or None


def sinusoidal(timestep: torch.Tensor, dim: int) -> torch.Tensor:
    """Transformer sinusoidal encoding of integer step indices: (...) -> (..., dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=timestep.device) / half)  # (half,)
    angles = timestep.float()[..., None] * freqs  # (..., half)
    enc = torch.cat([angles.sin(), angles.cos()], dim=-1)  # (..., 2*half)
    return nn.functional.pad(enc, (0, dim - 2 * half))  # (..., dim)


class ActionTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: DataSpec):
        super().__init__()
        self.cfg, self.spec = cfg, spec
        self.layout = layout = TokenLayout(cfg, spec)
        d, S, K, H = cfg.d_model, layout.tokens_per_step, cfg.window, cfg.n_head
        self.patch_embed = PatchEmbed(cfg, layout)
        self.proprio_embed = nn.Linear(spec.proprio_dim, d, bias=cfg.bias)
        # the instruction's token inputs: a word table, or a frozen pretrained encoder's features projected to d
        self.text_encoder = self.instr_proj = None
        if cfg.text_encoder:
            self.text_encoder = FrozenTextEncoder(cfg.text_encoder, spec.text_fingerprint or None)
            self.instr_embed = None
            self.instr_proj = nn.Linear(self.text_encoder.hidden_size, d, bias=cfg.bias)
        elif spec.text_fingerprint:
            raise ValueError(f"data spec text_fingerprint={spec.text_fingerprint!r} needs model.text_encoder")
        else:
            self.instr_embed = nn.Embedding(spec.vocab_size, d)
        self.instr_pos = nn.Embedding(cfg.instruction_len, d)
        # parallel decoding never feeds action values; its slots are queries (segment + index only)
        # (committed_actions: the committed slots of a delay-aware model hold their bin's embedding)
        feeds_bins = cfg.action_decoding == "autoregressive" or cfg.committed_actions
        self.action_embed = nn.Embedding(cfg.action_bins, d) if feeds_bins else None
        self.segment_embed = nn.Embedding(4, d)
        self.index_embed = nn.Embedding(S, d)  # position of a token inside its step's block
        self.time_embed = None
        if cfg.time_encoding == "learned":
            self.time_embed = nn.Embedding(cfg.max_episode_steps, d)
        elif cfg.time_encoding == "sinusoidal":  # fixed features, learned linear map (brings them to scale)
            self.time_embed = nn.Linear(d, d, bias=False)
        self.rel_bias = self.instr_bias = None
        if cfg.time_encoding == "relative":
            self.rel_bias = nn.Parameter(torch.zeros(H, K))  # (H, K): bias for step offset D = 0 .. K-1
            self.instr_bias = nn.Parameter(torch.zeros(H))  # (H,): bias on instruction keys (no time)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(d, bias=cfg.bias)
        self.head = nn.Linear(d, cfg.action_bins, bias=cfg.bias)
        self.film_pool = nn.Linear(d, 2, bias=False) if cfg.film else None  # two attention pools, see below
        # Optional auxiliary readout of privileged state (where the named object and its goal are): a
        # dense localization signal for the visual pathway during training. With keypoints it reads their
        # coordinates (and the proprio) through a small MLP, so the signal reaches the keypoint network
        # directly. Not a linear map: from a front camera a lifted block's image row mixes its depth with
        # its height, and only the proprio (gripper closed, hand raised) tells which.
        # It also reads the instruction's conditioning (what each keypoint was asked to look for): which of
        # the things the keypoints found the hand will grasp, or release at, depends on the task and colours.
        aux_in = 2 * spec.n_cameras * cfg.keypoints + spec.proprio_dim if cfg.keypoints else d
        if cfg.keypoints and cfg.film:
            aux_in += sum(layer.out_features for layer in self.patch_embed._conditioned())
        self.aux_head = None
        if spec.aux_dim:
            self.aux_head = nn.Sequential(nn.Linear(aux_in, d), nn.GELU(), nn.Linear(d, spec.aux_dim))
        # With aux_feed that prediction (the named block and its goal, relative to the hand) also enters the
        # proprio token at inference: the action is then nearly a function of one token.
        self.aux_embed = nn.Linear(spec.aux_dim, d, bias=False) if layout.feeds_aux else None

        # the static structure of one step (S tokens): segments, and the two index rules of the mask
        seg = torch.full((S,), SEG_ACTION, dtype=torch.long)
        seg[: layout.n_image_tokens], seg[layout.n_image_tokens] = SEG_IMAGE, SEG_PROPRIO
        is_action = torch.arange(S) >= layout.n_obs_tokens  # (S,)
        earlier = torch.ones(S, S, dtype=torch.bool)
        if cfg.causal_scope == "step":
            earlier = is_action[:, None] & ~is_action[None, :]  # action queries see observation keys
        self.register_buffer("step_segment", seg, persistent=False)  # (S,)
        self.register_buffer("same_step", torch.ones(S, S, dtype=torch.bool).tril(), persistent=False)  # (S, S)
        self.register_buffer("earlier_step", earlier, persistent=False)  # (S, S)
        self._init_parameters()

    def _init_parameters(self) -> None:
        cfg, H, K = self.cfg, self.cfg.n_head, self.cfg.window
        pe = self.patch_embed
        pretrained = set(pe.encoder.modules()) if pe.encoder is not None else set()  # fine-tuned: keeps its weights
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and module not in pretrained:
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        # FiLM and the auxiliary readout keep PyTorch's fan-in init: from N(0, 0.02) their signal into the
        # stem starts an order of magnitude weaker, and localization is what the demo budget is short of.
        for module in [
            self.film_pool,
            *(m for m in (self.aux_head or []) if isinstance(m, nn.Linear)),
            self.aux_embed,
            *(pe.film or []),
            *(pe.kp_film or []),
        ]:
            if module is not None:
                module.reset_parameters()
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") and not name.startswith("patch_embed.encoder."):  # residual: GPT-2
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
        for p in (pe.row, pe.col, pe.camera):
            nn.init.normal_(p, mean=0.0, std=0.02)
        if self.rel_bias is not None:  # ALiBi recency prior: -slope_h * D, slopes 2^(-8 h / H)
            slopes = 2.0 ** (-8.0 * torch.arange(1, H + 1) / H)  # (H,)
            with torch.no_grad():
                self.rel_bias.copy_(-slopes[:, None] * torch.arange(K)[None, :])  # (H, K)

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

    # ------------------------------------------------------------------------- embed

    def embed_instruction(self, instruction: torch.Tensor) -> torch.Tensor:
        """(B, L) int64 -> (B, L, d): word-table rows, or the frozen text encoder's features projected."""
        seg = self.segment_embed.weight[SEG_INSTRUCTION]  # (d,)
        if self.text_encoder is None:
            words = self.instr_embed(instruction)  # (B, L, d)
        else:
            words = self.instr_proj(self.text_encoder(instruction).to(self.instr_proj.weight.dtype))  # (B, L, E) -> d
        return words + self.instr_pos.weight[: instruction.shape[1]] + seg

    def instruction_context(self, instruction: torch.Tensor) -> torch.Tensor | None:
        """What the instruction sets in a FiLM stem (None without one): (B, L) -> (B, F), the stem's
        per-channel scales and shifts and the keypoint queries (`PatchEmbed.condition`), once per instruction.

        They read a summary (B, 2d): two learned attention pools over the instruction's token embeddings
        (word + position): one can learn "the first colour word" (which block), the other "the second"."""
        if not self.cfg.film:
            return None
        x = self.embed_instruction(instruction)  # (B, L, d)
        scores = self.film_pool(x).masked_fill((instruction == PAD_ID)[..., None], float("-inf"))  # (B, L, 2)
        pooled = torch.einsum("blq,bld->bqd", scores.softmax(dim=1), x)  # (B, 2, d)
        return self.patch_embed.condition(pooled.flatten(1))  # (B, 2d) -> (B, F)

    def _time_embed(self, timestep: torch.Tensor) -> torch.Tensor | None:
        """Absolute time encoding (B, T) -> (B, T, 1, d), or None for relative/none."""
        if self.cfg.time_encoding == "sinusoidal":
            return self.time_embed(sinusoidal(timestep, self.cfg.d_model).to(self.index_embed.weight.dtype))[:, :, None]
        if self.cfg.time_encoding == "learned":
            return self.time_embed(timestep.clamp(0, self.cfg.max_episode_steps - 1))[:, :, None]
        return None

    def embed_steps(self, image, proprio, timestep, actions=None, context=None, committed=None) -> StepEmbedding:
        """Step tokens: image (B,T,C,H,W,3) uint8, proprio (B,T,P) normalized, timestep (B,T), actions
        (B,T,chunk*A) int64 bins or None (autoregressive slots j >= 1 then hold no value; -1 = no value),
        context (B, F) the instruction's FiLM conditioning (`instruction_context`), committed (B,T,chunk*A)
        int64 bins already decided for slot j itself (-1 = free; read only with committed_actions)
        -> StepEmbedding with x (B, T, S, d)."""
        B, T = timestep.shape
        vision = self.patch_embed(image, context)  # (B, T, C*(g*g + M), d) with positions
        aux_pred = None
        if self.aux_head is not None and self.cfg.keypoints:
            feats = [vision.where.reshape(B, T, -1), proprio.to(vision.where.dtype)]  # (B, T, 2CM), (B, T, P)
            if context is not None:
                feats.append(context[:, None].expand(B, T, -1).to(vision.where.dtype))  # (B, T, F)
            aux_pred = self.aux_head(torch.cat(feats, -1))  # (B, T, 2CM + P [+ F]) -> (B, T, aux_dim)
        prop = self.proprio_embed(proprio.to(vision.tokens.dtype))  # (B, T, d)
        if self.aux_embed is not None:  # given, not trained through: the prediction learns from its target
            prop = prop + self.aux_embed(aux_pred.detach())
        act = vision.tokens.new_zeros(B, T, self.layout.n_action_tokens, self.cfg.d_model)  # (B, T, chunk*A, d)
        # only autoregressive slots are fed the previous bin; a parallel model's targets are labels, never
        # inputs (with committed_actions it owns an action table too, read only for `committed`)
        if self.cfg.action_decoding == "autoregressive" and actions is not None and act.shape[2] > 1:
            prev = actions[:, :, :-1]  # (B, T, chunk*A - 1): slot j holds bin j-1 (GPT shift); -1 = no value
            act[:, :, 1:] = self.action_embed(prev.clamp(min=0)) * (prev >= 0)[..., None]
        if self.cfg.committed_actions and committed is not None:  # later slots see these through the causal mask
            act = act + self.action_embed(committed.clamp(min=0)) * (committed >= 0)[..., None]  # (B, T, chunk*A, d)
        step_embed = self.segment_embed(self.step_segment) + self.index_embed.weight  # (S, d)
        x = torch.cat([vision.tokens, prop[:, :, None], act], dim=2) + step_embed  # (B, T, S, d)
        t = self._time_embed(timestep)
        return StepEmbedding(x if t is None else x + t, vision.where, vision.heat, aux_pred)

    def embed(self, batch: dict) -> tuple[torch.Tensor, StepEmbedding]:
        """The whole stream of a batch of windows: (B, L + T*S, d), and the step embedding's by-products."""
        instruction = batch["instruction"]
        context = self.instruction_context(instruction)  # (B, F) or None
        emb = self.embed_steps(
            batch["image"], batch["proprio"], batch["timestep"], batch.get("actions"), context, batch.get("committed")
        )
        return torch.cat([self.embed_instruction(instruction), emb.x.flatten(1, 2)], dim=1), emb

    # ------------------------------------------------------------------------- mask and trunk

    def window_mask(self, batch: dict) -> torch.Tensor:
        """(B, H|1, N, N) attention mask of a batch of whole windows."""
        coords = self.window_coords(batch["instruction"], batch["timestep"], batch.get("step_mask"))
        return self.mask(coords, coords)

    def window_coords(self, instruction, timestep, step_mask=None) -> TokenCoords:
        """Coordinates of every token of a whole window, instruction first: N = L + T*S tokens."""
        B, T = timestep.shape
        L, S = instruction.shape[1], self.layout.tokens_per_step
        if self.cfg.instruction_len != L or self.cfg.window < T:
            raise ValueError(
                f"instruction length {L} / window {T} must be {self.cfg.instruction_len} / <= {self.cfg.window}"
            )
        dev = timestep.device
        if step_mask is None:
            step_mask = torch.ones(B, T, dtype=torch.bool, device=dev)
        return TokenCoords(
            pos=torch.arange(L + T * S, device=dev),
            slot=torch.cat([torch.full((L,), -1, device=dev), torch.arange(T, device=dev).repeat_interleave(S)]),
            index=torch.cat([torch.arange(L, device=dev), torch.arange(S, device=dev).repeat(T)]),
            time=torch.cat([timestep.new_zeros(B, L), timestep.repeat_interleave(S, dim=1)], dim=1),  # (B, N)
            valid=torch.cat([instruction != PAD_ID, step_mask.repeat_interleave(S, dim=1)], dim=1),  # (B, N)
        )

    def mask(self, q: TokenCoords, k: TokenCoords) -> torch.Tensor:
        """The one attention rule (`transformer.attention_mask`) with this model's tables and time bias."""
        dtype = self.index_embed.weight.dtype
        return attention_mask(q, k, self.same_step, self.earlier_step, self.rel_bias, self.instr_bias, dtype)

    def trunk(self, x, mask, rows=None, need_weights: bool = False):
        """Blocks + final norm over a whole stream: (B, N, d) -> (B, N, d), or (B, r, d) for `rows`, and
        the per-layer attention probabilities when `need_weights`."""
        x, maps = self.drop(x), []
        for i, block in enumerate(self.blocks):
            x, weights = block(x, mask, rows=rows if i == len(self.blocks) - 1 else None, need_weights=need_weights)
            maps.append(weights)
        return self.ln_f(x), maps

    def action_rows(self, n_steps: int, device=None) -> torch.Tensor:
        """(n_steps * chunk*A,) stream positions of every action slot, step-major."""
        lay = self.layout
        steps = torch.arange(n_steps, device=device)
        start = self.cfg.instruction_len + steps * lay.tokens_per_step + lay.n_obs_tokens  # (n_steps,)
        return (start[:, None] + torch.arange(lay.n_action_tokens, device=device)).flatten()

    # ------------------------------------------------------------------------- full-window pass

    def forward(self, batch: dict) -> dict:
        """Training / evaluation pass over windows.

        batch: instruction (B, L) int64, image (B, T, C, H, W, 3) uint8, proprio (B, T, P) normalized,
        timestep (B, T) int64, step_mask (B, T) bool (optional, False = left padding), actions
        (B, T, chunk*A) int64 bins (optional: targets, and the inputs of autoregressive slots),
        action_is_pad (B, T, chunk) bool (optional, True = target past the demo's end), aux (B, T, D)
        (optional auxiliary targets), keypoint_targets (B, T, n, 2) (optional image positions).
        Returns logits (B, T, chunk*A, bins) and aux_pred; with targets also their losses (`losses`)."""
        B, T = batch["timestep"].shape
        step_mask = batch.get("step_mask")
        x, emb = self.embed(batch)  # (B, L + T*S, d)
        h, _ = self.trunk(x, self.window_mask(batch), rows=self.action_rows(T, x.device))  # (B, T*chunk*A, d)
        logits = self.head(h).view(B, T, self.layout.n_action_tokens, -1)  # (B, T, chunk*A, bins)
        aux_pred = emb.aux_pred
        if self.aux_head is not None and aux_pred is None:  # no keypoints: read the first action slot
            aux_pred = self.aux_head(h.view(B, T, self.layout.n_action_tokens, -1)[:, :, 0])  # (B, T, aux_dim)
        out = {"logits": logits, "aux_pred": aux_pred}
        step_weight = torch.ones(B, T, device=x.device) if step_mask is None else step_mask.float()  # (B, T)
        if "actions" in batch:
            shape = (B, T, self.cfg.chunk, self.spec.action_dim)
            weight = losses.action_weights(shape, x.device, step_mask, batch.get("action_is_pad"))
            out.update(losses.action_loss(logits, batch["actions"], weight))
        if "aux" in batch and aux_pred is not None:
            out["aux_loss"] = losses.aux_loss(aux_pred, batch["aux"], step_weight)
        if "keypoint_targets" in batch:
            n = batch["keypoint_targets"].shape[2]
            if emb.heat is None or n > self.cfg.keypoints:
                raise ValueError(f"{n} keypoint targets need keypoints >= {n}, got keypoints={self.cfg.keypoints}")
            heat = emb.heat[:, :, 0, :n]  # (B, T, n, h*w): first camera
            out["keypoint_loss"] = losses.keypoint_loss(
                heat, self.patch_embed.kp_coords, batch["keypoint_targets"], step_weight, self.layout.keypoint_grid
            )
        return out

    @torch.no_grad()
    def inspect(self, batch: dict) -> dict:
        """Per-layer attention probabilities (B, H, N, N) over the whole stream (math path) and the
        keypoint heat maps (B, T, C, M, h*w) or None. Slice rows with `token_layout`."""
        x, emb = self.embed(batch)  # (B, N, d)
        _, maps = self.trunk(x, self.window_mask(batch), need_weights=True)
        return {"attention": maps, "keypoint_heat": emb.heat}

    def token_layout(self, n_steps: int | None = None) -> dict[str, torch.Tensor]:
        """Per stream position: segment id, step (-1 = instruction), index within step/instruction."""
        n_steps = self.cfg.window if n_steps is None else n_steps
        L, S = self.cfg.instruction_len, self.layout.tokens_per_step
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
        temperature=0.0,
        generator=None,
        committed=None,
    ) -> StepOutput:
        """Decode the last step's action tokens from scratch (no cache) over the given window.

        Same inputs as `forward` (T <= K steps, oldest first); `actions` (B, T, chunk*A) holds the past
        steps' decoded tokens (read under causal_scope="stream" with autoregressive decoding); the last
        step's are decoded here. `committed` (B, chunk*A): the last step's committed bins (-1 = free)."""
        B, T = timestep.shape
        L, lay = self.cfg.instruction_len, self.layout
        S, n_obs, CA = lay.tokens_per_step, lay.n_obs_tokens, lay.n_action_tokens
        acts = torch.full((B, T, CA), -1, dtype=torch.long, device=timestep.device)  # (B, T, chunk*A), -1 = none
        if actions is not None:
            acts[:, :-1] = actions[:, :-1]
        coords = self.window_coords(instruction, timestep, step_mask)
        mask = self.mask(coords, coords)  # (B, H|1, N, N)
        context = self.instruction_context(instruction)  # (B, F) or None
        held = None
        if committed is not None:  # only the decoded step has committed slots
            held = torch.full_like(acts, -1)  # (B, T, chunk*A)
            held[:, -1] = committed
        steps = self.embed_steps(image, proprio, timestep, acts, context, held).x  # (B, T, S, d)
        x = torch.cat([self.embed_instruction(instruction), steps.flatten(1, 2)], dim=1)  # (B, L + T*S, d)
        last = L + (T - 1) * S + n_obs  # stream position of the last step's slot 0
        if self.cfg.action_decoding == "parallel":
            logits = self.head(self.trunk(x, mask, rows=slice(last, last + CA))[0])  # (B, chunk*A, bins)
            return StepOutput(self._choose(logits, temperature, generator), logits)
        # autoregressive: one full pass per action token; only the last step's slot inputs change
        free = x[:, last - n_obs :]  # (B, S, d): the last step, its slots without action values
        all_logits = []
        for j in range(CA):
            cur = free.clone()  # (B, S, d)
            if j:
                cur[:, n_obs + 1 : n_obs + 1 + j] += self.action_embed(acts[:, -1, :j])  # slot i <- bin i-1
            x = torch.cat([x[:, : last - n_obs], cur], dim=1)  # (B, L + T*S, d)
            logits_j = self.head(self.trunk(x, mask, rows=slice(last + j, last + j + 1))[0])  # (B, 1, bins)
            acts[:, -1, j] = self._choose(logits_j, temperature, generator)[:, 0]
            all_logits.append(logits_j)
        return StepOutput(acts[:, -1].clone(), torch.cat(all_logits, dim=1))  # (B, CA), (B, CA, bins)

    # ------------------------------------------------------------------------- streaming

    def for_inference(self) -> ActionTransformer:
        """Eval mode and, on CPU, convolution weights in channels-last layout: with one image per call
        PyTorch otherwise runs the stem on its slow reference convolution, and oneDNN's channels-last
        kernels take the vision part of a control step from ~3.5 to ~2.6 ms. Policies loaded from a
        checkpoint use it; a model being trained keeps its layout (a resumed run must compute exactly
        what an uninterrupted one does). Outputs agree to ~1e-7."""
        self.eval()
        if self.index_embed.weight.device.type == "cpu":
            self.to(memory_format=torch.channels_last)
        return self

    @torch.inference_mode()
    def new_cache(self, batch_size: int, device=None, dtype=None) -> KVCache:
        """Preallocate the KV cache: instruction prefix + K step slots, every layer."""
        cfg, w = self.cfg, self.index_embed.weight
        device, dtype = device or w.device, dtype or w.dtype
        hd = cfg.d_model // cfg.n_head
        return KVCache(
            kv=torch.zeros(
                cfg.n_layer, 2, batch_size, cfg.n_head, self.layout.n_tokens, hd, device=device, dtype=dtype
            ),
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
        coords = cache.coords()
        prefix = coords.select(slice(0, L))
        mask = self.mask(prefix, prefix).to(cache.kv.dtype)  # (B, 1, L, L)
        x = self.embed_instruction(instruction)  # (B, L, d)
        for i, block in enumerate(self.blocks):
            x, _ = block(x, mask, cache.kv[i, :, :, :, :L], 0)  # a view: writes land in the buffer
        cache.film_ctx = self.instruction_context(instruction)  # (B, F) or None: once per episode
        cache.started = True

    @torch.inference_mode()
    def step(
        self, cache, image, proprio, timestep, temperature: float = 0.0, generator=None, committed=None
    ) -> StepOutput:
        """One control step: append the step's observation tokens and decode its action tokens.

        image (B, C, H, W, 3) uint8, proprio (B, P) normalized, timestep (B,) episode step index, committed
        (B, chunk*A) bins already decided for this step's slots (-1 = free; with committed_actions).
        When the window already holds K steps, the oldest is evicted (its slot is overwritten)."""
        if not cache.started:
            raise RuntimeError("call model.start(cache, instruction) before model.step")
        n_obs, CA, S = self.layout.n_obs_tokens, self.layout.n_action_tokens, self.layout.tokens_per_step
        slot = cache.advance(timestep)
        base = cache.slot_offset(slot)  # buffer position of this step's first token
        mask = cache.memo_mask(slot, timestep, lambda keys: self.mask(keys.select(slice(base, base + S)), keys))
        held = None if committed is None else committed[:, None]  # (B, 1, chunk*A)
        x = self.embed_steps(image[:, None], proprio[:, None], timestep[:, None], None, cache.film_ctx, held).x[:, 0]
        # pass 0: observation tokens + the action slots that need no decoded value
        n0 = S if self.cfg.action_decoding == "parallel" else n_obs + 1
        h = x[:, :n0]  # (B, n0, d)
        for i, block in enumerate(self.blocks):
            rows = slice(n_obs, n0) if i == self.cfg.n_layer - 1 else None
            h, _ = block(h, mask[:, :, :n0], cache.kv[i], base, rows=rows)
        logits = self.head(self.ln_f(h))  # (B, n0 - n_obs, bins)
        tokens = self._choose(logits, temperature, generator)  # (B, n0 - n_obs)
        if self.cfg.action_decoding == "parallel":
            return StepOutput(tokens, logits)
        # autoregressive: slot j is fed the bin decoded for slot j-1, one pass each
        all_logits, all_tokens = [logits], [tokens]
        for j in range(1, CA):
            pos = n_obs + j  # position of slot j in the step
            h = x[:, pos : pos + 1] + self.action_embed(tokens)  # (B, 1, d)
            for i, block in enumerate(self.blocks):
                h, _ = block(h, mask[:, :, pos : pos + 1], cache.kv[i], base + pos)
            logits = self.head(self.ln_f(h))  # (B, 1, bins)
            tokens = self._choose(logits, temperature, generator)  # (B, 1)
            all_logits.append(logits)
            all_tokens.append(tokens)
        return StepOutput(torch.cat(all_tokens, 1), torch.cat(all_logits, 1))  # (B, CA), (B, CA, bins)
