"""Attention figures: the first action token's attention over patches and words, per layer."""

import numpy as np
import pytest

from vla.cli.eval import main as eval_main
from vla.evaluation.attention import first_action_attention
from vla.policy.load import load_policy


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
        grid = policy.model.layout.grid
        assert layer["patches"].shape == (cfg.n_head, grid, grid)
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
    n_layer = load_policy(tiny_checkpoint).cfg.n_layer  # a keypoint model: one heat-map figure per step too
    assert len([p for p in pngs if "_layer" in p]) == 2 * n_layer and len(pngs) == 2 * n_layer + 2
    assert "Reach-v0_seed100000_step000_layer0.png" in pngs and "Reach-v0_seed100000_step002_keypoints.png" in pngs


def test_keypoint_heat_maps_are_drawn_for_keypoint_models(tmp_path):
    """A keypoint model's figures include each keypoint's heat map of the newest frame: a distribution
    over the half-resolution grid whose soft-argmax is the keypoint's reported position."""
    import gymnasium as gym
    import torch

    import envs  # noqa: F401
    from vla.evaluation.attention import plot_attention
    from vla.model import ActionTransformer, DataSpec, ModelConfig
    from vla.policy.torch_policy import torch_policy
    from vla.tokenizers import ActionTokenizer, ProprioNormalizer, TextTokenizer, Tokenizers

    torch.manual_seed(0)
    text = TextTokenizer.fit(["reach the red block"])
    cfg = ModelConfig(patch_embed="conv", film=True, keypoints=3, window=2, d_model=32, n_head=2, n_layer=1, d_ff=64)
    spec = DataSpec(image_size=64, proprio_dim=9, action_dim=4, vocab_size=text.vocab_size)
    action = ActionTokenizer(bins=cfg.action_bins, low=-np.ones(4), high=np.ones(4))
    tok = Tokenizers(text, action, ProprioNormalizer(np.zeros(9), np.ones(9)))
    policy = torch_policy(ActionTransformer(cfg, spec), tok, meta={})
    env = gym.make("tabletop/Reach-v0")
    obs, _ = env.reset(seed=3)
    policy.reset(obs["instruction"])
    obs, *_ = env.step(policy.act(obs))
    policy.act(obs)
    result = first_action_attention(policy)
    maps, where = result["keypoints"], result["where"]
    assert maps.shape == (3, 32, 32) and where.shape == (3, 2)
    np.testing.assert_allclose(maps.sum(axis=(1, 2)), 1.0, atol=1e-5)
    centres = (np.arange(32) + 0.5) / 32 * 2 - 1
    np.testing.assert_allclose(where[:, 0], (maps.sum(2) * centres).sum(1), atol=1e-5)  # rows
    paths = plot_attention(result, tmp_path, "t")
    assert [p.name for p in paths] == ["t_layer0.png", "t_keypoints.png"] and all(p.stat().st_size > 0 for p in paths)
