"""Checkpoint directories: weights in safetensors, everything else in JSON, resume state apart.

    DIR/model.safetensors   the model's weights (loading never unpickles)
    DIR/config.json         resolved run config, model config, tokenizers and normalization stats,
                            env_args and tasks of the training data, step
    DIR/train_state.pt      optimizer, scheduler, RNG and sampler state, for --resume only
                            (tensors and plain containers; loaded with weights_only=True)
    DIR/best/               the same two files for the best evaluation so far

Every file is written to a temporary name, fsynced, and renamed over the old one, so a crash at any
moment leaves either the previous checkpoint or the new one, never a mix of half-files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

FORMAT = "vla-checkpoint"
VERSION = 1


class CheckpointError(Exception):
    """A checkpoint directory is missing a file or holds something we cannot read (one line)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write) -> None:
    """Call `write(tmp_path)`, fsync the result, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def save_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=2) + "\n"))


def save_model(directory: str | os.PathLike, model: torch.nn.Module, meta: dict) -> None:
    """Write model.safetensors, then config.json (the weights are never newer than their config)."""
    directory = Path(directory)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    atomic_write(directory / "model.safetensors", lambda tmp: save_file(state, str(tmp)))
    save_json(directory / "config.json", {"format": FORMAT, "version": VERSION, **meta})


def load_meta(directory: str | os.PathLike) -> dict:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: not a checkpoint directory (no config.json)")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a vla checkpoint config (format={meta.get('format')!r})")
    return meta


def load_weights(directory: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    path = Path(directory) / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no model.safetensors")
    try:
        return load_file(str(path), device=str(device))
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for a damaged file
        raise CheckpointError(f"{path}: cannot read weights ({type(e).__name__}: {e})") from None


def save_train_state(directory: str | os.PathLike, state: dict) -> None:
    atomic_write(Path(directory) / "train_state.pt", lambda tmp: torch.save(state, tmp))


def load_train_state(directory: str | os.PathLike) -> dict:
    path = Path(directory) / "train_state.pt"
    if not path.is_file():
        raise CheckpointError(f"{directory}: nothing to resume (no train_state.pt)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{path}: cannot read resume state ({type(e).__name__}: {e})") from None
