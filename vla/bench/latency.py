"""Per-control-step latency: streaming KV cache vs full recomputation vs Hugging Face GPT-2's cache.

One control step = append one step's observation tokens and decode its action tokens, with the
window full (K steps; the oldest is evicted). Three ways, same model size and token counts:

- streaming: `ActionTransformer.step` on the constant-memory ring-buffer cache;
- recompute: `ActionTransformer.recompute`, the same window from scratch, no cache (autoregressive
  decoding needs one full pass per action token);
- hf_gpt2: `transformers.GPT2LMHeadModel` built from a `GPT2Config` of the same width, depth, heads
  and MLP width (random weights, nothing downloaded), fed `inputs_embeds` prepared outside the timer,
  with its `past_key_values` cache held at the same window length (the step's tokens are cropped
  off again after each timed step). It processes the same tokens per step the way a language model
  decodes actions: one call with the observation tokens (+ the token before the first action),
  then one call per further action token. That equals our autoregressive pass structure, so in that
  row the difference is per-call overhead only.
- hf_gpt2_one_pass (with our parallel decoding only): GPT-2 given the whole step in one call, the
  same single pass our parallel decoding makes: again a like-for-like overhead comparison.

The top level reports our parallel decoding (one pass per step) against the token-at-a-time GPT-2
peer; `by_decoding` has every pairing, matched ones included.

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

import inspect
import os
import platform
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from vla.cli import common as cli
from vla.config import apply_overrides, from_dict, load_yaml
from vla.errors import UserError
from vla.model import ActionTransformer, DataSpec, ModelConfig, TokenLayout
from vla.model.card import model_card

# The data of our tabletop tasks: 64x64 frames, 9 proprio values, 4 action dims, the named block's and its
# goal's positions as auxiliary targets (6); the vocabulary size does not change the step's cost.
TABLETOP = DataSpec(image_size=64, proprio_dim=9, action_dim=4, vocab_size=64, n_cameras=1, aux_dim=6)
# How a streaming step can run: torch eager (`ActionTransformer.step`), and the exported step graph
# (vla/export/graphs.py) on onnxruntime in fp32 and dynamically quantized to int8.
BACKENDS = ("torch", "onnxruntime", "onnxruntime-int8")


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


def matmul_peak(device: torch.device, seconds: float = 1.0, n: int = 1024) -> float:
    """Best fp32 matmul rate (FLOP/s) over repeated n x n products at the current thread count: the
    arithmetic ceiling the FLOP limit divides by."""
    n = 4096 if device.type == "cuda" else n
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    for _ in range(3):
        a @ b
    _sync(device)
    best, end = 0.0, time.perf_counter() + seconds
    while best == 0.0 or time.perf_counter() < end:  # at least one timed round
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        _sync(device)
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t0))
    return best


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stats(samples: list[float]) -> dict:
    a = np.asarray(samples) * 1e3
    return {
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "mean": float(a.mean()),
        "min": float(a.min()),
    }


class _Episode:
    """Random inputs for one episode (batch 1): the same for every method."""

    def __init__(self, lay: TokenLayout, n_steps: int, device: torch.device, seed: int):
        g = torch.Generator().manual_seed(seed)
        cfg, spec = lay.cfg, lay.spec
        n_words = max(2, cfg.instruction_len * 2 // 3)
        instr = torch.zeros(1, cfg.instruction_len, dtype=torch.long)
        instr[0, 0] = 1  # <bos>
        instr[0, 1:n_words] = torch.randint(2, spec.vocab_size, (n_words - 1,), generator=g)
        self.instruction = instr.to(device)  # (1, L), padded tail
        shape = (1, n_steps, spec.n_cameras, spec.image_size, spec.image_size, 3)
        self.image = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).to(device)  # (1, E, C, H, W, 3)
        self.proprio = torch.randn(1, n_steps, spec.proprio_dim, generator=g).to(device)  # (1, E, P)
        self.timestep = torch.arange(n_steps, device=device)[None]  # (1, E)
        self.n_steps = n_steps


class _Streaming:
    """Our model with its ring-buffer KV cache: one `step` per control step."""

    def __init__(self, model, ep: _Episode, device):
        self.model, self.ep = model, ep
        self.cache = model.new_cache(1, device)
        model.start(self.cache, ep.instruction)
        self.tokens: list[torch.Tensor] = []  # decoded (1, chunk*A) per step, for recompute's past actions
        self.logits: list[torch.Tensor] = []  # (1, chunk*A, bins) per step, for the other backends' difference

    def __call__(self, t: int) -> None:
        ep = self.ep
        out = self.model.step(self.cache, ep.image[:, t], ep.proprio[:, t], ep.timestep[:, t])
        self.tokens.append(out.tokens)
        self.logits.append(out.logits)


def export_step_graphs(model: ActionTransformer, instruction: torch.Tensor, out: Path, int8: bool = True) -> float:
    """prefix.onnx, mask.onnx, step.onnx (and with `int8` step.int8.onnx) of a model: vla-export's graphs,
    without a checkpoint's tokenizers; returns the seconds it took. Raises vla.export.graphs.ExportError for what
    cannot be exported."""
    import copy

    from vla.export.graphs import check_exportable, export_graphs, quantize_step

    model = copy.deepcopy(model).float().cpu().eval()
    check_exportable(model)
    t0 = time.perf_counter()
    export_graphs(model, instruction.cpu(), out)
    if int8:
        quantize_step(out)
    return time.perf_counter() - t0


class _OnnxStreaming:
    """The exported graphs on onnxruntime (fp32 or int8) through `OnnxStreamer`, the runtime
    `load_policy(..., backend="onnxruntime")` steps with. Inputs are numpy arrays prepared outside the timer."""

    def __init__(self, export_dir: Path, model, ep: _Episode, threads: int, int8: bool):
        from vla.export.graphs import GRAPH_FILES
        from vla.policy.onnx_policy import OnnxStreamer

        ring = (model.cfg.instruction_len, model.cfg.window, model.layout.tokens_per_step)
        self.streamer = OnnxStreamer(export_dir, GRAPH_FILES, ring, threads, int8)
        self.streamer.start(ep.instruction.cpu().numpy())
        self.image = ep.image.cpu().numpy()  # (1, E, C, H, W, 3)
        self.proprio = ep.proprio.cpu().numpy().astype(np.float32)  # (1, E, P)
        self.logits: list[np.ndarray] = []  # (1, chunk*A, bins) per step

    def __call__(self, t: int) -> None:
        self.logits.append(self.streamer.step(self.image[:, t], self.proprio[:, t], np.array([t], np.int64)))


class _Recompute:
    """The same window from scratch, no cache (what an uncached policy does every step)."""

    def __init__(self, model, ep: _Episode, streaming: _Streaming):
        self.model, self.ep, self.streaming = model, ep, streaming

    def __call__(self, t: int) -> None:
        ep, lo = self.ep, max(0, t - self.model.cfg.window + 1)
        self.model.recompute(
            ep.instruction,
            ep.image[:, lo : t + 1],  # (1, K, C, H, W, 3)
            ep.proprio[:, lo : t + 1],
            ep.timestep[:, lo : t + 1],
        )


class _HFGPT2:
    """transformers' GPT2LMHeadModel of the same size with its own KV cache (random weights)."""

    def __init__(self, lay: TokenLayout, n_steps: int, device, seed: int, one_pass: bool):
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel

        transformers.logging.set_verbosity_error()
        torch.manual_seed(seed)
        cfg = lay.cfg
        gcfg = GPT2Config(
            vocab_size=cfg.action_bins,
            n_positions=max(1024, lay.n_tokens),
            n_embd=cfg.d_model,
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            n_inner=cfg.d_ff,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=None,
            eos_token_id=None,
        )
        gcfg._attn_implementation = "sdpa"
        self.gpt = GPT2LMHeadModel(gcfg).to(device).eval()
        self.version = transformers.__version__
        S, self.S, self.CA = lay.tokens_per_step, lay.tokens_per_step, lay.n_action_tokens
        # token at a time (as a language model decodes): observation tokens + the previous token in one
        # call, then one call per further action token; one_pass: the whole step in one call
        self.first = S if one_pass else lay.n_obs_tokens + 1
        g = torch.Generator().manual_seed(seed)
        self.obs = torch.randn(n_steps, 1, self.first, cfg.d_model, generator=g).to(device)  # (E, 1, first, d)
        prefix = torch.randn(1, lay.n_tokens - S, cfg.d_model, generator=g).to(device)  # instruction + K-1 steps
        # transformers >= 5.2x names the cache argument `cache`; earlier versions `past_key_values`
        self.key = "cache" if "cache" in inspect.signature(self.gpt.forward).parameters else "past_key_values"
        with torch.inference_mode():
            out = self.gpt(inputs_embeds=prefix, use_cache=True)
        self.pkv = out[self.key] if self.key in out else out["past_key_values"]

    @torch.inference_mode()
    def __call__(self, t: int) -> None:
        gpt, kw = self.gpt, {self.key: self.pkv}
        out = gpt(inputs_embeds=self.obs[t], use_cache=True, **kw)
        tok = out.logits[:, -1].argmax(-1)  # (1,)
        if self.first < self.S:
            for _ in range(self.CA - 1):
                out = gpt(inputs_embeds=gpt.transformer.wte(tok)[:, None], use_cache=True, **kw)  # (1, 1, d) in
                tok = out.logits[:, -1].argmax(-1)

    def after(self) -> None:
        """Untimed: drop the step's tokens again so the cache stays at the window's length."""
        self.pkv.crop(-self.S)  # negative = number of tokens to remove (transformers 4.x and 5.x)


