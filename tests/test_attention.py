"""Attention figures: the first action token's attention over patches and words, per layer."""

import numpy as np
import pytest

from vla.attention import first_action_attention
from vla.evaluate import main as eval_main
from vla.policy import load_policy


@pytest.fixture(scope="module")
def policy(tiny_checkpoint):
    return load_policy(tiny_checkpoint, device="cpu")


def test_first_action_attention_is_a_distribution_over_keys(policy):
    import gymnasium as gym

    import envs  # noqa: F401

    env = gym.make("tabletop/Stack-v0")
    obs, _ = env.reset(seed=7)
    policy.reset(obs["instruction"])
    for _ in range(4):
        obs, *_ = env.step(policy.act(obs))
    policy.act(obs)
    result = first_action_attention(policy)
    cfg = policy.cfg
    assert len(result["layers"]) == cfg.n_layer
    assert result["words"][1:] == obs["instruction"].split()  # <bos> then one piece per word
    for layer in result["layers"]:
        assert layer["patches"].shape == (cfg.n_head, cfg.grid, cfg.grid)
        assert layer["words"].shape == (cfg.n_head, len(result["words"]))
        total = layer["patches"].sum(axis=(1, 2)) + layer["words"].sum(1) + layer["other"]
        np.testing.assert_allclose(total, 1.0, atol=1e-5)
        assert np.all(layer["patches"] >= 0) and np.all(layer["words"] >= 0)
    np.testing.assert_array_equal(result["frame"], obs["image"])


def test_vla_eval_attention_writes_one_png_per_layer_and_step(tiny_checkpoint, tmp_path):
    code = eval_main(["--checkpoint", str(tiny_checkpoint), "--tasks", "reach", "--attention", str(tmp_path),
                      "--attention-steps", "0,2"])  # fmt: skip
    assert code == 0
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    n_layer = load_policy(tiny_checkpoint).cfg.n_layer
    assert len(pngs) == 2 * n_layer
    assert pngs[0].startswith("Reach-v0_seed100000_step000_layer0")
