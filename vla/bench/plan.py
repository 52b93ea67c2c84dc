"""Latency-budget planner: which model sizes fit a control rate's budget on this machine, and their FLOPs.

    vla-bench plan --hz 20 --budget-ms 10 --threads 1

Candidates are the demo model (ModelConfig defaults, our tabletop data sizes) over a small grid of
window K, chunk, width (d_model; heads of 32 features, MLP 4x wide) and depth (n_layer). Each is built
with random weights (latency does not depend on the values) and its streaming control step is timed
on each backend (torch eager, the exported step graph on onnxruntime fp32 and int8) with the window
full, the backends taking turns step by step. A candidate fits on a backend when its p99 times the
safety margin is within the budget: p99 leaves out 1 step in 100, the margin covers what a benchmark
does not see (observation preprocessing, other processes, a hotter or busier robot computer).
FLOPs per step are the model card's (vla/model/card.py, checked against torch's FlopCounterMode).
"""

from __future__ import annotations

import itertools
import os
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm import tqdm

from vla.bench.latency import (
    TABLETOP,
    add_backend_argument,
    add_peak_argument,
    check_peak_seconds,
    parse_backends,
)
from vla.bench.step_methods import Streaming, SyntheticEpisode, matmul_peak, ms_summary, onnx_methods, time_interleaved
from vla.cli import common as cli
from vla.errors import UserError
from vla.model import ActionTransformer, ModelConfig, TokenLayout
from vla.model.card import model_card

HEAD_DIM = 32  # features per attention head (the demo's 128 / 4)


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise UserError(f"{flag} {text!r}: give positive integers, comma-separated (e.g. 2,8)")
    return list(dict.fromkeys(values))


def add_arguments(p) -> None:
    p.add_argument("--hz", type=float, required=True, help="control rate, Hz (the period 1000/hz ms caps the budget)")
    p.add_argument("--budget-ms", type=float, default=None, help="time a control step may take, ms (default: period)")
    p.add_argument("--margin", type=float, default=1.5, help="safety factor on p99: fits if p99*margin <= budget")
    p.add_argument("--window", default="2,8", help="window sizes K to try, comma-separated (default 2,8)")
    p.add_argument("--chunk", default="1,4", help="action chunk lengths to try (default 1,4)")
    p.add_argument("--width", default="64,128,256", help="d_model values to try (multiples of 32; default 64,128,256)")
    p.add_argument("--depth", default="4", help="n_layer values to try (default 4)")
    p.add_argument("--steps", type=int, default=40, help="timed control steps per candidate and backend (default 40)")
    p.add_argument("--threads", type=int, default=None, help="torch / onnxruntime threads (default: usable cores)")
    add_backend_argument(p)
    add_peak_argument(p)
    p.add_argument("--image-size", type=int, default=TABLETOP.image_size, help="camera image side, px (default 64)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, auto (default cpu, a robot's computer)")
    p.add_argument("--seed", type=int, default=0)


def candidates(args) -> list[ModelConfig]:
    """The grid: every (window, chunk, width, depth), other settings the demo's."""
    grid = itertools.product(
        _ints(args.window, "--window"),
        _ints(args.chunk, "--chunk"),
        _ints(args.width, "--width"),
        _ints(args.depth, "--depth"),
    )
    out = []
    for window, chunk, width, depth in grid:
        if width % HEAD_DIM:
            raise UserError(f"--width {width}: must be a multiple of {HEAD_DIM} (heads of {HEAD_DIM} features)")
        out.append(
            replace(
                ModelConfig(),
                window=window,
                chunk=chunk,
                d_model=width,
                n_head=width // HEAD_DIM,
                d_ff=4 * width,
                n_layer=depth,
            )
        )
    return out


def measure(cfg: ModelConfig, spec, backends: list[str], steps: int, threads: int, seed: int, device) -> dict:
    """p50/p99 of the streaming step per backend (None + reason where one cannot run)."""
    torch.manual_seed(seed)
    model = ActionTransformer(cfg, spec).to(device).for_inference()  # as load_policy builds it
    warmup = cfg.window + 3  # window full, caches and allocator warm
    ep = SyntheticEpisode(model.layout, warmup + steps, device, seed)
    methods = {"torch": Streaming(model, ep, device)} if "torch" in backends else {}
    with tempfile.TemporaryDirectory(prefix="vla-plan-") as tmp:
        onnx, reasons, _ = onnx_methods(model, ep, backends, threads, device, Path(tmp))
        times = time_interleaved({**methods, **onnx}, warmup + steps, warmup, device)
    latency = {b: (ms_summary(times[b]) if b in times else None) for b in backends}
    return {"latency_ms": latency, "reasons": reasons, "parameters": model.num_params()}


