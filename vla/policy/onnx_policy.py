"""The exported policy on onnxruntime: the Policy API (`reset` / `act` / `act_chunk`) without torch.

    policy = load_policy("runs/demo", backend="onnxruntime")    # reads runs/demo/export/ (vla-export)
    policy.reset("put the red block in the bin")
    action = policy.act(obs)

Imports only numpy, onnxruntime and the torch-free parts of vla (the text tokenizer, temporal
ensembling, PolicyConfig), so it runs on a robot's computer with `pip install numpy onnxruntime`.
The streaming state lives in numpy (`OnnxStreamer`): the KV buffer the step graph reads and whose ring
slot it writes, the slot table `KVCache` keeps in torch, and the step masks (one mask.onnx run per
distinct ring state). The readout and temporal ensembling are `vla.policy.torch_policy.Policy`'s.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from vla.config import from_dict
from vla.policy.config import PolicyConfig
from vla.policy.ensemble import TemporalEnsembler
from vla.policy.observation import check_instruction, check_observation

# what vla-export writes and this runtime reads; 2: mask.onnx apart, the step returns its own keys/values;
# 3: a batch-free step graph with one K and one V input per layer, the FiLM conditioning from the prefix
MANIFEST_VERSION = 3


def _text_tokenizer_class():
    """vla/tokenizers/text.py is numpy-only, but importing it as `vla.tokenizers.text` runs the package's
    __init__, which imports the torch-using tokenizers: load the file on its own."""
    name = "vla._onnx_text_tokenizer"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parent.parent / "tokenizers" / "text.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].TextTokenizer


@dataclasses.dataclass(frozen=True)
class RuntimeDevice:
    type: str  # "cpu" or "cuda", as torch.device.type (what callers test)

    def __str__(self) -> str:
        return f"onnxruntime-{self.type}"


class PolicyLoadError(ValueError):
    """The directory holds no usable export."""


def find_export(path: str | Path) -> Path:
    """An export directory (with manifest.json), or a checkpoint directory holding one in export/."""
    path = Path(path)
    for candidate in (path, path / "export"):
        if (candidate / "manifest.json").is_file():
            return candidate
    raise PolicyLoadError(f"{path}: no ONNX export (manifest.json) here or in export/; run vla-export --checkpoint")


class OnnxStreamer:
    """vla-export's graphs as the streaming step: `start(ids)` then `step(image, proprio, t)` -> logits.

    Mirrors `KVCache` + `ActionTransformer.start/step` with numpy state: step n goes to ring slot n % K
    (evicting the oldest when full); its mask comes from mask.onnx, memoized by everything it depends on
    (slot, each slot's step offset, which slots are filled; the instruction's padding is fixed per
    episode); step.onnx returns the step's keys/values, written into the slot here."""

    def __init__(self, export_dir: Path, files: dict, ring: tuple, threads: int | None = None, int8: bool = False):
        """files: graph name (prefix, mask, step, step_int8) -> file in export_dir; ring: (L, K, S), the
        instruction length, the window and the tokens per step."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        available = ort.get_available_providers()
        self.providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
        if int8 and "step_int8" not in files:
            raise PolicyLoadError(f"{export_dir}: no int8 step graph; export with vla-export --int8")

        def session(name: str):
            return ort.InferenceSession(str(export_dir / files[name]), options, providers=self.providers)

        self._prefix, self._mask = session("prefix"), session("mask")
        self._step = session("step_int8" if int8 else "step")
        self._prefix_names = [o.name for o in self._prefix.get_outputs()]
        self._step_inputs = {i.name for i in self._step.get_inputs()}
        self.L, self.K, self.S = ring

    def start(self, ids: np.ndarray) -> None:
        """Begin an episode: instruction ids (1, L) int64 through the prefix graph; the ring empty."""
        state = dict(zip(self._prefix_names, self._prefix.run(None, {"instruction": ids}), strict=True))
        self.instr_valid = state["instr_valid"]
        kv = state["kv"]  # (n_layer, 2, 1, H, L + K*S, hd), written in place step by step
        self.kv = kv.reshape(kv.shape[0] * 2, *kv.shape[3:])  # (n_layer*2, H, N, hd): k0, v0, k1, ... (views)
        # the step graph's inputs that live for the episode: each layer's K and V buffer, the FiLM conditioning
        self._feeds = {f"{kind}{i // 2}": self.kv[i] for i, kind in enumerate("kv" * kv.shape[0])}
        if "film" in self._step_inputs:
            self._feeds["film"] = state["film"]
        B = ids.shape[0]
        self.slot_timestep = np.zeros((B, self.K), np.int64)
        self.slot_valid = np.zeros((B, self.K), bool)
        self.n_steps = 0
        self._masks: dict = {}

    def step(self, image: np.ndarray, proprio: np.ndarray, timestep: np.ndarray) -> np.ndarray:
        """One control step: image (1, C, H, W, 3) uint8, proprio (1, P) float32, timestep (1,) int64 ->
        logits (1, chunk*A, bins)."""
        slot = self.n_steps % self.K  # KVCache.advance
        self.slot_timestep[:, slot] = timestep
        self.slot_valid[:, slot] = True
        self.n_steps += 1
        key = (slot, (timestep[:, None] - self.slot_timestep).tobytes(), self.slot_valid.tobytes())
        mask = self._masks.get(key)
        if mask is None:
            ring = {"slot_timestep": self.slot_timestep, "slot_valid": self.slot_valid, "slot": np.array([slot])}
            mask = self._masks[key] = self._mask.run(
                None, {"instr_valid": self.instr_valid, "timestep": timestep, **ring}
            )[0][0]  # (H|1, S, N + S)
        feeds = self._feeds
        feeds["image"], feeds["proprio"], feeds["mask"] = image, proprio, mask
        if "timestep" in self._step_inputs:  # absolute time encodings read it
            feeds["timestep"] = timestep
        logits, *new_kv = self._step.run(None, feeds)
        at = self.L + slot * self.S
        for buffer, new in zip(self.kv, new_kv, strict=True):  # (H, N, hd) <- (H, S, hd): the step's slot
            buffer[:, at : at + self.S] = new
        return logits


class OnnxPolicy:
    def __init__(
        self, export_dir: str | Path, config: PolicyConfig | None = None, threads: int | None = None, int8=False
    ):
        self.dir = find_export(export_dir)
        manifest = json.loads((self.dir / "manifest.json").read_text())
        if manifest.get("format") != "vla-onnx-policy" or manifest.get("version") != MANIFEST_VERSION:
            raise PolicyLoadError(
                f"{self.dir}/manifest.json: not a vla-onnx-policy v{MANIFEST_VERSION} manifest (version "
                f"{manifest.get('version')}); "
                "export again with this version's vla-export"
            )
        self.manifest = manifest
        self.meta = {"tasks": manifest.get("tasks"), "model": manifest["model"], "data_spec": manifest["data_spec"]}
        self.spec = SimpleNamespace(**manifest["data_spec"])
        self.cfg = SimpleNamespace(**manifest["model"])
        self.config = self._checked(config or PolicyConfig(**manifest["policy"]))
        files = {name: graph["file"] for name, graph in manifest["graphs"].items()}
        ring = (self.cfg.instruction_len, self.cfg.window, manifest["tokens_per_step"])
        self._streamer = OnnxStreamer(self.dir, files, ring, threads, int8)
        self.device = RuntimeDevice("cpu" if self._streamer.providers[0] == "CPUExecutionProvider" else "cuda")
        self.image_keys = manifest["image_keys"]
        self._text = _text_tokenizer_class().from_dict(manifest["tokenizers"]["text"])
        self._mean = np.asarray(manifest["proprio"]["mean"], dtype=np.float32)
        self._std = np.asarray(manifest["proprio"]["std"], dtype=np.float32)
        centres = np.asarray(manifest["action"]["centres"], dtype=np.float64)  # (A, bins)
        self._centres64, self._centres = centres, centres.astype(np.float32)
        self._ensembler = TemporalEnsembler(self.cfg.chunk, self.config.ensemble_coeff)
        self._started = False
        self._plan: np.ndarray | None = None
        self._plan_t: int | None = None  # the step it was planned at (PolicyConfig.plan_row)
        self.t = 0

    def _checked(self, config: PolicyConfig) -> PolicyConfig:
        """`config` if this runtime can run it (ValueError otherwise)."""
        if config.n_action_steps > self.cfg.chunk:
            raise ValueError(f"policy n_action_steps={config.n_action_steps} exceeds the chunk={self.cfg.chunk}")
        if config.temperature > 0:
            raise ValueError("the onnxruntime backend decodes greedily: temperature must be 0")
        if not config.kv_cache:
            raise ValueError("the onnxruntime backend always streams with the KV cache (kv_cache=False is torch-only)")
        return config

    def fork(self, **overrides) -> OnnxPolicy:
        """A policy on the same graphs (one set of onnxruntime sessions) with its own episode state, and
        `overrides` (PolicyConfig fields) on top of this one's settings: vla-serve makes one per connection."""
        twin = copy.copy(self)
        twin.config = self._checked(from_dict(PolicyConfig, {**dataclasses.asdict(self.config), **overrides}, "policy"))
        twin._streamer = copy.copy(self._streamer)  # shares the sessions; `start` gives it its own buffers
        twin._ensembler = TemporalEnsembler(self.cfg.chunk, twin.config.ensemble_coeff)
        twin._started, twin._plan, twin._plan_t, twin.t = False, None, None, 0
        return twin

    @property
    def action_dim(self) -> int:
        return self.spec.action_dim

    @property
    def chunk(self) -> int:
        return self.cfg.chunk

    def reset(self, instruction: str) -> None:
        """Start an episode: encode the instruction prefix once (the prefix graph) into a fresh state."""
        ids = self._text.encode_batch([check_instruction(instruction)], self.cfg.instruction_len)  # (1, L) int64
        self._streamer.start(ids)
        self._started = True
        self._ensembler.reset()
        self._plan, self._plan_t = None, None
        self.t = 0

    def _inputs(self, obs: dict) -> tuple[np.ndarray, np.ndarray]:
        """obs -> image (1, n_cam, H, W, 3) uint8 and normalized proprio (1, P) float32, with clear errors."""
        frames, proprio = check_observation(obs, self.image_keys, self.spec.image_size, self.spec.proprio_dim)
        norm = ((proprio - self._mean) / self._std).astype(np.float32)  # ProprioNormalizer.normalize
        return np.ascontiguousarray(frames[None]), norm[None]

    def _values(self, logits: np.ndarray) -> np.ndarray:
        """One step's logits (chunk*A, bins) -> (chunk, A) action values (Policy._values)."""
        chunk, A = self.cfg.chunk, self.spec.action_dim
        logits = logits.reshape(chunk, A, -1).astype(np.float32)  # (chunk, A, bins)
        if self.config.readout == "expectation":
            z = np.exp(logits - logits.max(-1, keepdims=True))
            probs = z / z.sum(-1, keepdims=True)  # (chunk, A, bins)
            return (probs * self._centres).sum(-1)  # (chunk, A)
        tokens = logits.argmax(-1)  # (chunk, A)
        return self._centres64[np.arange(A), tokens].astype(np.float32)  # ActionTokenizer.decode

    def act_chunk(self, obs: dict) -> np.ndarray:
        """This step's action followed by the predicted next ones: (chunk - k, A) in [-1, 1] (Policy.act_chunk)."""
        if not self._started:
            raise RuntimeError("call policy.reset(instruction) before policy.act(obs)")
        image, proprio = self._inputs(obs)
        t, self.t = self.t, self.t + 1
        done = self.config.plan_row(t, self._plan_t)
        logits = self._streamer.step(image, proprio, np.array([t], dtype=np.int64))  # every step joins the context
        if done and self._plan is not None:
            return self._plan[done:]
        values = self._values(logits[0])
        if self.config.temporal_ensemble:
            values = self._ensembler.update(t, values)
        self._plan, self._plan_t = np.clip(values, -1.0, 1.0).astype(np.float32), t
        return self._plan

    def act(self, obs: dict) -> np.ndarray:
        """One action (A,) for this observation."""
        return self.act_chunk(obs)[0]


def load_onnx_policy(path: str | Path, threads: int | None = None, int8: bool = False, **overrides) -> OnnxPolicy:
    """An OnnxPolicy from an export directory (or a checkpoint directory with export/); `overrides` are
    PolicyConfig fields replacing the exported ones (readout, temporal_ensemble, n_action_steps, ...).
    `int8`: run the dynamically quantized step graph (`vla-export --int8`)."""
    export = find_export(path)
    saved = json.loads((export / "manifest.json").read_text()).get("policy", {})
    saved["kv_cache"] = True  # a saved recompute choice gives the same actions; only an explicit False is refused
    config = from_dict(PolicyConfig, {**saved, **overrides}, "policy")  # a bad override: one line, nearest key
    return OnnxPolicy(export, config, threads=threads, int8=int8)
