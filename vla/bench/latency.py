"""Per-control-step latency: streaming KV cache vs full recomputation vs Hugging Face GPT-2's cache.

One control step = append one step's observation tokens and decode its action tokens, with the
window full (K steps; the oldest is evicted). Three ways, same model size and token counts:

- streaming: `ActionTransformer.step` on the constant-memory ring-buffer cache;
- recompute: `ActionTransformer.recompute`, the same window from scratch, no cache;
- hf_gpt2: `transformers.GPT2LMHeadModel` built from a `GPT2Config` of the same width, depth, heads
  and MLP width (random weights, nothing downloaded), fed `inputs_embeds` prepared outside the timer,
  with its `past_key_values` cache held at the same window length (the step's tokens are cropped
  off again after each timed step). It processes the same tokens per step the way a language model
  decodes actions: one call with the observation tokens (+ the token before the first action),
  then one call per further action token.
- hf_gpt2_one_pass: GPT-2 given the whole step in one call, the same single pass our parallel decoding
  makes: a like-for-like overhead comparison.

The top level reports our decoding (one pass per step, every action slot at once) against the
token-at-a-time GPT-2 peer; `by_decoding` keeps the layout of older result files.

Backends (`--backend`, default all): the streaming step on torch eager (the `streaming` row), and the
exported step graph (vla/export/graphs.py's `StepGraph`, exported from this benchmark's model) on onnxruntime
in fp32 and dynamically quantized to int8 (`onnxruntime-int8`); their logits' largest difference from
torch's is reported. Next to each backend, the FLOP limit: the model card's FLOPs per step (which agree
with `torch.utils.flop_counter.FlopCounterMode`) divided by the fp32 matmul peak measured in the same
run at the same thread count (the better of before and after the steps), i.e. the time the step would
take at peak, and measured p50 / limit.

Timing: `time.perf_counter` around each step under `torch.inference_mode`, after a warm-up that
fills the window; p50/p99 in milliseconds. The three methods take turns step by step, so a change
in machine load during the run hits them alike. `--threads` defaults to the cores this process may use
(`os.sched_getaffinity`); on a small shared CPU, other load shows in the p99 (the 1-minute load
average is recorded). `max_abs_diff` is the largest |streaming - recompute| logit difference over an
episode long enough for the window to slide several times.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from vla.bench.step_methods import (
    HFGPT2,
    Recompute,
    Streaming,
    SyntheticEpisode,
    matmul_peak,
    ms_summary,
    onnx_methods,
    sync,
    time_interleaved,
)
from vla.cli import common as cli
from vla.config import apply_overrides, from_dict, load_yaml
from vla.errors import UserError
from vla.model import ActionTransformer, DataSpec, ModelConfig, TokenLayout
from vla.model.card import model_card
from vla.policy.config import BACKENDS

# The data of our tabletop tasks: 64x64 frames, 9 proprio values, 4 action dims, the named block's and its
# goal's positions as auxiliary targets (6) and their image positions as keypoint targets; the vocabulary size
# does not change the step's cost.
TABLETOP = DataSpec(
    image_size=64, proprio_dim=9, action_dim=4, vocab_size=64, n_cameras=1, aux_dim=6, keypoint_targets=True
)
# How a streaming step can run: torch eager (`ActionTransformer.step`), and the exported step graph
# (vla/export/graphs.py) on onnxruntime in fp32 and dynamically quantized to int8.


def add_backend_argument(p) -> None:
    p.add_argument(
        "--backend",
        default=",".join(BACKENDS),
        metavar="LIST",
        help=f"comma-separated backends of the streaming step, from {', '.join(BACKENDS)} (default: all; one "
        "that cannot run here, e.g. onnxruntime not installed, is reported with the reason)",
    )


def add_peak_argument(p) -> None:
    p.add_argument(
        "--peak-seconds", type=float, default=1.0, help="time spent finding the fp32 matmul peak, s (default 1.0)"
    )


def check_peak_seconds(seconds: float) -> None:
    if seconds <= 0:
        raise UserError(f"--peak-seconds must be > 0, got {seconds}")


def parse_backends(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in names if b not in BACKENDS]
    if bad or not names:
        raise UserError(f"--backend {text!r}: choose from {', '.join(BACKENDS)} (comma-separated)")
    return list(dict.fromkeys(names))  # in the given order, once each


def add_arguments(p) -> None:
    p.add_argument("--config", default=None, help="YAML with model keys (top level or under `model:`)")
    p.add_argument("--steps", type=int, default=200, help="timed control steps per method (default 200)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default: window + 10)")
    p.add_argument("--window", type=int, default=None, help="K, control steps in the window (default: the model's)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: usable cores)")
    add_backend_argument(p)
    add_peak_argument(p)
    p.add_argument("--equivalence-steps", type=int, default=None, help="episode length for max_abs_diff (5K)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, auto (default cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="model config overrides, e.g. n_layer=2")


def build_config(args) -> ModelConfig:
    """The default (demo) model, or a preset's `model:` section, then --window and the overrides."""
    data = {}
    if args.config:
        loaded = load_yaml(args.config)
        sections = any(isinstance(v, dict) for v in loaded.values())  # a training preset, or bare model keys
        data = loaded.get("model", {}) if sections else loaded
    cfg = from_dict(ModelConfig, data, "model")
    if args.window is not None:
        cfg = replace(cfg, window=args.window)
    return apply_overrides(cfg, list(args.overrides)) if args.overrides else cfg


