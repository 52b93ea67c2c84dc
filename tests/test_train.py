"""vla-train on a real (tiny) collected dataset: learning, exact resume, checkpoints, errors, DDP."""

import json
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs  # noqa: F401 - registers the tasks
from tests.conftest import run_cli
from vla.checkpoint import load_meta
from vla.policy import load_policy
from vla.train import main as train_main

TINY = "configs/tiny.yaml"


def train(data, out, *overrides):
    return train_main(["--config", TINY, "--data", str(data), "--out", str(out), *overrides])


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_loss_falls_and_run_dir_is_complete(tiny_dataset, tmp_path):
    out = tmp_path / "run"
    assert train(tiny_dataset, out, "train.steps=80", "train.log_every=10") == 0
    losses = [m["loss"] for m in metrics(out) if "loss" in m]
    assert len(losses) == 8
    assert losses[-1] < 0.6 * losses[0], losses
    for name in ("model.safetensors", "config.json", "train_state.pt", "run_config.json", "best/config.json"):
        assert (out / name).is_file(), name
    assert list((out / "tb").glob("events.out.tfevents.*"))
    meta = load_meta(out)
    assert meta["step"] == 80 and set(meta["tokenizers"]) == {"text", "action", "proprio"}
    assert meta["tasks"] and all(t.startswith("tabletop/") for t in meta["tasks"])
    assert any("valid/loss" in m for m in metrics(out))


def test_resume_is_exact(tiny_dataset, tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert train(tiny_dataset, whole, "train.steps=24", "train.log_every=4") == 0
    assert train(tiny_dataset, split, "train.steps=24", "train.log_every=4", "train.stop_at=10") == 0
    assert load_meta(split)["step"] == 10
    assert train_main(["--data", str(tiny_dataset), "--out", str(split), "--resume", "train.stop_at=0"]) == 0
    a = [(m["step"], m["loss"]) for m in metrics(whole) if "loss" in m]
    b = [(m["step"], m["loss"]) for m in metrics(split) if "loss" in m]
    assert [s for s, _ in a] == [s for s, _ in b]  # no duplicated or missing training lines
    assert abs(a[-1][1] - b[-1][1]) <= 1e-6, (a[-1], b[-1])
    pa, pb = load_policy(whole).model.state_dict(), load_policy(split).model.state_dict()
    assert all(torch.allclose(pa[k], pb[k], atol=1e-6) for k in pa)


def test_config_errors_are_one_line(tiny_dataset, tmp_path, capsys):
    assert train(tiny_dataset, tmp_path / "r", "model.n_layr=3") == 2
    err = capsys.readouterr().err.strip()
    assert err == "vla-train: error: unknown key 'model.n_layr'; did you mean 'n_layer'?"
    assert train(tiny_dataset, tmp_path / "r", "data.keypoint_key=object_px", "data.augment_shift=4") == 2
    assert "needs augment_shift: 0" in capsys.readouterr().err
    assert train(tmp_path / "missing.hdf5", tmp_path / "r") == 2
    assert "no such file" in capsys.readouterr().err
    assert train(tiny_dataset, tmp_path / "r", "train.steps=2") == 0
    assert train(tiny_dataset, tmp_path / "r", "train.steps=2") == 2  # would overwrite a run
    assert "--resume" in capsys.readouterr().err


def test_checkpoint_loads_in_a_fresh_process_with_identical_outputs(tiny_dataset, tmp_path):
    out = tmp_path / "run"
    assert train(tiny_dataset, out, "train.steps=10") == 0
    script = f"""
import json, numpy as np, gymnasium as gym, envs
from vla import load_policy
policy = load_policy({str(out)!r}, device="cpu")
env = gym.make("tabletop/Reach-v0")
obs, _ = env.reset(seed=3)
policy.reset(obs["instruction"])
print(json.dumps([policy.act(obs).tolist() for _ in range(3)]))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    theirs = np.array(json.loads(proc.stdout.strip().splitlines()[-1]))
    policy = load_policy(out, device="cpu")
    env = gym.make("tabletop/Reach-v0")
    obs, _ = env.reset(seed=3)
    policy.reset(obs["instruction"])
    ours = np.array([policy.act(obs).tolist() for _ in range(3)])
    np.testing.assert_array_equal(ours, theirs)


def test_nonfinite_loss_stops_with_step_and_demos(tiny_dataset, tmp_path, capsys):
    code = train(tiny_dataset, tmp_path / "r", "optim.lr=1e30", "optim.warmup_steps=1")
    err = capsys.readouterr().err
    assert code == 3
    assert "non-finite loss" in err and "step 2" in err and "demo_" in err
    assert (
        train(tiny_dataset, tmp_path / "s", "optim.lr=1e30", "optim.warmup_steps=1", "train.skip_nonfinite=true") == 0
    )
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["skipped_nonfinite"] > 0 and summary["finished"]


@pytest.mark.slow
def test_ddp_two_processes_hold_identical_weights(tiny_dataset, tmp_path):
    out = tmp_path / "ddp"
    proc = run_cli(
        "torch.distributed.run", "--nproc-per-node", "2", "-m", "vla.train",
        "--config", TINY, "--data", tiny_dataset, "--out", out, "train.steps=6", "train.log_every=2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["finished"]
    digests = summary["rank_weight_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
