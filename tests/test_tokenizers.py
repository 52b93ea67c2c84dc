"""Tokenizer round trips: actions within half a bin, instructions exactly, to_dict/from_dict identical."""

import json
import subprocess
import sys

import numpy as np
import pytest

from vla.tokenizers import ActionTokenizer, ProprioNormalizer, TextTokenizer
from vla.tokenizers.text import BOS_ID, PAD_ID


def bin_width(tok: ActionTokenizer) -> np.ndarray:
    """(A,) the widest spacing between neighbouring centres (uniform: all equal)."""
    return np.diff(tok.centres, axis=1).max(axis=1)


def expert_like_actions(n=4000, dims=4, seed=0):
    """Gaussian actions clipped to the Box [-1, 1], as a scripted expert's are: some saturate at +-1."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(0.0, 0.4, size=(n, dims)) * np.linspace(1.0, 1.5, dims), -1.0, 1.0)


def rarely_saturating_actions(n=4000, dims=3, seed=0):
    """Mostly inside [-0.8, 0.8]; 3 samples per dim at exactly -1 and +1 (0.075 % < the 0.5 % tails)."""
    a = np.random.default_rng(seed).uniform(-0.8, 0.8, size=(n, dims))
    a[:3], a[3:6] = -1.0, 1.0
    return a


# ---------------------------------------------------------------------------------------- actions


@pytest.mark.parametrize("mode", ["uniform", "quantile", "mulaw"])
def test_action_roundtrip_within_half_bin(mode):
    a = expert_like_actions()
    tok = ActionTokenizer(bins=256, mode=mode).fit(a)
    tokens = tok.encode(a)
    assert tokens.dtype == np.int64 and tokens.shape == a.shape
    assert tokens.min() >= 0 and tokens.max() < 256
    err = np.abs(tok.decode(tokens) - a)
    assert (err <= bin_width(tok) / 2 + 1e-6).all(), (err.max(0), bin_width(tok))


def test_uniform_bin_width_and_error_bound():
    a = expert_like_actions()
    tok = ActionTokenizer(bins=256).fit(a)
    assert np.allclose(bin_width(tok), (tok.high - tok.low) / 255)
    assert np.abs(tok.decode(tok.encode(a)) - a).max() <= 1.0 / 255 + 1e-6  # half of 2/255


@pytest.mark.parametrize("mode", ["uniform", "quantile", "mulaw"])
def test_saturated_actions_roundtrip_exactly(mode):
    a = rarely_saturating_actions()
    assert np.percentile(a, 99.5, axis=0).max() < 0.8, "percentiles alone would miss the limits"
    tok = ActionTokenizer(bins=256, mode=mode).fit(a)
    assert np.array_equal(tok.low, [-1.0] * 3) and np.array_equal(tok.high, [1.0] * 3)
    limits = np.array([[-1.0] * 3, [1.0] * 3])
    assert np.array_equal(tok.decode(tok.encode(limits)), limits.astype(np.float32))
    assert (np.abs(tok.decode(tok.encode(a)) - a) <= bin_width(tok) / 2 + 1e-6).all()


def test_bounds_robust_to_outliers_when_not_saturating():
    rng = np.random.default_rng(1)
    a = rng.uniform(-0.5, 0.5, size=(2000, 2))
    a[0] = [0.99, -0.99]  # outliers inside the Box, not at its limit
    tok = ActionTokenizer(bins=64).fit(a)
    assert (tok.high < 0.6).all() and (tok.low > -0.6).all()


def test_action_to_dict_from_dict_identical_tokens():
    a = expert_like_actions(n=500)
    for mode in ("uniform", "quantile", "mulaw"):
        tok = ActionTokenizer(bins=32, mode=mode).fit(a)
        again = ActionTokenizer.from_dict(json.loads(json.dumps(tok.to_dict())))
        assert np.array_equal(again.encode(a), tok.encode(a))
        assert np.array_equal(again.decode(tok.encode(a)), tok.decode(tok.encode(a)))


def test_action_unfitted_and_bad_mode():
    with pytest.raises(RuntimeError, match="not fitted"):
        ActionTokenizer().encode(np.zeros((1, 2)))
    with pytest.raises(ValueError, match="mode"):
        ActionTokenizer(mode="log")


# ---------------------------------------------------------------------------------------- text

INSTRUCTIONS = ["Put the red block in the bowl.", "push the green cube to the left", "Reach the goal, then stop!"]


def test_text_roundtrip_normalized():
    tok = TextTokenizer.fit(INSTRUCTIONS)
    for s in INSTRUCTIONS:
        ids = tok.encode(s)
        assert ids[0] == BOS_ID and all(i >= 2 + 256 for i in ids[1:]), "seen words get word ids"
        assert tok.decode(ids) == " ".join(s.lower().split())
    assert tok.decode(tok.encode("  PUT   the bowl ")) == "put the bowl"


def test_text_unseen_pieces_are_one_unk_token_each():
    tok = TextTokenizer.fit(INSTRUCTIONS)
    seen, unseen = tok.encode("put the red block"), tok.encode("put the crimson cuboid")
    assert len(unseen) == len(seen) and unseen[:3] == seen[:3]
    assert unseen[3] == unseen[4] and tok.decode(unseen) == "put the <unk> <unk>"
    assert tok.encode("put the <unk>") != unseen  # typed text cannot forge the sentinel
    assert tok.decode(tok.encode("put 🤖 the")) == "put <unk> the"
    again = TextTokenizer.from_dict(tok.to_dict())
    assert again.encode("put the crimson cuboid") == unseen
    old = {"kind": "word+byte", "version": 2, "pad_id": 0, "bos_id": 1, "unknown": "bytes", "words": [" put"]}
    with pytest.raises(ValueError, match="byte fallback is retired"):
        TextTokenizer.from_dict(old)


def test_text_truncation_and_batch_padding():
    tok = TextTokenizer.fit(INSTRUCTIONS)
    ids = tok.encode(INSTRUCTIONS[0], max_len=4)
    assert len(ids) == 4 and tok.decode(ids) == "put the red"
    batch = tok.encode_batch(INSTRUCTIONS + ["xyz the"], max_len=12)
    assert batch.shape == (4, 12) and batch.dtype == np.int64
    unk, the = tok.encode("xyz the")[1:]
    assert list(batch[3, :4]) == [BOS_ID, unk, the, PAD_ID] and tok.decode(batch[3]) == "<unk> the"


def test_text_to_dict_from_dict_identical_tokens():
    tok = TextTokenizer.fit(INSTRUCTIONS, min_count=1)
    again = TextTokenizer.from_dict(json.loads(json.dumps(tok.to_dict())))
    assert again.vocab_size == tok.vocab_size == 2 + 256 + len(tok.words)
    for s in INSTRUCTIONS + ["unseen words, ünïcode"]:
        assert again.encode(s, 16) == tok.encode(s, 16)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


# ---------------------------------------------------------------------------------------- proprio


def test_proprio_normalizer():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=(1000, 5)).astype(np.float32)
    x[:, 4] = 0.25  # a constant dimension: std floored, no division blow-up
    norm = ProprioNormalizer.fit(x)
    z = norm.normalize(x)
    assert np.allclose(z[:, :4].mean(0), 0, atol=1e-4) and np.allclose(z[:, :4].std(0), 1, atol=1e-3)
    assert np.all(z[:, 4] == 0) and norm.std[4] == pytest.approx(1e-2)
    again = ProprioNormalizer.from_dict(json.loads(json.dumps(norm.to_dict())))
    assert np.array_equal(again.normalize(x), z)


def test_tokenizers_are_numpy_only():
    """The robot side (load_policy with onnxruntime) runs the tokenizers without torch."""
    code = "import sys; import vla.tokenizers; assert 'torch' not in sys.modules and 'h5py' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
