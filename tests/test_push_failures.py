"""scripts/push_failures.py sorts Push episodes by how they ended: checked with the scripted expert (it succeeds)
and a policy that holds still (the block is never touched), in the real tabletop env."""

import importlib.util
from pathlib import Path

import numpy as np

from envs import make_env, make_expert

SPEC = importlib.util.spec_from_file_location(
    "push_failures", Path(__file__).parents[1] / "scripts" / "push_failures.py"
)
push_failures = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(push_failures)


class ExpertPolicy:
    """The scripted expert behind the policy interface the script drives (reset(instruction), act(obs))."""

    def __init__(self, env):
        self.env = env

    def reset(self, instruction):
        self.expert = make_expert(self.env)

    def act(self, obs):
        return self.expert.act(obs)


class StillPolicy:
    def reset(self, instruction):
        pass

    def act(self, obs):
        return np.zeros(4, dtype=np.float32)


def test_expert_episode_is_a_success_and_a_still_policy_leaves_the_block_untouched():
    env = make_env("tabletop/Push-v0")
    expert = push_failures.run_episode(env, ExpertPolicy(env), seed=3)
    assert expert["success"] and push_failures.kind(expert) == "success"
    assert expert["named_moved"] > 0.05 and expert["final"] < 0.025 < expert["start"]
    still = push_failures.run_episode(env, StillPolicy(), seed=3)
    assert not still["success"] and push_failures.kind(still) == "untouched"
    assert still["named_moved"] < 1e-3 and abs(still["final"] - still["start"]) < 1e-3
    env.close()


def test_kinds():
    base = {"success": False, "start": 0.15, "final": 0.1, "closest": 0.08}
    assert push_failures.kind({**base, "named_moved": 0.05, "other_moved": 0.0}) == "off target"
    assert push_failures.kind({**base, "named_moved": 0.0, "other_moved": 0.04}) == "wrong block"
    assert push_failures.kind({**base, "named_moved": 0.002, "other_moved": 0.001}) == "untouched"


def test_a_missing_checkpoint_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).parents[1] / "scripts" / "push_failures.py"
    result = subprocess.run(
        [sys.executable, str(script), "--checkpoint", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "not a checkpoint directory" in result.stderr
