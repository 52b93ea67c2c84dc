"""The demo's whole path at toy size: noisy collection -> configs/demo.yaml training -> eval -> deploy.

`make demo` runs the same commands at full size (scripts/demo.sh); this keeps its configuration
(FiLM, keypoints, the localization losses, DART labels) wired end to end in CI, in well under a minute."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli, run_main
from vla.policy.load import load_policy


@pytest.mark.slow
def test_demo_path_end_to_end_at_toy_size(tmp_path):
    data, run = tmp_path / "demo.hdf5", tmp_path / "run"
    r = run_cli("vla.cli.collect", "--tasks", "all", "--episodes-per-task", "2", "--workers", "2", "--noise", "0.3",
                "--out", data, "--quiet", "--valid-fraction", "0.5")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert run_main("vla.cli.data", "validate", data).returncode == 0  # its process is tested in test_data_cli

    tiny = ["model.d_model=32", "model.n_head=2", "model.n_layer=1", "model.d_ff=64", "model.keypoint_channels=8",
            "train.steps=6", "train.batch_size=4", "train.log_every=3", "eval.every=0", "eval.episodes=0"]  # fmt: skip
    r = run_cli("vla.cli.train", "--config", "configs/demo.yaml", "--data", data, "--out", run, *tiny)
    assert r.returncode == 0, r.stderr
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("aux_loss" in m and "keypoint_loss" in m for m in metrics)  # localization losses on, as in the demo
    policy = load_policy(run, device="cpu")
    assert policy.cfg.film and policy.cfg.keypoints == 8 and policy.spec.aux_dim == 6 and policy.model.layout.feeds_aux

    # eval and deploy in this process: their console scripts start in their own (tests/test_cli.py)
    r = run_main("vla.cli.eval", "--checkpoint", run, "--tasks", "reach", "--episodes-per-task", "1",
                "--json", tmp_path / "eval.json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "eval.json").read_text())["tasks"]["tabletop/Reach-v0"]["episodes"] == 1

    r = run_main("vla.cli.deploy", "--checkpoint", run, "--task", "pick_place", "--hz", 20, "--budget-ms", 50,
                "--seconds", 0.5, "--json", tmp_path / "deploy.json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "deploy.json").read_text())
    assert 1 <= report["steps"] <= 10  # 0.5 s at 20 Hz
    assert report["end_reason"] == ("success" if report["success"] else "time")
