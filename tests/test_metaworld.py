"""Meta-World MT10 through our contract: every id resets, renders and steps; experts; collect -> train -> eval.

Needs the `[metaworld]` extra, which `make setup` installs; without it these tests fail rather than skip.
"""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs.metaworld import MAX_EPISODE_STEPS, MT10

REACH, DRAWER_CLOSE = "metaworld/reach-v3", "metaworld/drawer-close-v3"


def test_the_ten_mt10_ids_are_registered_and_kept_apart_from_the_tabletop_suite():
    assert [f"metaworld/{t}" for t in MT10] == envs.METAWORLD_TASKS and len(MT10) == 10
    assert envs.expand_tasks("metaworld/mt10") == envs.METAWORLD_TASKS
    assert envs.expand_tasks(f"{REACH},reach,{REACH}") == [REACH, "tabletop/Reach-v0"]
    assert not set(envs.TASKS) & set(envs.METAWORLD_TASKS)  # `--tasks all` still means the tabletop suite
    for task_id in envs.METAWORLD_TASKS:
        assert gym.spec(task_id).max_episode_steps == MAX_EPISODE_STEPS[task_id.removeprefix("metaworld/")]


@pytest.mark.parametrize("task_id", envs.METAWORLD_TASKS)
def test_reset_render_step_and_determinism(task_id):
    env = gym.make(task_id, image_size=64)
    obs, info = env.reset(seed=7)
    image = obs["image"]
    assert image.dtype == np.uint8 and image.shape == (64, 64, 3)
    assert image.mean() > 30 and image.std() > 10  # a lit scene, not a black or blank frame
    assert env.observation_space.contains(obs) and obs["instruction"]
    raw = env.unwrapped.raw_obs
    # proprio: hand xyz, gripper opening, goal xyz (obs[36:39]); never the object state obs[4:18]
    assert np.array_equal(obs["proprio"], np.concatenate([raw[:4], raw[36:39]]).astype(np.float32))
    assert np.allclose(raw[36:39], env.unwrapped._mw._target_pos)  # the goal really is in the observation
    assert info["object"].shape == (6,) and np.all(np.abs(info["object_px"]) < 1)  # both points in view
    again, _ = env.reset(seed=7)
    assert np.array_equal(again["image"], image) and np.array_equal(again["proprio"], obs["proprio"])
    assert again["instruction"] == obs["instruction"]
    other, _ = env.reset(seed=8)
    assert not np.array_equal(other["image"], image)  # another seed, another variant
    for action in np.random.default_rng(0).uniform(-1, 1, size=(3, 4)).astype(np.float32):
        obs, reward, terminated, truncated, info = env.step(action)
    assert env.observation_space.contains(obs) and np.isfinite(reward) and isinstance(info["success"], bool)
    assert not np.array_equal(obs["image"], other["image"])  # the arm moved
    env.close()


def test_gymnasium_check_env():
    env = gym.make("metaworld/push-v3", image_size=64)
    check_env(env.unwrapped, skip_render_check=False)  # seeding, spaces, render: gymnasium's own checks
    env.close()


def test_the_pixels_only_twin_is_the_same_episode_without_the_goal_in_the_proprio():
    assert envs.expand_tasks("metaworld-pixels/mt10") == [f"metaworld-pixels/{t}" for t in MT10]
    full, pixels = gym.make("metaworld/push-v3", image_size=64), gym.make("metaworld-pixels/push-v3", image_size=64)
    a, _ = full.reset(seed=11)
    b, _ = pixels.reset(seed=11)
    expert_a, expert_b = envs.make_expert(full, noise=0.2, seed=11), envs.make_expert(pixels, noise=0.2, seed=11)
    for _ in range(5):  # same frames, same expert actions, proprio = hand xyz and gripper only
        assert np.array_equal(a["image"], b["image"]) and a["instruction"] == b["instruction"]
        assert b["proprio"].shape == (4,) and np.array_equal(b["proprio"], a["proprio"][:4])
        assert pixels.observation_space.contains(b)
        action = expert_a.act(a)
        assert np.array_equal(action, expert_b.act(b))
        a, *_ = full.step(action)
        b, *_ = pixels.step(action)
    assert pixels.unwrapped.env_args["env_kwargs"]["goal_in_proprio"] is False
    full.close()
    pixels.close()


def test_several_envs_in_one_process_each_render_their_own_scene():
    first = gym.make(REACH, image_size=64)
    alone, _ = first.reset(seed=3)
    second = gym.make("metaworld/door-open-v3", image_size=64)  # a second GL context, made current last
    door, _ = second.reset(seed=3)
    together, _ = first.reset(seed=3)
    assert np.array_equal(together["image"], alone["image"])
    assert not np.array_equal(door["image"], alone["image"])
    first.close()
    second.close()


@pytest.mark.parametrize("task_id", [REACH, DRAWER_CLOSE])
def test_the_expert_succeeds_and_the_episode_ends_at_its_first_success(task_id):
    env = gym.make(task_id, image_size=64)
    expert = envs.make_expert(env, noise=0.1, seed=0)
    obs, info = env.reset(seed=0)
    for _ in range(env.spec.max_episode_steps):
        action = expert.act(obs)
        assert action.dtype == np.float32 and np.all(np.abs(action) <= 1)
        assert not np.array_equal(action[:3], expert.clean_action[:3])  # DART: noisy action, clean label
        obs, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    assert info["success"] and terminated
    env.close()


