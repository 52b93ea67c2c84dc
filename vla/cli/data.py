"""`vla-data`: inspect, check, combine and replay demonstration datasets.

vla-data info FILE|DIR [--json]                   demos/steps per task, instructions, action stats
vla-data validate FILE|DIR                        exit 0 only for a valid file
vla-data convert SRC DST                          HDF5 (ours, robomimic, LIBERO) <-> LeRobot v3.0 directory
vla-data merge OUT IN1 IN2 ...                    combine datasets (same env_args, disjoint seeds)
vla-data replay FILE --demo NAME [--video out.mp4]  re-simulate a demo and report the drift
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import h5py
import numpy as np

from vla.cli import common as cli
from vla.data.hdf5_format import (
    DEMO_PREFIX,
    DatasetError,
    demo_meta,
    demo_names,
    env_args_compatible,
    merge_env_args,
    open_dataset,
    read_env_args,
    read_failed_seeds,
    write_dataset,
)
from vla.errors import UserError


class CliError(UserError):
    """One line for the user; the CLI prints it and exits 2."""


@contextlib.contextmanager
def _reading(path: str | os.PathLike) -> Iterator[None]:
    """Reading a dataset the user gave: a missing key or an unreadable chunk is a damaged file, not a bug."""
    try:
        yield
    except (KeyError, OSError, ValueError) as e:  # h5py: missing member, failed checksum; json: bad attribute
        reason = f"{type(e).__name__}: {cli.one_line(e)}"
        raise DatasetError(f"{path}: cannot read ({reason}); run `vla-data validate {path}`") from e


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not the usage block
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ------------------------------------------------------------------------------------ info


def summarize(path: str | os.PathLike) -> dict[str, Any]:
    """What `vla-data info` prints: per-task demos/steps, instructions, shapes, action statistics."""
    with open_dataset(path) as f, _reading(path):
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


def print_info(s: dict[str, Any]) -> None:
    print(f"{s['file']}: {s['demos']} demos, {s['steps']} steps, splits {s['splits']}")
    if "layout" in s:
        print(f"layout: {s['layout']}, keys: {s['keys']}")
    kw = s["env_args"].get("env_kwargs", {})
    print(f"env: {s['env_args'].get('type', '?')} {kw} at {s['env_args'].get('control_hz', '?')} Hz")
    print("shapes per step: " + ", ".join(f"{k} {tuple(v)}" for k, v in s["shapes"].items()))
    width = max([len(t) for t in s["tasks"]] + [4])
    print(f"\n{'task':<{width}}  demos  steps  mean len  success  instructions  failed seeds")
    for task, t in s["tasks"].items():
        print(
            f"{task:<{width}}  {t['demos']:>5}  {t['steps']:>5}  {t['mean_length']:>8}  "
            f"{t['successes']:>7}  {t['instructions']:>12}  {s['failed_seeds'].get(task, 0):>12}"
        )
    print("\ninstructions:")
    for task, lst in s["instructions"].items():
        shown = "; ".join(lst[:8]) + (f"; ... ({len(lst)} in all)" if len(lst) > 8 else "")
        print(f"  {task}: {shown}")
    if s["action_stats"]:
        print("\naction statistics per dim:")
        for k, v in s["action_stats"].items():
            print(f"  {k:<4} " + " ".join(f"{x:+8.3f}" for x in v))


# ------------------------------------------------------------------------------------ merge


def merge(out: str | os.PathLike, inputs: list[str], valid_fraction: float = 0.1, force: bool = False) -> int:
    """Combine datasets into `out` (written atomically); refuse mismatched env_args or duplicate
    (task, seed) pairs. Inputs must be valid. Returns the number of demos written."""
    from vla.data.validate import validate

    out = Path(out)
    if len(inputs) < 1:
        raise CliError("merge needs at least one input file")
    if out.exists() and not force and not any(out.resolve() == Path(i).resolve() for i in inputs):
        raise CliError(f"{out} already exists; pass --force to replace it")
    for p in inputs:
        problems = validate(p)
        if problems:
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise CliError(f"input is not valid: {problems[0]}{more}; run `vla-data validate {p}`")
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open_dataset(p)) for p in inputs]
        all_args = [read_env_args(f) for f in files]
        for p, a in zip(inputs[1:], all_args[1:], strict=True):
            if not env_args_compatible(all_args[0], a):
                diff = sorted(k for k in set(a) | set(all_args[0]) if a.get(k) != all_args[0].get(k) and k != "tasks")
                raise CliError(
                    f"env_args differ between {inputs[0]} and {p} in {diff}: "
                    + "; ".join(f"{k}: {all_args[0].get(k)!r} vs {a.get(k)!r}" for k in diff)
                )
        seen: dict[tuple[str, int], str] = {}
        demos: list[h5py.Group] = []
        failed: dict[str, set[int]] = defaultdict(set)
        for p, f in zip(inputs, files, strict=True):
            for name in demo_names(f):
                m = demo_meta(f, name)
                key = (m["task"], m["seed"])
                if key in seen:
                    raise CliError(
                        f"duplicate (task, seed) = {key}: {seen[key]} and {p}:{name}; "
                        "collect with disjoint --seed ranges"
                    )
                seen[key] = f"{p}:{name}"
                demos.append(f["data"][name])
            for task, seeds in read_failed_seeds(f).items():
                failed[task].update(seeds)
        for task, seed in seen:
            failed[task].discard(seed)
        return write_dataset(
            out,
            merge_env_args(all_args),
            demos,
            valid_fraction=valid_fraction,
            failed_seeds={t: sorted(s) for t, s in failed.items()},
        )


# ------------------------------------------------------------------------------------ replay


def _demo_name(f: h5py.File, demo: str) -> str:
    name = demo if demo.startswith(DEMO_PREFIX) else f"{DEMO_PREFIX}{demo}"
    if name not in f["data"]:
        names = demo_names(f)
        have = f"{names[0]} .. {names[-1]}" if names else "none"
        raise CliError(f"{f.filename}: no demo {demo!r} (demos: {have})")
    return name


def replay(path: str | os.PathLike, demo: str, video: str | None = None, scale: int = 4) -> dict[str, Any]:
    """Re-simulate a demo: `reset(seed)`, `set_state(states[0])`, step the recorded actions, and
    compare the physics state after action t with the recorded `states[t + 1]`.

    Returns drift per step (max |state difference|), whether the instruction and the success
    outcome are reproduced, and the largest image difference (recorded vs re-rendered). With
    `video`, writes an mp4 with the recorded (left) and replayed (right) frames side by side.
    """
    os.environ.setdefault("MUJOCO_GL", "egl")
    import gymnasium as gym

    import envs  # noqa: F401  (registers the tasks)

    with open_dataset(path) as f, _reading(path):
        name = _demo_name(f, demo)
        env_args = read_env_args(f)
        m = demo_meta(f, name)
        g = f["data"][name]
        states = g["states"][()]
        actions = g["actions"][()]
        images = g["obs/image"][()]
    env = gym.make(m["task"], **env_args.get("env_kwargs", {}))
    try:
        obs, _ = env.reset(seed=m["seed"])
        instruction_ok = obs["instruction"] == m["instruction"]
        base = env.unwrapped
        base.set_state(states[0])
        frames = [obs["image"]]  # the reset state is states[0]
        drift, info = [], {}
        for t, a in enumerate(actions):
            obs, _, terminated, truncated, info = env.step(a)
            if t + 1 < len(actions):
                drift.append(float(np.max(np.abs(base.get_state() - states[t + 1]))))
                frames.append(obs["image"])
        image_diff = max(
            int(np.max(np.abs(fr.astype(int) - im.astype(int)))) for fr, im in zip(frames, images, strict=True)
        )
        if video:
            import imageio.v2 as imageio

            up = lambda x: np.repeat(np.repeat(x, scale, axis=0), scale, axis=1)
            fps = env_args.get("control_hz", 20)
            with imageio.get_writer(video, fps=fps, macro_block_size=1) as w:
                for rec, rep in zip(images, frames, strict=True):
                    w.append_data(up(np.concatenate([rec, rep], axis=1)))
    finally:
        env.close()
    return {
        "file": str(path),
        "demo": name,
        "task": m["task"],
        "seed": m["seed"],
        "steps": len(actions),
        "max_drift": max(drift, default=0.0),
        "final_drift": drift[-1] if drift else 0.0,
        "drift_per_step": drift,
        "max_image_diff": image_diff,
        "instruction_reproduced": bool(instruction_ok),
        "recorded_success": m["success"],
        "replayed_success": bool(info.get("success", False)),
        "video": video,
    }


# ------------------------------------------------------------------------------------ CLI


def add_key_args(s: argparse.ArgumentParser) -> None:
    """The observation-key mapping, the same for every layout and the same as vla-train's data.* keys."""
    g = s.add_argument_group("key mapping (blank = the layout's default; same as vla-train data.*)")
    g.add_argument("--layout", default="auto", choices=["auto", "ours", "robomimic", "libero", "lerobot"],
                   help="dataset layout (default: detected)")  # fmt: skip
    g.add_argument("--image-key", default="", help="camera: obs/<key> or a LeRobot camera (robomimic: agentview_image)")
    g.add_argument("--proprio-keys", default="", help="comma-separated obs keys concatenated into proprio")
    g.add_argument("--instruction", default="", help="instruction for demos that carry none")
    g.add_argument("--valid-fraction", type=float, default=0.1, help="hash split share when the data has no masks")


