"""The onnxruntime backend of the Policy front end (vla/policy/policy.py): vla-export's graphs map a step to logits.

    policy = load_policy("runs/demo", backend="onnxruntime")    # reads runs/demo/export/ (vla-export)

Imports only numpy, onnxruntime and the torch-free parts of vla (the tokenizers, the KV ring's bookkeeping),
so it runs on a robot's computer with `pip install numpy onnxruntime`. The streaming state lives in numpy
(`OnnxStreamer`): the KV buffer the step graph reads and whose ring slot it writes, and the ring
(vla/kv_ring.py, as `KVCache` keeps it in torch) with its step masks (one mask.onnx run per distinct ring
state). The readout, planning and temporal ensembling are the front end's, as for torch.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from vla.config import ConfigError
from vla.errors import UserError
from vla.kv_ring import StepRing
from vla.tokenizers import Tokenizers

# what vla-export writes and this runtime reads; 2: mask.onnx apart, the step returns its own keys/values;
# 3: a batch-free step graph with one K and one V input per layer, the FiLM conditioning from the prefix
MANIFEST_VERSION = 3


@dataclasses.dataclass(frozen=True)
class RuntimeDevice:
    type: str  # "cpu" or "cuda", as torch.device.type (what callers test)

    def __str__(self) -> str:
        return f"onnxruntime-{self.type}"


class PolicyLoadError(UserError, ValueError):
    """The directory holds no usable export (one line, exit 2 from the CLIs)."""


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
        if int8 and "step_int8" not in files:
            raise PolicyLoadError(f"{export_dir}: no int8 step graph; export with vla-export --int8")
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        available = ort.get_available_providers()
        self.providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]

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
        self.ring = StepRing(np.zeros((B, self.K), np.int64), np.zeros((B, self.K), bool))

    def step(self, image: np.ndarray, proprio: np.ndarray, timestep: np.ndarray) -> np.ndarray:
        """One control step: image (1, C, H, W, 3) uint8, proprio (1, P) float32, timestep (1,) int64 ->
        logits (1, chunk*A, bins)."""
        ring = self.ring
        slot = ring.advance(timestep)

        def build():
            state = {"slot_timestep": ring.slot_timestep, "slot_valid": ring.slot_valid, "slot": np.array([slot])}
            return self._mask.run(None, {"instr_valid": self.instr_valid, "timestep": timestep, **state})[0][0]

        mask = ring.memo_mask(slot, timestep, build)  # (H|1, S, N + S)
        feeds = self._feeds
        feeds["image"], feeds["proprio"], feeds["mask"] = image, proprio, mask
        if "timestep" in self._step_inputs:  # absolute time encodings read it
            feeds["timestep"] = timestep
        logits, *new_kv = self._step.run(None, feeds)
        at = self.L + slot * self.S
        for buffer, new in zip(self.kv, new_kv, strict=True):  # (H, N, hd) <- (H, S, hd): the step's slot
            buffer[:, at : at + self.S] = new
        return logits


class OnnxBackend:
    def __init__(self, export_dir: str | Path, threads: int | None = None, int8: bool = False):
        self.dir = find_export(export_dir)
        self.manifest = manifest = read_manifest(self.dir)
        self.meta = {"tasks": manifest.get("tasks"), "model": manifest["model"], "data_spec": manifest["data_spec"]}
        self.spec = SimpleNamespace(**manifest["data_spec"])
        self.cfg = SimpleNamespace(**manifest["model"])
        self.image_keys = manifest["image_keys"]
        self.tok = Tokenizers.from_dict(manifest["tokenizers"])
        self.reads_committed = False  # the step graph has no committed-bin input
        files = {name: graph["file"] for name, graph in manifest["graphs"].items()}
        ring = (self.cfg.instruction_len, self.cfg.window, manifest["tokens_per_step"])
        self._streamer = OnnxStreamer(self.dir, files, ring, threads, int8)
        self.device = RuntimeDevice("cpu" if self._streamer.providers[0] == "CPUExecutionProvider" else "cuda")

    def fork(self, kv_cache: bool) -> OnnxBackend:
        """The same onnxruntime sessions with their own streaming state (`start` gives it its own buffers)."""
        check_streams(kv_cache)
        twin = copy.copy(self)
        twin._streamer = copy.copy(self._streamer)
        return twin

    def start(self, ids: np.ndarray) -> None:
        self._streamer.start(ids)

    def step(self, image: np.ndarray, proprio: np.ndarray, t: int, committed: np.ndarray | None) -> np.ndarray:
        """The exported step; committed bins are not an input of its graph (`reads_committed` is False)."""
        return self._streamer.step(image, proprio, np.array([t], dtype=np.int64))[0]  # (chunk*A, bins)


def check_streams(kv_cache: bool) -> None:
    if not kv_cache:
        raise ConfigError("the onnxruntime backend always streams with the KV cache (kv_cache=False is torch-only)")


def read_manifest(export: Path) -> dict:
    """An export's manifest.json, if this runtime reads its version (PolicyLoadError otherwise)."""
    manifest = json.loads((export / "manifest.json").read_text())
    if manifest.get("format") != "vla-onnx-policy" or manifest.get("version") != MANIFEST_VERSION:
        raise PolicyLoadError(
            f"{export}/manifest.json: not a vla-onnx-policy v{MANIFEST_VERSION} manifest (version "
            f"{manifest.get('version')}); export again with this version's vla-export"
        )
    return manifest
