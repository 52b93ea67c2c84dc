"""Data loader throughput (windows/s) against what the trainer consumes.

The loader side is what the trainer waits on per batch: DataLoader collation of K-step windows
plus the random-shift augmentation. It is measured three ways: frames preloaded into RAM, frames
read lazily from the HDF5 file in the main process, and lazily with DataLoader worker processes.
The peer is the trainer's own step rate on the same config (`vla-bench train`'s measurement). The
loader is never the bottleneck when its rate is well above the trainer's.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from vla.config import from_dict, load_yaml
from vla.data.hdf5_format import ObsKeys
from vla.data.windows import EpochSampler, WindowDataset, fit_tokenizers
from vla.errors import UserError
from vla.training.augment import random_shift
from vla.training.config import TrainConfig


def add_arguments(p) -> None:
    p.add_argument("--data", default="data/demo.hdf5", help="dataset (default data/demo.hdf5; collected if absent)")
    p.add_argument("--config", default="configs/demo.yaml", help="training preset (window, chunk, batch size)")
    p.add_argument("--batches", type=int, default=30, help="timed batches per loader setting (default 30)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers for the lazy+workers row")
    p.add_argument("--trainer-steps", type=int, default=8, help="timed trainer steps for the peer (default 8)")


def _ensure_data(path: Path) -> Path:
    if path.exists():
        return path
    import envs
    from vla.data.collect import Collector, CollectRequest

    out = Path(tempfile.mkdtemp()) / "bench.hdf5"
    print(f"{path} not found: collecting a small dataset into {out}")
    if Collector(CollectRequest(out, episodes_per_task=10, quiet=True), list(envs.TASKS)).run() != 0:
        raise UserError(f"{path} not found, and collecting a small dataset into {out} failed")
    return out


def loader_rate(dataset, batch_size: int, batches: int, workers: int, shift: int) -> float:
    """Windows per second delivered by a DataLoader (+ augmentation), after a warm-up batch."""
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, sampler=EpochSampler(len(dataset), batch_size, 0), num_workers=workers,
        persistent_workers=workers > 0,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        random_shift(next(it)["image"], shift, gen)
    return batches * batch_size / (time.perf_counter() - t0)


def run(args) -> dict:
    from vla.bench.train import measure_ours

    for flag, value in (
        ("--batches", args.batches),
        ("--workers", args.workers),
        ("--trainer-steps", args.trainer_steps),
    ):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    cfg = from_dict(TrainConfig, load_yaml(args.config))
    path = _ensure_data(Path(args.data))
    keys = ObsKeys()
    tok = fit_tokenizers(path, "train", keys, cfg.model.action_bins, "uniform")
    m, B = cfg.model, cfg.train.batch_size
    rows = {}
    for name, preload, workers in (
        ("preloaded", True, 0),
        ("lazy", False, 0),
        (f"lazy, {args.workers} workers", False, args.workers),
    ):
        t0 = time.perf_counter()
        ds = WindowDataset(path, "train", tok, m.window, m.chunk, m.instruction_len, keys, preload=preload)
        build = time.perf_counter() - t0
        rows[name] = {
            "windows_per_s": loader_rate(ds, B, args.batches, workers, cfg.data.augment_shift),
            "build_s": build,
        }
    trainer = measure_ours(cfg, B, warmup=2, steps=args.trainer_steps)
    for r in rows.values():
        r["headroom_over_trainer"] = r["windows_per_s"] / trainer["samples_per_s"]
    return {
        "data": str(path),
        "windows": len(ds),
        "config": args.config,
        "batch_size": B,
        "loaders": rows,
        "trainer_windows_per_s": trainer["samples_per_s"],
    }


def format_markdown(r: dict) -> str:
    rows = [
        f"Data loader vs trainer, `{r['config']}` (batch {r['batch_size']}), {r['windows']} windows in `{r['data']}`.",
        "",
        "| loader | windows/s | x trainer's consumption | dataset build (s) |",
        "|---|---|---|---|",
    ]
    for name, x in r["loaders"].items():
        rows.append(f"| {name} | {x['windows_per_s']:,.0f} | {x['headroom_over_trainer']:.1f}x | {x['build_s']:.1f} |")
    rows.append(f"| *trainer consumes* | {r['trainer_windows_per_s']:,.0f} | 1.0x | |")
    return "\n".join(rows) + "\n"