def source_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "layout": args.layout,
        "image": args.image_key,
        "proprio": tuple(k for k in args.proprio_keys.split(",") if k),
        "instruction": args.instruction,
        "valid_fraction": args.valid_fraction,
        **({"image_size": args.image_size} if getattr(args, "image_size", 0) else {}),
    }


def _layout(args: argparse.Namespace) -> str:
    from vla.data.sources import detect_layout

    return detect_layout(args.file) if args.layout == "auto" else args.layout


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vla-data", description="Inspect, validate, convert, merge and replay demonstration datasets.")
    sub = p.add_subparsers(
        dest="cmd", required=True, metavar="{info,validate,convert,merge,replay}", parser_class=_Parser
    )
    s = sub.add_parser("info", help="demos and steps per task, instructions, action statistics")
    s.add_argument("file", help="HDF5 file (ours, robomimic, LIBERO) or LeRobot v3 directory")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_key_args(s)
    s = sub.add_parser("validate", help="check schema, shapes, dtypes, values and masks (exit 0 = valid)")
    s.add_argument("file", help="HDF5 file (ours, robomimic, LIBERO) or LeRobot v3 directory")
    add_key_args(s)
    s = sub.add_parser(
        "convert",
        help="HDF5 (ours, robomimic, LIBERO) <-> LeRobot v3.0 directory",
        description="Convert SRC to DST: to a LeRobot v3.0 directory, or to our HDF5 layout when DST ends in "
        ".hdf5/.h5. Written to a temporary sibling and renamed when complete; SRC is only read.",
    )
    s.add_argument("src", help="HDF5 file or LeRobot directory")
    s.add_argument("dst", help="LeRobot directory to create, or NAME.hdf5")
    s.add_argument("--codec", default="", choices=["", "av1", "h264", "lossless"],
                   help="video codec for LeRobot output: av1 (LeRobot's default; used when available), h264, "
                   "or lossless (H.264 RGB qp 0: exact pixels, ~10x larger)")  # fmt: skip
    s.add_argument("--image-size", type=int, default=0, help="resize frames to N x N while converting (0 = keep)")
    s.add_argument("--force", action="store_true", help="replace DST if it exists")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument("--json", action="store_true", help="print the result (episodes, frames, frames/s) as JSON")
    add_key_args(s)
    s = sub.add_parser(
        "merge",
        help="combine datasets collected separately (same env_args, disjoint seeds)",
        description="Combine datasets into OUT (written atomically). Refuses mismatched env_args or a "
        "(task, seed) pair present twice. Demos are renumbered; train/valid masks are recomputed per task.",
    )
    s.add_argument("out")
    s.add_argument("inputs", nargs="+", metavar="IN")
    s.add_argument("--valid-fraction", type=float, default=0.1, help="share of each task's demos in mask/valid")
    s.add_argument("--force", action="store_true", help="replace OUT if it exists")
    s = sub.add_parser("replay", help="re-simulate a demo from its recorded states/actions and report the drift")
    s.add_argument("file")
    s.add_argument("--demo", required=True, help="demo name (demo_3) or index (3)")
    s.add_argument("--video", metavar="OUT.mp4", help="write recorded | replayed frames side by side")
    s.add_argument("--scale", type=int, default=4, help="video upscaling factor (default 4)")
    s.add_argument("--per-step", action="store_true", help="print the drift of every step")
    s.add_argument("--tol", type=float, default=1e-6, help="drift above this is reported as a failure")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def _info(args: argparse.Namespace) -> int:
    mapped = args.image_key or args.proprio_keys or args.instruction
    if _layout(args) == "ours" and not mapped:
        s = summarize(args.file)
    else:
        s = summarize_source(args.file, **source_options(args))
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print_info(s)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from vla.data.sources import open_source
    from vla.data.validate import validate

    problems = validate(args.file, **source_options(args))
    for line in problems:
        print(line)
    if problems:
        print(f"{args.file}: INVALID ({len(problems)} problem{'s' if len(problems) > 1 else ''})", file=sys.stderr)
        return 1
    with open_source(args.file, **source_options(args)) as src:
        names = src.names("")
        steps = sum(src.meta(n)["num_samples"] for n in names)
        print(f"{args.file}: valid ({len(names)} demos, {steps} steps, {src.layout} layout)")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from vla.data.convert import convert

    if not 0 <= args.valid_fraction < 1:
        raise CliError(f"--valid-fraction must be in [0, 1), got {args.valid_fraction}")
    r = convert(args.src, args.dst, codec=args.codec, force=args.force, quiet=args.quiet, **source_options(args))
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        video = f", video {r['codec']} at {r['fps']} fps" if "codec" in r else ""
        print(
            f"wrote {r['out']}: {r['episodes']} episodes, {r['frames']} frames in {r['seconds']:.1f} s "
            f"({r['frames_per_s']:.0f} frames/s){video}"
        )
    return 0


