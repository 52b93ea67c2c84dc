"""Behaviour cloning: `vla-train --config configs/demo.yaml --data data/demo.hdf5 --out runs/demo`.

Reads top to bottom: parse the config, seed everything, fit tokenizers on the training split, build
the windows and the model, then loop: batch -> loss on action tokens -> AdamW step; log, evaluate
in closed loop, checkpoint. `--resume` continues exactly where the last checkpoint left off.
Distributed: `torchrun --nproc-per-node N -m vla.train ...` (DDP; gloo on CPU, nccl on CUDA).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist

from vla import cli
from vla.checkpoint import load_meta, load_train_state, load_weights, save_json, save_model, save_train_state
from vla.config import ConfigError, apply_overrides, from_dict, load_yaml, to_dict
from vla.dataset import EpochSampler, Tokenizers, WindowDataset, fit_tokenizers
from vla.model import ActionTransformer, ModelConfig
from vla.policy import Policy, pick_device
from vla.sources import open_source

# ----------------------------------------------------------------------------------------- config


@dataclass
class DataConfig:
    layout: str = "auto"  # dataset layout: auto (detected), ours, robomimic, libero, lerobot (see vla.sources)
    image_key: str = ""  # camera: obs/<key> (robomimic: agentview_image) or a LeRobot camera; "" = layout default
    proprio_keys: list[str] = field(default_factory=list)  # obs keys concatenated into proprio; [] = layout default
    instruction: str = ""  # instruction for files whose demos carry none (LIBERO's problem_info is read first)
    image_size: int = 0  # resize frames to image_size x image_size (antialiased) before the model; 0 = as stored
    train_split: str | None = "train"  # mask/<name> to train on ("" = every demo)
    valid_split: str | None = "valid"  # mask/<name> for validation loss ("" = none)
    valid_fraction: float = 0.1  # share of demos in train/valid splits made by hash when the data has no masks
    preload: bool = True  # decode every frame into RAM once (small datasets); else read lazily
    num_workers: int = 0  # DataLoader worker processes
    augment_shift: int = 4  # random-shift augmentation, pixels (pad + random crop); 0 = off
    action_mode: Literal["uniform", "quantile", "mulaw"] = "uniform"  # action bin placement
    aux_key: str = ""  # obs/<key> of privileged object positions for an auxiliary loss ("" = none)
    action_key: str = "actions"  # <demo>/<key> to imitate; "expert_actions" = noise-free labels (DART)
    keypoint_key: str = ""  # obs/<key> of image positions the first keypoints must find ("" = none)

    def __post_init__(self):
        self.train_split, self.valid_split = self.train_split or "", self.valid_split or ""  # `split=` parses as None
        if self.image_size < 0 or not 0 <= self.valid_fraction < 1:
            raise ValueError(
                f"data.image_size={self.image_size} must be >= 0, data.valid_fraction={self.valid_fraction} in [0, 1)"
            )
        if self.keypoint_key and self.augment_shift:
            raise ValueError(
                f"keypoint_key={self.keypoint_key!r} needs augment_shift: 0 (a shifted frame moves the objects "
                "away from their recorded image positions)"
            )


@dataclass
class OptimConfig:
    lr: float = 1e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # final learning rate as a fraction of lr (cosine decay)
    warmup_steps: int = 200  # linear warmup, optimizer steps
    weight_decay: float = 0.05  # AdamW decay, on weight matrices only
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0  # max global gradient norm (0 = off)
    aux_weight: float = 0.5  # weight of the auxiliary loss (only with data.aux_key)
    keypoint_weight: float = 1.0  # weight of the keypoint heat-map loss (only with data.keypoint_key)

    def __post_init__(self):
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1 or len(self.betas) != 2:
            raise ValueError(
                f"bad optimizer settings: lr={self.lr}, min_lr_ratio={self.min_lr_ratio}, betas={self.betas}"
            )


@dataclass
class LoopConfig:
    steps: int = 1000  # optimizer steps in the whole run
    batch_size: int = 64  # windows per optimizer step (per rank under DDP)
    seed: int = 0  # seeds weights, data order, augmentation and dropout
    device: str = "auto"  # auto (CUDA if present), cpu, cuda
    amp: bool = True  # bf16 autocast on CUDA (ignored on CPU)
    threads: int = 0  # torch intra-op threads (0 = torch's default)
    log_every: int = 10  # steps between progress/metrics lines
    checkpoint_every: int = 500  # steps between checkpoints (always at the end too)
    skip_nonfinite: bool = False  # skip (and count) batches with a non-finite loss/grad instead of stopping
    stop_at: int = 0  # stop after this step as if interrupted (checkpoint first); 0 = run to the end

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(
                f"steps and batch_size must be positive, got steps={self.steps}, batch_size={self.batch_size}"
            )


@dataclass
class EvalConfig:
    every: int = 0  # steps between closed-loop evaluations (0 = only at the end if episodes > 0)
    episodes: int = 0  # episodes per task per evaluation (0 = no closed-loop evaluation)
    seed: int = 100_000  # first evaluation seed
    videos: int = 1  # rollout videos per task per evaluation
    valid_batches: int = 8  # batches of the valid split for the validation loss


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


def load_config(path: str | None, overrides: list[str]) -> TrainConfig:
    cfg = from_dict(TrainConfig, load_yaml(path)) if path else TrainConfig()
    return apply_overrides(cfg, overrides)


# ----------------------------------------------------------------------------------------- helpers


class NonFiniteError(RuntimeError):
    pass


def seed_everything(seed: int) -> None:
    """Weights and dropout draw from torch's global RNG; data order and augmentation have their own."""
    random.seed(seed)
    torch.manual_seed(seed)


