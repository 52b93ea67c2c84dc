"""Real-time deployment on the simulated robot, what `vla-deploy` runs (vla/cli/deploy.py).

Runs one episode of the fixed-rate controller (`vla.control.controller`) on the simulated robot
(`vla.control.robot.SimRobot`, whose physics follows the wall clock, so the arm keeps moving while the
policy thinks) and reports control-step latency p50/p95/p99/max, deadline misses, fallbacks, guard
interventions, whether a safe stop happened, and success, as JSON plus a latency histogram PNG
beside it (same stem). The episode ends after `seconds` or on success ("end_reason" says which).

The strategy picks how the policy's chunks are executed while it thinks (vla/policy/strategies.py, the same
strategies `vla-eval --delay-ticks` simulates): blocking (the synchronous loop), or chunk, ensemble,
delay_aware in a worker thread, where the measured inference time decides the delay d they plan with.
The JSON adds "strategy", "delay_ticks" (max/mean of the measured delay) and "smoothness" (mean
absolute jerk, jump at chunk boundaries).

Against a policy a `vla-serve` runs (vla/policy/remote.py) the network round trip is part of every inference,
so it is the delay the strategies measure and plan with. A server lost mid-episode is an inference that never
arrives: the loop makes its safe stop within `max_consecutive_misses` ticks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vla.errors import UserError


@dataclass
class DeployRun:
    """What one deployment run is, besides the controller's settings: it goes into the report."""

    task: str
    checkpoint: str | None  # None: a --server's policy
    server: str | None
    backend: str
    kv_cache: bool
    max_delta: float  # 0 = no limit
    limit_gripper: bool


def deploy(policy, run: DeployRun, config, json_path: str | Path) -> tuple[dict, object]:
    """One episode of `policy` on the simulated robot under `config` (a ControllerConfig); writes the report to
    `json_path` and the latency histogram beside it (.png). Returns the report and the controller's result."""
    import envs
    from vla.control.controller import Controller
    from vla.control.guard import ActionGuard
    from vla.control.robot import SimRobot

    if config.strategy == "delay_aware" and not policy.reads_committed:
        raise UserError(
            "--strategy delay_aware needs a checkpoint trained with model.committed_actions=true "
            "train.delay_aware_max=N, on the torch backend; this one has no committed action slots it can feed"
        )
    spec = policy.spec
    robot = SimRobot(envs.make_env(run.task, spec.image_size, wrist_camera=spec.n_cameras > 1), seed=config.seed)
    guard = ActionGuard.from_robot(robot, max_delta=run.max_delta or None, limit_gripper=run.limit_gripper)
    try:
        result = Controller(policy, robot, config, guard).run()
    finally:
        robot.close()
    report = make_report(run, config, policy, robot.sim_time, result)
    out = Path(json_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    name = Path(report["checkpoint"]).name
    title = (f"{run.task} at {config.hz:g} Hz, {result.strategy}, {name}, "
             f"injected {config.inject_latency_ms:g}±{config.inject_jitter_ms:g} ms")  # fmt: skip
    save_histogram(out.with_suffix(".png"), result.latency_ms, config.budget_ms, title)
    return report, result


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


def reply_timeout(config) -> float:
    """How long a remote step may take before the connection counts as lost, seconds: as long as the safe stop
    would take to come anyway (a later reply is of no use), at least a second (a first step may be slow)."""
    if not config.max_consecutive_misses:
        return 10.0
    return max(1.0, config.max_consecutive_misses * config.period_s)


def make_report(run: DeployRun, config, policy, sim_time: float, result) -> dict:
    """What one deployment run writes to its JSON: the settings it ran with, then the controller's summary."""
    remote = getattr(policy, "metadata", None) if run.server is not None else None  # what the server runs
    return {
        "checkpoint": str(run.checkpoint if remote is None else remote["checkpoint"]),
        "server": run.server,
        "task": run.task,
        "seed": config.seed,
        "hz": config.hz,
        "period_ms": 1e3 / config.hz,
        "budget_ms": config.budget_ms,
        "seconds": config.seconds,
        "async": config.worker_strategy is not None,
        "kv_cache": run.kv_cache,
        "backend": run.backend if remote is None else remote["backend"],
        "device": str(policy.device),
        "torch_threads": None if remote is not None else _torch_threads(),
        "inject_latency_ms": {"mean": config.inject_latency_ms, "jitter": config.inject_jitter_ms},
        "max_consecutive_misses": config.max_consecutive_misses,
        "max_delta": run.max_delta or None,
        "limit_gripper": run.limit_gripper,
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
