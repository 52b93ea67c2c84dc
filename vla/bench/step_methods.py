"""The ways a control step can run, as timed methods over one synthetic episode (vla-bench latency and plan).

Each method is a callable `method(t)` that runs control step t of a `SyntheticEpisode` (random inputs of the
real shapes, the same for every method): our streaming step on torch, the exported step graph on onnxruntime,
full recomputation of the window, and Hugging Face GPT-2 with its own cache as the peer. `time_interleaved`
lets them take turns step by step, so a change in machine load hits them alike.
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path

import numpy as np
import torch

from vla.model import ActionTransformer, TokenLayout


def matmul_peak(device: torch.device, seconds: float = 1.0, n: int = 1024) -> float:
    """Best fp32 matmul rate (FLOP/s) over repeated n x n products at the current thread count: the
    arithmetic ceiling the FLOP limit divides by."""
    n = 4096 if device.type == "cuda" else n
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    for _ in range(3):
        a @ b
    sync(device)
    best, end = 0.0, time.perf_counter() + seconds
    while best == 0.0 or time.perf_counter() < end:  # at least one timed round
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        sync(device)
        best = max(best, 4 * 2 * n**3 / (time.perf_counter() - t0))
    return best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ms_summary(samples: list[float]) -> dict:
    a = np.asarray(samples) * 1e3
    return {
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "mean": float(a.mean()),
        "min": float(a.min()),
    }


class SyntheticEpisode:
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


class Streaming:
    """Our model with its ring-buffer KV cache: one `step` per control step."""

    def __init__(self, model, ep: SyntheticEpisode, device):
        self.model, self.ep = model, ep
        self.cache = model.new_cache(1, device)
        model.start(self.cache, ep.instruction)
        self.logits: list[torch.Tensor] = []  # (1, chunk*A, bins) per step, for the other backends' difference

    def __call__(self, t: int) -> None:
        ep = self.ep
        out = self.model.step(self.cache, ep.image[:, t], ep.proprio[:, t], ep.timestep[:, t])
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


class OnnxStreaming:
    """The exported graphs on onnxruntime (fp32 or int8) through `OnnxStreamer`, the runtime
    `load_policy(..., backend="onnxruntime")` steps with. Inputs are numpy arrays prepared outside the timer."""

    def __init__(self, export_dir: Path, model, ep: SyntheticEpisode, threads: int, int8: bool):
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


class Recompute:
    """The same window from scratch, no cache (what an uncached policy does every step)."""

    def __init__(self, model, ep: SyntheticEpisode):
        self.model, self.ep = model, ep

    def __call__(self, t: int) -> None:
        ep, lo = self.ep, max(0, t - self.model.cfg.window + 1)
        self.model.recompute(
            ep.instruction,
            ep.image[:, lo : t + 1],  # (1, K, C, H, W, 3)
            ep.proprio[:, lo : t + 1],
            ep.timestep[:, lo : t + 1],
        )


class HFGPT2:
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


def onnx_methods(model, ep: SyntheticEpisode, backends: list[str], threads: int, device, workdir: Path):
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
    methods = {b: OnnxStreaming(workdir, model, ep, threads, b.endswith("int8")) for b in wanted}
    return methods, {}, seconds


def time_interleaved(methods: dict, n_steps: int, warmup: int, device) -> dict[str, list[float]]:
    """Seconds per step of each method after `warmup` steps; the methods take turns step by step, so a
    change in machine load hits them alike."""
    times = {name: [] for name in methods}
    for t in range(n_steps):
        for name, method in methods.items():
            sync(device)
            t0 = time.perf_counter()
            method(t)
            sync(device)
            if t >= warmup:
                times[name].append(time.perf_counter() - t0)
            if hasattr(method, "after"):
                method.after()
    return times
