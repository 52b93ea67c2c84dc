"""`vla-collect`: scripted-expert demonstrations into an HDF5 dataset, crash-safe and resumable.

    vla-collect --tasks all --episodes-per-task 50 --workers 2 --out data/demo.hdf5 --seed 0

How seeds, failures, crash safety and --resume work: vla/data/collect.py.
Exit status: 0 collected, 2 bad input, 4 a task ended short of its count after --max-attempts seeds,
130 interrupted (rerun with --resume); vla/cli/common.py has the table.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from vla.cli import common as cli
from vla.data.collect import CollectError, Collector, CollectRequest, parse_task_episodes, resolve_tasks

PROG = "vla-collect"


def build_parser() -> cli.Parser:
    p = cli.Parser(
        prog=PROG,
        description="Collect scripted-expert demonstrations into an HDF5 dataset (crash-safe, resumable).",
        epilog="Seeds --seed, --seed+1, ... per task; failed seeds are recorded and skipped. "
        "After a crash or Ctrl-C, rerun the same command with --resume.",
    )
    p.add_argument("--tasks", default="all", help="'all', 'metaworld/mt10' or comma-separated task ids / short names")
    p.add_argument("--episodes-per-task", type=int, required=True, metavar="N", help="episodes to keep per task")
    p.add_argument(
        "--task-episodes", action="append", default=[], metavar="TASK=N",
        help="keep N episodes of TASK instead of --episodes-per-task (repeatable; e.g. push=900)",
    )  # fmt: skip
    p.add_argument("--workers", type=int, default=1, metavar="W", help="worker processes (default 1)")
    p.add_argument("--out", required=True, metavar="FILE.hdf5", help="output dataset")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="first reset seed of every task (default 0)")
    p.add_argument("--image-size", type=int, default=64, help="camera resolution in pixels (default 64)")
    p.add_argument(
        "--wrist-camera", action="store_true",
        help="record the gripper's wrist camera too (obs/wrist_image; tabletop tasks); train on both cameras "
        "with data.wrist_image_key=wrist_image",
    )  # fmt: skip
    p.add_argument("--noise", type=float, default=0.0, help="std of the expert's action noise (default 0)")
    p.add_argument(
        "--perturb", type=float, default=0.0, metavar="P",
        help="chance per tick of a perturbation: 2-5 ticks in one random direction (default 0)",
    )  # fmt: skip
    p.add_argument(
        "--detour", type=float, default=0.0, metavar="P",
        help="chance per episode of first driving the gripper where cloned policies fail "
        "(Push: low just past the block, or on its top); tabletop tasks without such a pose ignore it "
        "(default 0)",
    )  # fmt: skip
    p.add_argument(
        "--driver", metavar="CHECKPOINT",
        help="a trained policy acts and the expert labels the states it visits (DAgger; the expert's labels "
        "go to expert_actions); without --takeover it implies --keep-failed: a failed episode's labels are the point",
    )  # fmt: skip
    p.add_argument(
        "--takeover", type=int, default=0, metavar="T",
        help="with --driver: the expert takes over after a random number of ticks, 0..T, and shows the way out "
        "(--noise applies to it; successes kept as usual); default 0: the policy drives to the end",
    )  # fmt: skip
    p.add_argument("--keep-failed", action="store_true", help="keep failed episodes too (N counts attempts)")
    p.add_argument("--resume", action="store_true", help="complete an existing output and its leftover parts")
    p.add_argument(
        "--max-attempts", type=int, default=None, metavar="M", help="seeds to try per task at most (default 3N+10)"
    )
    p.add_argument("--valid-fraction", type=float, default=0.1, help="share of each task's demos in mask/valid")
    p.add_argument(
        "--merge-every", type=float, default=30.0, metavar="SEC", help="merge finished episodes into OUT this often"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(PROG, lambda: _run(args), "interrupted; rerun with --resume to complete the dataset")


def _run(args: argparse.Namespace) -> int:
    check_args(args)
    tasks = resolve_tasks(args.tasks)
    targets = parse_task_episodes(args.task_episodes, tasks)
    import envs

    try:
        envs.check_detour(tasks, args.detour)
    except ValueError as e:
        raise CollectError(str(e)) from None
    if args.driver:  # without a takeover the failures are the point
        args.keep_failed = args.keep_failed or not args.takeover
    request = CollectRequest(**{f.name: getattr(args, f.name) for f in fields(CollectRequest)})
    return Collector(request, tasks, targets).run()


def check_args(args: argparse.Namespace) -> None:
    """The flags' own constraints, before any worker starts (CollectError: one line, exit 2)."""
    for name, v in (("--episodes-per-task", args.episodes_per_task), ("--workers", args.workers)):
        if v < 1:
            raise CollectError(f"{name} must be at least 1, got {v}")
    if not 0 <= args.valid_fraction < 1:
        raise CollectError(f"--valid-fraction must be in [0, 1), got {args.valid_fraction}")
    if args.noise < 0:
        raise CollectError(f"--noise must be >= 0, got {args.noise}")
    if not 0 <= args.perturb < 1:
        raise CollectError(f"--perturb must be in [0, 1), got {args.perturb}")
    if not 0 <= args.detour <= 1:
        raise CollectError(f"--detour must be in [0, 1], got {args.detour}")
    if args.driver:
        from vla.checkpoint import CheckpointError, load_checkpoint

        try:
            load_checkpoint(args.driver)
        except CheckpointError as e:
            raise CollectError(f"--driver: {e}") from None
        if args.detour or (not args.takeover and (args.noise or args.perturb)):
            raise CollectError(
                "--driver: the policy acts, so --detour (and --noise and --perturb, without --takeover) have "
                "nothing to change"
            )
    elif args.takeover:
        raise CollectError("--takeover needs --driver (the policy the expert takes over from)")
    if args.takeover < 0:
        raise CollectError(f"--takeover must be >= 0, got {args.takeover}")
    out = Path(args.out)
    if out.is_dir():
        raise CollectError(f"--out {out} is a directory; give a file name like {out}/demo.hdf5")
    if not out.parent.is_dir():
        raise CollectError(f"--out: directory {out.parent} does not exist")


if __name__ == "__main__":
    sys.exit(main())
