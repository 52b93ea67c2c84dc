"""The MT50 table in the SmolVLA paper's layout (vla/evaluation/mt50_table.py) and its job (scripts/metaworld_mt50.sh).

The run directory is synthetic: per-task success counts written here, so every figure is known by hand."""

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import envs
from tests.conftest import run_main
from vla.evaluation.evaluate import wilson_interval
from vla.evaluation.mt50_table import PUBLISHED, SPLITS, split_scores
from vla.evaluation.report import summary
from vla.training.config import load_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "metaworld_mt50.sh"

# Successes out of 10 per task, by split: easy 9/10 everywhere -> 90.0; medium 5 tasks solved, 6 not -> 5/11 =
# 45.5; hard 3/10 -> 30.0; very hard 2 solved, 3 at 5/10 -> 70.0. Average of the splits 58.9; the mean over the 50
# tasks is 355/500 = 71.0, so a table that averaged over tasks would show it.
OURS = {
    "easy": [9] * 28,
    "medium": [10] * 5 + [0] * 6,
    "hard": [3] * 6,
    "very_hard": [10, 10, 5, 5, 5],
}


def eval_json(wins_of_10: dict[str, list[int]], scale: int = 1) -> dict:
    """vla-eval's JSON for `scale` x 10 episodes per task, `scale` x wins successes."""
    tasks = {}
    for split, wins in wins_of_10.items():
        for task, k in zip(envs.MT50_SPLITS[split], wins, strict=True):
            n = 10 * scale
            tasks[task] = {"success_rate": k * scale / n, "episodes": n, "ci95": list(wilson_interval(k * scale, n)),
                           "mean_length": 100.0}  # fmt: skip
    k = sum(r["success_rate"] * r["episodes"] for r in tasks.values())
    n = sum(r["episodes"] for r in tasks.values())
    overall = {"success_rate": k / n, "episodes": n, "ci95": list(wilson_interval(round(k), n))}
    return {"tasks": tasks, "overall": overall}


def experts_json(episodes: int, shelf_place_wins: int) -> dict:
    rows = [{"task": t, "episodes": episodes, "success_rate": 1.0} for ids in envs.MT50_SPLITS.values() for t in ids]
    for r in rows:
        if r["task"] == "metaworld-lerobot/shelf-place-v3":
            r["success_rate"] = shelf_place_wins / episodes
    return {"rows": rows, "seed": 100000}


def checkpoint_files(run: Path, aux_key: str, waypoints: bool) -> None:
    """config.json and a model.safetensors header (1.1M parameters) as vla-train leaves them."""
    run.mkdir(parents=True, exist_ok=True)
    config = {"data": {"aux_key": aux_key, "keypoint_key": aux_key and "object_px", "waypoint_targets": waypoints},
              "train": {"steps": 9000}}  # fmt: skip
    (run / "config.json").write_text(json.dumps({"data_spec": {"image_size": 96}, "config": config}))
    header = json.dumps({"a": {"dtype": "F32", "shape": [1000, 1000], "data_offsets": [0, 4_000_000]},
                         "b": {"dtype": "F32", "shape": [100_000], "data_offsets": [4_000_000, 4_400_000]},
                         "__metadata__": {"format": "pt"}}).encode()  # fmt: skip
    (run / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)


@pytest.fixture
def run(tmp_path):
    (tmp_path / "eval.json").write_text(json.dumps(eval_json(OURS)))
    (tmp_path / "eval_more").mkdir()  # 40 more per task in two parts (10 and 30), at the same rates
    (tmp_path / "eval_more" / "seeds_100010.json").write_text(json.dumps(eval_json(OURS, scale=1)))
    (tmp_path / "eval_more" / "seeds_100020.json").write_text(json.dumps(eval_json(OURS, scale=3)))
    (tmp_path / "experts.json").write_text(json.dumps(experts_json(10, shelf_place_wins=7)))
    (tmp_path / "experts50.json").write_text(json.dumps(experts_json(50, shelf_place_wins=40)))
    (tmp_path / "mt50_job.json").write_text(json.dumps({"demos_per_task": 50, "valid_fraction": 0.1, "noise": 0.2}))
    checkpoint_files(tmp_path, aux_key="", waypoints=True)
    solved = {split: [10] * len(ids) for split, ids in envs.MT50_SPLITS.items()}
    checkpoint_files(tmp_path / "privileged", aux_key="object", waypoints=False)
    (tmp_path / "privileged" / "eval.json").write_text(json.dumps(eval_json(solved)))
    return tmp_path


