"""`vla-deploy`: one episode of the real-time controller on the simulated robot, under a latency budget.

    vla-deploy --checkpoint runs/demo --task reach --hz 20 --budget-ms 50 --seconds 10 --json FILE [KEY=VALUE ...]

What runs and what the report holds: vla/control/deploy.py. `--server URL [--token T]` runs the loop against the
policy a `vla-serve` runs; KEY=VALUE words override the policy settings saved with the checkpoint.
Exit status: 0 the episode ran to its end (success or not), 2 bad input, 3 a safe stop (too many consecutive
deadline misses, a lost server); vla/cli/common.py has the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vla.cli import common as cli
from vla.errors import UserError

PROG = "vla-deploy"


def parse_latency(text: str) -> tuple[float, float]:
    """'X' or 'X:JITTER' (ms) -> (X, JITTER)."""
    try:
        parts = [float(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or any(p < 0 or p != p for p in parts):
        raise argparse.ArgumentTypeError(f"expected X or X:JITTER in ms (non-negative numbers), got {text!r}")
    return parts[0], parts[1] if len(parts) == 2 else 0.0


def build_parser() -> cli.Parser:
    parser = cli.Parser(
        prog=PROG,
        description="Run a policy in a fixed-rate real-time loop under a latency budget on the simulated robot.",
        epilog=__doc__.split("\n\n")[-1],
    )
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (vla-train --out)")
    cli.add_server(parser)
    parser.add_argument("--task", required=True, help="task id or short name, e.g. tabletop/Reach-v0 or reach")
    parser.add_argument("--hz", type=float, default=20.0, help="control rate, ticks per second (default 20)")
    parser.add_argument("--budget-ms", type=float, default=50.0, help="deadline per decision, ms (default 50)")
    parser.add_argument("--seconds", type=float, default=10.0, help="episode length, wall-clock s (default 10)")
    parser.add_argument("--json", required=True, help="write the report here (and the histogram beside it, .png)")
    parser.add_argument(
        "--inject-latency-ms", type=parse_latency, default=(0.0, 0.0), metavar="X[:JITTER]",
        help="add X ms (uniform +- JITTER) to every inference, for testing",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="episode seed: scene layout and jitter (default 0)")
    parser.add_argument(
        "--max-consecutive-misses", type=int, default=5, metavar="N",
        help="safe stop after N deadline misses in a row (default 5; 0 = never)",
    )  # fmt: skip
    parser.add_argument(
        "--max-delta", type=float, default=1.0, metavar="D",
        help="largest change per tick of each motion dim, action units (default 1.0; 0 = no limit)",
    )  # fmt: skip
    parser.add_argument("--limit-gripper", action="store_true", help="rate-limit the gripper dim too")
    parser.add_argument(
        "--strategy", default="blocking", metavar="NAME",
        help="blocking (default: the synchronous loop), or chunk, ensemble, delay_aware (a worker thread)",
    )  # fmt: skip
    parser.add_argument(
        "--execute", type=int, default=0, metavar="S",
        help="actions executed per chunk by chunk / delay_aware (default 0: chunk - measured delay)",
    )  # fmt: skip
    parser.add_argument("--no-kv-cache", action="store_true", help="recompute the whole window every tick")
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda if available)")
    parser.add_argument(
        "--threads", type=int, default=None,
        help="torch intra-op threads (default on CPU: 1; more threads spin against the control loop "
        "and anything else on the cores, and a small model's step gains little from them)",
    )  # fmt: skip
    cli.add_backend(parser)
    parser.add_argument("--quiet", action="store_true", help="no summary on stdout")
    cli.add_policy_overrides(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(PROG, lambda: _run(args))


def _run(args) -> int:
    import envs
    from vla.control.controller import ControllerConfig
    from vla.control.deploy import DeployRun, deploy, format_summary, reply_timeout
    from vla.evaluation.evaluate import open_policy

    local = {"--backend": args.backend != "torch", "--device": args.device is not None,
             "--threads": args.threads is not None}  # fmt: skip
    cli.check_policy_source(args, local)
    if args.max_delta < 0:
        raise UserError(f"--max-delta must be >= 0 (0 = no limit), got {args.max_delta}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    latency, jitter = args.inject_latency_ms
    config = ControllerConfig(  # validates hz, budget, seconds, misses before anything heavy loads
        hz=args.hz, budget_ms=args.budget_ms, seconds=args.seconds, max_consecutive_misses=args.max_consecutive_misses,
        inject_latency_ms=latency, inject_jitter_ms=jitter, seed=args.seed, strategy=args.strategy,
        execute=args.execute,
    )  # fmt: skip
    task = envs.task_id(args.task)
    overrides = cli.policy_overrides(args.overrides) | ({"kv_cache": False} if args.no_kv_cache else {})
    if args.server is not None:
        policy = open_policy(server=args.server, token=args.token, timeout=reply_timeout(config), **overrides)
    else:
        policy = _load_here(args, overrides)
    run = DeployRun(task, args.checkpoint, args.server, args.backend, not args.no_kv_cache, args.max_delta,
                    args.limit_gripper)  # fmt: skip
    report, result = deploy(policy, run, config, args.json)
    if not args.quiet:
        print(format_summary(report, Path(args.json), Path(args.json).with_suffix(".png")))
    if result.safe_stop:
        why = f": {result.unavailable_reason}" if result.policy_unavailable else ""
        print(f"{PROG}: safe stop after {config.max_consecutive_misses} deadline misses in a row{why}", file=sys.stderr)
        return cli.SAFE_STOP
    return cli.OK


def _load_here(args, overrides: dict):
    """The checkpoint's policy in this process, its step on --threads CPU threads (default: load_policy's choice)."""
    from vla.policy.load import load_policy

    device = cli.device(args.device)
    return load_policy(args.checkpoint, device=device, backend=args.backend, threads=args.threads, **overrides)


if __name__ == "__main__":
    sys.exit(main())
