"""Real-time deployment: `vla-deploy --checkpoint DIR --task ID --hz H --budget-ms B --seconds T --json FILE`.

Runs one episode of the fixed-rate controller (`vla.control.controller`) on the simulated robot
(`vla.control.robot.SimRobot`, whose physics follows the wall clock, so the arm keeps moving while the
policy thinks) and reports control-step latency p50/p95/p99/max, deadline misses, fallbacks, guard
interventions, whether a safe stop happened, and success, as JSON plus a latency histogram PNG
beside it (same stem). The episode ends after --seconds or on success ("end_reason" says which).

`--strategy` picks how the policy's chunks are executed while it thinks (vla/policy/strategies.py, the same
strategies `vla-eval --delay-ticks` simulates): blocking (the synchronous loop), or chunk, ensemble,
delay_aware in a worker thread, where the measured inference time decides the delay d they plan with.
The JSON adds "strategy", "delay_ticks" (max/mean of the measured delay) and "smoothness" (mean
absolute jerk, jump at chunk boundaries). `--async` is `--strategy chunk --execute 1`.

`--server URL [--token T]` runs the loop against the policy a `vla-serve` runs (vla/policy/remote.py): the network
round trip is part of every inference, so it is the delay the strategies measure and plan with. A server
lost mid-episode is an inference that never arrives: the loop makes its safe stop within
--max-consecutive-misses ticks and says why on one line.

Exit status: 0 when the episode ran to its end (success or not), 3 after a safe stop (too many
consecutive deadline misses), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vla.cli import common as cli
from vla.errors import UserError

SAFE_STOP_EXIT = 3


def parse_latency(text: str) -> tuple[float, float]:
    """'X' or 'X:JITTER' (ms) -> (X, JITTER)."""
    try:
        parts = [float(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or any(p < 0 or p != p for p in parts):
        raise argparse.ArgumentTypeError(f"expected X or X:JITTER in ms (non-negative numbers), got {text!r}")
    return parts[0], parts[1] if len(parts) == 2 else 0.0


def save_histogram(path: str | Path, latency_ms: list[float], budget_ms: float, title: str = "") -> None:
    """Histogram of per-tick latency with the budget and p50/p99 marked (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if latency_ms:
        values = np.asarray(latency_ms)
        hi = max(float(values.max()), budget_ms) * 1.05
        ax.hist(values, bins=np.linspace(0, hi, 60), color="tab:blue", alpha=0.8, label=f"{len(values)} ticks")
        p50, p99 = np.percentile(values, [50, 99])
        ax.axvline(p50, color="tab:green", linestyle="--", label=f"p50 {p50:.2f} ms")
        ax.axvline(p99, color="tab:orange", linestyle="--", label=f"p99 {p99:.2f} ms")
    ax.axvline(budget_ms, color="tab:red", linewidth=2, label=f"budget {budget_ms:g} ms")
    ax.set_xlabel("control-step latency (tick start -> action sent), ms")
    ax.set_ylabel("ticks")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper right")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vla-deploy",
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
        "--inject-latency-ms",
        type=parse_latency,
        default=(0.0, 0.0),
        metavar="X[:JITTER]",
        help="add X ms (uniform +- JITTER) to every inference, for testing",
    )
    parser.add_argument("--seed", type=int, default=0, help="episode seed: scene layout and jitter (default 0)")
    parser.add_argument(
        "--max-consecutive-misses",
        type=int,
        default=5,
        metavar="N",
        help="safe stop after N deadline misses in a row (default 5; 0 = never)",
    )
    parser.add_argument(
        "--max-delta",
        type=float,
        default=1.0,
        metavar="D",
        help="largest change per tick of each motion dim, action units (default 1.0; 0 = no limit)",
    )
    parser.add_argument("--limit-gripper", action="store_true", help="rate-limit the gripper dim too")
    parser.add_argument(
        "--async", dest="async_inference", action="store_true", help="infer the next chunk in a worker thread"
    )
    parser.add_argument(
        "--strategy",
        default="blocking",
        metavar="NAME",
        help="blocking (default: the synchronous loop), or chunk, ensemble, delay_aware (a worker thread)",
    )
    parser.add_argument(
        "--execute",
        type=int,
        default=0,
        metavar="S",
        help="actions executed per chunk by chunk / delay_aware (default 0: chunk - measured delay)",
    )
    parser.add_argument("--no-kv-cache", action="store_true", help="recompute the whole window every tick")
    cli.add_policy_overrides(parser)
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda if available)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of the policy step (default: load_policy's, at most 2 and one core left for the loop; "
        "more threads spin against the control loop, and a small model's step gains little from them)",
    )
    cli.add_backend(parser)
    parser.add_argument("--quiet", action="store_true", help="no summary on stdout")
    args = parser.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    return cli.run("vla-deploy", lambda: _run(args))


