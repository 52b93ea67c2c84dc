"""What a training run measures before a checkpoint: the validation loss and closed-loop success."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from vla.policy.torch_policy import torch_policy
from vla.training.config import TrainConfig
from vla.training.run_data import TrainData, batches


def amp_context(use_amp: bool):
    return torch.autocast("cuda", dtype=torch.bfloat16) if use_amp else contextlib.nullcontext()


@torch.no_grad()
def validation_loss(model, valid_set, batch_size: int, n_batches: int, device, use_amp: bool) -> float:
    """Mean action loss over the same first `n_batches` batches of the validation split every time (so
    the figure is comparable across steps, and a resumed run computes what an uninterrupted one does)."""
    model.eval()
    losses = []
    valid_iter = batches(valid_set, batch_size, 0, 0, 1, 0, 0, False)
    for _ in range(n_batches):
        batch = {k: v.to(device) for k, v in next(valid_iter).items() if k != "demo"}
        with amp_context(use_amp):
            losses.append(model(batch)["loss"].item())
    model.train()
    return float(np.mean(losses))


def closed_loop_success(model, data: TrainData, meta: dict, cfg: TrainConfig, out: Path, step: int) -> dict:
    """Roll the current policy out in the training tasks' environments (fresh seeds)."""
    from vla.evaluation.evaluate import evaluate

    model.eval()
    video_dir = (out / "videos" / f"step{step:07d}") if cfg.eval.videos > 0 else None
    result = evaluate(
        torch_policy(model, data.tokenizers, meta, cfg.policy), data.tasks, cfg.eval.episodes, cfg.eval.seed,
        video_dir=video_dir, videos_per_task=cfg.eval.videos, progress=False,
    )  # fmt: skip
    model.train()
    return result


def side_jobs(model, data, meta, cfg: TrainConfig, out: Path, step: int, evaluate_now: bool, log, device, use_amp):
    """Closed-loop evaluation and validation loss before a checkpoint (rank 0); returns the checkpoint's
    score: closed-loop success when evaluating, else minus the validation loss, or None."""
    if not log.enabled:
        return None
    score = None
    if evaluate_now:
        result = closed_loop_success(model, data, meta, cfg, out, step)
        log.closed_loop(step, result)
        score = result["overall"]["success_rate"]
    if data.valid_set is not None:
        vloss = validation_loss(model, data.valid_set, cfg.train.batch_size, cfg.eval.valid_batches, device, use_amp)
        log.scalars(step, {"valid/loss": vloss})
        score = -vloss if cfg.eval.episodes <= 0 else score
    return score
