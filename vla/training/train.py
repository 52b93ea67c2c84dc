"""Behaviour cloning: `vla-train --config configs/demo.yaml --data data/demo.hdf5 --out runs/demo`.

Reads top to bottom (`train`): set up the device and seeds, read the data (tokenizers fitted on the
training split, or read back on resume), build the model and optimizer, then loop: batch -> loss on
action tokens -> AdamW step; every side job (logging, validation, closed-loop evaluation,
checkpointing) is a call with a name. `--resume` continues exactly where the last complete checkpoint
left off, after any interruption (kill -9, Ctrl-C).
Distributed: `torchrun --nproc-per-node N -m vla.cli.train ...` (DDP; gloo on CPU, nccl on CUDA).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from vla.checkpoint import Checkpoint, save_checkpoint
from vla.config import apply_overrides, from_dict, to_dict
from vla.files import write_json
from vla.model import ActionTransformer, ModelConfig
from vla.policy.torch_policy import pick_device
from vla.training.augment import random_shift
from vla.training.config import OptimConfig, TrainConfig
from vla.training.delay_prefix import commit_random_prefix
from vla.training.distributed import Distributed
from vla.training.run_data import (  # noqa: F401 - load_data, resolve_optional_keys: read by tests and scripts
    TrainData,
    batches,
    load_data,
    prepare_data,
    resolve_optional_keys,
)
from vla.training.run_log import RunLog, SilentLog
from vla.training.validation import amp_context, side_jobs


class NonFiniteError(RuntimeError):
    """A non-finite loss or gradient: the run stops, naming the step and the batch's demos."""


def lr_at(step: int, cfg: OptimConfig, total: int) -> float:
    """Linear warmup to lr, then cosine decay to lr * min_lr_ratio at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def param_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------------- data


# ----------------------------------------------------------------------------------------- steps


def total_loss(out: dict, cfg: OptimConfig) -> torch.Tensor:
    """The action cross-entropy plus the weighted auxiliary terms the batch had targets for."""
    loss = out["loss"]
    if "aux_loss" in out:
        loss = loss + cfg.aux_weight * out["aux_loss"]
    if "keypoint_loss" in out:
        loss = loss + cfg.keypoint_weight * out["keypoint_loss"]
    return loss


def train_step(model, wrapped, optimizer, batch: dict, cfg: TrainConfig, ddp: Distributed, use_amp: bool):
    """One optimizer step. Returns (model outputs, grad norm), or None when the loss or the gradients are
    non-finite on any rank: the decision is collective and taken before backward, so every rank stops
    together instead of waiting in a gradient all-reduce the others never enter."""
    with amp_context(use_amp):
        out = wrapped(batch)
    loss = total_loss(out, cfg.optim)
    optimizer.zero_grad(set_to_none=True)
    if ddp.any(not torch.isfinite(loss).item(), loss.device):
        return None
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
    if ddp.any(not torch.isfinite(grad_norm).item(), loss.device):
        optimizer.zero_grad(set_to_none=True)
        return None
    optimizer.step()
    return out, float(grad_norm)


def rng_state() -> dict:
    state = {"torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])


# ----------------------------------------------------------------------------------------- the run


def setup_processes(cfg: TrainConfig) -> tuple[torch.device, Distributed]:
    """The device (one GPU per rank under torchrun), torch threads, and the seeds of the initial weights."""
    device = pick_device(cfg.train.device)
    ddp = Distributed(device)
    if ddp.enabled and device.type == "cuda":
        device = torch.device("cuda", ddp.local_rank)
        torch.cuda.set_device(device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    random.seed(cfg.train.seed)
    torch.manual_seed(cfg.train.seed)  # the same initial weights on every rank
    return device, ddp


def build_optimizer(model, cfg: TrainConfig, device: torch.device):
    """AdamW over nanoGPT's parameter groups, and the warmup + cosine schedule."""
    optimizer = torch.optim.AdamW(
        model.optim_groups(cfg.optim.weight_decay), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
        fused=device.type == "cuda",
    )  # fmt: skip
    schedule = lambda s: lr_at(s, cfg.optim, cfg.train.steps) / cfg.optim.lr  # noqa: E731 - a factor of lr
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


@dataclass
class Progress:
    """What the loop carries from step to step and across a resume (besides weights and optimizer)."""

    best: dict  # {"score", "step"} of the best checkpoint so far
    last_loss: float = math.nan  # action loss at the last logged step

    @classmethod
    def from_state(cls, state: dict | None) -> Progress:
        if not state:
            return cls(best={"score": -math.inf, "step": -1})
        return cls(state["best"], float(state["last_loss"]))


def run_meta(cfg: TrainConfig, data: TrainData, data_path: str) -> dict:
    """What a checkpoint's config.json says besides the step: enough to rebuild the policy anywhere."""
    return {
        "model": to_dict(cfg.model), "data_spec": dataclasses.asdict(data.spec), "policy": to_dict(cfg.policy),
        "tokenizers": data.tokenizers.to_dict(), "config": to_dict(cfg), "data": str(data_path),
        "env_args": data.env_args, "tasks": data.tasks,
    }  # fmt: skip


