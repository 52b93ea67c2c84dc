"""vla-train on a real (tiny) collected dataset: learning, exact resume, checkpoints, errors, DDP."""

import json
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs  # noqa: F401 - registers the tasks
from vla.checkpoint import load_checkpoint
from vla.cli.train import main as train_main
from vla.policy.load import load_policy
from vla.training import train as train_module
from vla.training.config import load_config

TINY = "configs/tiny.yaml"


def train(data, out, *overrides):
    return train_main(["--config", TINY, "--data", str(data), "--out", str(out), *overrides])


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_loss_falls_and_run_dir_is_complete(tiny_dataset, tmp_path):
    out = tmp_path / "run"
    # closed-loop evaluation during training as well (one episode a task at steps 80 and 160): the path
    # `make demo` takes every 1600 steps
    assert train(tiny_dataset, out, "train.steps=160", "train.log_every=10", "train.keep_every=60",
                 "eval.every=80", "eval.episodes=1", "eval.videos=0") == 0  # fmt: skip
    assert [m["step"] for m in metrics(out) if "eval/success_rate" in m] == [80, 160]
    losses = [m["loss"] for m in metrics(out) if "loss" in m]
    assert len(losses) == 16
    # Each logged loss is one batch's (+-0.2 here), so means: the last four against the first two, 0.665 with
    # 32f1444's experts; a run that does not learn (optim.lr=1e-6) stays at 0.998
    assert sum(losses[-4:]) / 4 < 0.75 * sum(losses[:2]) / 2, losses
    for name in ("model.safetensors", "config.json", "latest/train_state.pt", "run_config.json", "best/config.json"):
        assert (out / name).is_file(), name
    kept = {d.name for d in (out / "checkpoints").iterdir()}  # what `latest` and `best` point to, and keep_every's
    pointed = {(out / "latest").resolve().name, (out / "best").resolve().name}
    assert kept == pointed | {"step_0000060", "step_0000120"} and "step_0000160" in kept
    assert load_checkpoint(out / "checkpoints" / "step_0000060").meta["step"] == 60  # a curve point loads
    assert list((out / "tb").glob("events.out.tfevents.*"))
    meta = load_checkpoint(out).meta
    assert meta["step"] == 160 and set(meta["tokenizers"]) == {"text", "action", "proprio"}
    assert meta["tasks"] and all(t.startswith("tabletop/") for t in meta["tasks"])
    assert any("valid/loss" in m for m in metrics(out))


def interrupt_after(monkeypatch, n_steps: int) -> None:
    """Ctrl-C in the optimizer step after `n_steps` steps of this process (the run's own code, unpatched)."""
    step, calls = train_module.train_step, []

    def counted(*args, **kwargs):
        calls.append(1)
        if len(calls) > n_steps:
            raise KeyboardInterrupt
        return step(*args, **kwargs)

    monkeypatch.setattr(train_module, "train_step", counted)


def test_resume_is_exact(tiny_dataset, tmp_path, monkeypatch):
    whole, split = tmp_path / "whole", tmp_path / "split"
    common = ("train.steps=24", "train.log_every=4", "train.checkpoint_every=5")
    assert train(tiny_dataset, whole, *common) == 0
    with monkeypatch.context() as m:
        interrupt_after(m, 12)
        assert train(tiny_dataset, split, *common) == 130  # interrupted in step 13
    assert load_checkpoint(split).meta["step"] == 10  # the last complete checkpoint
    assert train_main(["--out", str(split), "--resume"]) == 0
    a = [(m["step"], m["loss"]) for m in metrics(whole) if "loss" in m]
    b = [(m["step"], m["loss"]) for m in metrics(split) if "loss" in m]
    assert [s for s, _ in a] == [s for s, _ in b]  # no duplicated or missing training lines
    clock = [m["train_s"] for m in metrics(split) if "loss" in m]
    assert clock == sorted(set(clock))  # the wall clock only grows, across --resume too
    assert abs(a[-1][1] - b[-1][1]) <= 1e-6, (a[-1], b[-1])
    pa, pb = load_policy(whole).model.state_dict(), load_policy(split).model.state_dict()
    assert all(torch.allclose(pa[k], pb[k], atol=1e-6) for k in pa)
    summary = json.loads((split / "summary.json").read_text())
    assert (
        summary["finished"] and summary["final_loss"] == json.loads((whole / "summary.json").read_text())["final_loss"]
    )
    assert train_main(["--out", str(split), "--resume"]) == 0  # resuming a finished run: no step, same loss
    assert json.loads((split / "summary.json").read_text())["final_loss"] == summary["final_loss"]


