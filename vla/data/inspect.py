"""What `vla-data info` reports about a dataset: demos and steps per task, instructions, shapes, action statistics."""

from __future__ import annotations

import contextlib
import os
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np

from vla.data.hdf5_format import DatasetError, demo_meta, demo_names, open_dataset, read_env_args, read_failed_seeds


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


@contextlib.contextmanager
def reading(path: str | os.PathLike) -> Iterator[None]:
    """Reading a dataset the user gave: a missing key or an unreadable chunk is a damaged file, not a bug."""
    try:
        yield
    except (KeyError, OSError, ValueError) as e:  # h5py: missing member, failed checksum; json: bad attribute
        reason = f"{type(e).__name__}: {_one_line(e)}"
        raise DatasetError(f"{path}: cannot read ({reason}); run `vla-data validate {path}`") from e


def summarize(path: str | os.PathLike) -> dict[str, Any]:
    """What `vla-data info` prints: per-task demos/steps, instructions, shapes, action statistics."""
    with open_dataset(path) as f, reading(path):
        names = demo_names(f)
        tasks: dict[str, dict[str, Any]] = defaultdict(lambda: {"demos": 0, "steps": 0, "successes": 0})
        instructions: dict[str, Counter] = defaultdict(Counter)
        actions = []
        for name in names:
            m = demo_meta(f, name)
            t = tasks[m["task"]]
            t["demos"] += 1
            t["steps"] += m["num_samples"]
            t["successes"] += bool(m["success"])
            instructions[m["task"]][m["instruction"]] += 1
            actions.append(f["data"][name]["actions"][()])
        for task, t in tasks.items():
            t["mean_length"] = round(t["steps"] / t["demos"], 1)
            t["instructions"] = len(instructions[task])
        splits = {s: len(demo_names(f, s)) for s in ("train", "valid") if f"mask/{s}" in f}
        first = f["data"][names[0]] if names else None
        shapes = {}
        if first is not None:
            shapes = {k: list(first[k].shape[1:]) for k in ("actions", "states") if k in first}
            shapes.update({f"obs/{k}": list(v.shape[1:]) for k, v in first["obs"].items()} if "obs" in first else {})
        a = np.concatenate(actions) if actions else np.zeros((0, 0), np.float32)
        stats = {}
        if len(a):
            stats = {
                "mean": a.mean(0),
                "std": a.std(0),
                "min": a.min(0),
                "max": a.max(0),
                "q01": np.quantile(a, 0.01, axis=0),
                "q99": np.quantile(a, 0.99, axis=0),
            }
            stats = {k: [round(float(x), 4) for x in v] for k, v in stats.items()}
        return {
            "file": str(path),
            "demos": len(names),
            "steps": int(sum(t["steps"] for t in tasks.values())),
            "splits": splits,
            "env_args": read_env_args(f),
            "shapes": shapes,
            "tasks": dict(tasks),
            "failed_seeds": {t: len(s) for t, s in read_failed_seeds(f).items()},
            "instructions": {t: sorted(c) for t, c in instructions.items()},
            "action_stats": stats,
        }


def summarize_source(path: str | os.PathLike, **source_options: Any) -> dict[str, Any]:
    """`summarize` for any layout (robomimic, LIBERO, LeRobot), through the same key mapping as training."""
    from vla.data.sources import open_source

    with open_source(path, **source_options) as src:
        names = src.names("")
        tasks: dict[str, dict[str, Any]] = defaultdict(lambda: {"demos": 0, "steps": 0, "successes": 0})
        instructions: dict[str, Counter] = defaultdict(Counter)
        actions, shapes = [], {}
        for name in names:
            m = src.meta(name)
            t = tasks[m["task"]]
            t["demos"] += 1
            t["steps"] += m["num_samples"]
            t["successes"] += bool(m["success"])
            instructions[m["task"]][m["instruction"]] += 1
            demo = src.read(name, images=False)
            actions.append(demo.actions)
            shapes = shapes or {"actions": list(demo.actions.shape[1:]), "proprio": list(demo.proprio.shape[1:])}
        if names:
            shapes["image"] = list(src.frames(names[0], 0, 1).shape[1:])
        for task, t in tasks.items():
            t["mean_length"] = round(t["steps"] / t["demos"], 1)
            t["instructions"] = len(instructions[task])
        splits = {}
        for split in ("train", "valid"):
            with contextlib.suppress(DatasetError):
                splits[split] = len(src.names(split))
        a = np.concatenate(actions) if actions else np.zeros((0, 0), np.float32)
        stats = {}
        if len(a):
            stats = {"mean": a.mean(0), "std": a.std(0), "min": a.min(0), "max": a.max(0),
                     "q01": np.quantile(a, 0.01, axis=0), "q99": np.quantile(a, 0.99, axis=0)}  # fmt: skip
            stats = {k: [round(float(x), 4) for x in v] for k, v in stats.items()}
        k = src.keys
        return {
            "file": str(path),
            "layout": src.layout,
            "keys": {"image": k.image, "proprio": list(k.proprio), "actions": k.actions},
            "demos": len(names),
            "steps": int(sum(t["steps"] for t in tasks.values())),
            "splits": splits,
            "env_args": src.env_args(),
            "shapes": shapes,
            "tasks": dict(tasks),
            "failed_seeds": {},
            "instructions": {t: sorted(c) for t, c in instructions.items()},
            "action_stats": stats,
        }


def format_info(s: dict[str, Any]) -> str:
    """`summarize`'s dict as `vla-data info` prints it."""
    lines = [f"{s['file']}: {s['demos']} demos, {s['steps']} steps, splits {s['splits']}"]
    if "layout" in s:
        lines.append(f"layout: {s['layout']}, keys: {s['keys']}")
    kw = s["env_args"].get("env_kwargs", {})
    lines.append(f"env: {s['env_args'].get('type', '?')} {kw} at {s['env_args'].get('control_hz', '?')} Hz")
    lines.append("shapes per step: " + ", ".join(f"{k} {tuple(v)}" for k, v in s["shapes"].items()))
    width = max([len(t) for t in s["tasks"]] + [4])
    lines.append(f"\n{'task':<{width}}  demos  steps  mean len  success  instructions  failed seeds")
    for task, t in s["tasks"].items():
        lines.append(
            f"{task:<{width}}  {t['demos']:>5}  {t['steps']:>5}  {t['mean_length']:>8}  "
            f"{t['successes']:>7}  {t['instructions']:>12}  {s['failed_seeds'].get(task, 0):>12}"
        )
    lines.append("\ninstructions:")
    for task, lst in s["instructions"].items():
        shown = "; ".join(lst[:8]) + (f"; ... ({len(lst)} in all)" if len(lst) > 8 else "")
        lines.append(f"  {task}: {shown}")
    if s["action_stats"]:
        lines.append("\naction statistics per dim:")
        for k, v in s["action_stats"].items():
            lines.append(f"  {k:<4} " + " ".join(f"{x:+8.3f}" for x in v))
    return "\n".join(lines)