def run(args) -> dict:
    if args.hz <= 0:
        raise UserError(f"--hz must be > 0, got {args.hz}")
    period = 1000.0 / args.hz
    budget = period if args.budget_ms is None else args.budget_ms
    if budget <= 0 or budget > period:
        raise UserError(f"--budget-ms {budget:g} must be in (0, {period:g}]: the control period at {args.hz:g} Hz")
    if args.margin < 1:
        raise UserError(f"--margin {args.margin:g} must be >= 1 (a factor on p99)")
    if args.steps < 1:
        raise UserError(f"--steps must be at least 1, got {args.steps}")
    check_peak_seconds(args.peak_seconds)
    backends = parse_backends(args.backend)
    device = cli.device(args.device) or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = args.threads if args.threads is not None else usable
    torch.set_num_threads(threads)
    try:
        spec = replace(TABLETOP, image_size=args.image_size)
    except ValueError as e:
        raise UserError(f"--image-size {args.image_size}: {e}") from None
    grid = candidates(args)
    for cfg in grid:  # an image side the patches do not tile, or a bad size: one line, before any timing
        try:
            TokenLayout(cfg, spec)
        except ValueError as e:
            raise UserError(f"--image-size {args.image_size}: {e}") from None
    load = os.getloadavg()[0]
    peak_before = matmul_peak(device, args.peak_seconds)  # the better of before / after, as vla-bench latency does
    rows = []
    for cfg in tqdm(grid, desc="vla-bench plan", unit="model"):
        card = model_card(cfg, spec)
        m = measure(cfg, spec, backends, args.steps, threads, args.seed, device)
        flops = card["flops"]["per_control_step_streaming"]
        fits = {b: None if s is None else s["p99"] * args.margin <= budget for b, s in m["latency_ms"].items()}
        timed = {b: s["p99"] for b, s in m["latency_ms"].items() if s is not None}
        rows.append(
            {
                "config": {
                    "window": cfg.window,
                    "chunk": cfg.chunk,
                    "d_model": cfg.d_model,
                    "n_layer": cfg.n_layer,
                    "n_head": cfg.n_head,
                    "d_ff": cfg.d_ff,
                },
                "tokens_per_step": card["tokens"]["per_step"],
                "window_tokens": card["tokens"]["window_stream"],
                "parameters": m["parameters"],
                "flops_per_step": flops,
                "latency_ms": m["latency_ms"],
                "backend_reasons": m["reasons"],
                "fits": fits,
                "fits_any": any(fits.values()),
                "best_backend": min(timed, key=timed.get) if timed else None,
            }
        )
    peak = max(peak_before, matmul_peak(device, args.peak_seconds))
    for row in rows:
        row["flop_limit_ms"] = row["flops_per_step"] / peak * 1e3
    return {
        "hz": args.hz,
        "period_ms": period,
        "budget_ms": budget,
        "margin": args.margin,
        "rule": "fits = p99 * margin <= budget_ms",
        "backends": backends,
        "candidates": rows,
        "base_config": asdict(ModelConfig()),
        "data_spec": asdict(spec),
        "steps": args.steps,
        "threads": torch.get_num_threads(),
        "matmul_peak_flops_per_s": peak,
        "cpu_count": os.cpu_count(),
        "loadavg_1min_at_start": load,
        "device": str(device),
        "torch": torch.__version__,
    }


def format_markdown(r: dict) -> str:
    backends = r["backends"]
    lines = [
        f"### Latency plan: {r['hz']:g} Hz (period {r['period_ms']:.1f} ms), budget {r['budget_ms']:g} ms, "
        f"fits = p99 x {r['margin']:g} <= budget; {r['threads']} thread(s), {r['device']}, torch {r['torch']}",
        "",
        "| window | chunk | d_model | layers | params | tokens/step | MFLOPs/step | FLOP limit ms | "
        + " | ".join(f"{b} p50 / p99 ms" for b in backends)
        + " | fits on |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(backends) + "---|",
    ]
    for row in r["candidates"]:
        c = row["config"]
        cells = []
        for b in backends:
            s = row["latency_ms"][b]
            cells.append("n/a" if s is None else f"{s['p50']:.2f} / {s['p99']:.2f}")
        fits = ", ".join(b for b in backends if row["fits"][b]) or "none"
        lines.append(
            f"| {c['window']} | {c['chunk']} | {c['d_model']} | {c['n_layer']} | {row['parameters'] / 1e6:.2f}M "
            f"| {row['tokens_per_step']} | {row['flops_per_step'] / 1e6:.1f} | {row['flop_limit_ms']:.2f} | "
            + " | ".join(cells)
            + f" | {fits} |"
        )
    reasons = {b: why for row in r["candidates"] for b, why in row["backend_reasons"].items()}
    lines += [""] + [f"{b} not measured: {why}" for b, why in reasons.items()]
    lines.append(
        f"FLOP limit = model-card FLOPs / fp32 matmul peak {r['matmul_peak_flops_per_s'] / 1e9:.1f} GFLOP/s "
        f"(this run). Load average at start: {r['loadavg_1min_at_start']:.2f} on {r['cpu_count']} CPUs."
    )
    return "\n".join(lines) + "\n"
