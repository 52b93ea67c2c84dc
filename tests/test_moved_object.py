"""Moved-object targets: what a demonstration's own video says about where the thing it moves was."""

import h5py
import numpy as np
import pytest
import torch

from vla.data.hdf5_format import ObsKeys
from vla.data.moved_object import largest_region, moved_object_targets, scene, start_regions
from vla.data.windows import WindowDataset, fit_tokenizers
from vla.model.losses import keypoint_loss
from vla.training.config import load_config

SIDE = 32


def _demo(rng, block_from, block_to, moves_at, T=6):
    """(T, SIDE, SIDE, 3) uint8 frames on a grey table: a 4x4 block of a random colour at block_from until step
    moves_at, then at block_to; a dark 3x3 'arm' at a fixed home in the first frame, elsewhere along the top later."""
    frames = np.full((T, SIDE, SIDE, 3), 128, np.uint8)
    frames += rng.integers(0, 6, frames.shape, dtype=np.uint8)  # sensor noise, well below the change threshold
    colour = rng.integers(160, 256, 3)
    for t in range(T):
        r, c = block_from if t < moves_at else block_to
        frames[t, r : r + 4, c : c + 4] = colour
        arm = (1, 1) if t == 0 else (0, int(rng.integers(4, SIDE - 3)))  # above the blocks, never over one
        frames[t, arm[0] : arm[0] + 3, arm[1] : arm[1] + 3] = 20
    return frames


def _demos(n=12, seed=0):
    """n demos whose blocks start in different cells of a 5-pixel grid (a real scene's objects lie anywhere; here
    no pixel is a start in two demos, so every start region is the whole block)."""
    rng = np.random.default_rng(seed)
    cells = [(r, c) for r in range(6, SIDE - 8, 5) for c in range(6, SIDE - 8, 5)]
    demos, starts = [], []
    for i in rng.permutation(len(cells))[:n]:
        start, end = np.array(cells[i]), rng.integers(6, SIDE - 10, 2)
        while np.abs(start - end).max() < 6:  # the block really leaves its first place
            end = rng.integers(6, SIDE - 10, 2)
        demos.append(_demo(rng, start, end, moves_at=3))
        starts.append(start)
    return demos, starts


def test_largest_region_is_the_biggest_4_connected_blob():
    mask = np.zeros((6, 6), bool)
    mask[0, 0] = mask[1, 1] = True  # diagonal: two regions of one pixel, not one of two
    mask[3:5, 2:5] = True  # six pixels
    got = largest_region(mask)
    assert got.sum() == 6 and got[3:5, 2:5].all()
    assert largest_region(np.zeros((4, 4), bool)) is None


def test_the_start_of_what_each_demo_moves_is_found_until_it_moves():
    demos, starts = _demos()
    first, last = np.stack([d[0] for d in demos]), np.stack([d[-1] for d in demos])
    empty = scene(np.stack([d[i % 6] for i, d in enumerate(demos)]))
    regions = start_regions(first, last, empty)
    axis = (np.arange(SIDE) + 0.5) / SIDE * 2 - 1
    for frames, start, region in zip(demos, starts, regions, strict=True):
        block = np.zeros((SIDE, SIDE), bool)
        block[start[0] : start[0] + 4, start[1] : start[1] + 4] = True
        np.testing.assert_array_equal(region, block)  # the block, not where it went nor the arm's home pose
        targets = moved_object_targets(frames, region)[:, 0]  # (T, 2)
        centre = [axis[start[0] : start[0] + 4].mean(), axis[start[1] : start[1] + 4].mean()]
        np.testing.assert_allclose(targets[:3], np.broadcast_to(centre, (3, 2)), atol=1e-6)  # there until step 3
        assert np.isnan(targets[3:]).all()  # moved: no target


def test_a_demo_that_moves_nothing_has_no_target_and_a_covered_object_none_while_covered():
    demos, _ = _demos()
    still = _demo(np.random.default_rng(7), (10, 10), (10, 10), moves_at=6)  # the block never moves
    demos.append(still)
    first, last = np.stack([d[0] for d in demos]), np.stack([d[-1] for d in demos])
    regions = start_regions(first, last, scene(np.stack([d[2] for d in demos])))
    assert regions[-1] is None
    covered = demos[0].copy()
    rows, cols = np.nonzero(regions[0])
    covered[1, rows.min() : rows.min() + 4, cols.min() : cols.min() + 4] = 20  # the hand over the block
    targets = moved_object_targets(covered, regions[0])[:, 0, 0]
    assert np.isfinite(targets[[0, 2]]).all() and np.isnan(targets[1])


def test_keypoint_loss_skips_steps_without_a_target():
    torch.manual_seed(0)
    grid = 8
    axis = (torch.arange(grid) + 0.5) / grid * 2 - 1
    coords = torch.stack(torch.meshgrid(axis, axis, indexing="ij"), -1).reshape(-1, 2)  # (h*w, 2)
    heat = torch.randn(2, 3, 2, grid * grid).softmax(-1)  # (B, T, n, h*w)
    targets = torch.rand(2, 3, 2, 2) * 2 - 1
    weight = torch.ones(2, 3)
    with_nan = targets.clone()
    with_nan[:, :, 1] = float("nan")  # the second point has no target anywhere
    with_nan[0, 2, 0] = float("nan")  # nor the first at one step
    expected_weight = torch.ones(2, 3)
    expected_weight[0, 2] = 0
    got = keypoint_loss(heat, coords, with_nan, weight, grid)
    expected = keypoint_loss(heat[:, :, :1], coords, targets[:, :, :1], expected_weight, grid)
    torch.testing.assert_close(got, expected)
    assert torch.isfinite(got)
    assert keypoint_loss(heat, coords, torch.full_like(targets, float("nan")), weight, grid) == 0


def test_on_real_demos_the_target_is_the_named_block_and_a_reach_has_none(tiny_dataset):
    """The scripted experts' episodes: every target found is where the simulator says the named block is."""
    tok = fit_tokenizers(tiny_dataset, "train", ObsKeys(), action_bins=64, action_mode="uniform")
    ds = WindowDataset(tiny_dataset, "train", tok, window=1, chunk=1, instruction_len=12, moved_object=True)
    labelled = {}
    with h5py.File(tiny_dataset) as f:
        for d, name in enumerate(ds.names):
            target = ds.keypoint_targets[d][:, 0]  # (T, 2)
            block = f["data"][name]["obs"]["object_px"][:, :2]  # what the simulator recorded, never trained on
            found = np.isfinite(target[:, 0])
            np.testing.assert_allclose(target[found], block[found], atol=0.05)
            if found.any():
                assert not found[-1]  # by its last step the thing has moved
            task = ds.tasks[d].split("/")[1].split("-")[0]
            labelled.setdefault(task, []).append(found.any())
    assert not any(labelled["Reach"])  # a reach moves nothing
    for task in ("Push", "PickPlace", "Stack"):
        assert sum(labelled[task]) >= 2, labelled  # of 3 training demos each


def test_config_rejects_two_sources_of_the_first_keypoints_targets():
    with pytest.raises(ValueError, match="both give the first keypoint's targets"):
        load_config("configs/real.yaml", ["data.keypoint_key=object_px"])
    with pytest.raises(ValueError, match="augment_shift"):
        load_config("configs/real.yaml", ["data.augment_shift=4"])
    with pytest.raises(ValueError, match="moved_object_targets=true needs model.keypoints > 0"):
        load_config("configs/real.yaml", ["model.keypoints=0", "model.aux_feed=false", "data.waypoint_targets=false"])
