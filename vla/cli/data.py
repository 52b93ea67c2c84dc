"""`vla-data`: inspect, check, combine and replay demonstration datasets.

vla-data info FILE|DIR [--json]                   demos/steps per task, instructions, action stats
vla-data validate FILE|DIR                        exit 0 only for a valid file (4: problems found)
vla-data convert SRC DST                          HDF5 (ours, robomimic, LIBERO) <-> LeRobot v3.0 directory
vla-data merge OUT IN1 IN2 ...                    combine datasets (same env_args, disjoint seeds)
vla-data replay FILE --demo NAME [--video out.mp4]  re-simulate a demo and report the drift (4: it drifted)

The work: vla/data/inspect.py, validate.py, convert.py, merge.py, replay.py. Exit codes: vla/cli/common.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vla.cli import common as cli
from vla.errors import UserError

PROG = "vla-data"


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


def build_parser() -> cli.Parser:
    p = cli.Parser(prog=PROG, description="Inspect, validate, convert, merge and replay demonstration datasets.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{info,validate,convert,merge,replay}")
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
    s.add_argument("--drop", default="", metavar="KEYS",
                   help="comma-separated observation keys to leave out, e.g. the simulator-only labels: "
                   "--drop object,object_px (what a real robot's data would not have)")  # fmt: skip
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
    from vla.data.inspect import format_info, summarize, summarize_source

    mapped = args.image_key or args.proprio_keys or args.instruction
    if _layout(args) == "ours" and not mapped:
        s = summarize(args.file)
    else:
        s = summarize_source(args.file, **source_options(args))
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        print(format_info(s))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from vla.data.sources import open_source
    from vla.data.validate import validate

    problems = validate(args.file, **source_options(args))
    for line in problems:
        print(line)
    if problems:
        plural = "s" if len(problems) > 1 else ""
        return cli.failed_check(PROG, f"{args.file}: INVALID ({len(problems)} problem{plural})")
    with open_source(args.file, **source_options(args)) as src:
        names = src.names("")
        steps = sum(src.meta(n)["num_samples"] for n in names)
        print(f"{args.file}: valid ({len(names)} demos, {steps} steps, {src.layout} layout)")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from vla.data.convert import convert

    if not 0 <= args.valid_fraction < 1:
        raise UserError(f"--valid-fraction must be in [0, 1), got {args.valid_fraction}")
    drop = tuple(k for k in args.drop.split(",") if k)
    r = convert(args.src, args.dst, codec=args.codec, force=args.force, quiet=args.quiet, drop=drop,
                **source_options(args))  # fmt: skip
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
        raise UserError(f"--valid-fraction must be in [0, 1), got {args.valid_fraction}")
    from vla.data.merge import merge

    n = merge(args.out, args.inputs, args.valid_fraction, args.force)
    print(f"wrote {args.out}: {n} demos from {len(args.inputs)} files")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from vla.data.replay import replay

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
        return cli.failed_check(PROG, f"replay of {r['demo']} does not reproduce the recording (tol {args.tol:g})")
    return cli.OK


COMMANDS = {"info": _info, "validate": _validate, "convert": _convert, "merge": _merge, "replay": _replay}


def _run(args: argparse.Namespace) -> int:
    if args.cmd not in COMMANDS:
        raise UserError(f"unknown command {args.cmd}")
    return COMMANDS[args.cmd](args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run("vla-data", lambda: _run(args))


if __name__ == "__main__":
    sys.exit(main())