def test_the_splits_are_lerobots():
    assert [len(envs.MT50_SPLITS[s]) for s in SPLITS] == [28, 11, 6, 5]
    assert len({t for ids in envs.MT50_SPLITS.values() for t in ids}) == 50


def test_ten_episode_table_in_the_papers_layout(run):
    text = summary(run)
    lines = text.splitlines()
    header = "| policy | easy (28) | medium (11) | hard (6) | very hard (5) | average |"
    assert header in lines
    ours = "| ours, no privileged information (waypoint targets) | 90.0 | 45.5 | 30.0 | 70.0 | 58.9 |"
    privileged = "| ours, privileged training targets | 100.0 | 100.0 | 100.0 | 100.0 | 100.0 |"
    expert = "| scripted expert, same seeds | 100.0 | 100.0 | 100.0 | 94.0 | 98.5 |"
    smolvla = "| SmolVLA-0.45B (published) | 82.5 | 41.8 | 45.0 | 60.0 | 57.3 |"
    pi0 = "| pi0-3.3B, pretrained (published) | 71.8 | 48.2 | 41.7 | 30.0 | 47.9 |"
    rows = [ours, privileged, expert, smolvla, pi0]
    assert all(r in lines for r in rows), text
    assert [lines.index(r) for r in rows] == sorted(lines.index(r) for r in rows)  # ours first, published last
    assert lines.index(ours) == lines.index(header) + 2
    # the per-task table of every run is still there, 50 rows of it
    assert sum(line.startswith("| metaworld-lerobot/") for line in lines) == 50


def test_the_report_cli_prints_it(run):
    result = run_main("vla.cli.report", run)
    assert result.returncode == 0, result.stderr
    assert "| SmolVLA-0.45B (published) | 82.5 | 41.8 | 45.0 | 60.0 | 57.3 |" in result.stdout


def test_the_row_names_the_label_free_targets_it_trained_with(run):
    config = json.loads((run / "config.json").read_text())
    config["config"]["data"]["moved_object_targets"] = True
    (run / "config.json").write_text(json.dumps(config))
    row = "| ours, no privileged information (waypoint and moved-object targets) | 90.0 | 45.5 | 30.0 | 70.0 | 58.9 |"
    assert row in summary(run).splitlines()


def test_average_is_the_mean_of_the_splits_not_of_the_tasks(run):
    counts = {t: (k, 10) for split, ks in OURS.items() for t, k in zip(envs.MT50_SPLITS[split], ks, strict=True)}
    s = split_scores(counts)
    assert [round(100 * s[k]["rate"], 1) for k in SPLITS] == [90.0, 45.5, 30.0, 70.0]
    assert s["average"]["rate"] == pytest.approx((0.9 + 5 / 11 + 0.3 + 0.7) / 4)
    assert s["all"]["rate"] == pytest.approx(355 / 500)  # the mean over tasks differs: 71.0, not 58.9
    for _, splits, average in PUBLISHED:  # the paper's own rows obey the same rule
        assert sum(splits.values()) / 4 == pytest.approx(average, abs=0.05)


def test_differences_in_setting_are_named(run):
    text = summary(run)
    line = next(ln for ln in text.splitlines() if ln.startswith("Settings that differ."))
    needles = ("scripted-expert demonstrations (50 per task, 10% of them held out for the validation loss, DART",
               "DART noise 0.2;", "1.1M parameters", "9000 steps",
               "from scratch (no pretraining)", "96x96", "10 episodes per task", "seeds 100000+",
               "lerobot/metaworld_mt50", "pretrained VLM", "robot-data pretraining", "480x480")  # fmt: skip
    for needle in needles:
        assert needle in line, needle


