"""Checkpoint directories: each step's files written as one unit, weights in safetensors, the rest JSON.

    RUN/checkpoints/step_0000500/   one complete checkpoint:
        model.safetensors           the model's weights (loading never unpickles)
        config.json                 run config, model config, data spec, policy config, tokenizers and
                                    normalization stats, env_args and tasks of the training data, step
        train_state.pt              optimizer, scheduler, RNG, data fingerprint, for --resume only
                                    (tensors and plain containers; loaded with weights_only=True)
    RUN/latest -> checkpoints/step_0000500     the newest complete checkpoint
    RUN/best   -> checkpoints/step_...         the best evaluation so far (when there is a score)
    RUN/checkpoints/step_.../KEEP               kept as well (train.keep_every: points of a learning curve)
    RUN/model.safetensors, RUN/config.json -> latest/...   so RUN itself loads as a checkpoint

A step's files are written into a temporary directory, fsynced, and the directory renamed into place;
only then is `latest` switched, by atomically replacing a symlink. A kill at any instant leaves
`latest` on a complete checkpoint whose weights, optimizer state and RNG all belong to one step.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vla.files import atomic_dir, atomic_symlink

FORMAT = "vla-checkpoint"
VERSION = 2
WEIGHTS, CONFIG, TRAIN_STATE = "model.safetensors", "config.json", "train_state.pt"
KEEP = "KEEP"  # an empty file: this checkpoint outlives pruning


class CheckpointError(Exception):
    """A checkpoint directory is missing a file or holds something we cannot read (one line)."""


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    model: torch.nn.Module,
    meta: dict,
    train_state: dict,
    best: bool = False,
    keep: bool = False,
) -> Path:
    """Write step `step` as one unit under RUN/checkpoints/, switch RUN/latest (and RUN/best) to it, and
    prune older checkpoints (except those written with `keep`). Returns the checkpoint's directory."""
    run_dir = Path(run_dir)
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:07d}"
    # An earlier attempt may have written this step and died before `latest` pointed at it: replaced whole.
    with atomic_dir(root / name) as tmp:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS))
        meta_json = json.dumps({"format": FORMAT, "version": VERSION, **meta, "step": step}, indent=2)
        (tmp / CONFIG).write_text(meta_json + "\n")
        torch.save(train_state, tmp / TRAIN_STATE)
        if keep:
            (tmp / KEEP).touch()
    final = root / name
    atomic_symlink(run_dir / "latest", f"checkpoints/{name}")
    if best:
        atomic_symlink(run_dir / "best", f"checkpoints/{name}")
    for f in (WEIGHTS, CONFIG):  # RUN itself loads as the latest checkpoint
        if not (run_dir / f).is_symlink():
            atomic_symlink(run_dir / f, f"latest/{f}")
    _prune(run_dir)
    return final


def _prune(run_dir: Path) -> None:
    """Delete checkpoints that neither `latest` nor `best` points to nor a KEEP file marks, and stale
    temporary directories."""
    keep = {(run_dir / link).resolve() for link in ("latest", "best") if (run_dir / link).is_symlink()}
    for d in (run_dir / "checkpoints").iterdir():
        if ".tmp" in d.name or (d.name.startswith("step_") and d.resolve() not in keep and not (d / KEEP).exists()):
            shutil.rmtree(d, ignore_errors=True)


def has_checkpoint(run_dir: str | os.PathLike) -> bool:
    return (Path(run_dir) / "latest" / CONFIG).is_file()


@dataclass
class Checkpoint:
    """One complete checkpoint directory, resolved once (so its files all belong to one step)."""

    path: Path
    meta: dict

    def weights(self, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        path = self.path / WEIGHTS
        if not path.is_file():
            raise CheckpointError(f"{self.path}: no {WEIGHTS}")
        try:
            return load_file(str(path), device=str(device))
        except Exception as e:  # noqa: BLE001 - safetensors raises several types for a damaged file
            raise CheckpointError(f"{path}: cannot read weights ({type(e).__name__}: {e})") from None

    def load_into(self, model: torch.nn.Module, device: str | torch.device = "cpu") -> None:
        """Load the weights into `model`; a mismatch with its config is one line, not a traceback."""
        try:
            model.load_state_dict(self.weights(device), strict=True)
        except RuntimeError as e:
            lines = [line.strip() for line in str(e).strip().splitlines()]
            detail = "; ".join(lines[1:3]) or lines[0]
            raise CheckpointError(f"{self.path}: the weights do not match {CONFIG} ({detail})") from None

    def train_state(self) -> dict:
        path = self.path / TRAIN_STATE
        if not path.is_file():
            raise CheckpointError(f"{self.path}: nothing to resume (no {TRAIN_STATE})")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"{path}: cannot read resume state ({type(e).__name__}: {e})") from None


def load_checkpoint(directory: str | os.PathLike) -> Checkpoint:
    """Open a checkpoint: a run directory (its `latest`), or one checkpoint's own directory."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a checkpoint directory (it does not exist)")
    path = (directory / "latest").resolve() if (directory / "latest").is_symlink() else directory.resolve()
    config = path / CONFIG
    if not config.is_file():
        raise CheckpointError(f"{directory}: not a checkpoint directory (no {CONFIG})")
    try:
        meta = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{config}: not valid JSON ({e})") from None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if fmt != FORMAT:
        raise CheckpointError(f"{config}: not a vla checkpoint config (format={fmt!r})")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"{config}: checkpoint format version {meta.get('version')}, this vla reads {VERSION}")
    return Checkpoint(path, meta)
