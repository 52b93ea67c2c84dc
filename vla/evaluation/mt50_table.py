"""Meta-World MT50 in the SmolVLA paper's layout: easy / medium / hard / very hard / average (`vla.evaluation.report`).

A split's score is the mean success over its tasks (each task the same number of episodes, so also the pooled
rate); the Average is the mean of the four split scores, as the paper forms it ((82.5 + 41.8 + 45.0 + 60.0) / 4
= 57.3), not the mean over the 50 tasks (which would weigh easy's 28 most). Splits: LeRobot's, `envs.MT50_SPLITS`.

What `scripts/metaworld_mt50.sh` leaves in the run directory, and the row each file makes:
    eval.json                the policy, 10 episodes per task from seed 100000: the published protocol
    eval_more/seeds_S.json   the policy, 10 more per task from seed S = 100010, 100020, ...: with eval.json, 50
    experts.json             the scripted experts on eval.json's seeds (`python -m envs --json`)
    experts50.json           ... on the 50 seeds
    privileged/              a second run (the simulator's training-time targets), with its own eval files
    config.json, model.safetensors, mt50_job.json: the settings the differences line names
The 50-episode figures carry 95% Wilson intervals: per split and over all tasks on the pooled episodes; for the
Average (a mean of four binomial rates, not one) a Wilson interval at the effective sample size p(1-p)/Var.

Published rows: SmolVLA paper (Shukor et al., arXiv 2506.01844), Table 2, Meta-World block. SmolVLA-0.45B's four
splits and both averages are quoted in issue 44; pi0's splits (71.8 / 48.2 / 41.7 / 30.0) are read from two
transcriptions of that table (the paper's own text could not be fetched here); their mean is its 47.9 average.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import envs
from vla.evaluation.evaluate import wilson_interval

SPLITS = ("easy", "medium", "hard", "very_hard")
PUBLISHED = (  # (row, {split: %}, average %), SmolVLA paper Table 2
    ("SmolVLA-0.45B (published)", {"easy": 82.5, "medium": 41.8, "hard": 45.0, "very_hard": 60.0}, 57.3),
    ("pi0-3.3B, pretrained (published)", {"easy": 71.8, "medium": 48.2, "hard": 41.7, "very_hard": 30.0}, 47.9),
)
PUBLISHED_SETTING = (
    "LeRobot's `lerobot/metaworld_mt50` dataset (50 episodes per task); SmolVLA fine-tuned from a pretrained VLM "
    "(SmolVLM2, no robot-data pretraining), pi0 from PaliGemma-3B with robot-data pretraining, on GPUs; LeRobot's "
    "480x480 frames; 10 episodes per task, in an evaluation older than LeRobot's seeded resets (unseeded layouts)"
)

Counts = dict[str, tuple[int, int]]  # task -> (successes, episodes)


def is_mt50(ev: dict | None) -> bool:
    """Does this eval.json hold MT50 tasks (`metaworld-lerobot/...`)?"""
    tasks = {t for ids in envs.MT50_SPLITS.values() for t in ids}
    return bool(ev) and any(t in tasks for t in ev.get("tasks", {}))


def policy_counts(ev: dict | None) -> Counts:
    """vla-eval's JSON -> {task: (successes, episodes)}."""
    if not ev:
        return {}
    return {t: (round(r["success_rate"] * r["episodes"]), r["episodes"]) for t, r in ev["tasks"].items()}


def expert_counts(ex: dict | None) -> Counts:
    """`python -m envs --json` -> {task: (successes, episodes)}."""
    rows = (ex or {}).get("rows", [])
    return {r["task"]: (round(r["success_rate"] * r["episodes"]), r["episodes"]) for r in rows}


def pooled(*parts: Counts) -> Counts:
    """Per-task sums of several evaluations on disjoint seeds (eval.json + eval_more/*.json = 50 per task)."""
    out: dict[str, list[int]] = {}
    for part in parts:
        for task, (k, n) in part.items():
            acc = out.setdefault(task, [0, 0])
            acc[0] += k
            acc[1] += n
    return {t: (k, n) for t, (k, n) in out.items()}


def split_scores(counts: Counts) -> dict:
    """{split: {"rate", "successes", "episodes", "tasks", "of"}} and "average" (mean of the four splits, None unless
    all four have results) with its effective-n Wilson interval, and "all" (the pooled episodes of every task)."""
    out: dict = {}
    for split in SPLITS:
        present = [counts[t] for t in envs.MT50_SPLITS[split] if t in counts and counts[t][1] > 0]
        if not present:
            out[split] = None
            continue
        k, n = sum(c[0] for c in present), sum(c[1] for c in present)
        rate = sum(c[0] / c[1] for c in present) / len(present)  # the mean over the split's tasks
        out[split] = {"rate": rate, "successes": k, "episodes": n, "tasks": len(present),
                      "of": len(envs.MT50_SPLITS[split]), "ci95": wilson_interval(k, n)}  # fmt: skip
    scored = [out[s] for s in SPLITS if out[s] is not None]
    out["average"] = None
    if len(scored) == len(SPLITS):
        p = sum(s["rate"] for s in scored) / len(SPLITS)
        var = sum(s["rate"] * (1 - s["rate"]) / s["episodes"] for s in scored) / len(SPLITS) ** 2
        n_eff = p * (1 - p) / var if var > 0 else sum(s["episodes"] for s in scored)
        out["average"] = {"rate": p, "ci95": wilson_interval(p * n_eff, n_eff)}
    k, n = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
    out["all"] = {"rate": k / n, "episodes": n, "ci95": wilson_interval(k, n)} if n else None
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _cell(s: dict | None, ci: bool = False) -> str:
    if s is None:
        return "-"
    text = _pct(s["rate"])
    if "tasks" in s and s["tasks"] < s["of"]:
        text += f" ({s['tasks']}/{s['of']} tasks)"
    if ci:
        lo, hi = s["ci95"]
        text += f" [{_pct(lo)}, {_pct(hi)}]"
    return text