def _equivalence(model, ep: _Episode, device) -> tuple[float, bool]:
    """Max |streaming - recompute| logit difference and whether every decoded token matches."""
    K = model.cfg.window
    cache = model.new_cache(1, device)
    model.start(cache, ep.instruction)
    worst, same, tokens = 0.0, True, []
    for t in range(ep.n_steps):
        out = model.step(cache, ep.image[:, t], ep.proprio[:, t], ep.timestep[:, t])
        tokens.append(out.tokens)
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
        _sync(device)
        t0 = time.perf_counter()
        kv[..., L:, :] = torch.roll(kv[..., L:, :], -S, dims=-2)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def onnx_methods(model, ep: _Episode, backends: list[str], threads: int, device, workdir: Path):
    """The requested onnxruntime backends as timed methods, and why any of them cannot run here."""
    wanted = [b for b in backends if b != "torch"]
    if not wanted:
        return {}, {}, None
    try:
        import onnxruntime  # noqa: F401 - the `export` extra
    except ImportError as e:
        return {}, {b: f"onnxruntime is not importable ({e}); install the `export` extra" for b in wanted}, None
    from vla.export.graphs import ExportError

    try:
        seconds = export_step_graphs(model, ep.instruction, workdir, int8="onnxruntime-int8" in wanted)
    except ExportError as e:
        return {}, {b: f"not exportable: {e}" for b in wanted}, None
    methods = {b: _OnnxStreaming(workdir, model, ep, threads, b.endswith("int8")) for b in wanted}
    return methods, {}, seconds