def test_a_crash_while_writing_a_checkpoint_resumes_from_the_last_complete_one(tiny_dataset, tmp_path, monkeypatch):
    """The checkpoint is one unit: a kill after step 15's weights are written but before its optimizer
    state is leaves `latest` on step 10, and the resumed run ends exactly where an uninterrupted one does."""
    whole, crashed = tmp_path / "whole", tmp_path / "crashed"
    args = ("train.steps=20", "train.checkpoint_every=5", "train.log_every=5")
    assert train(tiny_dataset, whole, *args) == 0
    real_save = torch.save

    def dies_at_step_15(obj, path, *a, **k):
        if isinstance(obj, dict) and obj.get("step") == 15:
            raise KeyboardInterrupt  # a kill: the weights and config of step 15 are on disk, its state is not
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr("vla.checkpoint.torch.save", dies_at_step_15)
    assert train(tiny_dataset, crashed, *args) == 130
    monkeypatch.setattr("vla.checkpoint.torch.save", real_save)
    assert load_checkpoint(crashed).meta["step"] == 10
    assert train_main(["--out", str(crashed), "--resume"]) == 0
    final = [json.loads((d / "summary.json").read_text())["final_loss"] for d in (whole, crashed)]
    assert final[0] == final[1]
    assert sorted(d.name for d in (crashed / "checkpoints").iterdir()) == ["step_0000020"]  # no stale dirs