def lr_at(step: int, cfg: OptimConfig, total: int) -> float:
    """Linear warmup to lr, then cosine decay to lr * min_lr_ratio at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def random_shift(image: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """DrQ-style augmentation: pad by replicating the edges, crop back at a random offset.

    image (B, K, C, H, W, 3) uint8; one offset per window (the same for every step and camera, so
    motion between steps stays real). Stays in uint8: this runs on every training batch."""
    if pad <= 0:
        return image
    B, K, C, H, W, _ = image.shape
    x = torch.cat(
        [
            image[:, :, :, :1].expand(-1, -1, -1, pad, -1, -1),
            image,
            image[:, :, :, -1:].expand(-1, -1, -1, pad, -1, -1),
        ],
        dim=3,
    )  # (B, K, C, H+2p, W, 3)
    x = torch.cat(
        [x[:, :, :, :, :1].expand(-1, -1, -1, -1, pad, -1), x, x[:, :, :, :, -1:].expand(-1, -1, -1, -1, pad, -1)],
        dim=4,
    )  # (B, K, C, H+2p, W+2p, 3)
    dy, dx = torch.randint(0, 2 * pad + 1, (2, B), generator=generator).tolist()
    return torch.stack([x[b, :, :, dy[b] : dy[b] + H, dx[b] : dx[b] + W] for b in range(B)])  # (B, K, C, H, W, 3)


def param_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Distributed:
    """torchrun's environment, or a single process."""

    def __init__(self, device: torch.device):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.enabled = self.world > 1
        if self.enabled:
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def any(self, flag: bool, device) -> bool:
        """True on every rank if `flag` is true on any rank (so ranks take the same branch)."""
        if not self.enabled:
            return flag
        t = torch.tensor([float(flag)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def gather(self, obj) -> list:
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.enabled:
            dist.barrier()  # no rank tears down while another still talks to it
            dist.destroy_process_group()


# ----------------------------------------------------------------------------------------- training


def batch_to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def validation_loss(model, loader_iter, batches: int, device, amp_ctx) -> float:
    model.eval()
    losses = []
    for _ in range(batches):
        batch = batch_to(next(loader_iter), device)
        with amp_ctx():
            losses.append(model(batch)["loss"].item())
    model.train()
    return float(np.mean(losses))


def train(cfg: TrainConfig, data_path: str, out: Path, resume: bool) -> dict:
    device = pick_device(cfg.train.device)
    ddp = Distributed(device)
    if ddp.enabled and device.type == "cuda":
        device = torch.device("cuda", ddp.local_rank)
        torch.cuda.set_device(device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed_everything(cfg.train.seed)
    source = open_source(  # any layout (ours, robomimic, LIBERO, LeRobot), one key mapping, frames resized
        data_path, layout=cfg.data.layout, image=cfg.data.image_key, proprio=cfg.data.proprio_keys,
        instruction=cfg.data.instruction, actions=cfg.data.action_key, image_size=cfg.data.image_size,
        valid_fraction=cfg.data.valid_fraction,
    )  # fmt: skip
    keys = source.keys

    # ---- tokenizers: fitted once on the training split, or read back on resume
    state = None
    if resume:
        meta = load_meta(out)
        tokenizers = Tokenizers.from_dict(meta["tokenizers"])
        state = load_train_state(out)
    else:
        tokenizers = fit_tokenizers(source, cfg.data.train_split, keys, cfg.model.action_bins, cfg.data.action_mode)
    env_args = source.env_args()
    train_set = WindowDataset(
        source, cfg.data.train_split, tokenizers, cfg.model.window, cfg.model.chunk,
        cfg.model.instruction_len, keys, preload=cfg.data.preload, aux_key=cfg.data.aux_key,
        keypoint_key=cfg.data.keypoint_key,
    )  # fmt: skip
    sample = train_set[0]
    side = sample["image"].shape[-2]
    if side % cfg.model.patch_size:
        raise ConfigError(
            f"{data_path}: frames are {side}x{side}, not a multiple of model.patch_size={cfg.model.patch_size}; "
            f"resize them with data.image_size={max(1, round(side / cfg.model.patch_size)) * cfg.model.patch_size}"
        )
    # Fields the data decides: taken from it, so a preset works for any dataset.
    cfg.model = dataclasses.replace(
        cfg.model,
        image_size=sample["image"].shape[-2],
        proprio_dim=sample["proprio"].shape[-1],
        vocab_size=tokenizers.text.vocab_size,
        action_dim=tokenizers.action.action_dim,
        aux_dim=sample["aux"].shape[-1] if "aux" in sample else 0,
    )
    tasks = sorted(set(train_set.tasks))
    if cfg.eval.episodes > 0 and not set(tasks) <= set(_registered_tasks()):  # robomimic, LIBERO, LeRobot data
        print(f"vla-train: no closed-loop eval: tasks {tasks[:3]} are not registered envs", file=sys.stderr)
        cfg.eval = dataclasses.replace(cfg.eval, episodes=0)

    # ---- data order: a deterministic, rank-sharded, resumable stream of windows
    start_step = int(state["step"]) if state else 0
    sampler = EpochSampler(len(train_set), cfg.train.batch_size, cfg.train.seed, ddp.rank, ddp.world, start_step)
    loader = torch.utils.data.DataLoader(
        train_set, batch_size=cfg.train.batch_size, sampler=sampler, num_workers=cfg.data.num_workers,
        persistent_workers=cfg.data.num_workers > 0, pin_memory=device.type == "cuda", drop_last=True,
    )  # fmt: skip
    valid_iter = None
    if cfg.data.valid_split and cfg.eval.valid_batches > 0:
        try:
            valid_set = WindowDataset(
                source, cfg.data.valid_split, tokenizers, cfg.model.window, cfg.model.chunk,
                cfg.model.instruction_len, keys, preload=cfg.data.preload, aux_key=cfg.data.aux_key,
                keypoint_key=cfg.data.keypoint_key,
            )  # fmt: skip
            valid_iter = iter(
                torch.utils.data.DataLoader(
                    valid_set,
                    batch_size=cfg.train.batch_size,
                    sampler=EpochSampler(len(valid_set), cfg.train.batch_size, 0),
                )
            )
        except Exception as e:  # noqa: BLE001 - no/empty valid split: train without a validation loss
            print(f"vla-train: no validation loss ({e})", file=sys.stderr)

    # ---- model and optimizer
    model = ActionTransformer(cfg.model).to(device)
    optimizer = torch.optim.AdamW(
        model.optim_groups(cfg.optim.weight_decay), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
        fused=device.type == "cuda",
    )  # fmt: skip
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_at(s, cfg.optim, cfg.train.steps) / cfg.optim.lr
    )
    if state:
        model.load_state_dict(load_weights(out, device))
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if ddp.enabled else model
    use_amp = cfg.train.amp and device.type == "cuda"

    def amp_ctx():
        return torch.autocast("cuda", dtype=torch.bfloat16) if use_amp else _nullcontext()

    meta = {
        "model": to_dict(cfg.model),
        "tokenizers": tokenizers.to_dict(),
        "config": to_dict(cfg),
        "data": str(data_path),
        "env_args": env_args,
        "tasks": tasks,
    }

    # ---- logging (rank 0 only)
    writer, metrics_file, bar = None, None, None
    if ddp.main:
        out.mkdir(parents=True, exist_ok=True)
        save_json(out / "run_config.json", to_dict(cfg))
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        writer = SummaryWriter(str(out / "tb"), purge_step=start_step if resume else None)
        if not resume:
            _log_hparams(writer, cfg)
        metrics_path = out / "metrics.jsonl"
        kept = []
        if resume and metrics_path.exists():  # drop lines logged after the checkpoint we resume from
            kept = [
                ln for ln in metrics_path.read_text().splitlines() if ln and json.loads(ln).get("step", 0) <= start_step
            ]
        metrics_path.write_text("".join(ln + "\n" for ln in kept))
        metrics_file = metrics_path.open("a")
        bar = tqdm(total=cfg.train.steps, initial=start_step, desc="train", file=sys.stderr, dynamic_ncols=True)

    def log(record: dict) -> None:
        if metrics_file is not None:
            metrics_file.write(json.dumps(record) + "\n")
            metrics_file.flush()

    best = state["best"] if state else {"score": -math.inf, "step": -1}
    skipped = int(state["skipped_nonfinite"]) if state else 0

    def checkpoint(step: int, score: float | None) -> None:
        nonlocal best
        if not ddp.main:
            return
        save_model(out, model, {**meta, "step": step})
        if score is not None and score > best["score"]:
            best = {"score": score, "step": step}
            save_model(out / "best", model, {**meta, "step": step, "best_score": score})
        train_state = {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "best": best,
            "skipped_nonfinite": skipped,
        }
        save_train_state(out, train_state)

    def closed_loop_eval(step: int) -> float | None:
        if cfg.eval.episodes <= 0 or not ddp.main:
            return None
        from vla.evaluate import evaluate

        model.eval()
        policy = Policy(model, tokenizers, meta)
        video_dir = (out / "videos" / f"step{step:07d}") if cfg.eval.videos > 0 else None
        result = evaluate(
            policy, tasks, cfg.eval.episodes, cfg.eval.seed, video_dir=video_dir, videos_per_task=cfg.eval.videos,
            image_size=cfg.model.image_size, progress=False,
        )  # fmt: skip
        model.train()
        record = {"step": step, "eval/success_rate": result["overall"]["success_rate"]}
        for task, r in result["tasks"].items():
            record[f"eval/success/{task}"] = r["success_rate"]
        for k, v in record.items():
            if k != "step":
                writer.add_scalar(k, v, step)
        log(record)
        bar.write(f"step {step}: closed-loop success {result['overall']['success_rate']:.0%} " + " ".join(
            f"{t.split('/')[-1]}={r['success_rate']:.0%}" for t, r in result["tasks"].items()))  # fmt: skip
        return result["overall"]["success_rate"]

    # ---- the loop
    model.train()
    tokens_per_sample = cfg.model.n_tokens
    step, last_loss = start_step, float("nan")
    t_last, n_since = time.perf_counter(), 0
    data_iter = iter(loader)
    stop = cfg.train.stop_at if cfg.train.stop_at else cfg.train.steps
    while step < min(stop, cfg.train.steps):
        batch = next(data_iter)
        demos = batch.pop("demo")
        gen = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + step * 101 + ddp.rank)
        batch["image"] = random_shift(batch["image"], cfg.data.augment_shift, gen)
        batch = batch_to(batch, device)
        with amp_ctx():
            out_ = wrapped(batch)
        loss = out_["loss"]
        if "aux_loss" in out_:  # the logged "loss" stays the action cross-entropy, comparable across runs
            loss = loss + cfg.optim.aux_weight * out_["aux_loss"]
        if "keypoint_loss" in out_:
            loss = loss + cfg.optim.keypoint_weight * out_["keypoint_loss"]
        optimizer.zero_grad(set_to_none=True)
        bad = not torch.isfinite(loss).item()
        if not bad:
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
            bad = not torch.isfinite(grad_norm).item()
        if ddp.any(bad, device):
            names = sorted({train_set.names[int(d)] for d in demos})
            where = f"step {step + 1}: non-finite {'loss' if not torch.isfinite(loss).item() else 'gradients'}"
            if not cfg.train.skip_nonfinite:
                raise NonFiniteError(f"{where} (batch demos: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''})")
            skipped += 1
            optimizer.zero_grad(set_to_none=True)
            if bar is not None:
                bar.write(f"{where}; skipped ({skipped} so far)")
            scheduler.step()
            step += 1
            continue
        optimizer.step()
        scheduler.step()
        step += 1
        n_since += 1
        last_loss = out_["loss"].item()

        if ddp.main and (step % cfg.train.log_every == 0 or step == cfg.train.steps):
            elapsed = time.perf_counter() - t_last
            tok_s = n_since * cfg.train.batch_size * tokens_per_sample * ddp.world / max(elapsed, 1e-9)
            t_last, n_since = time.perf_counter(), 0
            acc = out_["accuracy"].tolist()
            record = {
                "step": step,
                "loss": last_loss,
                **{k: out_[k].item() for k in ("aux_loss", "keypoint_loss") if k in out_},
                "lr": scheduler.get_last_lr()[0],
                "grad_norm": float(grad_norm),
                "tokens_per_s": tok_s,
                "skipped_nonfinite": skipped,
                **{f"accuracy/dim{i}": a for i, a in enumerate(acc)},
            }
            for k, v in record.items():
                if k != "step":
                    writer.add_scalar(f"train/{k}" if "/" not in k else f"train/{k}", v, step)
            log(record)
            bar.set_postfix_str(f"loss {last_loss:.3f} | {tok_s / 1000:.1f}k tok/s")
        if bar is not None:
            bar.update(1)

        at_end = step == cfg.train.steps or step == stop
        evaluate_now = cfg.eval.every > 0 and step % cfg.eval.every == 0
        if evaluate_now or (at_end and cfg.eval.episodes > 0):
            score = closed_loop_eval(step)
            if valid_iter is not None and ddp.main:
                vloss = validation_loss(model, valid_iter, cfg.eval.valid_batches, device, amp_ctx)
                writer.add_scalar("valid/loss", vloss, step)
                log({"step": step, "valid/loss": vloss})
            checkpoint(step, score)
        elif at_end or step % cfg.train.checkpoint_every == 0:
            score = None
            if valid_iter is not None and ddp.main:
                vloss = validation_loss(model, valid_iter, cfg.eval.valid_batches, device, amp_ctx)
                writer.add_scalar("valid/loss", vloss, step)
                log({"step": step, "valid/loss": vloss})
                score = -vloss if cfg.eval.episodes <= 0 else None
            checkpoint(step, score)

    digests = ddp.gather(param_digest(model))
    summary = {
        "step": step,
        "finished": step >= cfg.train.steps,
        "final_loss": last_loss,
        "skipped_nonfinite": skipped,
        "world_size": ddp.world,
        "rank_weight_digests": digests,
        "best": best,
    }
    if ddp.main:
        bar.close()
        save_json(out / "summary.json", summary)
        writer.close()
        metrics_file.close()
    ddp.close()
    return summary


def _registered_tasks() -> list[str]:
    """The gymnasium ids `vla-eval` can run (closed-loop eval needs the dataset's tasks among them)."""
    import envs

    return list(envs.TASKS)


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _log_hparams(writer, cfg: TrainConfig) -> None:
    """Hyperparameters at the start of the run, as text and in TensorBoard's HParams tab."""
    from torch.utils.tensorboard.summary import hparams

    flat = {}
    for section, values in to_dict(cfg).items():
        for k, v in values.items():
            flat[f"{section}.{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    writer.add_text("config", "```\n" + json.dumps(to_dict(cfg), indent=2) + "\n```", 0)
    exp, ssi, sei = hparams(flat, {"eval/success_rate": float("nan"), "valid/loss": float("nan")})
    for summary in (exp, ssi, sei):
        writer.file_writer.add_summary(summary)


# ----------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vla-train",
        description=__doc__.split("\n\n")[0],
        epilog="Overrides: dotted keys, e.g. train.steps=200 model.n_layer=2 (unknown keys are errors).",
    )
    parser.add_argument("--config", help="YAML preset, e.g. configs/demo.yaml (default: built-in defaults)")
    parser.add_argument(
        "--data", required=True, help="dataset: HDF5 (ours, robomimic, LIBERO) or a LeRobot v3 directory"
    )
    parser.add_argument("--out", required=True, help="run/checkpoint directory")
    parser.add_argument("--resume", action="store_true", help="continue from OUT's last checkpoint")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args, unknown = parser.parse_known_args(argv)
    bad = [u for u in unknown if not (u.startswith("--") and "=" in u)]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    os.environ.setdefault("MUJOCO_GL", "egl")

    def body() -> int:
        out = Path(args.out)
        if args.resume:
            saved = out / "run_config.json"
            if not saved.is_file():
                raise ConfigError(f"{out}: nothing to resume (no run_config.json); drop --resume to start a new run")
            cfg = apply_overrides(from_dict(TrainConfig, json.loads(saved.read_text())), args.overrides + unknown)
        else:
            if (out / "train_state.pt").exists():
                raise ConfigError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
            cfg = load_config(args.config, args.overrides + unknown)
        try:
            summary = train(cfg, args.data, out, args.resume)
        except NonFiniteError as e:
            print(f"vla-train: error: {e}", file=sys.stderr)
            return 3
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps({k: summary[k] for k in ("step", "final_loss", "skipped_nonfinite", "world_size")}))
        return 0

    return cli.run("vla-train", body)


if __name__ == "__main__":
    sys.exit(main())
