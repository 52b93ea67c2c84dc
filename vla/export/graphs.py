"""vla-export: the streaming policy as three ONNX graphs and a JSON manifest, runnable without torch.

    vla-export --checkpoint runs/demo                      # writes runs/demo/export/
    policy = load_policy("runs/demo", backend="onnxruntime")

Files written (`--out`, default CHECKPOINT/export/):
- prefix.onnx: instruction ids (1, L) -> every layer's KV buffer with the instruction prefix's keys/values
  at [0, L) (zeros elsewhere), the instruction's validity, and the FiLM conditioning of the stem (every
  stage's per-channel scale and shift and the keypoint queries) when the model has FiLM.
- mask.onnx: the ring's state after a step's advance (slot timesteps and validity, the instruction's
  validity, the step's timestep and slot) -> that step's attention mask, by the model's one rule. It
  depends on nothing else, so the runtime computes it once per distinct ring state and reuses it.
- step.onnx: one control step: image (1, C, H, W, 3) uint8, proprio (1, P) normalized, timestep (1,),
  the mask, the FiLM conditioning, and each layer's K and V buffer -> action logits (1, chunk*A, bins) and
  each layer's keys and values of this step, which the runtime writes into the step's ring slot: the ring
  bookkeeping of `KVCache` (which slot, eviction) lives in the runtime, `vla.policy.onnx_policy.OnnxStreamer`.
- manifest.json: graph inputs/outputs (names, shapes, dtypes), the tokenizers, proprio normalization,
  action decoding (bin centres, readout), the policy and model configurations, and the parity figures.

Why three graphs and not one: the mask computed inside the step graph and rewriting the whole KV buffer
were a large share of a step (docs/benchmarks.md); as a memoized graph and an appended key block they
cost nothing per step. Inside the step graph every op is paid per call (onnxruntime's small kernels cost
microseconds each whatever their size), so the graph is batch-free (2-D activations: a linear layer is
one Gemm, no reshapes around it), takes one K and one V per layer (no slicing of a stacked buffer) and
reads the FiLM scales, shifts and queries computed once in the prefix graph.

The graphs are thin wrappers around the model's own submodules (embeddings, patch embed, blocks, head)
that compute what `start` / `step` compute with the KV cache as explicit tensors instead of a buffer
written in place. Export refuses (exit 2) what it cannot reproduce faithfully: a Hugging Face text or
image encoder inside the model. At the end, short rollouts of every
tabletop task compare the exported policy's actions with PyTorch's (`--parity-steps`, 0 to skip).
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from vla.model import ActionTransformer
from vla.model.config import PAD_ID
from vla.model.transformer import Block, TokenCoords, attention_weights, ring_coords, ring_layout
from vla.policy.onnx_policy import MANIFEST_VERSION

# the files an export writes (the int8 step only with --int8), by the names the manifest gives them
GRAPH_FILES = {"prefix": "prefix.onnx", "mask": "mask.onnx", "step": "step.onnx", "step_int8": "step.int8.onnx"}
PARITY_TOL = 1e-4  # fp32 actions, max abs difference over the parity rollouts


class ExportError(ValueError):
    """The checkpoint holds something this exporter cannot reproduce faithfully."""


def check_exportable(model: ActionTransformer, policy_config=None) -> None:
    cfg = model.cfg
    if cfg.text_encoder:
        raise ExportError(
            f"model.text_encoder={cfg.text_encoder!r} cannot be exported: the prefix graph would have to carry the "
            "Hugging Face encoder; run this policy with the torch backend"
        )
    if cfg.vision_encoder:
        raise ExportError(
            f"model.vision_encoder={cfg.vision_encoder!r} cannot be exported: the step graph would have to carry the "
            "Hugging Face image model, which this exporter neither traces nor checks; run this policy with the torch "
            "backend"
        )


def _block(block: Block, x, mask, cache=None, rows: slice | None = None):
    """`Block.forward` for batch 1 with the keys/values given explicitly: x (n, d) the block input, mask
    (H|1, n, N + n), cache (k, v) (H, N, hd) each the keys before this input's own (None: there are none)
    -> the output (n|r, d) and this input's keys/values (H, n, hd) each. Batch-free 2-D tensors: every
    linear layer is one Gemm, with no reshapes around it, and the runtime keeps one K and one V per layer."""
    a = block.attn
    q, k_new, v_new = _qkv(block, x)  # (H, n, hd) each
    k, v = (k_new, v_new) if cache is None else (torch.cat([cache[0], k_new], 1), torch.cat([cache[1], v_new], 1))
    if rows is not None:
        q, mask, x = q[:, rows], mask[:, rows], x[rows]  # (H, r, hd), (H|1, r, N + n), (r, d)
    y = attention_weights(q, k, mask, floor=80.0) @ v  # (H, r, hd): the model's attention, denormal-free
    y = y.transpose(0, 1).reshape(q.shape[1], -1)  # (r, d)
    x = x + a.c_proj(y)
    return x + block.mlp(block.ln_2(x)), (k_new, v_new)


def _qkv(block: Block, x):
    """(n, d) -> the block's queries, keys and values of its normed input, (H, n, hd) each."""
    a = block.attn
    qkv = a.c_attn(block.ln_1(x)).view(x.shape[0], 3 * a.n_head, a.head_dim).transpose(0, 1)  # (3H, n, hd)
    return qkv.split(a.n_head, dim=0)