def test_resume_refuses_another_dataset(tiny_dataset, tmp_path, capsys):
    import shutil

    import h5py

    out, other = tmp_path / "run", tmp_path / "other.hdf5"
    assert train(tiny_dataset, out, "train.steps=4") == 0
    shutil.copy(tiny_dataset, other)
    with h5py.File(other, "r+") as f:
        name = next(iter(f["mask/train"][()])).decode()
        f[f"data/{name}/actions"][0, 0] += 0.5  # one number of the training split changed
    capsys.readouterr()
    assert train_main(["--data", str(other), "--out", str(out), "--resume", "train.steps=8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vla-train: error: --data") and "not the dataset this run started on" in err
    assert len(err.splitlines()) == 1
    assert train_main(["--data", str(tiny_dataset), "--out", str(out), "--resume", "train.steps=8"]) == 0


def test_init_starts_from_the_weights_and_tokenizers_on_other_data(tiny_dataset, tiny_checkpoint, tmp_path, capsys):
    """`--init` (DAgger's retraining): the checkpoint's weights and tokenizers, any dataset, a fresh schedule."""
    import shutil

    import h5py

    other = tmp_path / "other.hdf5"  # stands for the aggregated data: another fingerprint
    shutil.copy(tiny_dataset, other)
    with h5py.File(other, "r+") as f:
        name = next(iter(f["mask/train"][()])).decode()
        f[f"data/{name}/actions"][0, 0] += 0.5
    out = tmp_path / "ft"  # a learning rate too small to move anything: the weights must be the checkpoint's
    assert train_main(["--init", str(tiny_checkpoint), "--data", str(other), "--out", str(out), "train.steps=2",
                       "optim.lr=1e-12", "optim.weight_decay=0", "eval.episodes=0"]) == 0  # fmt: skip
    start, tuned = load_checkpoint(tiny_checkpoint).meta, load_checkpoint(out).meta
    assert tuned["step"] == 2 and tuned["tokenizers"] == start["tokenizers"] and tuned["model"] == start["model"]
    assert tuned["data"] == str(other) and tuned["init"] == str(load_checkpoint(tiny_checkpoint).path)
    a = load_policy(tiny_checkpoint, device="cpu").model.state_dict()
    b = load_policy(out, device="cpu").model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    fresh = tmp_path / "fresh"  # the same run without --init: other weights
    assert train(other, fresh, "train.steps=2", "optim.lr=1e-12", "optim.weight_decay=0", "eval.episodes=0") == 0
    c = load_policy(fresh, device="cpu").model.state_dict()
    assert not all(torch.allclose(a[k], c[k], atol=1e-3) for k in a)

    capsys.readouterr()
    assert train_main(["--init", str(tiny_checkpoint), "--data", str(other), "--out", str(tmp_path / "x"),
                       "model.n_layer=7"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert "the weights do not match" in err and len(err.splitlines()) == 1  # a model the weights cannot fill
    with pytest.raises(SystemExit) as usage:
        train_main(["--init", str(tiny_checkpoint), "--out", str(out), "--resume"])
    assert usage.value.code == 2 and "give one of them" in capsys.readouterr().err


def test_train_state_holds_the_rng_streams_and_the_data_fingerprint(tiny_dataset, tmp_path):
    out = tmp_path / "run"
    assert train(tiny_dataset, out, "train.steps=3") == 0
    state = torch.load(out / "latest" / "train_state.pt", weights_only=True)
    assert {"torch_rng", "data_fingerprint", "last_loss", "optimizer", "scheduler"} <= set(state)
    assert ("cuda_rng" in state) == torch.cuda.is_available()


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


@pytest.mark.slow
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
    assert code == 4  # a check the run makes on itself did not pass (vla/cli/common.py's table)
    assert "non-finite loss" in err and "step 2" in err and "demo_" in err


def _launch_ranks(rank_fn, *args, world: int = 2, timeout: float = 120) -> None:
    """Run `rank_fn(rank, *args)` in `world` forked processes with the environment torchrun gives each rank
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT; gloo on CPU). As torchrun's agent does, the launcher
    holds the rendezvous store on a port the OS picked, so no other process can take that port first.
    Forked: the ranks only train (no GL context), and each spared a fresh torch import is ~2 s of CPU a
    rank. A hang fails after `timeout`."""
    import torch.multiprocessing as mp
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # serves until this returns
    ctx = mp.start_processes(_as_rank, args=(world, store.port, rank_fn, args), nprocs=world, join=False,
                             start_method="fork")  # fmt: skip
    deadline = time.time() + timeout
    while not ctx.join(timeout=5):
        assert time.time() < deadline, f"DDP ranks still running after {timeout:.0f} s (hung?)"


def _as_rank(rank: int, world: int, port: int, rank_fn, args) -> None:
    import os

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")  # fmt: skip
    torch.set_num_threads(1)  # a forked child must not enter an OpenMP pool its parent may have started
    rank_fn(rank, *args)


def _train_main_rank(rank: int, data: str, out: str) -> None:
    assert train_main(["--config", TINY, "--data", data, "--out", out, "train.steps=6", "train.log_every=2"]) == 0


@pytest.mark.slow
def test_ddp_two_processes_hold_identical_weights(tiny_dataset, tmp_path):
    """vla-train's main on two ranks, as `torchrun --nproc-per-node 2 -m vla.cli.train ...` starts it."""
    out = tmp_path / "ddp"
    _launch_ranks(_train_main_rank, str(tiny_dataset), str(out))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["finished"]
    digests = summary["rank_weight_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]


def _rank_with_a_nan_loss(rank: int, data: str, out: str) -> None:
    """A DDP rank in which rank 1 alone sees a non-finite loss (its model's forward is patched)."""
    from vla.model import ActionTransformer
    from vla.training import train as train_module

    if rank == 1:
        forward = ActionTransformer.forward

        def poisoned(self, batch):
            out = forward(self, batch)
            return {**out, "loss": out["loss"] * float("nan")}

        ActionTransformer.forward = poisoned
    cfg = load_config(TINY, ["train.steps=4", "train.device=cpu"])
    try:
        train_module.train(cfg, data, Path(out))
    except train_module.NonFiniteError:
        Path(out, f"rank{rank}.nonfinite").write_text(str(torch.initial_seed()))  # the rank's dropout seed
        return
    Path(out, f"rank{rank}.finished").write_text("no error")


@pytest.mark.slow
def test_ddp_a_nonfinite_loss_on_one_rank_stops_every_rank_instead_of_hanging(tiny_dataset, tmp_path):
    _launch_ranks(_rank_with_a_nan_loss, str(tiny_dataset), str(tmp_path))
    assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0.nonfinite", "rank1.nonfinite"]
    seeds = {(tmp_path / f"rank{r}.nonfinite").read_text() for r in (0, 1)}
    assert len(seeds) == 2  # each rank draws its own dropout masks (the weights start equal: DDP checks that)


def test_a_wrist_camera_is_collected_trained_on_and_evaluated_with(tmp_path):
    """`vla-collect --wrist-camera` records obs/wrist_image; `data.wrist_image_key` trains on both cameras
    (data spec n_cameras 2); evaluation builds the env with the wrist camera the policy reads."""
    from vla.cli.collect import main as collect_main
    from vla.evaluation.evaluate import evaluate

    data, out = tmp_path / "wrist.hdf5", tmp_path / "run"
    argv = ["--tasks", "reach", "--episodes-per-task", "2", "--out", str(data), "--wrist-camera", "--quiet"]
    assert collect_main(argv) == 0
    assert train(data, out, "train.steps=2", "eval.episodes=0", "data.wrist_image_key=wrist_image",
                 "data.valid_split=") == 0  # fmt: skip
    assert load_checkpoint(out).meta["data_spec"]["n_cameras"] == 2
    lazy = tmp_path / "lazy"  # frames read per window instead of preloaded: the same batches, the same weights
    assert train(data, lazy, "train.steps=2", "eval.episodes=0", "data.wrist_image_key=wrist_image",
                 "data.valid_split=", "data.preload=false") == 0  # fmt: skip
    a, b = (load_policy(r, device="cpu").model.state_dict() for r in (out, lazy))
    assert all(torch.equal(a[k], b[k]) for k in a)
    policy = load_policy(out, device="cpu")
    result = evaluate(policy, ["tabletop/Reach-v0"], 1, seed=5, progress=False)  # a one-camera env would fail
    assert result["tasks"]["tabletop/Reach-v0"]["episodes"] == 1
    assert train(data, tmp_path / "front", "train.steps=2", "eval.episodes=0", "data.valid_split=") == 0
    assert load_checkpoint(tmp_path / "front").meta["data_spec"]["n_cameras"] == 1  # the wrist camera only when asked
