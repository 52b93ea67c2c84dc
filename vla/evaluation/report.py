"""Summarize a run directory (`python -m vla.cli.report runs/demo`).

Prints the per-task success table (policy beside the scripted expert, plus the grounding probe and
the held-out paraphrases),
the deployment latency and each stage's wall-clock time, and draws the training curves
(`training_curves.png`) from `metrics.jsonl`. Reads whatever of these the directory holds:
eval.json, experts.json, eval_swap_colour.json, eval_paraphrase.json, deploy.json, stage_times.txt,
metrics.jsonl, and curve/step_*.json (vla-eval of the checkpoints `train.keep_every` kept: closed-loop
success against training minutes, `success_curve.png`). A Meta-World MT50 run (`make metaworld-mt50`) also gets
the SmolVLA paper's table, our rows beside the published ones (vla/evaluation/mt50_table.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from vla.evaluation.mt50_table import is_mt50, mt50_table


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def plot_training_curves(run: Path) -> Path | None:
    """Loss (train and valid) and closed-loop success against step, one PNG."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    series = lambda key: ([r["step"] for r in rows if key in r], [r[key] for r in rows if key in r])  # noqa: E731
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.6))
    for key, label in (("loss", "train loss"), ("valid/loss", "valid loss")):
        x, y = series(key)
        if x:
            ax_loss.plot(x, y, label=label)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("cross-entropy on action tokens")
    ax_loss.set_yscale("log")
    ax_loss.legend()
    for key in sorted({k for r in rows for k in r if k.startswith("accuracy/")}):
        x, y = series(key)
        ax_acc.plot(x, y, label=key.replace("accuracy/", "token acc. "), alpha=0.7)
    x, y = series("eval/success_rate")
    if x:
        ax_acc.plot(x, y, "ko-", label="closed-loop success")
    ax_acc.set_xlabel("step")
    ax_acc.set_ylim(0, 1)
    if ax_acc.get_legend_handles_labels()[0]:  # a run without accuracy lines has nothing to name
        ax_acc.legend(fontsize=7)
    fig.suptitle(f"training: {run}")
    fig.tight_layout()
    out = run / "training_curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def success_curve(run: Path) -> list[dict]:
    """[{step, minutes, success_rate, ci95, episodes}] from curve/step_*.json and the final eval.json, in
    step order; minutes from metrics.jsonl's train_s at that step (None where it was not logged)."""
    rows = (
        [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        if (run / "metrics.jsonl").is_file()
        else []
    )
    clock = {r["step"]: r["train_s"] for r in rows if "train_s" in r}
    points = {int(p.stem.removeprefix("step_")): _load(p) for p in sorted((run / "curve").glob("step_*.json"))}
    final, last = _load(run / "eval.json"), max(clock, default=None)
    if points and final and last is not None and last not in points:
        points[last] = final
    curve = []
    for step, ev in sorted(points.items()):
        logged = [s for s in clock if s <= step]
        o = ev["overall"]
        minutes = clock[max(logged)] / 60 if logged else None
        curve.append({"step": step, "minutes": minutes, "success_rate": o["success_rate"], "ci95": o["ci95"],
                      "episodes": o["episodes"]})  # fmt: skip
    return curve


def plot_success_curve(run: Path, curve: list[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4))
    x = [c["minutes"] if c["minutes"] is not None else float("nan") for c in curve]
    y = [c["success_rate"] for c in curve]
    err = [[c["success_rate"] - c["ci95"][0] for c in curve], [c["ci95"][1] - c["success_rate"] for c in curve]]
    ax.errorbar(x, y, yerr=err, fmt="ko-", capsize=3)
    ax.set_xlabel("training wall-clock (minutes)")
    ax.set_ylabel("closed-loop success (95% CI)")
    ax.set_ylim(0, 1)
    ax.set_title(f"success against training time: {run}", fontsize=8)
    fig.tight_layout()
    out = run / "success_curve.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summary(run: Path) -> str:
    lines = []
    ev, ex, swap = _load(run / "eval.json"), _load(run / "experts.json"), _load(run / "eval_swap_colour.json")
    para = _load(run / "eval_paraphrase.json")
    rate = lambda probe, task: probe and probe.get("tasks", {}).get(task)  # noqa: E731
    pct = lambda r: f"{r['success_rate']:.0%}" if r else "-"  # noqa: E731
    if ev:
        experts = {r["task"]: r for r in (ex or {}).get("rows", [])}
        lines += [
            "| task | policy success | 95% CI | expert (same seeds) | swapped colour | held-out paraphrase |",
            "|---|---|---|---|---|---|",
        ]
        for task, r in ev["tasks"].items():
            lo, hi = r["ci95"]
            e = experts.get(task)
            cells = f"{pct(e)} | {pct(rate(swap, task))} | {pct(rate(para, task))}"
            lines.append(f"| {task} | {r['success_rate']:.0%} ({r['episodes']}) | [{lo:.0%}, {hi:.0%}] | {cells} |")
        o = ev["overall"]
        mean_task = sum(r["success_rate"] for r in ev["tasks"].values()) / max(len(ev["tasks"]), 1)
        expert_mean = sum(r["success_rate"] for r in experts.values()) / len(experts) if experts else None
        lines.append(
            f"| **mean over tasks** | **{mean_task:.0%}** ({o['episodes']}) | | "
            f"{f'{expert_mean:.0%}' if expert_mean is not None else '-'} | "
            f"{pct(swap and swap['overall'])} | {pct(para and para['overall'])} |"
        )
        if para and ev["overall"]["success_rate"] > 0:  # the bar: at least 70% of the in-distribution rate
            ratio = para["overall"]["success_rate"] / ev["overall"]["success_rate"]
            lines.append(f"held-out paraphrases reach {ratio:.0%} of the in-distribution success")
        if is_mt50(ev):
            lines.append(mt50_table(run))
    dep = _load(run / "deploy.json")
    if dep:
        lat = dep["latency_ms"]
        lines.append(
            f"\ndeploy: {dep.get('hz', '?')} Hz, budget {dep.get('budget_ms', '?')} ms: "
            f"latency p50 {lat['p50']:.1f} ms, "
            f"p99 {lat['p99']:.1f} ms, max {lat['max']:.1f} ms; {dep['steps']} steps, {dep['deadline_misses']} "
            f"deadline misses, {dep['fallbacks']} fallbacks, success={dep['success']}"
        )
    times = run / "stage_times.txt"
    if times.is_file():
        parts = [ln.split() for ln in times.read_text().splitlines() if ln.strip()]
        lines.append("\nwall-clock per stage: " + ", ".join(f"{n} {int(s)} s" for n, s in parts))
        lines.append(f"total: {sum(int(s) for _, s in parts)} s")
    curve = success_curve(run)
    if curve:
        lines += ["\n| training minutes | step | success | 95% CI | episodes |", "|---|---|---|---|---|"]
        for c in curve:
            minutes = f"{c['minutes']:.0f}" if c["minutes"] is not None else "-"
            lo, hi = c["ci95"]
            lines.append(
                f"| {minutes} | {c['step']} | {c['success_rate']:.0%} | [{lo:.0%}, {hi:.0%}] | {c['episodes']} |"
            )
        lines.append(f"success curve: {plot_success_curve(run, curve)}")
    curves = plot_training_curves(run)
    if curves:
        lines.append(f"\ntraining curves: {curves}")
    return "\n".join(lines) if lines else f"{run}: nothing to summarize yet"
