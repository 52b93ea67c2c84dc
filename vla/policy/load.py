"""`load_policy`: a checkpoint (or its export) as the Policy front end on the backend asked for.

    policy = load_policy("runs/demo")                                  # torch, on CUDA when present
    policy = load_policy("runs/demo", backend="onnxruntime")           # vla-export's graphs, no torch imported
    policy = load_policy("runs/demo", readout="argmax", n_action_steps=4, temporal_ensemble=False)

Keywords other than the named ones are PolicyConfig fields replacing the values saved with the checkpoint.
Nothing here imports torch or h5py until the torch backend is asked for, so a robot's computer with numpy
and onnxruntime runs the exported policy.
"""

from __future__ import annotations

import os
from pathlib import Path

from vla.config import ConfigError, from_dict
from vla.policy.config import BACKENDS, PolicyConfig
from vla.policy.policy import Policy

# PolicyConfig fields that are gone, with the one value older checkpoints saved for them (dropped on load)
RETIRED_FIELDS = {"temperature": 0.0}


def load_policy(
    checkpoint_dir: str | Path,
    device=None,
    kv_cache: bool | None = None,
    backend: str = "torch",
    text_encoder: str | Path | None = None,
    vision_encoder: str | Path | None = None,
    threads: int | None = None,
    **overrides,
) -> Policy:
    """A Policy from a checkpoint directory (safetensors + JSON; never unpickles), or from its export
    (`vla-export`: DIR/export/ or DIR itself) with backend "onnxruntime" / "onnxruntime-int8" (the int8 step
    graph of `vla-export --int8`).

    `kv_cache` and `overrides`: PolicyConfig fields. `device`: torch's (onnxruntime takes CUDA when its provider
    is installed). `text_encoder` / `vision_encoder`: where the checkpoint's
    encoder folder is on this machine, if it moved (its fingerprint must still match; torch only).
    `threads`: CPU threads for the step (default `step_threads()`; torch's setting is process-wide)."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if kv_cache is not None:
        overrides["kv_cache"] = kv_cache
    if threads is not None and threads < 1:
        raise ConfigError(f"threads={threads} must be >= 1")
    if backend == "torch":
        return _load_torch(checkpoint_dir, device, text_encoder, vision_encoder, threads, overrides)
    if text_encoder is not None or vision_encoder is not None:
        raise ConfigError("text_encoder and vision_encoder are torch backend options (an export embeds its encoders)")
    return _load_onnx(checkpoint_dir, backend == "onnxruntime-int8", threads, overrides)


def step_threads() -> int:
    """CPU threads for one step of one episode: at most 2, and one core left for the control loop and the
    simulator. A batch-of-one step is a chain of small ops, whose split across more threads costs more in
    synchronization than it saves, and threads that spin on the loop's core delay it."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(2, cores - 1))


def policy_config(saved: dict, overrides: dict) -> PolicyConfig:
    """The saved settings (retired fields at their old value dropped) with the caller's overrides on top."""
    saved = {k: v for k, v in saved.items() if not (k in RETIRED_FIELDS and v == RETIRED_FIELDS[k])}
    return from_dict(PolicyConfig, {**saved, **overrides}, "policy")  # a bad key: one line naming the nearest


def _load_onnx(path, int8: bool, threads: int | None, overrides: dict) -> Policy:
    from vla.policy.onnx_policy import OnnxBackend, check_streams, find_export, read_manifest

    export = find_export(path)
    saved = dict(read_manifest(export).get("policy", {}))
    saved["kv_cache"] = True  # a saved recompute choice gives the same actions; only an explicit False is refused
    config = policy_config(saved, overrides)
    check_streams(config.kv_cache)
    return Policy(OnnxBackend(export, threads or step_threads(), int8), config)


def _load_torch(checkpoint_dir, device, text_encoder, vision_encoder, threads: int | None, overrides) -> Policy:
    import torch

    from vla.checkpoint import CheckpointError, load_checkpoint
    from vla.model import ActionTransformer, DataSpec, ModelConfig
    from vla.policy.torch_policy import pick_device, torch_policy
    from vla.tokenizers import Tokenizers
    from vla.tokenizers.encoder import relocated as text_relocated

    ckpt = load_checkpoint(checkpoint_dir)
    meta = ckpt.meta if text_encoder is None else text_relocated(ckpt.meta, text_encoder)
    if vision_encoder is not None:
        from vla.model.vision_encoder import relocated as vision_relocated

        meta = vision_relocated(meta, vision_encoder)
    try:
        cfg = from_dict(ModelConfig, meta["model"], "model")
        spec = from_dict(DataSpec, meta["data_spec"], "data_spec")
        saved = meta.get("policy", {})
        policy_config(saved, {})
        tokenizers = Tokenizers.from_dict(meta["tokenizers"])
    except KeyError as e:
        raise CheckpointError(f"{ckpt.path}/config.json: incomplete (no {e})") from None
    except ConfigError as e:
        raise CheckpointError(f"{ckpt.path}/config.json: invalid ({e})") from None
    config = policy_config(saved, overrides)  # a bad override: the caller's error
    device = pick_device(device)
    if device.type == "cpu":
        torch.set_num_threads(threads or step_threads())
    model = ActionTransformer(cfg, spec)
    ckpt.load_into(model)
    return torch_policy(model.to(device).for_inference(), tokenizers, meta, config)
