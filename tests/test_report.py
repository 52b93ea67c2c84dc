"""The run summary: policy beside expert and grounding probe, deploy latency, stage times, curves."""

import json

from vla.cli.report import main
from vla.evaluation.report import summary


def test_summary_of_a_run_directory(tmp_path):
    task = "tabletop/Reach-v0"
    ev = {"tasks": {task: {"success_rate": 0.9, "episodes": 50, "ci95": [0.79, 0.96], "mean_length": 12.0}},
          "overall": {"success_rate": 0.9, "episodes": 50, "ci95": [0.79, 0.96]}}  # fmt: skip
    (tmp_path / "eval.json").write_text(json.dumps(ev))
    (tmp_path / "experts.json").write_text(json.dumps({"rows": [{"task": task, "success_rate": 1.0}]}))
    swap = {"tasks": {task: {"success_rate": 0.1}}, "overall": {"success_rate": 0.1}}
    (tmp_path / "eval_swap_colour.json").write_text(json.dumps(swap))
    para = {"tasks": {task: {"success_rate": 0.72}}, "overall": {"success_rate": 0.72}}
    (tmp_path / "eval_paraphrase.json").write_text(json.dumps(para))
    dep = {"latency_ms": {"p50": 3.0, "p95": 4.0, "p99": 5.5, "max": 7.0}, "steps": 100, "deadline_misses": 0,
           "fallbacks": 0, "success": True, "hz": 20, "budget_ms": 50}  # fmt: skip
    (tmp_path / "deploy.json").write_text(json.dumps(dep))
    (tmp_path / "stage_times.txt").write_text("collect 40\ntrain 900\n")
    lines = [{"step": s, "loss": 3.0 / s, "accuracy/dim0": 0.5} for s in (1, 2, 3)] + [{"step": 3, "valid/loss": 1.2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    text = summary(tmp_path)
    assert f"| {task} | 90% (50) | [79%, 96%] | 100% | 10% | 72% |" in text
    assert "held-out paraphrases reach 80% of the in-distribution success" in text
    assert "p50 3.0 ms" in text and "p99 5.5 ms" in text
    assert "collect 40 s, train 900 s" in text and "total: 940 s" in text
    assert (tmp_path / "training_curves.png").stat().st_size > 1000


def test_missing_directory_is_one_clear_error(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_success_against_training_minutes_from_kept_checkpoints(tmp_path):
    point = lambda rate, n: {
        "tasks": {},
        "overall": {"success_rate": rate, "episodes": n, "ci95": [rate - 0.1, rate + 0.1]},
    }  # noqa: E731
    (tmp_path / "curve").mkdir()
    (tmp_path / "curve" / "step_0000100.json").write_text(json.dumps(point(0.3, 100)))
    (tmp_path / "eval.json").write_text(json.dumps(point(0.6, 500)))  # the final checkpoint's, step 200
    lines = [{"step": s, "loss": 1.0, "train_s": 6.0 * s} for s in (50, 100, 150, 200)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    text = summary(tmp_path)
    assert "| 10 | 100 | 30% | [20%, 40%] | 100 |" in text and "| 20 | 200 | 60% | [50%, 70%] | 500 |" in text
    assert (tmp_path / "success_curve.png").stat().st_size > 1000