def _run(args) -> int:
    from vla.control.controller import ControllerConfig

    local = {"--backend": args.backend != "torch", "--device": args.device is not None,
             "--threads": args.threads is not None}  # fmt: skip
    cli.check_policy_source(args, local)
    latency, jitter = args.inject_latency_ms
    if args.max_delta < 0:
        raise UserError(f"--max-delta must be >= 0 (0 = no limit), got {args.max_delta}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    config = ControllerConfig(  # validates hz, budget, seconds, misses before anything heavy loads
        hz=args.hz,
        budget_ms=args.budget_ms,
        seconds=args.seconds,
        max_consecutive_misses=args.max_consecutive_misses,
        async_inference=args.async_inference,
        inject_latency_ms=latency,
        inject_jitter_ms=jitter,
        seed=args.seed,
        strategy=args.strategy,
        execute=args.execute,
    )
    import envs

    task = envs.task_id(args.task)
    from vla.control.controller import Controller
    from vla.control.guard import ActionGuard
    from vla.control.robot import SimRobot
    from vla.evaluation.evaluate import policy_env

    overrides = cli.policy_overrides(args.policy) | ({"kv_cache": False} if args.no_kv_cache else {})
    if args.server is not None:
        policy = cli.open_policy(server=args.server, token=args.token, timeout=reply_timeout(config), **overrides)
    else:
        policy = _load_here(args, overrides)
    if config.strategy == "delay_aware" and not policy.reads_committed:
        raise UserError(
            "--strategy delay_aware needs a checkpoint trained with model.committed_actions=true "
            "train.delay_aware_max=N, on the torch backend; this one has no committed action slots it can feed"
        )
    robot = SimRobot(policy_env(task, policy.spec), seed=args.seed)
    guard = ActionGuard.from_robot(robot, max_delta=args.max_delta or None, limit_gripper=args.limit_gripper)
    try:
        result = Controller(policy, robot, config, guard).run()
    finally:
        robot.close()

    report = make_report(args, config, task, policy, robot.sim_time, result)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    png = out.with_suffix(".png")
    name = Path(report["checkpoint"]).name
    title = f"{task} at {args.hz:g} Hz, {result.strategy}, {name}, injected {latency:g}±{jitter:g} ms"
    save_histogram(png, result.latency_ms, args.budget_ms, title)
    if not args.quiet:
        print(format_summary(report, out, png))
    if result.safe_stop:
        why = f": {result.unavailable_reason}" if result.policy_unavailable else ""
        stop = f"vla-deploy: safe stop after {config.max_consecutive_misses} deadline misses in a row{why}"
        print(stop, file=sys.stderr)
    return SAFE_STOP_EXIT if result.safe_stop else 0


def _load_here(args, overrides: dict):
    """The checkpoint's policy in this process, its step on --threads CPU threads (default: load_policy's choice)."""
    from vla.policy.load import load_policy

    device = cli.device(args.device)
    return load_policy(args.checkpoint, device=device, backend=args.backend, threads=args.threads, **overrides)


def reply_timeout(config) -> float:
    """How long a remote step may take before the connection counts as lost, seconds: as long as the safe stop
    would take to come anyway (a later reply is of no use), at least a second (a first step may be slow)."""
    if not config.max_consecutive_misses:
        return 10.0
    return max(1.0, config.max_consecutive_misses * config.period_s)


def make_report(args, config, task: str, policy, sim_time: float, result) -> dict:
    """What one deployment run writes to its JSON: the settings it ran with, then the controller's summary."""
    remote = getattr(policy, "metadata", None) if args.server is not None else None  # what the server runs
    latency, jitter = args.inject_latency_ms
    return {
        "checkpoint": str(args.checkpoint if remote is None else remote["checkpoint"]),
        "server": args.server,
        "task": task,
        "seed": args.seed,
        "hz": args.hz,
        "period_ms": 1e3 / args.hz,
        "budget_ms": args.budget_ms,
        "seconds": args.seconds,
        "async": config.worker_strategy is not None,
        "kv_cache": not args.no_kv_cache,
        "backend": args.backend if remote is None else remote["backend"],
        "device": str(policy.device),
        "torch_threads": None if remote is not None else _torch_threads(),
        "inject_latency_ms": {"mean": latency, "jitter": jitter},
        "max_consecutive_misses": args.max_consecutive_misses,
        "max_delta": args.max_delta or None,
        "limit_gripper": args.limit_gripper,
        "sim_time_s": sim_time,
        **result.summary(),
    }


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def format_summary(r: dict, json_path: Path, png: Path) -> str:
    lat, inf = r["latency_ms"], r["inference_ms"]

    def ms(d: dict, key: str) -> str:
        return "-" if d[key] is None else f"{d[key]:.2f}"

    g = r["guard"]
    return "\n".join(
        [
            f'{r["task"]} "{r["instruction"]}": {r["steps"]} ticks at {r["hz"]:g} Hz, budget {r["budget_ms"]:g} ms, '
            f"{'async' if r['async'] else 'sync'} inference, strategy {r['strategy']}",
            f"  control-step latency ms: p50 {ms(lat, 'p50')}  p95 {ms(lat, 'p95')}  p99 {ms(lat, 'p99')}  "
            f"max {ms(lat, 'max')}   (inference p50 {ms(inf, 'p50')}, p99 {ms(inf, 'p99')})",
            f"  deadline misses {r['deadline_misses']}, fallbacks {r['fallbacks']} "
            f"(chunk {r['fallback_kinds']['chunk']}, hold {r['fallback_kinds']['hold']}), "
            f"skipped ticks {r['skipped_ticks']}",
            f"  guard: nonfinite {g['nonfinite']}, clamped {g['clamped']}, rate-limited {g['rate_limited']}",
            *smooth_line(r),
            f"  end: {r['end_reason']} after {r['elapsed_s']:.2f} s, success {r['success']}, "
            f"safe stop {r['safe_stop']}",
            f"  wrote {json_path} and {png}",
        ]
    )


def smooth_line(r: dict) -> list[str]:
    sm, d = r.get("smoothness"), r.get("delay_ticks")
    if sm is None:
        return []
    delay = "" if d is None else f"; measured delay max {d['max']} ticks, mean {d['mean']:.2f}"
    return [f"  smoothness: jerk {sm['jerk']:.4f}, chunk-boundary jump {sm['boundary_jump']:.4f} "
            f"(other ticks {sm['step_change']:.4f}){delay}"]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