class PrefixGraph(nn.Module):
    """`ActionTransformer.start` as a function: instruction ids (1, L) -> the KV buffer of every layer with
    the prefix's keys/values at [0, L) (zeros elsewhere), the instruction's validity (and the FiLM
    conditioning of the stem, `ActionTransformer.instruction_context`)."""

    def __init__(self, model: ActionTransformer):
        super().__init__()
        self.model = model

    def forward(self, instruction: torch.Tensor):
        m, cfg = self.model, self.model.cfg
        B, L = instruction.shape
        N = m.layout.n_tokens
        valid = instruction != PAD_ID  # (B, L)
        prefix = TokenCoords(
            pos=torch.arange(L),
            slot=torch.full((L,), -1, dtype=torch.long),
            index=torch.arange(L),
            time=torch.zeros(B, L, dtype=torch.long),
            valid=valid,
        )
        mask = m.mask(prefix, prefix)[0]  # (1, L, L)
        embedded = m.embed_instruction(instruction)  # (B, L, d)
        x = embedded[0]  # (L, d)
        layers = []
        for block in m.blocks:
            x, kv = _block(block, x, mask)
            layers.append(torch.stack(kv))  # (2, H, L, hd)
        kv = torch.stack(layers)[:, :, None]  # (n_layer, 2, 1, H, L, hd)
        kv = F.pad(kv, (0, 0, 0, N - L))  # (n_layer, 2, B, H, N, hd): the K step slots empty
        state = [kv, valid]
        if cfg.film:
            state.append(m.instruction_context(instruction, embedded).flat())  # (B, F): the parts side by side
        return tuple(state)


def step_key_coords(model: ActionTransformer, instr_valid, slot_timestep, slot_valid, timestep, slot) -> TokenCoords:
    """The keys a step attends to in the exported graphs: the whole buffer (`KVCache.coords`' layout) with
    this step's slot hidden (it still holds the evicted step), followed by this step's own S tokens.
    `slot_timestep` / `slot_valid` (B, K) are after this step's KVCache.advance; slot (1,)."""
    L, K, S = model.cfg.instruction_len, model.cfg.window, model.layout.tokens_per_step
    B = instr_valid.shape[0]
    evicted = torch.arange(K) == slot  # (K,)
    buffer = ring_coords(ring_layout(L, K, S), instr_valid, slot_timestep, slot_valid & ~evicted)
    own = TokenCoords(  # this step's tokens, after the buffer
        pos=L + K * S + torch.arange(S),
        slot=slot.expand(S),
        index=torch.arange(S),
        time=timestep[:, None].expand(B, S),
        valid=torch.ones(B, S, dtype=torch.bool),
    )
    return TokenCoords(*(torch.cat([getattr(buffer, f.name), getattr(own, f.name)], -1) for f in fields(TokenCoords)))