def test_fifty_episode_figures_pool_the_two_evaluations_with_wilson_intervals(run):
    lines = summary(run).splitlines()
    row = next(ln for ln in lines if ln.startswith("| ours, no privileged information") and " episodes |" in ln)
    assert ", 2500 episodes |" in row
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    lo, hi = wilson_interval(28 * 45, 28 * 50)  # easy: 9 of 10 and 36 of 40 per task, pooled
    assert cells[0] == f"90.0 [{100 * lo:.1f}, {100 * hi:.1f}]"
    lo, hi = wilson_interval(3 * 5 * 6, 50 * 6)  # hard
    assert cells[2] == f"30.0 [{100 * lo:.1f}, {100 * hi:.1f}]"
    lo, hi = wilson_interval(355 * 5, 2500)  # over all tasks
    assert cells[5] == f"71.0 [{100 * lo:.1f}, {100 * hi:.1f}]"
    # the average's interval: Wilson at the effective sample size of the mean of four rates
    p = (0.9 + 5 / 11 + 0.3 + 0.7) / 4
    var = sum(r * (1 - r) / n for r, n in ((0.9, 1400), (5 / 11, 550), (0.3, 300), (0.7, 250))) / 16
    lo, hi = wilson_interval(p * p * (1 - p) / var, p * (1 - p) / var)
    assert cells[4] == f"{100 * p:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"
    assert lo < p < hi and hi - lo < 0.1
    expert = next(ln for ln in lines if ln.startswith("| scripted expert, same seeds, 2500 episodes |"))
    assert "| 96.0 [" in expert  # very hard: 4 tasks 50 of 50, shelf-place 40 of 50 -> 96.0
    privileged = next(ln for ln in lines if ln.startswith("| ours, privileged") and " episodes |" in ln)
    assert ", 500 episodes |" in privileged  # no eval_more/ there: its 10 per task, said so


def test_a_partial_evaluation_says_what_it_covers():
    counts = {t: (5, 10) for t in envs.MT50_SPLITS["easy"][:20]}
    s = split_scores(counts)
    assert s["easy"]["tasks"] == 20 and s["medium"] is None and s["average"] is None


def test_the_job_script_parses_and_prints_its_header():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    out = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, check=True, timeout=10).stdout
    needles = (
        "make metaworld-mt50",
        "EPISODES_PER_TASK=50",
        "IMAGE_SIZE=128",
        "docs/metaworld_mt50.md",
        "MT50_PRIVILEGED=1",
        "1 experts",
        "2 collect",
        "3 train",
        "4 evaluate",
        "6 40 more",
        "8 report",
    )
    for needle in needles:
        assert needle in out, needle
    assert "set -euo" not in out and "metaworld-mt50: setup" in (ROOT / "Makefile").read_text()


@pytest.mark.parametrize(("size", "demos"), [(96, 50), (128, 100)])
def test_the_job_refuses_data_collected_for_another_job(tmp_path, size, demos):
    """A run directory from another size or demo count under today's defaults: exit 2, one line, nothing trained."""
    run, data = tmp_path / "run", tmp_path / "mt50.hdf5"
    run.mkdir()
    for name in ("experts.json", "experts50.json"):
        (run / name).write_text("{}")
    data.write_bytes(b"collected")
    job = {"image_size": size, "demos_per_task": demos, "data": str(data)}
    (run / "mt50_job.json").write_text(json.dumps(job))
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "RUN": str(run),
        "DATA": str(data),
    }
    for setting in ("IMAGE_SIZE", "EPISODES_PER_TASK"):  # the script's defaults: 128 px, 50 a task
        env.pop(setting, None)
    got = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert got.returncode == 2, got.stderr
    assert got.stderr.strip().splitlines()[-1] == (
        f"error: {data} was collected at {size}px with {demos} demos per task, not IMAGE_SIZE=128"
        " EPISODES_PER_TASK=50; set those or give another DATA and RUN"
    )
    assert not (run / "latest").exists() and data.read_bytes() == b"collected"


def test_the_two_rows_configs():
    row1 = load_config(str(ROOT / "configs" / "metaworld_mt50.yaml"), [])
    assert (row1.data.aux_key, row1.data.keypoint_key, row1.data.waypoint_targets) == ("", "", True)
    assert row1.data.gripper_dim == 3 and row1.data.waypoint_dims == [0, 1, 2]  # obs[:4]: hand xyz, gripper
    overrides = re.search(r"PRIVILEGED_OVERRIDES=\(([^)]*)\)", SCRIPT.read_text()).group(1).split()
    row2 = load_config(str(ROOT / "configs" / "metaworld_mt50.yaml"), overrides)
    assert (row2.data.aux_key, row2.data.keypoint_key, row2.data.waypoint_targets) == ("object", "object_px", False)