def _equivalence(model, ep: SyntheticEpisode, device) -> tuple[float, bool]:
    """Max |streaming - recompute| logit difference and whether every decoded token matches."""
    K = model.cfg.window
    cache = model.new_cache(1, device)
    model.start(cache, ep.instruction)
    worst, same = 0.0, True
    for t in range(ep.n_steps):
        out = model.step(cache, ep.image[:, t], ep.proprio[:, t], ep.timestep[:, t])
        lo = max(0, t - K + 1)
        ref = model.recompute(
            ep.instruction,
            ep.image[:, lo : t + 1],
            ep.proprio[:, lo : t + 1],
            ep.timestep[:, lo : t + 1],
        )
        worst = max(worst, (out.logits.float() - ref.logits.float()).abs().max().item())
        same &= bool((out.tokens == ref.tokens).all())
    return worst, same


def _time_roll(lay: TokenLayout, device, n: int = 200) -> list[float]:
    """What eviction would cost as a roll of the step region (the ring buffer moves no data)."""
    cfg, L, S = lay.cfg, lay.cfg.instruction_len, lay.tokens_per_step
    kv = torch.zeros(cfg.n_layer, 2, 1, cfg.n_head, lay.n_tokens, cfg.d_model // cfg.n_head, device=device)
    times = []
    for _ in range(n):
        sync(device)
        t0 = time.perf_counter()
        kv[..., L:, :] = torch.roll(kv[..., L:, :], -S, dims=-2)
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def logit_difference(reference: list[torch.Tensor], other: list[np.ndarray]) -> float:
    """Max |logit difference| of a backend against torch's streaming step, over every step both ran."""
    return max(float(np.abs(r.float().cpu().numpy() - o).max()) for r, o in zip(reference, other, strict=True))


def _measure(cfg: ModelConfig, args, device, backends: list[str]) -> dict:
    """Time the methods interleaved step by step, so drifting machine load hits them alike."""
    K = cfg.window
    warmup = max(args.warmup if args.warmup is not None else K + 10, K)  # window full before timing
    torch.manual_seed(args.seed)
    model = ActionTransformer(cfg, TABLETOP).to(device).for_inference()  # as load_policy builds it
    lay = model.layout
    ep = SyntheticEpisode(lay, warmup + args.steps, device, args.seed)
    streaming = Streaming(model, ep, device)
    methods = {"streaming": streaming, "recompute": Recompute(model, ep)}
    hf_reason = None
    try:
        methods["hf_gpt2"] = HFGPT2(lay, warmup + args.steps, device, args.seed, one_pass=False)
        # GPT-2 given our parallel slots: the same single pass
        methods["hf_gpt2_one_pass"] = HFGPT2(lay, warmup + args.steps, device, args.seed, one_pass=True)
    except ImportError as e:  # an optional extra: `pip install -e .[bench]`
        hf_reason = f"transformers is not importable ({e}); install the `bench` extra"
    with tempfile.TemporaryDirectory(prefix="vla-bench-onnx-") as tmp:
        onnx, reasons, export_s = onnx_methods(model, ep, backends, torch.get_num_threads(), device, Path(tmp))
        times = time_interleaved({**methods, **onnx}, warmup + args.steps, warmup, device)
    n_eq = args.equivalence_steps if args.equivalence_steps is not None else 5 * K
    diff, same = _equivalence(model, SyntheticEpisode(lay, n_eq, device, args.seed + 1), device)
    res = {
        "streaming_ms": ms_summary(times["streaming"]),
        "recompute_ms": ms_summary(times["recompute"]),
        "hf_gpt2_ms": ms_summary(times["hf_gpt2"]) if "hf_gpt2" in times else None,
        "max_abs_diff": diff,
        "tokens_identical": same,
        "equivalence_steps": n_eq,
        "forward_passes_per_step": 1,
        # the streaming step per backend ("torch" is `streaming_ms`); null with a reason where it cannot run
        "backends_ms": {
            b: ms_summary(times["streaming" if b == "torch" else b]) if b not in reasons else None for b in backends
        },  # fmt: skip
        "backend_reasons": reasons,
        "backend_max_abs_logit_diff": {b: logit_difference(streaming.logits, m.logits) for b, m in onnx.items()},
        "export_seconds": export_s,
    }
    if "hf_gpt2_one_pass" in times:
        res["hf_gpt2_one_pass_ms"] = ms_summary(times["hf_gpt2_one_pass"])
    if hf_reason:
        res["hf_gpt2_reason"] = hf_reason
    else:
        res["transformers"] = methods["hf_gpt2"].version
    s50 = res["streaming_ms"]["p50"]
    res["speedup_p50"] = {
        "recompute_over_streaming": res["recompute_ms"]["p50"] / s50,
        "hf_gpt2_over_streaming": None if hf_reason else res["hf_gpt2_ms"]["p50"] / s50,
    }
    if "hf_gpt2_one_pass_ms" in res:
        res["speedup_p50"]["hf_gpt2_one_pass_over_streaming"] = res["hf_gpt2_one_pass_ms"]["p50"] / s50
    return res


def flop_limit(res: dict, cfg: ModelConfig, peak: float) -> dict:
    """The model card's FLOPs next to the measured times: the time a step would take at the matmul peak
    (the FLOP limit) and how far each backend is from it (measured p50 / limit)."""
    flops = model_card(cfg, TABLETOP)["flops"]
    step, recompute = flops["per_control_step_streaming"], flops["per_control_step_recompute"]
    limit_ms, recompute_limit_ms = step / peak * 1e3, recompute / peak * 1e3
    measured = {b: None if s is None else s["p50"] / limit_ms for b, s in res["backends_ms"].items()}
    timed = {b: s["p50"] for b, s in res["backends_ms"].items() if s is not None}
    fastest = min(timed, key=timed.get) if timed else None
    out = {
        "flops_per_step": step,
        "limit_ms": limit_ms,
        "measured_over_limit": measured,
        "fastest_backend": fastest,
        "recompute_flops": recompute,
        "recompute_limit_ms": recompute_limit_ms,
        "recompute_measured_over_limit": res["recompute_ms"]["p50"] / recompute_limit_ms,
        "flop_ratio_recompute_over_streaming": recompute / step,
        "time_ratio_recompute_over_streaming": res["speedup_p50"]["recompute_over_streaming"],
    }
    if fastest is not None and res["hf_gpt2_ms"] is not None:
        out["hf_gpt2_over_fastest"] = res["hf_gpt2_ms"]["p50"] / timed[fastest]
    return out


def run(args) -> dict:
    if args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    cfg = build_config(args)
    device = cli.device(args.device) or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = args.threads if args.threads is not None else usable
    torch.set_num_threads(threads)
    check_peak_seconds(args.peak_seconds)
    backends = parse_backends(args.backend)
    modes = ["parallel"]  # the one decoding (autoregressive was removed in issue 42)
    primary = modes[0]
    load = os.getloadavg()[0]
    # The matmul peak in the same run at the same thread count, before and after the steps: the better
    # of the two is what this machine can do (a busy neighbour during one of them only lowers it).
    peak_before = matmul_peak(device, args.peak_seconds)
    by_mode = {m: _measure(cfg, args, device, backends) for m in modes}
    peak_after = matmul_peak(device, args.peak_seconds)
    peak = max(peak_before, peak_after)
    for r in by_mode.values():
        r["flop_limit"] = flop_limit(r, cfg, peak)
    lay = TokenLayout(cfg, TABLETOP)
    top = by_mode[primary]
    result = {
        "streaming_ms": top["streaming_ms"],
        "recompute_ms": top["recompute_ms"],
        "hf_gpt2_ms": top["hf_gpt2_ms"],
        "max_abs_diff": max(r["max_abs_diff"] for r in by_mode.values()),
        "decoding": primary,
        "speedup_p50": top["speedup_p50"],
        "backends_ms": top["backends_ms"],
        "flop_limit": top["flop_limit"],
        "matmul_peak_flops_per_s": peak,
        "matmul_peak_before_after": [peak_before, peak_after],
        "by_decoding": by_mode,
        "eviction_ms": {"ring_buffer": 0.0, "roll_step_region": ms_summary(_time_roll(lay, device))},
        "config": asdict(cfg),
        "data_spec": asdict(TABLETOP),
        "tokens_per_step": lay.tokens_per_step,
        "window_tokens": lay.n_tokens,
        "params": ActionTransformer(cfg, TABLETOP).num_params(),
        "steps": args.steps,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "loadavg_1min_at_start": load,
        "device": str(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if top["hf_gpt2_ms"] is None:
        result["hf_gpt2_reason"] = top["hf_gpt2_reason"]
    return result


def _backend_table(r: dict) -> list[str]:
    """The streaming step per backend (and recompute) next to the FLOP limit of this machine's matmul peak."""
    peak = r["matmul_peak_flops_per_s"]
    lines = [
        "",
        f"### Streaming step by backend, next to its FLOP limit (model-card FLOPs / fp32 matmul peak "
        f"{peak / 1e9:.1f} GFLOP/s measured in this run at {r['threads']} thread(s))",
        "",
        "| our decoding | backend | p50 ms | p99 ms | FLOPs/step | FLOP limit ms | measured / limit "
        "| GFLOP/s | max abs logit diff vs torch |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for mode, m in r["by_decoding"].items():
        fl = m["flop_limit"]
        for backend, stats in m["backends_ms"].items():
            if stats is None:
                lines.append(f"| {mode} | {backend} | n/a | n/a | {fl['flops_per_step'] / 1e6:.1f}M "
                             f"| {fl['limit_ms']:.3f} | n/a | n/a | (not measured, below) |")  # fmt: skip
                continue
            diff = m["backend_max_abs_logit_diff"].get(backend)
            lines.append(
                f"| {mode} | {backend} | {stats['p50']:.2f} | {stats['p99']:.2f} | {fl['flops_per_step'] / 1e6:.1f}M "
                f"| {fl['limit_ms']:.3f} | {fl['measured_over_limit'][backend]:.1f}x "
                f"| {fl['flops_per_step'] / stats['p50'] / 1e6:.1f} "
                f"| {'(reference)' if diff is None else f'{diff:.1e}'} |"
            )
        lines.append(
            f"| {mode} | recompute (torch) | {m['recompute_ms']['p50']:.2f} | {m['recompute_ms']['p99']:.2f} "
            f"| {fl['recompute_flops'] / 1e6:.1f}M | {fl['recompute_limit_ms']:.3f} "
            f"| {fl['recompute_measured_over_limit']:.1f}x "
            f"| {fl['recompute_flops'] / m['recompute_ms']['p50'] / 1e6:.1f} | |"
        )
    return lines


def format_markdown(r: dict) -> str:
    c = r["config"]

    def cell(stats):
        return "n/a" if stats is None else f"{stats['p50']:.2f} / {stats['p99']:.2f}"

    lines = [
        f"### Control-step latency (ms, p50 / p99): d_model {c['d_model']}, {c['n_layer']} layers, "
        f"{c['n_head']} heads, d_ff {c['d_ff']}, window {c['window']}, {r['tokens_per_step']} tokens/step "
        f"({r['window_tokens']} in the window), {r['threads']} thread(s), {r['device']}, torch {r['torch']}",
        "",
        "| our decoding | passes | streaming | recompute | GPT-2 token at a time | GPT-2 one pass "
        "| recompute / streaming | GPT-2 tok / streaming | GPT-2 one pass / streaming | max abs diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, m in r["by_decoding"].items():
        sp = m["speedup_p50"]

        def ratio(key, sp=sp):
            return "n/a" if sp.get(key) is None else f"{sp[key]:.1f}x"

        one_pass = m.get("hf_gpt2_one_pass_ms") if mode == "parallel" else m["hf_gpt2_ms"]
        lines.append(
            f"| {mode} | {m['forward_passes_per_step']} | {cell(m['streaming_ms'])} | {cell(m['recompute_ms'])} "
            f"| {cell(m['hf_gpt2_ms'])} | {cell(one_pass) if mode == 'parallel' else '(same)'} "
            f"| {ratio('recompute_over_streaming')} | {ratio('hf_gpt2_over_streaming')} "
            f"| {ratio('hf_gpt2_one_pass_over_streaming') if mode == 'parallel' else '(same)'} "
            f"| {m['max_abs_diff']:.1e} |"
        )
    lines += _backend_table(r)
    lines.append("")
    for mode, m in r["by_decoding"].items():
        reasons = {}
        for backend, why in m["backend_reasons"].items():  # the same reason for fp32 and int8: say it once
            reasons.setdefault(why, []).append(backend)
        lines += [f"{mode}, {', '.join(names)} not measured: {why}" for why, names in reasons.items()]
    for mode, m in r["by_decoding"].items():
        fl = m["flop_limit"]
        gpt = (
            f", GPT-2 token at a time / fastest {fl['hf_gpt2_over_fastest']:.1f}x"
            if "hf_gpt2_over_fastest" in fl
            else ""
        )
        lines.append(
            f"{mode}: fastest backend {fl['fastest_backend']}; recompute / streaming: FLOPs "
            f"{fl['flop_ratio_recompute_over_streaming']:.1f}x, "
            f"time {fl['time_ratio_recompute_over_streaming']:.1f}x{gpt}."
        )
    roll = r["eviction_ms"]["roll_step_region"]["p50"]
    lines += [
        "",
        f"Eviction: the ring buffer moves no data; rolling the step region instead costs {roll:.3f} ms/step.",
        f"Load average at start: {r['loadavg_1min_at_start']:.2f} on {r['cpu_count']} CPUs.",
    ]
    if r.get("hf_gpt2_reason"):
        lines.append(f"HF GPT-2 not measured: {r['hf_gpt2_reason']}")
    return "\n".join(lines) + "\n"
