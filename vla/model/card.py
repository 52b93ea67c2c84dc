"""Model card: parameters by component and FLOPs per control step / per training sample.

The per-layer parameter count is checked against the chapter's formula 4·d² (Q, K, V, output
projections) + 2·d·d_ff (the two MLP matrices); the difference is the biases and the two LayerNorms.
FLOPs count a multiply-add as 2 and cover every matrix product the passes run: the conv stem or linear
patch embedding, the keypoint network (its convolutions, the instruction query, the soft-argmax), the
FiLM layers, proprio / auxiliary / time projections, Q·Kᵀ and the weighted sum of V, the projections
and MLP, and the head; norms, softmax, GELU and table look-ups are left out. They follow the code pass
by pass and agree with `torch.utils.flop_counter.FlopCounterMode` (tests/test_model_card.py):
- the last block computes queries, attention, output projection and MLP for the rows that are read
  (the action slots) only; keys and values for every token;
- the explicit attention mask makes every query score every key of the buffer (masked, empty and
  stale ones too), so attention is counted over all L + K*S keys;
- a streaming step embeds one frame; the instruction prefix and FiLM context are paid once in `start`.
Work the network does that it need not (left as is, the numerics are pinned): the FiLM scales and
shifts are recomputed from the constant instruction context on every step (few FLOPs, but five small
kernels per step); a step's observation queries score the earlier steps' keys that the mask then
hides; recompute runs the vision of all K frames again.
"""

from __future__ import annotations

import torch

from vla.model import ActionTransformer, DataSpec, ModelConfig, TokenLayout


def _numel(module) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _linear(n: int, d_in: int, d_out: int) -> int:
    """FLOPs of n rows through a d_in -> d_out matrix."""
    return 2 * n * d_in * d_out


def _conv(side_out: int, c_in: int, c_out: int, kernel: int) -> int:
    """FLOPs of a square convolution with a side_out x side_out output."""
    return 2 * side_out * side_out * c_in * kernel * kernel * c_out


def _vision_flops(cfg: ModelConfig, lay: TokenLayout, n_frames: int) -> int:
    """FLOPs of `PatchEmbed` over n_frames steps (all cameras): patch features, then keypoints. The FiLM
    scales, shifts and queries come from `instruction_context` (`_film_context_flops`)."""
    p, g, d, C = cfg.patch_size, lay.grid, cfg.d_model, lay.spec.n_cameras
    per_image = 0
    if cfg.patch_embed == "linear":
        per_image += _linear(g * g, p * p * 3, d)
    else:  # the stem in vla/model/vision.py: log2(p) 3x3 stride-2 stages from pixels + 2 coordinate channels
        c_in, side = 3 + 2, lay.spec.image_size
        for i in range(p.bit_length() - 1):
            side = (side + 1) // 2
            last = i == p.bit_length() - 2
            c_out = d if last else cfg.conv_channels * 2**i
            per_image += _conv(side, c_in, c_out, 3)
            c_in = c_out
    if cfg.keypoints:  # the spatial-softmax keypoint network, at half resolution
        h, c, M = lay.keypoint_grid, cfg.keypoint_channels, cfg.keypoints
        c_in = 3 + 2 * lay.spec.keypoint_targets  # colours [+ coordinates]
        per_image += _conv(h, c_in, c, 3) + _conv(h, c, c, 3) + _conv(h, c, M, 1)  # stride-2 3x3, 3x3, 1x1
        if cfg.film:
            per_image += _linear(M, c, h * h)  # heat += <pixel features, instruction query> per map
        per_image += _linear(M, h * h, 2) + _linear(M, 3, d)  # soft-argmax coordinates, (x, y, strength) -> d
    return n_frames * C * per_image


def _step_embed_flops(cfg: ModelConfig, lay: TokenLayout, n_steps: int, training: bool = False) -> int:
    """FLOPs of `embed_steps` over n_steps steps: vision, proprio, the auxiliary readout."""
    d, spec = cfg.d_model, lay.spec
    per_step = _linear(1, spec.proprio_dim, d)
    if spec.aux_dim and cfg.keypoints:  # the auxiliary MLP reads keypoint coordinates + proprio [+ FiLM]
        aux_in = 2 * spec.n_cameras * cfg.keypoints + spec.proprio_dim
        if cfg.film and not spec.keypoint_targets:
            aux_in += _film_width(cfg)
        per_step += _linear(1, aux_in, d) + _linear(1, d, spec.aux_dim)
    if lay.feeds_aux:
        per_step += _linear(1, spec.aux_dim, d)
    return _vision_flops(cfg, lay, n_steps) + n_steps * per_step


def _film_width(cfg: ModelConfig) -> int:
    """Entries of the instruction's conditioning (`Film.flat`): the stem's and keypoint net's [scale | shift]
    and the keypoint queries."""
    n_stages = cfg.patch_size.bit_length() - 1
    stem = cfg.patch_embed == "conv" and not cfg.vision_encoder
    width = sum(2 * cfg.conv_channels * 2**i for i in range(n_stages - 1)) if stem else 0
    if cfg.keypoints:
        width += 2 * 2 * cfg.keypoint_channels + cfg.keypoints * cfg.keypoint_channels
    return width


def _film_context_flops(cfg: ModelConfig) -> int:
    """FLOPs of `instruction_context`: two attention pools over the instruction (scores, weighted sums),
    then every FiLM scale / shift and keypoint query (`_film_width` of them) from the summary (2d)."""
    if not cfg.film:
        return 0
    return 2 * _linear(cfg.instruction_len, cfg.d_model, 2) + _linear(1, 2 * cfg.d_model, _film_width(cfg))


