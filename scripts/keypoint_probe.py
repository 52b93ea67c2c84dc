"""Do the keypoints find the named object? Train briefly and measure, every N steps, how far the best keypoint
is from where the object really is in the image (the collector's `object_px`, read here only to measure:
with `data.keypoint_key=""` the training never sees it).

    python scripts/keypoint_probe.py --data data/reach.hdf5 --steps 500 data.moved_object_targets=false
    python scripts/keypoint_probe.py --data data/reach.hdf5 --steps 500 data.aux_key=object data.keypoint_key=
    python scripts/keypoint_probe.py --data data/demo.hdf5 --checkpoint runs/real9   # a trained run, per task

With --checkpoint: no training; per task, over validation windows, the best keypoint's mean distance to the named
block and to its goal (front camera), beside a constant guess's.

Columns: action loss; heat-map entropy (uniform = log of the pixel count); the spread of the keypoints'
positions over a batch (0 = every image gives the same spot); the best keypoint's mean distance to the named
object (image half-widths) beside a constant guess's; gradient norms of the keypoint net and of the stem.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from vla.checkpoint import load_checkpoint
from vla.config import from_dict
from vla.model import ActionTransformer, DataSpec
from vla.training.config import TrainConfig, apply_overrides, load_config
from vla.training.train import batches, build_optimizer, prepare_data, setup_processes, total_loss


def measure(model: ActionTransformer, batch: dict, targets: torch.Tensor) -> dict:
    """Heat-map entropy, keypoint spread, the best keypoint's error against `targets` (B, T, n, 2)."""
    with torch.no_grad():
        context = model.instruction_context(batch["instruction"])
        emb = model.embed_steps(batch["image"], batch["proprio"], context)
    heat, where = emb.heat, emb.where  # (B, T, C, M, h*w), (B, T, C, M, 2)
    entropy = float(-(heat.clamp_min(1e-12).log() * heat).sum(-1).mean())
    target = targets[:, -1, 0]  # (B, 2): the named object in the last step
    error = (where[:, -1, 0] - target[:, None]).norm(dim=-1).mean(0)  # (M,): each keypoint's mean distance
    constant = (target - target.mean(0)).norm(dim=-1).mean()
    return {"entropy": entropy, "spread": float(where.std(0).mean()), "error": float(error.min()),
            "constant": float(constant)}  # fmt: skip


def grad_norm(params) -> float:
    return float(torch.sqrt(sum(p.grad.norm() ** 2 for p in params if p.grad is not None)))


def per_task(run: str, data_path: str, windows: int) -> None:
    """The trained run's keypoints against the recorded object_px, task by task (validation windows)."""
    ckpt = load_checkpoint(run)
    cfg = from_dict(TrainConfig, ckpt.meta["config"])  # the run's own config
    cfg = apply_overrides(cfg, ["data.keypoint_key=object_px", "data.moved_object_targets=false", "data.preload=false"])
    cfg, data = prepare_data(cfg, data_path, ckpt, None)
    # object_px rides along only to measure: the net is the one the run recorded (keypoint targets or not)
    model = ActionTransformer(cfg.model, from_dict(DataSpec, ckpt.meta["data_spec"], "data_spec"))
    ckpt.load_into(model)
    model.eval()
    valid, rng = data.valid_set, np.random.default_rng(0)
    print(f"{'task':<22} {'windows':>7} {'block':>6} {'const':>6} {'goal':>6} {'const':>6}")
    for task in sorted(set(valid.tasks)):
        rows = np.flatnonzero([valid.tasks[d] == task for d, _ in valid.index])
        rows = rng.choice(rows, min(windows, len(rows)), replace=False)
        batch = torch.utils.data.default_collate([valid[int(i)] for i in rows])
        with torch.no_grad():
            emb = model.embed_steps(batch["image"], batch["proprio"], model.instruction_context(batch["instruction"]))
        where = emb.where[:, -1, 0]  # (B, M, 2): the last step, front camera
        cells = []
        for k in range(batch["keypoint_targets"].shape[2]):  # the named block, then its goal
            target = batch["keypoint_targets"][:, -1, k]  # (B, 2)
            error = (where - target[:, None]).norm(dim=-1).mean(0).min()  # the best keypoint's mean distance
            cells += [float(error), float((target - target.mean(0)).norm(dim=-1).mean())]
        print(f"{task:<22} {len(rows):>7} " + " ".join(f"{c:>6.3f}" for c in cells), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="an HDF5 file recorded by vla-collect (it has object_px)")
    parser.add_argument("--config", default="configs/real.yaml", help="training preset")
    parser.add_argument("--checkpoint", default="", help="measure this trained run per task instead of training")
    parser.add_argument("--windows", type=int, default=512, help="validation windows a task (with --checkpoint)")
    parser.add_argument("--steps", type=int, default=500, help="optimizer steps")
    parser.add_argument("--every", type=int, default=100, help="steps between measurements")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args(argv)
    if args.checkpoint:
        per_task(args.checkpoint, args.data, args.windows)
        return 0

    # object_px rides along in the batches for the measurement; it is removed before the loss
    cfg = load_config(args.config, [*args.overrides, f"train.steps={args.steps}"])
    trains_on_pixels = bool(cfg.data.keypoint_key)
    if cfg.data.moved_object_targets:  # its batches would carry those targets, not object_px to measure with
        parser.error("data.moved_object_targets=true: train the run with vla-train, then measure it with --checkpoint")
    cfg = load_config(args.config, [*args.overrides, f"train.steps={args.steps}", "data.keypoint_key=object_px"])
    device, _ = setup_processes(cfg)
    cfg, data = prepare_data(cfg, args.data, None, None)
    spec = dataclasses.replace(data.spec, keypoint_targets=trains_on_pixels)  # the net that recipe trains
    model = ActionTransformer(cfg.model, spec).to(device)
    optimizer, schedule = build_optimizer(model, cfg, device)
    stream = batches(data.train_set, cfg.train.batch_size, cfg.train.seed, 0, 1, 0, 0, False)
    pe = model.patch_embed
    print(f"{'step':>5} {'loss':>6} {'entropy':>8} {'spread':>7} {'error':>6} {'const':>6} {'g_kp':>8} {'g_stem':>8}")
    print(f"{'':>5} {'':>6} {np.log(model.layout.keypoint_grid**2):>8.2f} (uniform)")
    start = time.time()
    for step in range(args.steps + 1):
        batch = {k: v.to(device) for k, v in next(stream).items() if k != "demo"}
        targets = batch["keypoint_targets"] if trains_on_pixels else batch.pop("keypoint_targets")
        out = model(batch)
        optimizer.zero_grad(set_to_none=True)
        total_loss(out, cfg.optim).backward()
        if step % args.every == 0:
            m = measure(model, batch, targets)
            print(f"{step:>5} {out['loss'].item():>6.3f} {m['entropy']:>8.2f} {m['spread']:>7.3f} {m['error']:>6.3f} "
                  f"{m['constant']:>6.3f} {grad_norm(pe.kp_convs.parameters()):>8.1e} "
                  f"{grad_norm(pe.proj.parameters()):>8.1e}  {time.time() - start:.0f}s", flush=True)  # fmt: skip
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        schedule.step()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
