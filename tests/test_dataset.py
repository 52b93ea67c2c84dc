"""Training windows, the resumable sampler and the augmentation, on a real collected dataset."""

import numpy as np
import pytest
import torch

from vla.data.hdf5_format import ObsKeys, open_dataset, read_demo
from vla.data.windows import EpochSampler, WindowDataset, fit_tokenizers
from vla.training.augment import random_shift


@pytest.fixture(scope="module")
def tokenizers(tiny_dataset):
    return fit_tokenizers(tiny_dataset, "train", ObsKeys(), action_bins=64, action_mode="uniform")


@pytest.mark.parametrize("preload", [True, False])
def test_windows_match_the_demo(tiny_dataset, tokenizers, preload):
    ds = WindowDataset(tiny_dataset, "train", tokenizers, window=3, chunk=2, instruction_len=12, preload=preload)
    with open_dataset(tiny_dataset) as f:
        demo = read_demo(f, ds.names[0], ObsKeys())
    T = demo.num_samples
    tokens = tokenizers.action.encode(demo.actions)  # (T, A)
    first = ds[0]  # the window ending at step 0: two padding steps, then step 0
    assert first["step_mask"].tolist() == [False, False, True]
    assert first["timestep"].tolist() == [0, 0, 0]
    assert torch.equal(first["image"][2, 0], torch.from_numpy(demo.image[0]))
    assert int(first["image"][:2].sum()) == 0 and float(first["proprio"][:2].abs().sum()) == 0
    last = ds[T - 1]  # the window ending at the demo's last step
    assert last["step_mask"].all() and last["timestep"].tolist() == [T - 3, T - 2, T - 1]
    for k in range(3):
        assert torch.equal(last["image"][k, 0], torch.from_numpy(demo.image[T - 3 + k]))
    np.testing.assert_allclose(
        last["proprio"][-1].numpy(), tokenizers.proprio.normalize(demo.proprio[T - 1]), rtol=1e-6
    )
    # chunk targets: actions t and t+1, chunk-major; past the end a slot is marked and carries no target
    assert last["actions"][0].tolist() == [*tokens[T - 3], *tokens[T - 2]]
    assert last["actions"][2][: tokens.shape[1]].tolist() == [*tokens[T - 1]]
    assert last["action_is_pad"].tolist() == [[False, False], [False, False], [False, True]]
    assert not ds[T - 2]["action_is_pad"].any()
    assert len(ds) == sum(int(n) for n in np.bincount(ds.index[:, 0]))


def test_sampler_is_deterministic_resumable_and_sharded():
    n, B = 50, 4
    stream = lambda s: [i for _, i in zip(range(60), iter(s), strict=False)]  # noqa: E731
    full = stream(EpochSampler(n, B, seed=3))
    assert full == stream(EpochSampler(n, B, seed=3))
    assert full != stream(EpochSampler(n, B, seed=4))
    assert sorted(full[:n]) == list(range(n))  # an epoch is a permutation
    resumed = stream(EpochSampler(n, B, seed=3, start_step=5))  # 5 batches of 4 already consumed
    assert resumed[:40] == full[20:60]
    r0 = stream(EpochSampler(n, B, seed=3, rank=0, world=2))[:25]
    r1 = stream(EpochSampler(n, B, seed=3, rank=1, world=2))[:25]
    assert not set(r0) & set(r1) and len(set(r0) | set(r1)) == 50


def test_random_shift_replicates_edges_and_keeps_steps_aligned():
    image = torch.randint(0, 256, (6, 3, 1, 16, 16, 3), dtype=torch.uint8)
    out = random_shift(image, 2, torch.Generator().manual_seed(0))
    assert out.shape == image.shape and out.dtype == torch.uint8
    dy, dx = torch.randint(0, 5, (2, 6), generator=torch.Generator().manual_seed(0)).tolist()
    for b in range(6):
        rows = (torch.arange(16) + dy[b] - 2).clamp(0, 15)
        cols = (torch.arange(16) + dx[b] - 2).clamp(0, 15)
        assert torch.equal(out[b], image[b][:, :, rows][:, :, :, cols])  # same shift for every step
    assert torch.equal(random_shift(image, 0, torch.Generator()), image)