class MaskGraph(nn.Module):
    """The attention mask of one streaming step (the model's one rule, `ActionTransformer.mask`), as a graph of
    its own: it changes only with the ring's state, so the runtime runs it once per distinct state and keeps
    the result (`vla.policy.onnx_policy.OnnxStreamer`). Inputs after this step's advance; out (B, H|1, S, N + S)."""

    def __init__(self, model: ActionTransformer):
        super().__init__()
        check_exportable(model)
        self.model = model

    def forward(self, instr_valid, slot_timestep, slot_valid, timestep, slot):
        keys = step_key_coords(self.model, instr_valid, slot_timestep, slot_valid, timestep, slot)
        N = keys.pos.shape[0] - self.model.layout.tokens_per_step
        return self.model.mask(keys.select(slice(N, None)), keys)


class StepGraph(nn.Module):
    """`ActionTransformer.step` (parallel decoding) as a function: image (1, C, H, W, 3) uint8, proprio
    (1, P), timestep (1,), the step's mask (MaskGraph, (H|1, S, N + S)), the FiLM conditioning, then each
    layer's K and V buffer (H, N, hd) -> logits (1, chunk*A, bins) and each layer's keys and values of this
    step (H, S, hd), which the runtime writes into the step's ring slot. The queries attend to [buffer |
    own keys] (the mask hides the slot's old step), so the graph holds no scatter and copies no buffer."""

    def __init__(self, model: ActionTransformer):
        super().__init__()
        check_exportable(model)
        self.model = model

    def forward(self, image, proprio, timestep, mask, *state):
        """state: the FiLM conditioning (B, F) when the model has FiLM, then k0, v0, k1, ... (H, N, hd)."""
        m, lay = self.model, self.model.layout
        n_obs, S = lay.n_obs_tokens, lay.tokens_per_step
        film, kv = (m.patch_embed.film_from_flat(state[0]), state[1:]) if m.cfg.film else (None, state)
        h = m.embed_steps(image[:, None], proprio[:, None], film).x[0, 0]  # (1, 1, S, d) -> (S, d)
        new_kv = []
        for i, block in enumerate(m.blocks):
            rows = slice(n_obs, S) if i == len(m.blocks) - 1 else None
            h, new = _block(block, h, mask, kv[2 * i : 2 * i + 2], rows)
            new_kv += new
        return m.head(m.ln_f(h))[None], *new_kv  # (1, chunk*A, bins), then (H, S, hd) per layer: K, V


def prefix_outputs(model: ActionTransformer) -> list[str]:
    return ["kv", "instr_valid", "film"] if model.cfg.film else ["kv", "instr_valid"]


def kv_names(model: ActionTransformer, prefix: str = "") -> list[str]:
    """The step graph's per-layer key/value inputs (k0, v0, k1, ...) or outputs (prefix "new_")."""
    return [f"{prefix}{kind}{i}" for i in range(model.cfg.n_layer) for kind in "kv"]


def export_graphs(model: ActionTransformer, instruction: torch.Tensor, out: Path) -> None:
    """prefix.onnx, mask.onnx and step.onnx of a model (fp32, CPU), traced with `instruction` (1, L)."""
    spec, K = model.spec, model.cfg.window
    names = prefix_outputs(model)
    with torch.no_grad():
        prefix = PrefixGraph(model)
        _onnx_export(prefix, (instruction,), out / GRAPH_FILES["prefix"], ["instruction"], names)
        kv, instr_valid, *film = prefix(instruction)
        timestep, slot = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
        ring = (torch.zeros(1, K, dtype=torch.long), torch.zeros(1, K, dtype=torch.bool))
        mask_inputs = ["instr_valid", "slot_timestep", "slot_valid", "timestep", "slot"]
        _onnx_export(
            MaskGraph(model), (instr_valid, *ring, timestep, slot), out / GRAPH_FILES["mask"], mask_inputs, ["mask"]
        )
        mask = MaskGraph(model)(instr_valid, *ring, timestep, slot)[0]  # (H|1, S, N + S)
        image = torch.zeros(1, spec.n_cameras, spec.image_size, spec.image_size, 3, dtype=torch.uint8)
        layers = kv[:, :, 0].flatten(0, 1).unbind(0)  # k0, v0, k1, ...: (H, N, hd) each
        _onnx_export(
            StepGraph(model),
            (image, torch.zeros(1, spec.proprio_dim), timestep, mask, *film, *layers),
            out / GRAPH_FILES["step"],
            ["image", "proprio", "timestep", "mask", *(["film"] if film else []), *kv_names(model)],
            ["logits", *kv_names(model, "new_")],
        )


