"""`vla-collect` and the HDF5 layout: a small collected file, resume, failed seeds, kill -9 safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from vla.cli.collect import main as collect_main
from vla.data.hdf5_format import (
    DatasetError,
    Episode,
    ObsKeys,
    demo_meta,
    demo_names,
    open_dataset,
    read_demo,
    read_env_args,
    read_failed_seeds,
    split_masks,
    write_dataset,
)
from vla.data.validate import validate

REACH, PUSH, STACK = "tabletop/Reach-v0", "tabletop/Push-v0", "tabletop/Stack-v0"


def pairs(path) -> list[tuple[str, int]]:
    with open_dataset(path) as f:
        return [(m["task"], m["seed"]) for m in (demo_meta(f, n) for n in demo_names(f))]


# The tests that read `small` run on one worker, which collects it once (pytest-xdist --dist loadgroup).
uses_small = pytest.mark.xdist_group("collect_small")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("collect") / "small.hdf5"
    argv = ["--tasks", f"{REACH},push", "--episodes-per-task", "3", "--workers", "2", "--out", str(out)]
    assert collect_main([*argv, "--seed", "10", "--quiet"]) == 0
    return out


@uses_small
def test_layout_of_a_collected_file(small):
    assert validate(small) == []
    with h5py.File(small, "r") as f:
        data = f["data"]
        env_args = json.loads(data.attrs["env_args"])
        assert env_args["tasks"] == [REACH, PUSH]
        assert env_args["env_kwargs"]["image_size"] == 64 and env_args["type"] == "vla-tabletop"
        names = sorted(data, key=lambda n: int(n.split("_")[1]))
        assert names == [f"demo_{i}" for i in range(6)]
        total = 0
        for i, name in enumerate(names):
            g = data[name]
            t = int(g.attrs["num_samples"])
            total += t
            assert g.attrs["task"].decode() == [REACH, PUSH][i // 3]  # sorted by task, then seed
            assert int(g.attrs["seed"]) == 10 + i % 3  # seeds --seed, --seed+1, ...
            assert g.attrs["instruction"] and bool(g.attrs["success"])
            assert g["actions"].dtype == np.float32 and g["actions"].shape == (t, 4)
            assert g["rewards"].shape == (t,) and g["dones"].shape == (t,) and g["dones"][-1] == 1
            assert g["states"].dtype == np.float64 and g["states"].shape[0] == t
            img = g["obs/image"]
            assert img.dtype == np.uint8 and img.shape == (t, 64, 64, 3)
            assert img.chunks == (1, 64, 64, 3) and img.compression == "gzip" and img.fletcher32
            assert g["obs/proprio"].dtype == np.float32 and g["obs/proprio"].shape == (t, 9)
            assert g["obs/object"].shape == (t, 6) and g["obs/object_px"].shape == (t, 4)  # privileged targets
        assert int(data.attrs["total"]) == total
        train = {n.decode() for n in f["mask/train"][()]}
        valid = {n.decode() for n in f["mask/valid"][()]}
        assert train | valid == set(names) and not train & valid and len(valid) == 2  # one per task


@uses_small
def test_rerun_refuses_and_resume_of_complete_file_adds_nothing(small, capsys):
    before = small.read_bytes()
    argv = ["--tasks", f"{REACH},{PUSH}", "--episodes-per-task", "3", "--out", str(small), "--seed", "10", "--quiet"]
    assert collect_main(argv) == 2
    assert "already exists; pass --resume" in capsys.readouterr().err
    assert collect_main([*argv, "--resume"]) == 0
    assert small.read_bytes() == before  # nothing to do: the file is not even rewritten


@uses_small
def test_resume_extends_counts_without_duplicates(small, tmp_path):
    out = tmp_path / "more.hdf5"
    out.write_bytes(small.read_bytes())
    argv = ["--tasks", REACH, "--episodes-per-task", "5", "--out", str(out), "--seed", "10", "--quiet", "--resume"]
    assert collect_main(argv) == 0
    got = pairs(out)
    assert len(got) == len(set(got)) == 8
    assert sorted(s for t, s in got if t == REACH) == [10, 11, 12, 13, 14]
    assert validate(out) == []


@uses_small
def test_task_episodes_sets_one_tasks_count(small, tmp_path, capsys):
    out = tmp_path / "more_push.hdf5"
    out.write_bytes(small.read_bytes())
    argv = ["--tasks", f"{REACH},push", "--episodes-per-task", "3", "--out", str(out), "--seed", "10", "--quiet"]
    assert collect_main([*argv, "--task-episodes", "push=5", "--resume"]) == 0
    got = pairs(out)
    assert sorted(s for t, s in got if t == PUSH) == [10, 11, 12, 13, 14]
    assert sorted(s for t, s in got if t == REACH) == [10, 11, 12]  # the other task keeps --episodes-per-task
    assert "tabletop/Push-v0: 5/5 episodes" in capsys.readouterr().out
    for bad, why in (
        ("push", "expected TASK=N, e.g. push=900"),
        ("stack=2", "stack is not one of the collected tasks"),
        ("push=0", "N must be at least 1"),
        ("nope=2", "unknown task 'nope'"),
    ):
        assert collect_main([*argv, "--task-episodes", bad, "--resume"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"vla-collect: error: --task-episodes {bad!r}: ") and why in err and err.count("\n") == 1
    assert len(pairs(out)) == 8  # refused runs add nothing


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    assert collect_main(["--tasks", "nope", "--episodes-per-task", "1", "--out", str(tmp_path / "a.hdf5")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vla-collect: error: unknown task 'nope'") and "\n" not in err
    assert collect_main(["--episodes-per-task", "0", "--out", str(tmp_path / "a.hdf5")]) == 2
    assert collect_main(["--episodes-per-task", "1", "--out", str(tmp_path / "no/dir/a.hdf5")]) == 2
    capsys.readouterr()
    assert collect_main(["--episodes-per-task", "1", "--perturb", "1", "--out", str(tmp_path / "a.hdf5")]) == 2
    assert capsys.readouterr().err == "vla-collect: error: --perturb must be in [0, 1), got 1.0\n"
    assert collect_main(["--episodes-per-task", "1", "--detour", "-0.5", "--out", str(tmp_path / "a.hdf5")]) == 2
    assert capsys.readouterr().err == "vla-collect: error: --detour must be in [0, 1], got -0.5\n"
    argv = ["--tasks", "metaworld/reach-v3", "--episodes-per-task", "1", "--detour", "0.5"]
    assert collect_main([*argv, "--out", str(tmp_path / "a.hdf5")]) == 2  # Meta-World's expert has no detour pose
    assert capsys.readouterr().err == (
        "vla-collect: error: --detour is for the tabletop tasks; metaworld/reach-v3 have no detour pose\n"
    )
    assert not (tmp_path / "a.hdf5").exists()


@pytest.mark.slow
def test_failed_seeds_are_recorded_and_never_retried(tmp_path, capsys):
    """With heavy action noise the Stack expert fails: the seeds are recorded, the cap stops the run
    with a clear message and a non-zero exit, and --resume does not retry them."""
    out = tmp_path / "fail.hdf5"
    argv = ["--tasks", STACK, "--episodes-per-task", "1", "--noise", "3", "--max-attempts", "2"]
    argv += ["--out", str(out), "--quiet", "--workers", "2"]
    assert collect_main(argv) == 4  # a collection that ended short: a check that did not pass
    err = capsys.readouterr().err
    assert "only 0/1 episodes after 2 attempts" in err and "--max-attempts" in err
    parts = Path(f"{out}.parts")
    markers = sorted(p.name for p in parts.glob("*.failed.json"))
    assert markers == ["tabletop--Stack-v0__seed0.failed.json", "tabletop--Stack-v0__seed1.failed.json"]
    assert not out.exists()  # no successful demo yet: no (empty) dataset is written
    written = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in parts.glob("*.failed.json")}
    assert collect_main([*argv, "--resume"]) == 4  # the cap is already used up: nothing is rerun ...
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in parts.glob("*.failed.json")} == written
    assert "(0 successes in 2 attempts)" in capsys.readouterr().out  # ... and no seed beyond the cap is tried


@pytest.mark.slow
def test_keep_failed_keeps_every_attempt(tmp_path):
    out = tmp_path / "all.hdf5"
    argv = ["--tasks", STACK, "--episodes-per-task", "2", "--noise", "3", "--keep-failed", "--out", str(out)]
    assert collect_main([*argv, "--quiet", "--workers", "1"]) == 0
    assert validate(out) == []
    with open_dataset(out) as f:
        metas = [demo_meta(f, n) for n in demo_names(f)]
        assert [m["seed"] for m in metas] == [0, 1]
        assert read_failed_seeds(f) == {}
    assert not Path(f"{out}.parts").exists()


@pytest.mark.slow
def test_kill_9_mid_run_then_resume(tmp_path):
    """kill -9 of the collector's process group while episodes are landing: the output is absent or
    valid, and --resume completes the counts with no (task, seed) pair twice."""
    out = tmp_path / "k.hdf5"
    parts = Path(f"{out}.parts")
    n = 10
    cmd = [sys.executable, "-m", "vla.cli.collect", "--tasks", f"{REACH},{PUSH}", "--episodes-per-task", str(n)]
    cmd += ["--workers", "2", "--out", str(out), "--quiet", "--merge-every", "0.2"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        # wait for a merged output AND a finished part not yet merged into it: the worst moment
        while not (out.exists() and any(parts.glob("*.hdf5"))):
            assert proc.poll() is None, f"collector ended before the kill: {proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, "no episode landed within 60 s"
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    if out.exists():
        assert validate(out) == []
        assert len(pairs(out)) < 2 * n
    assert collect_main([*cmd[3:], "--resume"]) == 0
    assert validate(out) == []
    got = pairs(out)
    assert len(got) == len(set(got)) == 2 * n
    for task in (REACH, PUSH):
        assert sorted(s for t, s in got if t == task) == list(range(n))  # the experts succeed without noise
    assert not parts.exists()
    assert not list(tmp_path.glob("*.tmp-*"))


# ------------------------------------------------------------------------------------ the format


def _episode(task: str, seed: int, t: int = 5) -> Episode:
    rng = np.random.default_rng(seed)
    return Episode(
        task=task,
        seed=seed,
        instruction=f"do {task} {seed}",
        actions=rng.uniform(-1, 1, (t, 4)).astype(np.float32),
        rewards=np.zeros(t, np.float32),
        dones=np.eye(t, dtype=np.uint8)[-1],
        states=rng.normal(size=(t, 7)),
        obs={"image": rng.integers(0, 255, (t, 8, 8, 3), dtype=np.uint8), "proprio": rng.normal(size=(t, 3))},
    )


def test_robomimic_style_keys_are_readable_through_obskeys(tmp_path):
    """A LIBERO/robomimic-style file: other observation names, no instruction/task/seed attrs."""
    path = tmp_path / "robomimic.hdf5"
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["env_args"] = json.dumps({"env_name": "Lift", "type": 1, "env_kwargs": {}})
        data.attrs["problem_info"] = json.dumps({"language_instruction": "lift the cube"})
        g = data.create_group("demo_0")
        g.attrs["num_samples"] = 4
        g["actions"] = np.zeros((4, 7), np.float64)
        g["obs/agentview_image"] = np.ones((4, 16, 16, 3), np.uint8)
        g["obs/robot0_eef_pos"] = np.arange(12, dtype=np.float64).reshape(4, 3)
        g["obs/robot0_gripper_qpos"] = np.full((4, 2), 7.0)
    keys = ObsKeys(image="agentview_image", proprio=("robot0_eef_pos", "robot0_gripper_qpos"))
    with open_dataset(path) as f:
        demo = read_demo(f, "demo_0", keys)
    assert demo.proprio.shape == (4, 5) and demo.proprio.dtype == np.float32
    assert demo.proprio[1].tolist() == [3, 4, 5, 7, 7]
    assert demo.image.shape == (4, 16, 16, 3) and demo.actions.dtype == np.float32
    assert demo.instruction == "lift the cube" and demo.task == "Lift" and demo.seed is None
    with open_dataset(path) as f, pytest.raises(DatasetError, match="demo_0/obs has no 'proprio'"):
        read_demo(f, "demo_0")  # our default keys: a clear message naming the missing key


def test_write_read_roundtrip_and_stable_masks(tmp_path):
    eps = [_episode(t, s) for t in ("a/A-v0", "a/B-v0") for s in range(10)]
    path = tmp_path / "rt.hdf5"
    write_dataset(path, {"type": "t", "tasks": ["a/A-v0", "a/B-v0"]}, eps, valid_fraction=0.2)
    assert validate(path) == []
    with open_dataset(path) as f:
        assert read_env_args(f)["tasks"] == ["a/A-v0", "a/B-v0"]
        d = read_demo(f, "demo_13")
        valid = demo_names(f, "valid")
    assert (d.task, d.seed, d.instruction) == ("a/B-v0", 3, "do a/B-v0 3")
    np.testing.assert_array_equal(d.actions, eps[13].actions)
    np.testing.assert_array_equal(d.image, eps[13].obs["image"])
    assert len(valid) == 4  # 2 per task
    # a demo's split depends on its (task, seed), not on its position
    ids = [(f"x{i}", e.task, e.seed) for i, e in enumerate(reversed(eps))]
    _, valid2 = split_masks(ids, 0.2)
    assert {(t, s) for n, t, s in ids if n in valid2} == {(eps[int(n[5:])].task, eps[int(n[5:])].seed) for n in valid}


def test_noisy_collection_keeps_the_experts_clean_labels(tmp_path):
    """DART: the env executes the noisy action (so replay uses `actions`), the policy can learn the
    expert's noise-free one (`expert_actions`), read through `ObsKeys(actions=...)`."""
    out = tmp_path / "dart.hdf5"
    argv = ["--tasks", REACH, "--episodes-per-task", "2", "--noise", "0.3", "--out", str(out), "--quiet"]
    assert collect_main([*argv, "--workers", "1"]) == 0
    assert validate(out) == []
    with open_dataset(out) as f:
        name = demo_names(f)[0]
        executed = read_demo(f, name, images=False).actions
        clean = read_demo(f, name, ObsKeys(actions="expert_actions"), images=False).actions
    assert executed.shape == clean.shape and np.abs(clean).max() <= 1.0
    assert np.abs(executed[:, :3] - clean[:, :3]).mean() > 0.05  # the noise is in what was executed
    np.testing.assert_array_equal(executed[:, 3], clean[:, 3])  # the gripper command is never noised
    bursts = tmp_path / "bursts.hdf5"  # perturbations alone (no Gaussian noise) are noise too: labels kept
    argv = ["--tasks", REACH, "--episodes-per-task", "1", "--perturb", "0.5", "--out", str(bursts), "--quiet"]
    assert collect_main(argv) == 0
    with open_dataset(bursts) as f:
        executed = read_demo(f, demo_names(f)[0], images=False).actions
        clean = read_demo(f, demo_names(f)[0], ObsKeys(actions="expert_actions"), images=False).actions
    assert (np.abs(executed[:, :3] - clean[:, :3]).max(axis=1) > 0.05).sum() >= 2
    quiet = tmp_path / "quiet.hdf5"
    assert collect_main(["--tasks", REACH, "--episodes-per-task", "1", "--out", str(quiet), "--quiet"]) == 0
    with open_dataset(quiet) as f, pytest.raises(DatasetError, match="has no 'expert_actions'"):
        read_demo(f, demo_names(f)[0], ObsKeys(actions="expert_actions"), images=False)