def test_auxiliary_targets_are_the_recorded_object_positions(tiny_dataset, tokenizers):
    ds = WindowDataset(tiny_dataset, "train", tokenizers, window=2, chunk=1, instruction_len=12, aux_key="object")
    with open_dataset(tiny_dataset) as f:
        recorded = f["data"][ds.names[0]]["obs"]["object"][()]  # (T, 6): named block xyz, goal xyz
        ee = f["data"][ds.names[0]]["obs"]["proprio"][()][:, :3]  # (T, 3): the end effector
    item = ds[1]
    expected = 10.0 * (recorded[:2].reshape(2, 2, 3) - ee[:2, None, :]).reshape(2, 6)  # relative, in 10 cm
    np.testing.assert_allclose(item["aux"].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert float(ds[0]["aux"][0].abs().sum()) == 0.0  # padding step
    with pytest.raises(Exception, match="no 'nothing'"):
        WindowDataset(tiny_dataset, "train", tokenizers, window=2, chunk=1, instruction_len=12, aux_key="nothing")


def test_keypoint_targets_are_the_recorded_image_positions(tiny_dataset, tokenizers):
    ds = WindowDataset(
        tiny_dataset, "train", tokenizers, window=2, chunk=1, instruction_len=12, keypoint_key="object_px"
    )
    with open_dataset(tiny_dataset) as f:
        recorded = f["data"][ds.names[0]]["obs"]["object_px"][()]  # (T, 4): block (row, col), goal (row, col)
    item = ds[1]
    assert item["keypoint_targets"].shape == (2, 2, 2)
    np.testing.assert_array_equal(item["keypoint_targets"].numpy(), recorded[:2].reshape(2, 2, 2))
    assert float(ds[0]["keypoint_targets"][0].abs().sum()) == 0.0  # padding step
    with pytest.raises(Exception, match="no 'nothing' for keypoint targets"):
        WindowDataset(tiny_dataset, "train", tokenizers, window=2, chunk=1, instruction_len=12, keypoint_key="nothing")


def test_chunk_targets_past_the_demo_end_carry_no_loss(tiny_dataset, tokenizers):
    """ACT's action_is_pad: whatever sits in a padded target slot, the loss and accuracy are the same."""
    from vla.model import ActionTransformer, DataSpec, ModelConfig

    ds = WindowDataset(tiny_dataset, "train", tokenizers, window=2, chunk=3, instruction_len=12, preload=True)
    T = int(np.bincount(ds.index[:, 0])[0])
    batch = {k: v[None] for k, v in ds[T - 1].items() if k != "demo"}  # the demo's last window
    spec = DataSpec(image_size=batch["image"].shape[-2], proprio_dim=batch["proprio"].shape[-1],
                    action_dim=tokenizers.action.action_dim, vocab_size=tokenizers.text.vocab_size)  # fmt: skip
    cfg = ModelConfig(d_model=32, n_head=2, n_layer=1, d_ff=64, patch_embed="linear", film=False, keypoints=0,
                      aux_feed=False, window=2, chunk=3, action_bins=64, instruction_len=12)  # fmt: skip
    torch.manual_seed(0)
    model = ActionTransformer(cfg, spec).eval()
    A = spec.action_dim
    pad = batch["action_is_pad"][0, -1]  # (chunk,): the last step's targets t+1, t+2 lie past the end
    assert pad.tolist() == [False, True, True]
    other = dict(batch, actions=batch["actions"].clone())
    other["actions"][0, -1, A:] = (other["actions"][0, -1, A:] + 7) % cfg.action_bins  # change only padded slots
    with torch.no_grad():
        a, b = model(batch), model(other)
    assert torch.equal(a["loss"], b["loss"]) and torch.equal(a["accuracy"], b["accuracy"])
    unmasked = dict(other, action_is_pad=torch.zeros_like(other["action_is_pad"]))
    with torch.no_grad():
        assert not torch.equal(model(unmasked)["loss"], a["loss"])  # without the mask those targets would count