def train(
    cfg: TrainConfig, data_path: str, out: Path, resume: Checkpoint | None = None, init: Checkpoint | None = None
) -> dict:
    """`resume`: continue that run (its weights, optimizer, schedule and data); `init`: start from its weights
    and tokenizers only, on any data of the same shapes, with a fresh optimizer and schedule (DAgger)."""
    device, ddp = setup_processes(cfg)
    state = resume.train_state() if resume else None
    cfg, data = prepare_data(cfg, data_path, resume or init, state)
    model = ActionTransformer(cfg.model, data.spec).to(device)
    optimizer, scheduler = build_optimizer(model, cfg, device)
    torch.manual_seed(cfg.train.seed * 1_000_003 + ddp.rank)  # dropout: each rank its own masks
    if init:
        init.load_into(model, device)
    if state:
        resume.load_into(model, device)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        restore_rng(state)
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if ddp.enabled else model
    use_amp = cfg.train.amp and device.type == "cuda"
    meta, progress = run_meta(cfg, data, data_path), Progress.from_state(state)
    if init or (resume and "init" in resume.meta):  # where the weights started: provenance for the reader
        meta["init"] = str(init.path) if init else resume.meta["init"]
    start = int(state["step"]) if state else 0
    tokens_per_step = cfg.train.batch_size * ddp.world * model.layout.n_tokens
    log = RunLog(out, cfg, start, tokens_per_step, resumed=state is not None) if ddp.main else SilentLog()
    train_iter = batches(data.train_set, cfg.train.batch_size, cfg.train.seed, ddp.rank, ddp.world, start,
                         cfg.data.num_workers, device.type == "cuda")  # fmt: skip

    def checkpoint(step: int, score: float | None, keep: bool) -> None:
        is_best = score is not None and score > progress.best["score"]
        progress.best = {"score": score, "step": step} if is_best else progress.best
        train_state = {
            "step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "data_fingerprint": data.fingerprint, **dataclasses.asdict(progress), **rng_state(),
        }  # fmt: skip
        if ddp.main:
            save_checkpoint(out, step, model, meta, train_state, best=is_best, keep=keep)

    model.train()
    stop = cfg.train.steps
    for step in range(start + 1, stop + 1):
        batch = next(train_iter)
        demos = batch.pop("demo")
        gen = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + step * 101 + ddp.rank)
        batch["image"] = random_shift(batch["image"], cfg.data.augment_shift, gen)
        if cfg.train.delay_aware_max:
            batch = commit_random_prefix(batch, cfg.train.delay_aware_max, cfg.model.chunk, gen)
        result = train_step(model, wrapped, optimizer, {k: v.to(device) for k, v in batch.items()}, cfg, ddp, use_amp)
        scheduler.step()
        if result is None:
            names = sorted({data.train_set.names[int(d)] for d in demos})
            raise NonFiniteError(f"step {step}: non-finite loss or gradients (batch demos: {', '.join(names[:8])})")
        if step % cfg.train.log_every == 0 or step == stop:  # host syncs only here
            progress.last_loss = result[0]["loss"].item()
            log.train_step(step, result[0], result[1], scheduler.get_last_lr()[0])
        log.tick()
        evaluate_now = cfg.eval.episodes > 0 and ((cfg.eval.every and step % cfg.eval.every == 0) or step == stop)
        kept = cfg.train.keep_every > 0 and step % cfg.train.keep_every == 0
        if evaluate_now or step == stop or step % cfg.train.checkpoint_every == 0 or kept:
            score = side_jobs(model, data, meta, cfg, out, step, evaluate_now, log, device, use_amp)
            checkpoint(step, score, kept)

    final = max(start, stop)
    summary = {
        "step": final, "finished": final >= cfg.train.steps, "final_loss": progress.last_loss, "world_size": ddp.world,
        "rank_weight_digests": ddp.gather(param_digest(model)), "best": progress.best,
    }  # fmt: skip
    if ddp.main:
        write_json(out / "summary.json", summary)
    log.close()
    ddp.close()
    return summary


def saved_config(ckpt: Checkpoint, overrides: list[str]) -> TrainConfig:
    """The config a checkpoint was trained with, then `overrides`."""
    return apply_overrides(from_dict(TrainConfig, ckpt.meta["config"]), overrides)


def with_model_of(cfg: TrainConfig, init: Checkpoint) -> TrainConfig:
    """`cfg` with `init`'s model settings, except those the config sets itself (dropout, say); the
    weights must still fit the result (`load_into` says which do not)."""
    model, default = to_dict(from_dict(ModelConfig, init.meta["model"], "model")), to_dict(ModelConfig())
    model.update({k: v for k, v in to_dict(cfg.model).items() if v != default[k]})
    return dataclasses.replace(cfg, model=from_dict(ModelConfig, model, "model"))
