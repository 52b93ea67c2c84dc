"""Meta-World MT50 on LeRobot's protocol (`metaworld-lerobot/<task>-v3`): ids, suites, observation, experts.

Needs the `[metaworld]` extra, which `make setup` installs. Kept cheap: one test builds all 50 scenes at 16 px.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs import metaworld_lerobot as lerobot
from envs.metaworld import MetaWorldEnv

MT50 = "metaworld-lerobot/mt50"
SPLITS = {"easy": 28, "medium": 11, "hard": 6, "very-hard": 5}


def test_the_suites_are_lerobots_difficulty_splits_disjoint_and_covering_the_50():
    ids = envs.expand_tasks(MT50)
    assert len(ids) == 50 == len(set(ids)) == len(lerobot.TASK_DESCRIPTIONS)
    splits = {name: envs.expand_tasks(f"{MT50}-{name}") for name in SPLITS}
    assert {name: len(t) for name, t in splits.items()} == SPLITS
    union = [t for split in splits.values() for t in split]
    assert len(union) == len(set(union)) == 50 and set(union) == set(ids)  # disjoint, and all of MT50
    assert "metaworld-lerobot/push-v3" in splits["hard"] and "metaworld-lerobot/reach-v3" in splits["easy"]
    for task_id in ids:
        assert gym.spec(task_id).max_episode_steps == 500  # LeRobot's rollout length
    assert not set(ids) & set(envs.TASKS + envs.METAWORLD_TASKS)  # `--tasks all` and MT10 keep their meaning
    assert envs.expand_tasks("metaworld-lerobot/reach-v3,reach") == ["metaworld-lerobot/reach-v3", "tabletop/Reach-v0"]


def test_every_mt50_id_resets_renders_and_steps_with_lerobots_observation():
    """All 50 in one loop (each scene costs ~0.3 s to build): corner2 frame, obs[:4], the task's description."""
    actions = np.random.default_rng(0).uniform(-1, 1, size=(2, 4)).astype(np.float32)
    for task_id in envs.expand_tasks(MT50):
        env = gym.make(task_id, image_size=16)
        base = env.unwrapped
        obs, info = env.reset(seed=5)
        assert obs["image"].shape == (16, 16, 3) and obs["image"].std() > 5, task_id  # a lit scene, not blank
        raw = base.raw_obs
        assert obs["proprio"].shape == (4,) and np.array_equal(obs["proprio"], raw[:4].astype(np.float32)), task_id
        assert obs["instruction"] == lerobot.TASK_DESCRIPTIONS[base.task_name]
        assert env.observation_space.contains(obs), task_id
        assert base.camera == "corner2" and np.allclose(base._mw.model.cam_pos[2], lerobot.CAMERA_POS)
        assert info["object"].shape == (6,) and np.all(np.abs(info["object_px"]) < 1), task_id  # targets in view
        for action in actions:
            obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs) and np.isfinite(reward) and isinstance(info["success"], bool)
        env.close()


def test_seeded_resets_and_the_env_args_rebuild_the_same_episode():
    env = gym.make("metaworld-lerobot/basketball-v3", image_size=32)
    a, _ = env.reset(seed=3)
    b, _ = env.reset(seed=4)
    assert not np.array_equal(a["image"], b["image"])  # every seed its own variant
    args = env.unwrapped.env_args
    assert args["env_kwargs"] == {"image_size": 32, "protocol": "lerobot"} and args["metaworld"]["camera"] == "corner2"
    again = gym.make(args["env_name"], **args["env_kwargs"])
    c, _ = again.reset(seed=3)
    assert np.array_equal(a["image"], c["image"]) and np.array_equal(a["proprio"], c["proprio"])
    env.close()
    again.close()
    with pytest.raises(ValueError, match="goal_in_proprio"):
        MetaWorldEnv("reach-v3", protocol="lerobot", goal_in_proprio=True)
    with pytest.raises(ValueError, match="protocol 'project'"):
        MetaWorldEnv("assembly-v3")  # outside MT10 only on LeRobot's protocol


# One task per split whose expert is reliable and quick (docs/metaworld_mt50.md, the per-task table).
@pytest.mark.parametrize(
    "task", ["handle-press-v3", "coffee-push-v3", "pick-place-v3", "stick-push-v3"], ids=list(SPLITS)
)
def test_the_expert_solves_a_task_of_each_split(task):
    env = gym.make(lerobot.PREFIX + task, image_size=16)
    expert = envs.make_expert(env, seed=0)
    for seed in (100_000, 100_001):
        obs, info = env.reset(seed=seed)
        expert.reset()
        for _ in range(env.spec.max_episode_steps):
            obs, _, terminated, truncated, info = env.step(expert.act(obs))
            if terminated or truncated:
                break
        assert info["success"] and terminated, (task, seed)  # the episode ends at its first success
    env.close()