def _merge(args: argparse.Namespace) -> int:
    if not 0 <= args.valid_fraction < 1:
        raise CliError(f"--valid-fraction must be in [0, 1), got {args.valid_fraction}")
    n = merge(args.out, args.inputs, args.valid_fraction, args.force)
    print(f"wrote {args.out}: {n} demos from {len(args.inputs)} files")
    return 0


def _replay(args: argparse.Namespace) -> int:
    r = replay(args.file, args.demo, args.video, args.scale)
    ok = (
        r["max_drift"] <= args.tol
        and r["instruction_reproduced"]
        and r["recorded_success"] in (None, r["replayed_success"])
    )
    if args.json:
        print(json.dumps({**r, "ok": ok}, indent=2))
    else:
        print(
            f"{r['file']} {r['demo']} ({r['task']}, seed {r['seed']}): {r['steps']} steps, "
            f"state drift max {r['max_drift']:.3g} final {r['final_drift']:.3g}, "
            f"max image diff {r['max_image_diff']}, "
            f"instruction {'ok' if r['instruction_reproduced'] else 'DIFFERS'}, "
            f"success recorded {r['recorded_success']} replayed {r['replayed_success']}"
        )
        if args.per_step:
            for t, d in enumerate(r["drift_per_step"]):
                print(f"  step {t + 1:4d}  drift {d:.3g}")
        if args.video:
            print(f"video: {args.video}")
    if not ok:
        print(f"vla-data: replay of {r['demo']} does not reproduce the recording (tol {args.tol:g})", file=sys.stderr)
    return 0 if ok else 1


COMMANDS = {"info": _info, "validate": _validate, "convert": _convert, "merge": _merge, "replay": _replay}


def _run(args: argparse.Namespace) -> int:
    if args.cmd not in COMMANDS:
        raise CliError(f"unknown command {args.cmd}")
    return COMMANDS[args.cmd](args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run("vla-data", lambda: _run(args))


if __name__ == "__main__":
    sys.exit(main())
