"""The Policy API users drive a robot with: streaming equals recomputation, input checks, clear errors."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs  # noqa: F401 - registers the tasks
from vla import load_policy
from vla.checkpoint import CheckpointError
from vla.config import ConfigError
from vla.policy.config import PolicyConfig
from vla.policy.ensemble import ensemble_weights


@pytest.fixture(scope="module")
def policies(tiny_checkpoint):
    return load_policy(tiny_checkpoint, device="cpu", kv_cache=True), load_policy(
        tiny_checkpoint, device="cpu", kv_cache=False
    )


@pytest.fixture(scope="module")
def obs():
    env = gym.make("tabletop/Push-v0", image_size=64)
    first, _ = env.reset(seed=1)
    env.close()
    return first


@pytest.mark.parametrize("task", ["tabletop/PickPlace-v0", "tabletop/Reach-v0"])
def test_cached_and_uncached_give_identical_actions_over_whole_episodes(policies, task):
    cached, uncached = policies
    env = gym.make(task, image_size=cached.spec.image_size)
    steps = 0
    for seed in (5, 6):  # two episodes: reset must forget the first
        obs, _ = env.reset(seed=seed)
        cached.reset(obs["instruction"])
        uncached.reset(obs["instruction"])
        done = False
        while not done:
            a, b = cached.act_chunk(obs), uncached.act_chunk(obs)
            # the expectation readout sums probabilities in a different order: equal to float precision
            np.testing.assert_allclose(a, b, atol=1e-6, err_msg=f"{task} seed {seed} step {cached.t}")
            assert a.shape == (cached.chunk, cached.action_dim) and a.dtype == np.float32
            assert all(env.action_space.contains(row) for row in a)
            obs, _, terminated, truncated, _ = env.step(a[0])
            done = terminated or truncated
            steps += 1
    env.close()
    assert steps > 2 * cached.cfg.window  # the window slid many times


def test_act_returns_an_action_inside_the_action_space(policies, obs):
    policy = policies[0]
    policy.reset(obs["instruction"])
    a = policy.act(obs)
    assert a.shape == (4,) and a.dtype == np.float32
    assert gym.spaces.Box(-1.0, 1.0, (4,), np.float32).contains(a)


def test_extra_observation_keys_are_ignored(policies, obs):
    policy = policies[0]
    policy.reset(obs["instruction"])
    plain = policy.act_chunk(obs)
    policy.reset(obs["instruction"])
    extra = {**obs, "wrist_image": np.zeros((5, 5, 3), np.uint8), "depth": np.ones(3), "note": None}
    np.testing.assert_array_equal(policy.act_chunk(extra), plain)


@pytest.mark.parametrize(
    "change, error, message",
    [
        (lambda o: o.pop("image"), KeyError, "missing 'image'"),
        (lambda o: o.pop("proprio"), KeyError, "missing 'proprio'"),
        (lambda o: o.update(image=o["image"][:32]), ValueError, r"obs\['image'\] must be uint8 \(64, 64, 3\)"),
        (lambda o: o.update(image=o["image"].astype(np.float32)), ValueError, "must be uint8"),
        (lambda o: o.update(proprio=o["proprio"][:5]), ValueError, r"obs\['proprio'\] must have shape \(9,\)"),
        (lambda o: o.update(proprio=np.full(9, np.nan)), ValueError, "NaN"),
    ],
)
def test_missing_or_misshaped_observation_is_a_clear_error(policies, obs, change, error, message):
    policy = policies[0]
    policy.reset(obs["instruction"])
    bad = dict(obs)
    change(bad)
    with pytest.raises(error, match=message):
        policy.act(bad)
    with pytest.raises(TypeError, match="dict"):
        policy.act([obs["image"]])


def test_act_before_reset_and_empty_instruction_are_errors(tiny_checkpoint, obs):
    policy = load_policy(tiny_checkpoint, device="cpu")
    with pytest.raises(RuntimeError, match="reset"):
        policy.act(obs)
    with pytest.raises(ValueError, match="instruction"):
        policy.reset("  ")
    policy.reset("an instruction with zxqv unseen words")  # byte fallback, no crash
    assert policy.act(obs).shape == (4,)


def test_load_policy_on_a_non_checkpoint_is_a_clear_error(tmp_path, tiny_checkpoint):
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        load_policy(tmp_path)
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        load_policy(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_policy(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(CheckpointError, match="not a vla checkpoint"):
        load_policy(tmp_path)
    meta = json.loads((tiny_checkpoint / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_policy(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot read weights"):
        load_policy(tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_asking_for_cuda_without_one_is_a_clear_error(tiny_checkpoint):
    with pytest.raises(ValueError, match="no CUDA device"):
        load_policy(tiny_checkpoint, device="cuda")


def test_expectation_readout_is_the_mean_over_bin_centres(tiny_checkpoint, obs):
    """action_readout="expectation" returns, per slot, the probability-weighted mean of the bin centres
    of the same logits the argmax readout picks its bin from; the two agree to within the spread."""
    policy = load_policy(tiny_checkpoint, device="cpu", readout="argmax", temporal_ensemble=False)
    policy.reset(obs["instruction"])
    argmax = policy.act_chunk(obs)
    policy = load_policy(tiny_checkpoint, device="cpu", readout="expectation", temporal_ensemble=False)
    policy.reset(obs["instruction"])
    captured = {}
    step = policy.model.step
    policy.model.step = lambda *a, **k: captured.setdefault("out", step(*a, **k))
    mean = policy.act_chunk(obs)
    probs = captured["out"].logits[0].softmax(-1).view(policy.chunk, policy.action_dim, -1).numpy()
    expected = np.clip((probs * policy.tok.action.centres[None]).sum(-1), -1, 1)
    np.testing.assert_allclose(mean, expected, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(mean, argmax)  # a tiny model's distributions are broad: the mean moves
    tokens = captured["out"].tokens[0].view(policy.chunk, policy.action_dim).numpy()
    np.testing.assert_array_equal(argmax, np.clip(policy.tok.action.decode(tokens), -1, 1).astype(np.float32))


@pytest.mark.parametrize("coeff", [0.0, -0.5])
def test_temporal_ensemble_averages_every_stored_prediction_for_the_step(tiny_checkpoint, coeff):
    """With temporal_ensemble, chunk row j at step t is the mean of the raw predictions for step t + j
    made at steps t, t-1, ... (those whose chunk reaches t + j), weighted exp(-coeff * i) from the
    oldest (i = 0); a reset forgets them."""
    # mean readout: unsaturated values, so averaging visibly changes them
    plain = load_policy(tiny_checkpoint, device="cpu", readout="expectation", temporal_ensemble=False)
    ens = load_policy(tiny_checkpoint, device="cpu", readout="expectation", ensemble_coeff=coeff)
    C = ens.chunk
    assert C >= 2
    env = gym.make("tabletop/Reach-v0", image_size=ens.spec.image_size)
    for seed in (1, 2):  # two episodes: the second must not see the first's chunks
        obs, _ = env.reset(seed=seed)
        plain.reset(obs["instruction"])
        ens.reset(obs["instruction"])
        raw = []
        for t in range(C + 2):
            raw.append(plain.act_chunk(obs))  # the same model and inputs: the raw chunk of this step
            got = ens.act_chunk(obs)
            for j in range(C):
                guesses = np.array([raw[s][t + j - s] for s in range(max(0, t + j - C + 1), t + 1)])  # oldest first
                w = np.exp(-coeff * np.arange(len(guesses)))
                expected = (w[:, None] * guesses).sum(0) / w.sum()
                np.testing.assert_allclose(got[j], np.clip(expected, -1, 1), rtol=1e-5, atol=1e-6)
            obs, *_ = env.step(got[0])
        assert not np.allclose(got, raw[-1])  # averaging changed something
    env.close()


def test_ensemble_weights_favour_the_newest_by_default_and_never_overflow():
    w = ensemble_weights(4, PolicyConfig().ensemble_coeff)  # oldest first
    assert np.all(np.diff(w) > 0) and w[-1] == 1.0  # the default leans on the newest prediction
    assert np.all(np.diff(ensemble_weights(4, 0.5)) < 0)  # ACT's direction: the oldest
    np.testing.assert_array_equal(ensemble_weights(3, 0.0), [1.0, 1.0, 1.0])
    for coeff in (-1000.0, 1000.0):  # exp(1000 * i) would be inf; scaled, one guess takes all the weight
        w = ensemble_weights(8, coeff)
        assert np.all(np.isfinite(w)) and w.max() == 1.0
    with pytest.raises(ValueError, match="ensemble_coeff=nan must be a finite number"):
        PolicyConfig(ensemble_coeff=float("nan"))


def test_policy_settings_are_saved_with_the_checkpoint_and_overridable(tiny_checkpoint):
    saved = load_policy(tiny_checkpoint)
    assert saved.config.readout == "expectation" and saved.config.temporal_ensemble  # the defaults, saved
    other = load_policy(tiny_checkpoint, readout="argmax", temporal_ensemble=False, kv_cache=False)
    assert (other.config.readout, other.config.temporal_ensemble, other.config.kv_cache) == ("argmax", False, False)
    with pytest.raises(ConfigError, match="policy.readout: 'mode' is not one of"):
        load_policy(tiny_checkpoint, readout="mode")
    with pytest.raises(ConfigError, match="unknown key 'policy.temporal_ensembling'"):
        load_policy(tiny_checkpoint, temporal_ensembling=False)
    with pytest.raises(ConfigError, match="temporal_ensemble=True needs n_action_steps=1"):
        load_policy(tiny_checkpoint, n_action_steps=2)
    with pytest.raises(ConfigError, match="n_action_steps=3 exceeds the model's chunk=2"):
        load_policy(tiny_checkpoint, n_action_steps=3, temporal_ensemble=False)


def test_n_action_steps_executes_the_plan_before_replanning(tiny_checkpoint, obs):
    every = load_policy(tiny_checkpoint, temporal_ensemble=False)
    two = load_policy(tiny_checkpoint, temporal_ensemble=False, n_action_steps=2)
    env = gym.make("tabletop/Reach-v0", image_size=two.spec.image_size)
    obs, _ = env.reset(seed=4)
    every.reset(obs["instruction"])
    two.reset(obs["instruction"])
    for t in range(6):
        fresh, got = every.act_chunk(obs), two.act_chunk(obs)
        if t % 2 == 0:  # a re-planning step: the same network, the same context
            np.testing.assert_array_equal(got, fresh)
            plan = got
        else:  # the rest of the plan made one step ago
            np.testing.assert_array_equal(got, plan[1:])
        obs, *_ = env.step(got[0])
    env.close()


def test_a_config_that_does_not_match_the_weights_is_one_line(tiny_checkpoint, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint / "latest", broken)  # one checkpoint's own directory
    meta = json.loads((broken / "config.json").read_text())
    meta["model"]["d_model"] = 2 * meta["model"]["d_model"]
    (broken / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="the weights do not match config.json") as e:
        load_policy(broken)
    assert "\n" not in str(e.value)


def test_cached_and_uncached_pick_identical_bins(tiny_checkpoint):
    cached = load_policy(tiny_checkpoint, readout="argmax", temporal_ensemble=False, kv_cache=True)
    uncached = load_policy(tiny_checkpoint, readout="argmax", temporal_ensemble=False, kv_cache=False)
    env = gym.make("tabletop/Stack-v0", image_size=cached.spec.image_size)
    obs, _ = env.reset(seed=8)
    cached.reset(obs["instruction"])
    uncached.reset(obs["instruction"])
    for _ in range(3 * cached.cfg.window):
        a, b = cached.act_chunk(obs), uncached.act_chunk(obs)
        np.testing.assert_array_equal(a, b)
        obs, *_ = env.step(a[0])
    env.close()
