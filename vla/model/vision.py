"""Vision encoder: uint8 frames -> image tokens (patch features, then spatial-softmax keypoints).

Patch features come from a conv stem, linear patches, or a pretrained image model's feature map
(`model.vision_encoder`, vla/model/vision_encoder.py); the keypoints always read the pixels.

Pure: `forward` returns everything a caller may need (tokens, keypoint coordinates, heat maps);
nothing is kept on the module between calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from vla.model.config import ModelConfig, TokenLayout
from vla.model.vision_encoder import VisionEncoder


@dataclass
class ImageTokens:
    tokens: torch.Tensor  # (B, T, C*(g*g + M), d) image tokens with patch position / keypoint id + camera
    where: torch.Tensor | None  # (B, T, C, M, 2) keypoint coordinates (row, column) in [-1, 1], or None
    heat: torch.Tensor | None  # (B, T, C, M, h*w) keypoint heat maps (softmax over pixels), or None


@dataclass
class Film:
    """What the instruction sets in the vision stem, computed once per instruction (`PatchEmbed.condition`)
    and only read by every control step after it."""

    stem: list[torch.Tensor]  # per hidden conv-stem stage: (B, 2c) [scale | shift]; [] without a FiLM stem
    keypoints: list[torch.Tensor]  # per hidden keypoint-net layer: (B, 2c) [scale | shift]; [] without keypoints
    query: torch.Tensor | None  # (B, M*c) each keypoint map's query, scaled by 1/sqrt(c); None without keypoints

    def parts(self) -> list[torch.Tensor]:
        return [*self.stem, *self.keypoints, *([] if self.query is None else [self.query])]

    def flat(self) -> torch.Tensor:
        """(B, F): every part side by side, the auxiliary head's input and the exported graphs' one tensor."""
        return torch.cat(self.parts(), 1)

    def copy_(self, other: Film) -> None:
        """Overwrite in place (a captured CUDA graph reads these addresses)."""
        for mine, theirs in zip(self.parts(), other.parts(), strict=True):
            mine.copy_(theirs)


def film_gelu(x: torch.Tensor, film: torch.Tensor | None) -> torch.Tensor:
    """GELU of feature maps x (N, c, h, w), first scaled and shifted per channel when there is FiLM: film
    (B, 2c) is [scale | shift] (a part of `Film`), shared by the N / B images of each batch row."""
    if film is not None:
        film = _per_image(film, x.shape[0])  # (N, 2c)
        scale, shift = film[:, :, None, None].chunk(2, 1)  # (N, c, 1, 1) each
        x = x * scale + shift  # (N, c, h, w)
    return F.gelu(x)


def _per_image(per_row: torch.Tensor, n_images: int) -> torch.Tensor:
    """(B, ...) -> (N, ...): each batch row's value for its N / B images (no copy when N = B, as in a step)."""
    return per_row if n_images == per_row.shape[0] else per_row.repeat_interleave(n_images // per_row.shape[0], 0)


class PatchEmbed(nn.Module):
    """uint8 images -> image tokens with a learned 2-D (row + column) position and a camera embedding."""

    def __init__(self, cfg: ModelConfig, layout: TokenLayout):
        super().__init__()
        self.cfg, self.layout = cfg, layout
        p, d, g, size = cfg.patch_size, cfg.d_model, layout.grid, layout.spec.image_size
        self.supervised_keypoints = layout.spec.aux_dim > 0
        # the instruction's FiLM layers: the stem's (conv), the keypoint net's and its queries (with keypoints)
        self.film = self.kp_film = self.kp_query = self.encoder = None
        if cfg.vision_encoder:
            # A pretrained image model in the stem's place: its last feature map, pooled to the patch grid, is
            # projected to d by a trained linear map. It takes no FiLM: the instruction reaches the patches
            # through attention (and the keypoints through their own FiLM).
            self.encoder = VisionEncoder(
                cfg.vision_encoder, size, cfg.vision_encoder_trainable, layout.spec.vision_fingerprint or None
            )
            self.proj = nn.Linear(self.encoder.channels, d)
        elif layout.spec.vision_fingerprint:
            raise ValueError(
                f"data spec vision_fingerprint={layout.spec.vision_fingerprint!r} needs model.vision_encoder"
            )
        elif cfg.patch_embed == "linear":
            self.proj = nn.Linear(p * p * 3, d)
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
                convs.append(nn.Conv2d(c_in, c_out, kernel_size=3, stride=2, padding=1))
                if cfg.film and i < n - 1:
                    films.append(nn.Linear(2 * d, 2 * c_out))
                c_in = c_out
            self.proj = nn.ModuleList(convs)
            self.film = nn.ModuleList(films) if cfg.film else None
        self.row = nn.Parameter(torch.zeros(g, d))
        self.col = nn.Parameter(torch.zeros(g, d))
        self.camera = nn.Parameter(torch.zeros(layout.spec.n_cameras, d))
        if cfg.keypoints:
            # Spatial-softmax keypoints (Levine et al. 2016; robomimic's default readout): a small conv
            # net at half resolution gives M heat maps; each map's softmax-weighted pixel coordinates are
            # where "its" thing is, to a fraction of a pixel. A 16-pixel patch token cannot say where in
            # the patch a 5-pixel block sits; a keypoint token says it directly.
            # What the keypoint net sees depends on what trains its maps. With heat-map targets (the
            # simulator's object pixels) it sees colours and coordinate channels: the targets put each peak
            # on its object, and the coordinates tell look-alikes apart (Meta-World's red arm and red puck).
            # Without them it sees colours only, and each map is standardized (see `keypoints`): given
            # coordinates, a map trained from the action and waypoint losses alone falls onto a fixed spot
            # (a linear ramp in the coordinates) and stops learning. docs/metaworld.md has both measured.
            self.kp_coords_in = layout.spec.keypoint_targets
            c, M = cfg.keypoint_channels, cfg.keypoints
            c_in = 3 + 2 * self.kp_coords_in
            self.kp_convs = nn.ModuleList(
                [nn.Conv2d(c_in, c, 3, stride=2, padding=1), nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, M, 1)]
            )
            # With `film` the maps are conditioned on the instruction, so a keypoint can follow "the
            # named block" rather than "the red thing": the transformer then reads it at a fixed slot.
            # Besides scaling hidden channels, the instruction gives each map a query that is matched
            # against every pixel's features (heat = conv(x) + <x, q>): "orange" becomes a direction in
            # feature space, a bilinear link that supervised keypoints learn in a few hundred steps.
            self.kp_film = nn.ModuleList([nn.Linear(2 * d, 2 * c) for _ in range(2)]) if cfg.film else None
            self.kp_query = nn.Linear(2 * d, M * c) if cfg.film else None
            sharpness = 20.0 if self.kp_coords_in else 2.0  # raw maps vs standardized ones (unit spread)
            self.kp_sharpness = nn.Parameter(torch.tensor(math.log(sharpness)))  # log inverse softmax temperature
            self.kp_proj = nn.Linear(3, d)  # (x, y, strength) -> d
            self.kp_id = nn.Parameter(torch.zeros(M, d))  # which keypoint a token is
            h = layout.keypoint_grid
            axis = (torch.arange(h) + 0.5) / h * 2 - 1  # pixel centres; -1 / +1 are the image edges
            ys, xs = torch.meshgrid(axis, axis, indexing="ij")
            self.register_buffer("kp_coords", torch.stack([ys.flatten(), xs.flatten()], 1), persistent=False)
        if cfg.patch_embed == "conv" or cfg.keypoints:  # coordinate channels of the conv inputs
            axis = torch.linspace(-0.5, 0.5, size)
            ys, xs = torch.meshgrid(axis, axis, indexing="ij")  # (H, W) each
            self.register_buffer("coords", torch.stack([ys, xs]), persistent=False)  # (2, H, W)

    def positions(self) -> torch.Tensor:
        """(C * (g*g + M), d): 2-D patch position (row + column) or keypoint id, + camera embedding."""
        pos = (self.row[:, None, :] + self.col[None, :, :]).flatten(0, 1)  # (g*g, d): index r*g + c
        if self.cfg.keypoints:
            pos = torch.cat([pos, self.kp_id], dim=0)  # (g*g + M, d)
        return (self.camera[:, None, :] + pos).flatten(0, 1)  # (C*(g*g + M), d)

    def _conditioned(self) -> list[nn.Linear]:
        """The layers that map the instruction context to the stem's FiLM and the keypoint queries, in order."""
        if not self.cfg.film:
            return []
        return [*(self.film or []), *(self.kp_film or []), *([self.kp_query] if self.kp_query is not None else [])]

    def condition(self, context: torch.Tensor | None) -> Film | None:
        """What the instruction sets in the stem, computed once per instruction: context (B, 2d) -> every
        FiLM layer's [scale | shift] (scale = 1 + gamma) and the keypoint queries; None without FiLM."""
        if context is None or not self.cfg.film:
            return None

        def scale_shift(layer: nn.Linear) -> torch.Tensor:
            gamma, beta = layer(context).chunk(2, 1)  # (B, c) each
            return torch.cat([1 + gamma, beta], 1)  # (B, 2c)

        stem, kp = [scale_shift(m) for m in self.film or []], [scale_shift(m) for m in self.kp_film or []]
        query = None
        if self.kp_query is not None:
            query = self.kp_query(context) / math.sqrt(self.cfg.keypoint_channels)  # (B, M*c)
        return Film(stem, kp, query)

    def film_from_flat(self, flat: torch.Tensor) -> Film:
        """`Film.flat`'s (B, F) back to its parts (the exported step graph receives the one tensor)."""
        stem, kp = [m.out_features for m in self.film or []], [m.out_features for m in self.kp_film or []]
        query = [] if self.kp_query is None else [self.kp_query.out_features]
        parts = list(flat.split(stem + kp + query, dim=1))
        return Film(parts[: len(stem)], parts[len(stem) : len(stem) + len(kp)], parts[-1] if query else None)

    def keypoints(self, x: torch.Tensor, films: list, query: torch.Tensor | None):
        """(N, 3 [+ 2 coordinates], H, W) pixels -> keypoint tokens (N, M, d), coordinates (N, M, 2) and heat
        maps (N, M, h*w). films / query from `condition` (B rows) condition the maps (N = B * steps *
        cameras); [] / None: none."""
        for conv, film in zip(self.kp_convs[:-1], films or [None] * (len(self.kp_convs) - 1), strict=True):
            x = film_gelu(conv(x), film)  # (N, c, h, w)
        heat = self.kp_convs[-1](x).flatten(2)  # (N, M, h*w)
        if query is not None:
            c, M = x.shape[1], heat.shape[1]
            q = _per_image(query.view(-1, M, c), x.shape[0])  # (N, M, c), already scaled by 1/sqrt(c)
            # a batched matmul, not einsum: onnxruntime's Einsum kernel took ~80 us for this 0.5 MFLOP product
            heat = heat + q @ x.flatten(2)  # (N, M, h*w)
        # Without heat-map targets each map is standardized over its pixels, so only the learned sharpness
        # sets how peaked it is: left free, the maps' scale grows in the first hundred steps, the softmax
        # saturates on whatever it first fell on, and the action loss alone can no longer move it.
        if not self.kp_coords_in:
            heat = (heat - heat.mean(-1, keepdim=True)) / (heat.std(-1, keepdim=True) + 1e-5)  # (N, M, h*w)
        att = (heat * self.kp_sharpness.exp()).softmax(-1)  # (N, M, h*w)
        where = att @ self.kp_coords.to(att.dtype)  # (N, M, 2): expected (y, x) in [-1, 1]
        strength = (att * heat).sum(-1, keepdim=True)  # (N, M, 1): how strongly the map fired there
        feats = torch.cat([where, strength], dim=-1)  # (N, M, 3)
        if self.supervised_keypoints:  # they learn only from the auxiliary targets; the policy reads them
            feats = feats.detach()  # as given features
        return self.kp_proj(feats), where, att

    def patches(self, x: torch.Tensor, pix: torch.Tensor | None, films: list) -> torch.Tensor:
        """Patch features: x (B, T, C, H, W, 3) in [-0.5, 0.5], pix (B*T*C, 5, H, W) -> (B, T, C, g*g, d)."""
        B, T, p = x.shape[0], x.shape[1], self.cfg.patch_size
        if self.encoder is not None:
            features = self.encoder(pix[:, :3] + 0.5)  # (B*T*C, C_enc, h, w) from pixels in [0, 1]
            features = F.adaptive_avg_pool2d(features, self.layout.grid)  # (B*T*C, C_enc, g, g)
            features = rearrange(features, "(b t c) e h w -> b t c (h w) e", b=B, t=T)  # (B, T, C, g*g, C_enc)
            return self.proj(features.to(self.proj.weight.dtype))  # (B, T, C, g*g, d)
        if self.cfg.patch_embed == "linear":
            x = rearrange(x, "b t c (h p1) (w p2) ch -> b t c (h w) (p1 p2 ch)", p1=p, p2=p)  # (B, T, C, g*g, p*p*3)
            return self.proj(x)  # (B, T, C, g*g, d)
        x = pix  # (B*T*C, 5, H, W)
        for conv, film in zip(self.proj[:-1], films or [None] * (len(self.proj) - 1), strict=True):
            x = film_gelu(conv(x), film)  # (B*T*C, c_i, H / 2^(i+1), W / 2^(i+1))
        x = self.proj[-1](x)  # (B*T*C, d, g, g)
        return rearrange(x, "(b t c) d h w -> b t c (h w) d", b=B, t=T)  # (B, T, C, g*g, d)

    def forward(self, image: torch.Tensor, film: Film | None = None) -> ImageTokens:
        """(B, T, C, H, W, 3) uint8 -> image tokens; `film` from `condition` conditions a FiLM stem."""
        B, T, C = image.shape[:3]
        x = image.to(self.row.dtype) / 255.0 - 0.5  # (B, T, C, H, W, 3) in [-0.5, 0.5]
        pix = None
        if self.cfg.patch_embed == "conv" or self.cfg.keypoints:  # conv inputs: pixels + coordinates, once
            pix = rearrange(x, "b t c h w ch -> (b t c) ch h w")  # (B*T*C, 3, H, W)
            coords = self.coords.to(pix.dtype).expand(pix.shape[0], -1, -1, -1)  # (B*T*C, 2, H, W)
            pix = torch.cat([pix, coords], dim=1)  # (B*T*C, 5, H, W)
        stem_films, kp_films, query = (film.stem, film.keypoints, film.query) if film is not None else ([], [], None)
        tokens = self.patches(x, pix, stem_films)  # (B, T, C, g*g, d)
        where = heat = None
        if self.cfg.keypoints:
            kp_in = pix if self.kp_coords_in else pix[:, :3]  # (N, 5 or 3, H, W)
            kp, where, heat = self.keypoints(kp_in, kp_films, query)  # (N, M, d), (N, M, 2), (N, M, h*w)
            kp = rearrange(kp, "(b t c) m d -> b t c m d", b=B, t=T)  # (B, T, C, M, d)
            tokens = torch.cat([tokens, kp], dim=3)  # (B, T, C, g*g + M, d)
            where = where.view(B, T, C, *where.shape[1:])  # (B, T, C, M, 2)
            heat = heat.view(B, T, C, *heat.shape[1:])  # (B, T, C, M, h*w)
        return ImageTokens(tokens.flatten(2, 3) + self.positions(), where, heat)  # (B, T, C*(g*g + M), d)