def _io(path: Path) -> dict:
    """Names, shapes and element types of an ONNX graph's inputs and outputs."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph

    def describe(values):
        out = []
        for v in values:
            t = v.type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
            out.append({"name": v.name, "shape": [d.dim_value for d in t.shape.dim], "dtype": dtype})
        return out

    return {"inputs": describe(graph.input), "outputs": describe(graph.output)}


def quantize_step(out: Path) -> None:
    """out/step.onnx -> out/step.int8.onnx: weights int8, activations quantized per call (no calibration)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()  # it suggests "pre-processing" on the root logger, every time
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(
            str(out / GRAPH_FILES["step"]), str(out / GRAPH_FILES["step_int8"]), weight_type=QuantType.QInt8
        )
    finally:
        root.setLevel(level)


def _onnx_export(module: nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str]) -> None:
    # The TorchScript-based exporter: fixed shapes need no dynamo/onnxscript, and it exports this torch's
    # SDPA with a float mask (opset >= 14). Its tracer warnings (shapes read as Python numbers, advanced
    # indexing, slices it cannot constant-fold) are about dynamic shapes, which these graphs do not have.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, args, str(path), input_names=inputs, output_names=outputs, opset_version=17, dynamo=False
        )


def export_policy(policy, out: str | Path, int8: bool = False) -> dict:
    """Write prefix.onnx, step.onnx and manifest.json for a torch `Policy`; returns the manifest."""
    from dataclasses import asdict

    model = policy.model.eval().float().cpu()
    check_exportable(model, policy.config)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg, spec, lay = model.cfg, model.spec, model.layout
    t0 = time.perf_counter()
    ids = torch.as_tensor(policy.tok.text.encode_batch(["export"], cfg.instruction_len), dtype=torch.long)
    export_graphs(model, ids, out)
    if int8:
        quantize_step(out)
    tok = policy.tok
    manifest = {
        "format": "vla-onnx-policy",
        "version": MANIFEST_VERSION,
        "graphs": {
            name: {"file": GRAPH_FILES[name], **_io(out / GRAPH_FILES[name])} for name in ("prefix", "mask", "step")
        },
        "model": asdict(cfg),
        "data_spec": asdict(spec),
        "policy": asdict(policy.config),
        "image_keys": list(policy.image_keys),
        "tokenizers": tok.to_dict(),
        "proprio": {"mean": tok.proprio.mean.tolist(), "std": tok.proprio.std.tolist()},  # std already floored
        "action": {"centres": np.asarray(tok.action.centres).tolist(), "bins": tok.action.bins},  # (A, bins)
        "tasks": policy.meta.get("tasks"),
        "int8": int8,
        "export_seconds": round(time.perf_counter() - t0, 2),
    }
    if int8:
        manifest["graphs"]["step_int8"] = {"file": GRAPH_FILES["step_int8"], **_io(out / GRAPH_FILES["step_int8"])}
    manifest["tokens_per_step"] = lay.tokens_per_step
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


class _ParityPair:
    """Acts with the torch policy's chunk and records how far the ONNX policy's chunk is from it."""

    def __init__(self, torch_policy, onnx_policy):
        self.policies, self.worst = (torch_policy, onnx_policy), 0.0

    def reset(self, instruction: str) -> None:
        for policy in self.policies:
            policy.reset(instruction)

    def act(self, obs: dict) -> np.ndarray:
        a, b = (policy.act_chunk(obs) for policy in self.policies)
        self.worst = max(self.worst, float(np.abs(a - b).max()))
        return a[0]


def parity(torch_policy, onnx_policy, tasks: list[str], steps: int | None = None, seed: int = 0) -> dict[str, float]:
    """Max |action difference| per task over one rollout each (driven by the torch policy's actions);
    `steps` caps the rollout (None = the whole episode)."""
    from vla.evaluation.episode import episode_steps
    from vla.evaluation.evaluate import policy_env

    diffs = {}
    for task in tasks:
        env = policy_env(task, torch_policy.spec)
        try:
            pair = _ParityPair(torch_policy, onnx_policy)
            for _ in episode_steps(env, pair, seed, max_steps=steps or None):
                pass
            diffs[task] = pair.worst
        finally:
            env.close()
    return diffs