def test_a_driver_policy_acts_and_the_expert_labels_what_it_visits(tiny_checkpoint, tmp_path, capsys):
    """DAgger (`--driver`): the policy's actions are what the env executed, the expert's label of every state
    the policy visited is in `expert_actions`, and failed episodes are kept (their labels are the point)."""
    import gymnasium as gym

    import envs
    from vla.policy.load import load_policy

    out = tmp_path / "dagger.hdf5"
    argv = ["--tasks", PUSH, "--episodes-per-task", "2", "--driver", str(tiny_checkpoint), "--out", str(out)]
    assert collect_main([*argv, "--seed", "40", "--quiet"]) == 0
    assert validate(out) == []
    with open_dataset(out) as f:
        metas = [demo_meta(f, n) for n in demo_names(f)]
        demo = read_demo(f, demo_names(f)[0], images=False)
        labels = read_demo(f, demo_names(f)[0], ObsKeys(actions="expert_actions"), images=False).actions
    assert sorted(m["seed"] for m in metas) == [40, 41]  # every attempt kept, success or not
    assert not all(m["success"] for m in metas)  # a 20-step policy fails Push: kept anyway

    env = gym.make(PUSH)
    policy = load_policy(tiny_checkpoint, device="cpu")
    obs, _ = env.reset(seed=metas[0]["seed"])
    policy.reset(obs["instruction"])
    expert = envs.make_expert(env)
    expert.reset()
    for t in range(12):  # the executed actions are the policy's, in the states it led to
        np.testing.assert_allclose(policy.act(obs), demo.actions[t], atol=1e-5)
        obs, *_ = env.step(demo.actions[t])
    for t in (0, 5, 30, 90):  # the labels are the expert's own action in each recorded state (it is Markovian)
        env.unwrapped.set_state(demo.states[t])
        np.testing.assert_allclose(expert.act(None), labels[t], atol=1e-3)  # set_state: float-exact up to 1e-4
    assert np.abs(labels - demo.actions).max() > 0.1  # what it would do is not what was done

    handed = tmp_path / "takeover.hdf5"  # --takeover: the expert acts from a tick drawn in 0..5 to the end
    argv = ["--tasks", PUSH, "--episodes-per-task", "3", "--driver", str(tiny_checkpoint), "--takeover", "5"]
    assert collect_main([*argv, "--seed", "40", "--out", str(handed), "--quiet"]) == 0
    with open_dataset(handed) as f:
        for name in demo_names(f):
            executed = read_demo(f, name, images=False).actions
            labels = read_demo(f, name, ObsKeys(actions="expert_actions"), images=False).actions
            same = np.all(executed == labels, axis=1)
            tick = len(same) - np.argmin(same[::-1]) if not same.all() else 0  # first tick of the expert's tail
            assert tick <= 5 and same[tick:].all() and demo_meta(f, name)["success"]

    capsys.readouterr()
    assert collect_main([*argv[:-2], "--detour", "0.5", "--out", str(tmp_path / "x.hdf5")]) == 2
    assert "--driver: the policy acts" in capsys.readouterr().err
    assert collect_main([*argv[:4], "--takeover", "5", "--out", str(tmp_path / "x.hdf5")]) == 2
    assert "--takeover needs --driver" in capsys.readouterr().err
    assert collect_main(["--tasks", PUSH, "--episodes-per-task", "1", "--driver", str(tmp_path), "--out",
                         str(tmp_path / "y.hdf5")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err.startswith("vla-collect: error: --driver:") and len(err.splitlines()) == 1
