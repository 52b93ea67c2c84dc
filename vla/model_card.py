"""Model card: parameters by component and FLOPs per control step / per training sample.

The per-layer parameter count is checked against the chapter's formula 4·d² (Q, K, V, output
projections) + 2·d·d_ff (the two MLP matrices); the difference is the biases and the two LayerNorms.
FLOPs count a multiply-add as 2 and cover the matrix products (projections, MLP, patch embedding,
head) plus attention (Q·Kᵀ and the weighted sum of V: 4·d per query-key pair per layer); norms,
softmax and GELU are left out. The explicit attention mask makes every query score every key of the
buffer (masked pairs are computed too), so attention is counted over all keys.
"""

from __future__ import annotations

import torch

from vla.model import ActionTransformer, DataSpec, ModelConfig, TokenLayout


def _numel(module) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _patch_embed_flops(cfg: ModelConfig, lay: TokenLayout) -> int:
    """FLOPs to embed one step's images (all cameras)."""
    p, g, d = cfg.patch_size, lay.grid, cfg.d_model
    if cfg.patch_embed == "linear":
        flops = g * g * 2 * (p * p * 3) * d
    else:
        flops, c_in, side, n = 0, 3 + 2, lay.spec.image_size, p.bit_length() - 1  # the stem in vla/model/vision.py
        for i in range(n):
            side = (side + 1) // 2
            c_out = d if i == n - 1 else cfg.conv_channels * 2**i
            flops += side * side * 2 * c_in * 9 * c_out
            c_in = c_out
    if cfg.keypoints:  # the spatial-softmax keypoint network, at half resolution
        h, c = lay.keypoint_grid, cfg.keypoint_channels
        flops += h * h * 2 * (5 * 9 * c + c * 9 * c + c * cfg.keypoints * (2 if cfg.film else 1))  # + queries
    return lay.spec.n_cameras * flops


def _flops(cfg: ModelConfig, lay: TokenLayout) -> dict:
    """FLOPs of one streaming control step, one recompute, and one training sample."""
    d, nl = cfg.d_model, cfg.n_layer
    L, K, S, CA = cfg.instruction_len, cfg.window, lay.tokens_per_step, lay.n_action_tokens
    dense_per_token = nl * 2 * (4 * d * d + 2 * d * cfg.d_ff)  # projections + MLP matmuls, all layers
    n_keys = L + K * S  # the streaming buffer: every query scores all of it
    attn_per_query = nl * 4 * d * n_keys
    head = 2 * d * cfg.action_bins
    embed_step = _patch_embed_flops(cfg, lay) + 2 * lay.spec.proprio_dim * d
    streaming = S * dense_per_token + S * attn_per_query + CA * head + embed_step
    N = L + K * S  # stream length of a full training window
    forward = N * dense_per_token + nl * 4 * d * N * N + K * CA * head + K * embed_step
    if cfg.film:  # the instruction's own pass that conditions the stem (done once per episode at inference)
        forward += L * dense_per_token + nl * 4 * d * L * L
    passes = CA if cfg.action_decoding == "autoregressive" else 1
    recompute = passes * (N * dense_per_token + nl * 4 * d * N * N + CA * head) + K * embed_step
    return {
        "per_control_step_streaming": streaming,
        "per_control_step_recompute": recompute,
        "recompute_over_streaming": recompute / streaming,
        "per_training_sample_forward": forward,
        "per_training_sample_train": 3 * forward,  # backward ~ 2x forward
    }


def model_card(cfg: ModelConfig, spec: DataSpec) -> dict:
    """Parameters by component (total == sum of numel) and FLOPs, for a config (no weights allocated)."""
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
        "time": _numel(model.time_embed) + sum(p.numel() for p in (model.rel_bias, model.instr_bias) if p is not None),
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
            "action_decoding": cfg.action_decoding,
            "time_encoding": cfg.time_encoding,
            "causal_scope": cfg.causal_scope,
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


def _fmt(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.2f}"


def format_model_card(card: dict) -> str:
    """Markdown tables of a `model_card` dict."""
    c = card["config"]
    lines = [
        f"### Model card: d_model {c['d_model']}, {c['n_layer']} layers, {c['n_head']} heads, "
        f"d_ff {c['d_ff']}, window {c['window']} ({c['action_decoding']}, {c['time_encoding']} time, "
        f"causal_scope {c['causal_scope']})",
        "",
        "| component | parameters |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v:,} |" for k, v in card["parameters"]["by_component"].items()]
    lines += [f"| **total** | **{card['parameters']['total']:,}** |", ""]
    pl = card["per_layer"]
    lines += [
        "| per layer | parameters |",
        "|---|---:|",
        f"| actual | {pl['actual']:,} |",
        f"| 4·d² + 2·d·d_ff | {pl['formula_4d2_plus_2d_dff']:,} |",
        f"| difference ({pl['difference_is']}) | {pl['difference']:,} |",
        "",
        "| tokens | count |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {v} |" for k, v in card["tokens"].items()]
    lines += ["", "| FLOPs | value |", "|---|---:|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in card["flops"].items()]
    lines += ["", f"KV cache per episode (fp32): {_fmt(card['kv_cache_bytes_per_episode_fp32'])}B"]
    return "\n".join(lines) + "\n"