def _trunk_flops(cfg: ModelConfig, n: int, n_keys: int, rows: int) -> int:
    """FLOPs of one pass of n tokens through the blocks, attending to n_keys keys; the last block computes
    queries, attention, output projection and MLP for `rows` of them only (keys/values for all n)."""
    d = cfg.d_model

    def layer(n_in: int, n_out: int) -> int:
        qkv = _linear(n_in, d, 3 * d)
        attention = 2 * _linear(n_out, d, n_keys)  # Q·Kᵀ and the weighted sum of V, over every head
        return qkv + attention + _linear(n_out, d, d) + _linear(n_out, d, cfg.d_ff) + _linear(n_out, cfg.d_ff, d)

    return (cfg.n_layer - 1) * layer(n, n) + layer(n, rows)


def _flops(cfg: ModelConfig, lay: TokenLayout) -> dict:
    """FLOPs of one streaming control step, one recompute, and one training sample, pass by pass as
    `ActionTransformer.step`, `.recompute` and `.forward` run them."""
    L, K, S = cfg.instruction_len, cfg.window, lay.tokens_per_step
    CA, bins, d = lay.n_action_tokens, cfg.action_bins, cfg.d_model
    N = L + K * S  # a full window's stream = the streaming buffer (every query scores all of it, masked or not)
    head = _linear(CA, d, bins)  # one step's action slots
    # the whole step at once; only its action slots leave the last block. The instruction prefix and FiLM
    # context are paid once, in `start`.
    streaming = _trunk_flops(cfg, S, N, CA) + _step_embed_flops(cfg, lay, 1) + head
    recompute = _trunk_flops(cfg, N, N, CA) + head + _step_embed_flops(cfg, lay, K) + _film_context_flops(cfg)
    forward = _trunk_flops(cfg, N, N, K * CA) + K * head + _step_embed_flops(cfg, lay, K) + _film_context_flops(cfg)
    return {
        "per_control_step_streaming": streaming,
        "per_control_step_recompute": recompute,
        "recompute_over_streaming": recompute / streaming,
        "per_training_sample_forward": forward,
        "per_training_sample_train": 3 * forward,  # backward ~ 2x forward
    }


def model_card(cfg: ModelConfig, spec: DataSpec) -> dict:
    """Parameters by component (total == sum of numel) and FLOPs, for a config (no weights allocated)."""
    if cfg.vision_encoder:
        raise ValueError(
            f"vision_encoder={cfg.vision_encoder!r}: the model card counts the network's own layers and the conv "
            "stem's FLOPs, not a pretrained image model's"
        )
    with torch.device("meta"):
        model = ActionTransformer(cfg, spec)
    lay = model.layout
    d, dff, nl = cfg.d_model, cfg.d_ff, cfg.n_layer
    L, K, S, CA = cfg.instruction_len, cfg.window, lay.tokens_per_step, lay.n_action_tokens

    attn = sum(_numel(b.attn) for b in model.blocks)
    mlp = sum(_numel(b.mlp) for b in model.blocks)
    norms = sum(_numel(b.ln_1) + _numel(b.ln_2) for b in model.blocks)
    embeddings = {
        "instruction (words + positions)": _numel(model.instr_embed) + _numel(model.instr_pos),
        "patch position + camera": sum(p.numel() for p in (model.patch_embed.row, model.patch_embed.col))
        + model.patch_embed.camera.numel(),
        "proprio projection": _numel(model.proprio_embed),
        "action bins": _numel(model.action_embed),
        "segment + index-within-step": _numel(model.segment_embed) + _numel(model.index_embed),
        "time": model.rel_bias.numel() + model.instr_bias.numel(),
    }
    components = {
        f"patch embed ({cfg.patch_embed})": _numel(model.patch_embed.proj),
        "patch embed FiLM (instruction -> stem)": _numel(getattr(model.patch_embed, "film", None))
        + _numel(model.film_pool),
        "image keypoints (spatial softmax)": sum(
            _numel(getattr(model.patch_embed, n, None)) for n in ("kp_convs", "kp_proj", "kp_film", "kp_query")
        )
        + sum(getattr(model.patch_embed, n).numel() for n in ("kp_id", "kp_sharpness") if cfg.keypoints),
        **{f"embed: {k}": v for k, v in embeddings.items()},
        "blocks: attention": attn,
        "blocks: MLP": mlp,
        "blocks: LayerNorms": norms,
        "final norm + head": _numel(model.ln_f) + _numel(model.head),
        "auxiliary head (+ its feed into the proprio token)": _numel(model.aux_head) + _numel(model.aux_embed),
    }
    total = sum(p.numel() for p in model.parameters())
    assert sum(components.values()) == total, "model card misses a parameter group"

    per_layer = (attn + mlp + norms) // nl
    formula = 4 * d * d + 2 * d * dff
    flops = _flops(cfg, lay)
    n_keys = L + K * S  # the streaming buffer
    kv_bytes = nl * 2 * n_keys * d * 4  # fp32, one episode
    return {
        "config": {
            "d_model": d,
            "n_layer": nl,
            "n_head": cfg.n_head,
            "d_ff": dff,
            "window": K,
            "chunk": cfg.chunk,
            "keypoints": cfg.keypoints,
        },
        "parameters": {"total": total, "by_component": components},
        "per_layer": {
            "actual": per_layer,
            "formula_4d2_plus_2d_dff": formula,
            "difference": per_layer - formula,
            "difference_is": "biases of the Q, K, V, output and 2 MLP projections + 2 LayerNorms",
        },
        "tokens": {
            "instruction": L,
            "per_step": S,
            "image_per_step": lay.n_image_tokens,
            "proprio_per_step": 1,
            "action_per_step": CA,
            "window_stream": n_keys,
        },
        "flops": flops,
        "kv_cache_bytes_per_episode_fp32": kv_bytes,
    }
