"""The policy network: one causally masked token stream through a decoder-only transformer.

Token stream of one sample (a window of K control steps, S tokens per step):

    [instruction: L tokens, right-padded; pad keys masked]
    step t: [image: n_cameras * (patches + keypoints)] [proprio: 1] [action slots: chunk * A]
    step t+1: ...

embed -> trunk -> head, in that order, in every pass (training here; streaming in vla/model/streaming.py):
- embed: a token's input is its content (image token, proprio projection, instruction word + position)
  plus a segment embedding (instruction / image / proprio / action) plus, for step tokens, an
  index-within-step embedding. An action slot has no content: it is a learned query, and all of a step's
  action tokens come out of one pass (slot j = c * A + a is dim a of action t + c, chunk-major). With
  `committed_actions` a slot may hold the embedding of a bin already decided (vla/training/delay_prefix.py).
  `embed_steps` is the only step embedding: training, recompute and the streaming step all call it. With
  `text_encoder` an instruction token's content is a frozen pretrained encoder's feature, projected to d
  (vla/model/text_encoder.py); with `vision_encoder` a pretrained image model gives the patch tokens.
- trunk: pre-norm blocks under the one attention rule of `transformer.attention_mask`, a final norm.
  Only the action slots' outputs are ever read, so the last block computes queries, projection and MLP
  for those rows only (its keys/values still come from every token).
- head: one linear map to `action_bins` logits shared by every action dim (a slot's dim is known
  from its index embedding).

Time: a learned bias per head and step offset, added through the attention mask (T5/ALiBi style,
initialized to ALiBi's recency slopes), plus one learned per-head bias on the instruction's keys. Outputs
depend on time only through offsets, so a cached key never changes when the window slides. A bias rather
than RoPE because the instruction prefix has no step index.

The auxiliary head (when the data has auxiliary targets) reads the keypoints' coordinates, the proprio
and the instruction's FiLM conditioning; with `aux_feed` its prediction also enters the proprio token.
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
from vla.model.streaming import Streaming
from vla.model.text_encoder import FrozenTextEncoder
from vla.model.transformer import Block, TokenCoords, attention_mask
from vla.model.vision import Film, PatchEmbed


@dataclass
class StepEmbedding:
    x: torch.Tensor  # (B, T, S, d) step token inputs
    where: torch.Tensor | None  # (B, T, C, M, 2) keypoint coordinates, or None
    heat: torch.Tensor | None  # (B, T, C, M, h*w) keypoint heat maps, or None
    aux_pred: torch.Tensor | None  # (B, T, aux_dim) auxiliary prediction from the keypoints, or None


class ActionTransformer(Streaming, nn.Module):
    def __init__(self, cfg: ModelConfig, spec: DataSpec):
        super().__init__()
        self.cfg, self.spec = cfg, spec
        self.layout = layout = TokenLayout(cfg, spec)
        d, S, K, H = cfg.d_model, layout.tokens_per_step, cfg.window, cfg.n_head
        if spec.aux_dim and not cfg.keypoints:
            raise ValueError(f"aux targets (aux_dim={spec.aux_dim}) need model.keypoints > 0 (the head reads them)")
        self.patch_embed = PatchEmbed(cfg, layout)
        self.proprio_embed = nn.Linear(spec.proprio_dim, d)
        # the instruction's token inputs: a word table, or a frozen pretrained encoder's features projected to d
        self.text_encoder = self.instr_proj = None
        if cfg.text_encoder:
            self.text_encoder = FrozenTextEncoder(cfg.text_encoder, spec.text_fingerprint or None)
            self.instr_embed = None
            self.instr_proj = nn.Linear(self.text_encoder.hidden_size, d)
        elif spec.text_fingerprint:
            raise ValueError(f"data spec text_fingerprint={spec.text_fingerprint!r} needs model.text_encoder")
        else:
            self.instr_embed = nn.Embedding(spec.vocab_size, d)
        self.instr_pos = nn.Embedding(cfg.instruction_len, d)
        # action slots are queries (segment + index only); a delay-aware model's committed slots hold a bin's embedding
        self.action_embed = nn.Embedding(cfg.action_bins, d) if cfg.committed_actions else None
        self.segment_embed = nn.Embedding(4, d)
        self.index_embed = nn.Embedding(S, d)  # position of a token inside its step's block
        self.rel_bias = nn.Parameter(torch.zeros(H, K))  # (H, K): bias for step offset D = 0 .. K-1
        self.instr_bias = nn.Parameter(torch.zeros(H))  # (H,): bias on instruction keys (no time)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg.action_bins)
        self.film_pool = nn.Linear(d, 2, bias=False) if cfg.film else None  # two attention pools, see below
        # The auxiliary readout of privileged state (where the named object and its goal are): a dense
        # localization signal that reaches the keypoint network directly. Not a linear map: from a front
        # camera a lifted block's image row mixes its depth with its height, and only the proprio (gripper
        # closed, hand raised) tells which. Without heat-map targets it also reads the instruction's
        # conditioning (what each keypoint was asked to look for): no keypoint then has a fixed meaning, and
        # which of the things found the hand will grasp depends on the task and colours. With them each has
        # one, and that input, even detached from the FiLM layers, cost Meta-World's small-object tasks
        # (docs/label_free.md, session 7). For label-free runs it measured neither better nor worse than the
        # head without it (session 8); kept, so their checkpoints and published figures stay what they were.
        self.aux_reads_context = not spec.keypoint_targets
        aux_in = 2 * spec.n_cameras * cfg.keypoints + spec.proprio_dim
        if self.aux_reads_context:
            aux_in += sum(layer.out_features for layer in self.patch_embed._conditioned())
        self.aux_head = None
        if spec.aux_dim:
            self.aux_head = nn.Sequential(nn.Linear(aux_in, d), nn.GELU(), nn.Linear(d, spec.aux_dim))
        # With aux_feed that prediction (the named block and its goal, relative to the hand) also enters the
        # proprio token at inference: the action is then nearly a function of one token.
        self.aux_embed = nn.Linear(spec.aux_dim, d, bias=False) if layout.feeds_aux else None

        # the static structure of one step (S tokens): segments, and the two index rules of the mask
        seg = torch.full((S,), SEG_ACTION, dtype=torch.long)  # (S,)
        seg[: layout.n_image_tokens], seg[layout.n_image_tokens] = SEG_IMAGE, SEG_PROPRIO
        is_action = torch.arange(S) >= layout.n_obs_tokens  # (S,)
        earlier = is_action[:, None] & ~is_action[None, :]  # (S, S): action queries see earlier observation keys
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
        slopes = 2.0 ** (-8.0 * torch.arange(1, H + 1) / H)  # (H,): ALiBi recency prior -slope_h * D
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

    def instruction_context(self, instruction: torch.Tensor, embedded: torch.Tensor | None = None) -> Film | None:
        """What the instruction sets in a FiLM stem (None without one): ids (B, L) and their embedding (B, L, d)
        (`embed_instruction`, computed here when not given) -> the stem's per-channel scales and shifts and
        the keypoint queries (`PatchEmbed.condition`), once per instruction.

        They read a summary (B, 2d): two learned attention pools over the instruction's token embeddings
        (word + position): one can learn "the first colour word" (which block), the other "the second"."""
        if not self.cfg.film:
            return None
        if embedded is None:
            embedded = self.embed_instruction(instruction)  # (B, L, d)
        pad = (instruction == PAD_ID)[..., None]  # (B, L, 1)
        scores = self.film_pool(embedded).masked_fill(pad, float("-inf"))  # (B, L, 2)
        pooled = torch.einsum("blq,bld->bqd", scores.softmax(dim=1), embedded)  # (B, 2, d)
        return self.patch_embed.condition(pooled.flatten(1))  # (B, 2d) -> Film

    def embed_steps(self, image, proprio, context: Film | None = None, committed=None) -> StepEmbedding:
        """Step tokens: image (B,T,C,H,W,3) uint8, proprio (B,T,P) normalized, context the instruction's
        FiLM conditioning (`instruction_context`), committed (B,T,chunk*A) int64 bins already decided for
        slot j itself (-1 = free; read only with committed_actions) -> StepEmbedding with x (B, T, S, d).
        Time is not embedded: it enters through the attention mask's relative bias."""
        B, T = proprio.shape[:2]
        vision = self.patch_embed(image, context)  # (B, T, C*(g*g + M), d) with positions
        aux_pred = None
        if self.aux_head is not None:
            feats = [vision.where.reshape(B, T, -1), proprio.to(vision.where.dtype)]  # (B, T, 2CM), (B, T, P)
            if context is not None and self.aux_reads_context:
                feats.append(context.flat()[:, None].expand(B, T, -1).to(vision.where.dtype))  # (B, F) -> (B, T, F)
            aux_pred = self.aux_head(torch.cat(feats, -1))  # (B, T, 2CM + P [+ F]) -> (B, T, aux_dim)
        prop = self.proprio_embed(proprio.to(vision.tokens.dtype))  # (B, T, d)
        if self.aux_embed is not None:  # given, not trained through: the prediction learns from its target
            prop = prop + self.aux_embed(aux_pred.detach())
        act = vision.tokens.new_zeros(B, T, self.layout.n_action_tokens, self.cfg.d_model)  # (B, T, chunk*A, d)
        if self.cfg.committed_actions and committed is not None:  # later slots see these through the causal mask
            act = act + self.action_embed(committed.clamp(min=0)) * (committed >= 0)[..., None]  # (B, T, chunk*A, d)
        step_embed = self.segment_embed(self.step_segment) + self.index_embed.weight  # (S, d)
        x = torch.cat([vision.tokens, prop[:, :, None], act], dim=2) + step_embed  # (B, T, S, d)
        return StepEmbedding(x, vision.where, vision.heat, aux_pred)

    def embed(self, batch: dict) -> tuple[torch.Tensor, StepEmbedding]:
        """The whole stream of a batch of windows: (B, L + T*S, d), and the step embedding's by-products.
        The instruction is embedded once: the stream's prefix and the FiLM context both read it."""
        instruction = batch["instruction"]
        prefix = self.embed_instruction(instruction)  # (B, L, d)
        context = self.instruction_context(instruction, prefix)  # Film or None
        emb = self.embed_steps(batch["image"], batch["proprio"], context, batch.get("committed"))
        return torch.cat([prefix, emb.x.flatten(1, 2)], dim=1), emb  # (B, L + T*S, d)

    # ------------------------------------------------------------------------- mask and trunk

    def window_mask(self, batch: dict) -> torch.Tensor:
        """(B, H, N, N) attention mask of a batch of whole windows."""
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
            pos=torch.arange(L + T * S, device=dev),  # (N,)
            slot=torch.cat([torch.full((L,), -1, device=dev), torch.arange(T, device=dev).repeat_interleave(S)]),
            index=torch.cat([torch.arange(L, device=dev), torch.arange(S, device=dev).repeat(T)]),  # (N,)
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
        return (start[:, None] + torch.arange(lay.n_action_tokens, device=device)).flatten()  # (n_steps * chunk*A,)

    # ------------------------------------------------------------------------- full-window pass

    def forward(self, batch: dict) -> dict:
        """Training / evaluation pass over windows.

        batch: instruction (B, L) int64, image (B, T, C, H, W, 3) uint8, proprio (B, T, P) normalized,
        timestep (B, T) int64, step_mask (B, T) bool (optional, False = left padding), actions
        (B, T, chunk*A) int64 bins (optional targets), action_is_pad (B, T, chunk) bool (optional, True =
        target past the demo's end), committed (B, T, chunk*A) (optional, delay-aware training), aux
        (B, T, D) (optional auxiliary targets), keypoint_targets (B, T, n, 2) (optional image positions).
        Returns logits (B, T, chunk*A, bins) and aux_pred; with targets also their losses (`losses`)."""
        B, T = batch["timestep"].shape
        step_mask = batch.get("step_mask")
        x, emb = self.embed(batch)  # (B, L + T*S, d)
        h, _ = self.trunk(x, self.window_mask(batch), rows=self.action_rows(T, x.device))  # (B, T*chunk*A, d)
        logits = self.head(h).view(B, T, self.layout.n_action_tokens, -1)  # (B, T, chunk*A, bins)
        out = {"logits": logits, "aux_pred": emb.aux_pred}
        step_weight = torch.ones(B, T, device=x.device) if step_mask is None else step_mask.float()  # (B, T)
        if "actions" in batch:
            shape = (B, T, self.cfg.chunk, self.spec.action_dim)
            weight = losses.action_weights(shape, x.device, step_mask, batch.get("action_is_pad"))
            out.update(losses.action_loss(logits, batch["actions"], weight))
        if "aux" in batch and emb.aux_pred is not None:
            out["aux_loss"] = losses.aux_loss(emb.aux_pred, batch["aux"], step_weight)
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
        seg = torch.cat([torch.full((L,), SEG_INSTRUCTION), self.step_segment.cpu().repeat(n_steps)])  # (N,)
        step = torch.cat([torch.full((L,), -1), torch.arange(n_steps).repeat_interleave(S)])  # (N,)
        index = torch.cat([torch.arange(L), torch.arange(S).repeat(n_steps)])  # (N,)
        return {"segment": seg, "step": step, "index": index}

    def for_inference(self) -> ActionTransformer:
        """Eval mode and, on CPU, convolution weights in channels-last layout: with one image per call
        PyTorch otherwise runs the stem on its slow reference convolution, and oneDNN's channels-last
        kernels run it faster. Policies loaded from a checkpoint use it; a model being trained keeps its
        layout (a resumed run must compute exactly what an uninterrupted one does). Outputs agree to ~1e-7."""
        self.eval()
        if self.index_embed.weight.device.type == "cpu":
            self.to(memory_format=torch.channels_last)
        return self
