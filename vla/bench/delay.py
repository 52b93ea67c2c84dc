"""Success against inference delay: every execution strategy at d = 0..4 ticks of simulated delay.

    vla-bench delay --checkpoint runs/demo --episodes-per-task 50 --workers 2 --docs docs/delay_sweep.png

For each strategy (vla/policy/strategies.py) and each delay d (control ticks the policy "thinks" while the
environment keeps stepping, simulated time: vla/control/delay.py) it runs the vla-eval evaluation on the
checkpoint's tasks with the same seeds and records success with Wilson 95% intervals and the smoothness
of the executed actions (mean absolute jerk, jump at chunk boundaries). Each point is written to
OUT/points/<strategy>_d<d>.json as soon as it is done, and a rerun with the same settings reuses the
points already there (so an interrupted sweep resumes). At the end OUT/delay_sweep.json and
OUT/delay_sweep.png (success against d, one line per strategy, with the intervals; chunk-boundary jump
beside it), and a copy of the plot at --docs. OUT defaults to CHECKPOINT/delay_sweep.

delay_aware needs a checkpoint trained with committed action slots (model.committed_actions=true
train.delay_aware_max=N): left out with a notice when the checkpoint has none, unless asked for by name.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from vla.errors import UserError

DEFAULT_DELAYS = "0,1,2,3,4"


def add_arguments(p) -> None:
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (vla-train --out)")
    p.add_argument("--delays", default=DEFAULT_DELAYS, help=f"delays in control ticks (default {DEFAULT_DELAYS})")
    p.add_argument(
        "--strategies",
        default=None,
        help="comma-separated strategies (default: every one; delay_aware only if the checkpoint has committed slots)",
    )
    p.add_argument("--episodes-per-task", type=int, default=50, help="episodes per task and point (default 50)")
    p.add_argument("--execute", type=int, default=0, help="actions per chunk for chunk / delay_aware (0 = chunk - d)")
    p.add_argument("--workers", type=int, default=1, help="parallel evaluation processes per point (default 1)")
    p.add_argument("--seed", type=int, default=None, help="first evaluation seed (default vla-eval's)")
    p.add_argument("--tasks", default="trained", help="'trained' (the checkpoint's tasks), 'all', or ids")
    p.add_argument("--device", default=None, help="cpu, cuda (default: cuda if available)")
    p.add_argument("--out", type=Path, default=None, help="sweep directory (default CHECKPOINT/delay_sweep)")
    p.add_argument(
        "--docs", type=Path, default=None, metavar="PNG", help="also copy the plot here (e.g. docs/delay_sweep.png)"
    )


def parse_list(text: str, what: str, cast=str) -> list:
    try:
        items = [cast(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--{what}: expected a comma-separated list, got {text!r}") from None
    if not items:
        raise UserError(f"--{what}: empty list")
    return items


def run(args) -> dict:

    from tqdm import tqdm

    import envs
    from vla.cli import common as cli
    from vla.evaluation.evaluate import EVAL_SEED, delay_options
    from vla.policy.load import load_policy

    delays = parse_list(args.delays, "delays", int)
    if args.episodes_per_task < 1 or args.workers < 1:
        raise UserError(f"--episodes-per-task and --workers must be >= 1, got {args.episodes_per_task}, {args.workers}")
    asked = None if args.strategies is None else parse_list(args.strategies, "strategies")
    for name in asked or []:
        delay_options(0, name, args.execute)  # one-line errors for an unknown strategy
    for d in delays:
        delay_options(d, "blocking", args.execute)  # ... and for a negative delay or execute
    device = cli.device(args.device)
    plain = load_policy(args.checkpoint, device=device)
    strategies = _strategies(asked, plain.cfg.committed_actions)
    trained = plain.meta.get("tasks") or envs.TASKS
    tasks = (
        list(trained)
        if args.tasks == "trained"
        else list(envs.TASKS)
        if args.tasks == "all"
        else envs.expand_tasks(args.tasks)
    )
    seed = EVAL_SEED if args.seed is None else args.seed
    out = args.out or Path(args.checkpoint) / "delay_sweep"
    (out / "points").mkdir(parents=True, exist_ok=True)
    settings = {"checkpoint": str(args.checkpoint), "tasks": tasks, "episodes_per_task": args.episodes_per_task,
                "seed": seed, "execute": args.execute}  # fmt: skip
    points = []
    bar = tqdm([(s, d) for s in strategies for d in delays], desc="delay sweep", file=sys.stderr)
    for strategy, d in bar:
        bar.set_postfix_str(f"{strategy} d={d}")
        path = out / "points" / f"{strategy}_d{d}.json"
        if path.exists():
            saved = json.loads(path.read_text())
            if saved.get("settings") == settings:
                points.append(saved)
                continue
        result = _evaluate_point(args, plain, strategy, d, tasks, seed, device)
        point = {"strategy": strategy, "delay_ticks": d, "settings": settings, **result}
        path.write_text(json.dumps(point, indent=2) + "\n")  # as it goes: a rerun resumes from here
        points.append(point)
    bar.close()
    summary = {"settings": settings, "chunk": plain.chunk, "strategies": strategies, "delays": delays,
               "points": [_row(p) for p in points]}  # fmt: skip
    (out / "delay_sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
    png = out / "delay_sweep.png"
    plot(summary, png, f"{Path(args.checkpoint).name}: {args.episodes_per_task} episodes per task and point")
    summary["plot"] = str(png)
    if args.docs is not None:
        args.docs.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, args.docs)
        summary["docs_plot"] = str(args.docs)
    return summary


def _strategies(asked: list[str] | None, has_committed: bool) -> list[str]:
    """The strategies to sweep: those asked for, else every one the checkpoint can run."""
    from vla.policy.strategies import STRATEGIES

    strategies = asked or [s for s in STRATEGIES if s != "delay_aware" or has_committed]
    if asked is None and not has_committed:
        print("vla-bench delay: delay_aware left out: this checkpoint has no committed action slots", file=sys.stderr)
    if "delay_aware" in strategies and not has_committed:
        raise UserError("--strategies delay_aware needs a checkpoint trained with model.committed_actions=true")
    return strategies


def _evaluate_point(args, plain, strategy: str, d: int, tasks: list[str], seed: int, device) -> dict:
    """One point of the sweep: vla-eval's result for `strategy` at delay d, in worker processes or in this one
    (`plain`: the policy built here)."""
    from vla.evaluation.evaluate import delay_options, evaluate, evaluate_parallel, policy_info

    delay = delay_options(d, strategy, args.execute)
    if args.workers > 1:
        return evaluate_parallel(args.checkpoint, tasks, args.episodes_per_task, seed, "own", None, args.workers,
                                 {"device": device}, delay, progress=False)  # fmt: skip
    # a strategy that schedules chunks itself takes the network's whole chunks (predict_chunk)
    result = evaluate(plain, tasks, args.episodes_per_task, seed, progress=False, delay=delay)
    return {**result, "policy": policy_info(plain)}


def _row(point: dict) -> dict:
    o, sm = point["overall"], point.get("smoothness", {}).get("overall", {})
    return {"strategy": point["strategy"], "delay_ticks": point["delay_ticks"], "success_rate": o["success_rate"],
            "ci95": o["ci95"], "episodes": o["episodes"],
            "tasks": {t: r["success_rate"] for t, r in point["tasks"].items()}, **sm}  # fmt: skip


def plot(summary: dict, path: Path, title: str) -> None:
    """Success (Wilson 95% bars) and chunk-boundary jump against delay, one line per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    n = len(summary["strategies"])
    for i, strategy in enumerate(summary["strategies"]):
        rows = sorted((r for r in summary["points"] if r["strategy"] == strategy), key=lambda r: r["delay_ticks"])
        d = [r["delay_ticks"] + 0.06 * (i - (n - 1) / 2) for r in rows]  # side by side, so no interval hides another
        rate = [r["success_rate"] for r in rows]
        err = [[r["success_rate"] - r["ci95"][0] for r in rows], [r["ci95"][1] - r["success_rate"] for r in rows]]
        ax.errorbar(d, rate, yerr=err, marker="o", capsize=3, label=strategy)
        bx.plot(d, [r.get("boundary_jump", 0.0) for r in rows], marker="o", label=strategy)
    for axis in (ax, bx):
        axis.set_xticks(summary["delays"])
    ax.set_xlabel("inference delay, control ticks")
    ax.set_ylabel("success rate (95% Wilson interval)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    ax.set_title(title, fontsize=9)
    bx.set_xlabel("inference delay, control ticks")
    bx.set_ylabel("mean |action change| where the source changes")
    bx.set_title("smoothness", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def format_markdown(summary: dict) -> str:
    lines = [f"chunk {summary['chunk']}, {summary['settings']['episodes_per_task']} episodes per task and point",
             "", "| strategy | delay (ticks) | success | 95% CI | jerk | boundary jump | hold fraction |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in summary["points"]:
        lo, hi = r["ci95"]
        lines.append(
            f"| {r['strategy']} | {r['delay_ticks']} | {r['success_rate']:.0%} | [{lo:.0%}, {hi:.0%}] | "
            f"{r.get('jerk', 0.0):.4f} | {r.get('boundary_jump', 0.0):.4f} | {r.get('hold_fraction', 0.0):.2f} |"
        )
    return "\n".join(lines) + "\n"