def time_interleaved(methods: dict, n_steps: int, warmup: int, device) -> dict[str, list[float]]:
    """Seconds per step of each method after `warmup` steps; the methods take turns step by step, so a
    change in machine load hits them alike."""
    times = {name: [] for name in methods}
    for t in range(n_steps):
        for name, method in methods.items():
            _sync(device)
            t0 = time.perf_counter()
            method(t)
            _sync(device)
            if t >= warmup:
                times[name].append(time.perf_counter() - t0)
            if hasattr(method, "after"):
                method.after()
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
    ep = _Episode(lay, warmup + args.steps, device, args.seed)
    streaming = _Streaming(model, ep, device)
    methods = {"streaming": streaming, "recompute": _Recompute(model, ep, streaming)}
    hf_reason = None
    try:
        methods["hf_gpt2"] = _HFGPT2(lay, warmup + args.steps, device, args.seed, one_pass=False)
        # GPT-2 given our parallel slots: the same single pass
        methods["hf_gpt2_one_pass"] = _HFGPT2(lay, warmup + args.steps, device, args.seed, one_pass=True)
    except ImportError as e:  # an optional extra: `pip install -e .[bench]`
        hf_reason = f"transformers is not importable ({e}); install the `bench` extra"
    with tempfile.TemporaryDirectory(prefix="vla-bench-onnx-") as tmp:
        onnx, reasons, export_s = onnx_methods(model, ep, backends, torch.get_num_threads(), device, Path(tmp))
        times = time_interleaved({**methods, **onnx}, warmup + args.steps, warmup, device)
    n_eq = args.equivalence_steps if args.equivalence_steps is not None else 5 * K
    diff, same = _equivalence(model, _Episode(lay, n_eq, device, args.seed + 1), device)
    res = {
        "streaming_ms": _stats(times["streaming"]),
        "recompute_ms": _stats(times["recompute"]),
        "hf_gpt2_ms": _stats(times["hf_gpt2"]) if "hf_gpt2" in times else None,
        "max_abs_diff": diff,
        "tokens_identical": same,
        "equivalence_steps": n_eq,
        "forward_passes_per_step": 1,
        # the streaming step per backend ("torch" is `streaming_ms`); null with a reason where it cannot run
        "backends_ms": {
            b: _stats(times["streaming" if b == "torch" else b]) if b not in reasons else None for b in backends
        },  # fmt: skip
        "backend_reasons": reasons,
        "backend_max_abs_logit_diff": {b: logit_difference(streaming.logits, m.logits) for b, m in onnx.items()},
        "export_seconds": export_s,
    }
    if "hf_gpt2_one_pass" in times:
        res["hf_gpt2_one_pass_ms"] = _stats(times["hf_gpt2_one_pass"])
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
        "eviction_ms": {"ring_buffer": 0.0, "roll_step_region": _stats(_time_roll(lay, device))},
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