def _load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def parameter_count(run: Path) -> int | None:
    """The parameters in RUN/model.safetensors, from its JSON header (no torch): None without the file."""
    path = run / "model.safetensors"
    if not path.is_file():
        return None
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")


def _run_setting(run: Path) -> dict:
    """What the run's checkpoint and job file say: image side, parameters, privileged targets, steps, demos."""
    meta = _load(run / "config.json") or {}
    data = meta.get("config", {}).get("data", {})
    job = _load(run / "mt50_job.json") or {}
    return {
        "image_size": meta.get("data_spec", {}).get("image_size"),
        "params": parameter_count(run),
        "privileged": bool(data.get("aux_key") or data.get("keypoint_key")) if data else None,
        "waypoints": bool(data.get("waypoint_targets")),
        "moved_object": bool(data.get("moved_object_targets")),
        "steps": meta.get("config", {}).get("train", {}).get("steps"),
        "demos_per_task": job.get("demos_per_task"),
        "noise": job.get("noise"),
        "valid_fraction": job.get("valid_fraction"),
    }


def _row_name(setting: dict, fallback: str) -> str:
    if setting["privileged"] is None:
        return fallback
    if setting["privileged"]:
        return "ours, privileged training targets"  # object xyz and image position, from the simulator
    # read from proprio + gripper command, and from what the video shows the hand move
    kinds = [kind for kind, on in (("waypoint", setting["waypoints"]), ("moved-object", setting["moved_object"])) if on]
    return "ours, no privileged information" + (f" ({' and '.join(kinds)} targets)" if kinds else "")


def _our_runs(run: Path) -> list[tuple[str, Path]]:
    """(row name, directory) of the run and its privileged/ twin, those that have an eval.json."""
    runs = [(run, "ours"), (run / "privileged", "ours, privileged training targets")]
    return [(_row_name(_run_setting(d), name), d) for d, name in runs if (d / "eval.json").is_file()]


def differences(run: Path) -> str:
    """One line naming every setting in which our rows differ from the published ones."""
    s = _run_setting(run)
    size = f"{s['image_size']}x{s['image_size']}" if s["image_size"] else "our chosen size"
    params = f"{s['params'] / 1e6:.1f}M parameters" if s["params"] else "a small model"
    demos = f"{s['demos_per_task']} per task" if s["demos_per_task"] else "per task as collected"
    if s["valid_fraction"]:
        demos += f", {s['valid_fraction']:.0%} of them held out for the validation loss"
    noise = f", DART noise {s['noise']}" if s["noise"] else ""
    steps = f" for {s['steps']} steps" if s["steps"] else ""
    return (
        f"Settings that differ. Ours: scripted-expert demonstrations ({demos}{noise}; Meta-World's own policies, "
        f"random layouts from collector seeds 0+), {params} trained from scratch (no pretraining)"
        f"{steps}, the corner2 camera at {size} (our renderer: no shadows "
        "or multisampling), 10 episodes per task (and 50) on evaluation seeds 100000+, disjoint from the "
        "collector's (our seed -> layout map is not LeRobot's). Published: " + PUBLISHED_SETTING + ". Same: the 50 "
        "tasks and splits, the instruction sentences, obs[:4] as the state, 500 steps, success at any step."
    )


def mt50_table(run: Path) -> str:
    """The MT50 section of `python -m vla.cli.report RUN`: 10-episode table beside the published rows, the
    differences in setting, then the 50-episode figures with Wilson intervals."""
    ours = _our_runs(run)
    lines = [
        "\n## Meta-World MT50 (LeRobot's protocol; the SmolVLA paper's Table 2 layout)",
        "\nSuccess (%), 10 episodes per task (500 in all), seeds 100000-100009; average = mean of the four splits.\n",
        "| policy | easy (28) | medium (11) | hard (6) | very hard (5) | average |",
        "|---|---|---|---|---|---|",
    ]
    rows = [(name, policy_counts(_load(d / "eval.json"))) for name, d in ours]
    rows.append(("scripted expert, same seeds", expert_counts(_load(run / "experts.json"))))
    for name, counts in rows:
        s = split_scores(counts)
        lines.append(f"| {name} | " + " | ".join(_cell(s[k]) for k in (*SPLITS, "average")) + " |")
    for name, splits, average in PUBLISHED:
        lines.append(f"| {name} | " + " | ".join(f"{splits[k]:.1f}" for k in SPLITS) + f" | {average:.1f} |")
    lines.append("\n" + differences(run))
    lines += [
        "\nSuccess (%) [95% Wilson interval; the average's at its effective sample size], 50 episodes per task "
        "(2500 in all), seeds 100000-100049:\n",
        "| policy | easy (28) | medium (11) | hard (6) | very hard (5) | average | mean over tasks |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = [(name, pooled(*(policy_counts(_load(p)) for p in [d / "eval.json", *sorted(d.glob("eval_more/*.json"))])))
            for name, d in ours]  # fmt: skip
    rows.append(("scripted expert, same seeds", expert_counts(_load(run / "experts50.json"))))
    for name, counts in rows:
        s = split_scores(counts)
        episodes = s["all"]["episodes"] if s["all"] else 0
        cells = [_cell(s[k], ci=True) for k in (*SPLITS, "average", "all")]
        lines.append(f"| {name}, {episodes} episodes | " + " | ".join(cells) + " |")
    return "\n".join(lines)