def test_expert_outcomes_are_the_same_without_rendering():
    from envs.__main__ import expert_episode, measure

    env = gym.make("metaworld/drawer-close-v3", image_size=64)  # a contact task; 0.6x window-close's time
    rendered, physics = (expert_episode(env, envs.make_expert(env, noise=0.2, seed=4), 4, render=r) for r in (1, 0))
    assert rendered == physics
    env.close()
    fast, full = (measure(REACH, 2, 0, 64, 0.2, physics_only=p) for p in (True, False))
    assert (fast["success_rate"], fast["mean_length"]) == (full["success_rate"], full["mean_length"])


def test_without_the_package_import_envs_still_works_and_the_ids_are_absent():
    code = (
        "import sys; sys.modules['metaworld'] = None\n"  # what an install without the extra looks like
        "import gymnasium as gym, envs\n"
        "assert envs.METAWORLD_TASKS == [] and 'metaworld/reach-v3' not in gym.registry\n"
        "assert 'metaworld-pixels/reach-v3' not in gym.registry\n"
        "assert 'metaworld-lerobot/reach-v3' not in gym.registry\n"
        "try:\n    envs.expand_tasks('metaworld-lerobot/mt50')\nexcept ValueError as e:\n    print(e)\n"
        "assert len(envs.TASKS) == 4\n"
        "try:\n    envs.expand_tasks('metaworld/mt10')\nexcept ValueError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.count("pip install -e '.[metaworld]'") == 2


@pytest.mark.slow
def test_collect_train_and_evaluate_a_metaworld_task(tmp_path):
    from vla.cli.collect import main as collect_main
    from vla.cli.train import main as train_main
    from vla.data.hdf5_format import demo_meta, demo_names, open_dataset, read_env_args
    from vla.evaluation.evaluate import add_expert_rates, format_table, run_episode, summarize
    from vla.policy.load import load_policy

    data = tmp_path / "mw.hdf5"
    argv = ["--tasks", REACH, "--episodes-per-task", "1", "--workers", "1", "--out", str(data), "--quiet"]
    assert collect_main([*argv, "--noise", "0.1", "--valid-fraction", "0"]) == 0
    with open_dataset(data) as f:
        assert read_env_args(f)["type"] == "vla-metaworld" and read_env_args(f)["tasks"] == [REACH]
        (name,) = demo_names(f)
        g = f["data"][name]
        assert demo_meta(f, name)["task"] == REACH and bool(g.attrs["success"])
        assert g["obs/image"].shape[1:] == (64, 64, 3) and g["obs/proprio"].shape[1:] == (7,)
        assert g["obs/object_px"].shape[1:] == (4,) and "expert_actions" in g
        steps = g["actions"].shape[0]
    assert steps < MAX_EPISODE_STEPS["reach-v3"]  # cut at the first success

    # The pixels-only dataset derived from it is the one collecting the pixels-only twin writes.
    from scripts.metaworld_pixels_only import main as derive_main

    derived, collected = tmp_path / "derived.hdf5", tmp_path / "collected.hdf5"
    assert derive_main([str(data), str(derived)]) == 0
    pixels_argv = ["--tasks", "metaworld-pixels/reach-v3", "--episodes-per-task", "1", "--workers", "1", "--quiet"]
    assert collect_main([*pixels_argv, "--out", str(collected), "--noise", "0.1", "--valid-fraction", "0"]) == 0
    with open_dataset(derived) as f, open_dataset(collected) as g:
        assert read_env_args(f) == read_env_args(g)
        a, b = f["data/demo_0"], g["data/demo_0"]
        assert dict(a.attrs) == dict(b.attrs) and set(a["obs"]) == set(b["obs"])
        for key in ("actions", "expert_actions", "states", "obs/image", "obs/proprio", "obs/object_px"):
            assert np.array_equal(a[key][()], b[key][()]), key

    ckpt = tmp_path / "ckpt"
    code = train_main(["--config", "configs/tiny.yaml", "--data", str(data), "--out", str(ckpt),
                       "train.steps=4", "train.log_every=2", "train.checkpoint_every=4"])  # fmt: skip
    assert code == 0
    policy = load_policy(ckpt, device="cpu")
    assert policy.spec.proprio_dim == 7
    env = gym.make(REACH, image_size=64, max_episode_steps=12)  # vla-eval's episode loop, cut short
    episode = run_episode(env, policy, seed=100_000)
    env.close()
    assert episode["length"] == 12 and isinstance(episode["success"], bool)
    result = summarize({REACH: [episode]})
    experts = {"seed": 100_000, "rows": [{"task": REACH, "success_rate": 1.0, "episodes": 1}]}
    add_expert_rates(result, experts, 100_000, "experts.json")
    assert "expert (same seeds)" in format_table(result) and result["tasks"][REACH]["expert_success_rate"] == 1.0
    with pytest.raises(ValueError, match="from seed 0"):
        add_expert_rates(result, {**experts, "seed": 0}, 100_000, "experts.json")
