"""Moved-object targets: what a demonstration's own video says about where the thing it moves was."""

import h5py
import numpy as np
import pytest
import torch

from vla.data.hdf5_format import ObsKeys
from vla.data.moved_object import (
    end_regions,
    largest_region,
    moved_object_targets,
    moves_early,
    scene,
    start_regions,
    still_there,
)
from vla.data.waypoints import still_held
from vla.data.windows import WindowDataset, fit_tokenizers
from vla.model.losses import keypoint_loss
from vla.training.config import load_config

SIDE = 32


def _path(block_from, block_to, moves_at, T):
    """(T, 2) int: the block's top-left corner at each step, still until moves_at, then straight to block_to, which it
    reaches two steps before the end (a few pixels a step, as a pushed or carried object goes)."""
    share = np.clip((np.arange(T) - moves_at + 1) / (T - 2 - moves_at), 0, 1)[:, None]  # (T, 1)
    return np.round(np.asarray(block_from) + share * (np.asarray(block_to) - block_from)).astype(int)


def _demo(rng, block_from, block_to, moves_at, T=8, mark=None, home=(1, 1), size=4):
    """(T, SIDE, SIDE, 3) uint8 frames on a grey table: a size x size block of a random colour at block_from until
    step moves_at, then on its way to block_to, on a green 6x6 target there; a dark 3x3 'arm' at `home` in the
    first frame, elsewhere along the top later; with `mark`, a 4x4 patch of the block's colour at that corner."""
    frames = np.full((T, SIDE, SIDE, 3), 128, np.uint8)
    frames += rng.integers(0, 6, frames.shape, dtype=np.uint8)  # sensor noise, well below the change threshold
    colour = rng.integers(160, 256, 3)
    for t, (r, c) in enumerate(_path(block_from, block_to, moves_at, T)):
        frames[t, block_to[0] - 1 : block_to[0] + 5, block_to[1] - 1 : block_to[1] + 5] = (40, 200, 40)
        if mark is not None:
            frames[t, mark[0] : mark[0] + 4, mark[1] : mark[1] + 4] = colour
        frames[t, r : r + size, c : c + size] = colour
        arm = home if t == 0 else (0, int(rng.integers(4, SIDE - 3)))  # above the blocks, never over one
        frames[t, arm[0] : arm[0] + 3, arm[1] : arm[1] + 3] = 20
    return frames


def _demos(n=12, seed=0):
    """n demos whose blocks start and end in different cells of a 5-pixel grid (a real scene's objects lie
    anywhere; here no pixel is a start or an end in two demos, so every region is the whole block)."""
    rng = np.random.default_rng(seed)
    cells = [np.array((r, c)) for r in range(6, SIDE - 8, 5) for c in range(6, SIDE - 8, 5)]
    demos, starts, ends, free = [], [], [], list(rng.permutation(len(cells)))
    for i in rng.permutation(len(cells))[:n]:
        start = cells[i]
        end = cells[next(j for j in free if np.abs(cells[j] - start).max() >= 10)]  # it really leaves its place
        free = [j for j in free if not (cells[j] == end).all()]
        demos.append(_demo(rng, start, end, moves_at=3))
        starts.append(start)
        ends.append(end)
    return demos, starts, ends


def _block(corner, size=4) -> np.ndarray:
    mask = np.zeros((SIDE, SIDE), bool)
    mask[corner[0] : corner[0] + size, corner[1] : corner[1] + size] = True
    return mask


def test_largest_region_is_the_biggest_4_connected_blob():
    mask = np.zeros((6, 6), bool)
    mask[0, 0] = mask[1, 1] = True  # diagonal: two regions of one pixel, not one of two
    mask[3:5, 2:5] = True  # six pixels
    got = largest_region(mask)
    assert got.sum() == 6 and got[3:5, 2:5].all()
    assert largest_region(np.zeros((4, 4), bool)) is None


def test_where_each_demo_moves_its_object_from_and_to_is_found():
    demos, starts, ends = _demos()
    first, last = np.stack([d[0] for d in demos]), np.stack([d[-1] for d in demos])
    empty = scene(np.stack([d[i % 6] for i, d in enumerate(demos)]))
    tasks = ["push"] * len(demos)
    found_starts = start_regions(first, last, empty, tasks)
    found_ends = end_regions(first, last, empty, tasks, found_starts, [False] * len(demos))
    axis = (np.arange(SIDE) + 0.5) / SIDE * 2 - 1
    centre = lambda corner: [axis[corner[0] : corner[0] + 4].mean(), axis[corner[1] : corner[1] + 4].mean()]  # noqa: E731
    for frames, start, end, found_start, found_end in zip(demos, starts, ends, found_starts, found_ends, strict=True):
        np.testing.assert_array_equal(found_start, _block(start))  # not where it went, nor the arm's home pose
        np.testing.assert_array_equal(found_end, _block(end))  # the block on its target, not the target around it
        targets = moved_object_targets(frames, found_start, found_end, empty)  # (T, 2, 2)
        path = [centre(corner) for corner in _path(start, end, 3, len(frames))]
        np.testing.assert_allclose(targets[:, 0], path, atol=1e-6)  # where it is, at rest and on its way
        np.testing.assert_allclose(targets[:, 1], np.broadcast_to(centre(end), (8, 2)), atol=1e-6)  # the goal: always
    held = [True] + [False] * (len(demos) - 1)  # the first demo's hand still holds the block at its end
    assert end_regions(first, last, empty, tasks, found_starts, held)[0] is None


def test_where_the_hand_stops_over_the_goal_the_end_is_what_it_covers_nearest_the_object():
    """A hand that stays over the goal hides the moved block in the last frame: no pixel of its colour shows
    there, so the goal is what the hand covers (the target the block lies on), not nothing; and of what the arm
    covers besides (here a larger mark), the region nearest where the block was last seen."""
    demos, starts, ends = _demos()
    demo, (r, c), hand = demos[0], ends[0], 30
    demo[:, SIDE - 5 :, :8] = (40, 40, 200)  # a blue mark along the bottom edge, below every block and target
    demo[-1, SIDE - 5 :, :8] = hand  # ... which the arm covers at the end
    demo[-1, r - 2 : r + 6, c - 2 : c + 6] = hand  # as the hand covers the block and all of its target
    first, last = np.stack([d[0] for d in demos]), np.stack([d[-1] for d in demos])
    empty = scene(np.stack([d[i % 6] for i, d in enumerate(demos)]))
    tasks = ["push"] * len(demos)
    found_starts = start_regions(first, last, empty, tasks)
    end = end_regions(first, last, empty, tasks, found_starts, [False] * len(demos))[0]
    target = np.zeros((SIDE, SIDE), bool)
    target[r - 1 : r + 5, c - 1 : c + 5] = True  # the 6x6 target the block lies on, under the hand
    assert end[target].all() and end.sum() == target.sum() + 5 * 8  # the target and the mark: both covered
    axis = (np.arange(SIDE) + 0.5) / SIDE * 2 - 1
    goal = moved_object_targets(demo, found_starts[0], end, empty)[:, 1]  # (T, 2)
    np.testing.assert_allclose(goal, np.broadcast_to([axis[r : r + 4].mean(), axis[c : c + 4].mean()], goal.shape))
    demo[-1, r - 2 : r + 6, c - 2 : c + 6] = 128  # the hand gone and the block with it: nothing arrived there
    demo[-1, SIDE - 5 :, :8] = (40, 40, 200)
    (r0, c0) = starts[0]
    demo[:, r0 + 4, c0 : c0 + 4] = (60, 60, 60)  # a shadow along the block's start ...
    demo[-1, r0 + 4, c0 : c0 + 4] = (200, 200, 40)  # ... that looks otherwise at the end: where it was, no goal
    first, last = np.stack([d[0] for d in demos]), np.stack([d[-1] for d in demos])
    assert end_regions(first, last, empty, tasks, found_starts, [False] * len(demos))[0] is None


def test_still_held_means_a_grasp_that_was_never_released():
    assert still_held(np.array([0, 0, 1, 1], bool))  # grasped, held to the end
    assert not still_held(np.array([0, 1, 1, 0], bool))  # let go before the end
    assert not still_held(np.array([1, 1, 1, 1], bool))  # closed throughout: a push with closed fingers
    assert not still_held(np.array([0, 0, 0, 0], bool))


def test_a_tasks_own_home_pose_is_not_taken_for_a_moved_object():
    """A task whose arm starts in a pose of its own, and that moves nothing that leaves its place (a button
    pressed): the arm's home pose left, in every demonstration of that task but few of the split's."""
    demos, _, _ = _demos()
    rng = np.random.default_rng(5)
    presses = [_demo(rng, (10, 10), (10, 10), moves_at=8, home=(1, 20)) for _ in range(2)]  # the block never moves
    demos += presses
    first, last = np.stack([d[0] for d in demos]), np.stack([d[-1] for d in demos])
    empty = scene(np.stack([d[i % 6] for i, d in enumerate(demos)]))
    by_task = start_regions(first, last, empty, ["push"] * 12 + ["press"] * 2)
    assert by_task[-2] is None and by_task[-1] is None
    assert all(region is not None for region in by_task[:12])
    as_one_task = start_regions(first, last, empty, ["push"] * 14)  # what the split alone would say
    for region in as_one_task[-2:]:
        assert region is not None and region[1:4, 20:23].all()  # the arm's home pose, taken for an object


def test_each_task_keeps_start_regions_of_its_own_objects_size():
    """A task that moves a small thing (a puck beside blocks four times its area) keeps its regions: the size a
    region should have is its task's; a thing of one or two pixels is noise in any task."""
    demos, _, _ = _demos()
    rng = np.random.default_rng(13)
    paths = [((3, 27), (3, 18)), ((27, 3), (27, 12)), ((27, 27), (18, 27))]
    demos += [_demo(rng, start, end, moves_at=3, size=2) for start, end in paths]  # pucks: 4 pixels
    demos += [_demo(rng, start, end, moves_at=3, size=1) for start, end in paths]  # crumbs: 1 pixel
    first, last = np.stack([d[0] for d in demos]), np.stack([d[-1] for d in demos])
    empty = scene(np.stack([d[i % 6] for i, d in enumerate(demos)]))
    found = start_regions(first, last, empty, ["push"] * 12 + ["puck"] * 3 + ["crumb"] * 3)
    assert all(region is not None for region in found[:12])
    for region, (start, _) in zip(found[12:15], paths, strict=True):
        np.testing.assert_array_equal(region, _block(start, size=2))
    assert all(region is None for region in found[15:])


def test_the_moved_object_is_followed_past_a_mark_of_its_own_colour():
    """A goal mark of the block's colour (a red block to the red zone) does not look as if the block were there:
    the mark is where it was in the first frame, the block is not."""
    demos, starts, ends = _demos()
    rng = np.random.default_rng(3)
    start, end, mark = np.array((6, 6)), np.array((21, 21)), np.array((11, 16))  # the mark beside the block's way
    demos[0] = _demo(rng, start, end, moves_at=3, mark=mark)
    first, last = np.stack([d[0] for d in demos]), np.stack([d[-1] for d in demos])
    empty = scene(np.stack([d[i % 6] for i, d in enumerate(demos)]))
    found = start_regions(first, last, empty, ["push"] * len(demos))[0]
    np.testing.assert_array_equal(found, _block(start))
    targets = moved_object_targets(demos[0], found, None, empty)[:, 0]  # (T, 2)
    axis = (np.arange(SIDE) + 0.5) / SIDE * 2 - 1
    path = [[axis[r : r + 4].mean(), axis[c : c + 4].mean()] for r, c in _path(start, end, 3, 8)]
    np.testing.assert_allclose(targets, path, atol=1e-6)


def test_a_demo_that_moves_nothing_has_no_target_and_a_covered_object_none_while_covered():
    demos, _, _ = _demos()
    still = _demo(np.random.default_rng(7), (10, 10), (10, 10), moves_at=8)  # the block never moves
    demos.append(still)
    first, last = np.stack([d[0] for d in demos]), np.stack([d[-1] for d in demos])
    regions = start_regions(first, last, scene(np.stack([d[2] for d in demos])), ["push"] * len(demos))
    assert regions[-1] is None
    covered = demos[0].copy()
    rows, cols = np.nonzero(regions[0])
    covered[1, rows.min() : rows.min() + 4, cols.min() : cols.min() + 4] = 20  # the hand over the block
    targets = moved_object_targets(covered, regions[0], None, scene(np.stack([d[2] for d in demos])))[:, 0, 0]
    assert np.isfinite(targets[[0, 2]]).all() and np.isnan(targets[1])


def test_a_region_that_changes_as_the_demo_begins_is_the_arms_and_marks_nothing():
    """What the hand moves lies still while the hand travels to it; a start region that changes within the first
    steps is the arm leaving a pose of its own (Meta-World's reach, window-close): no target at any step."""
    rng = np.random.default_rng(11)
    start, end = np.array((6, 6)), np.array((21, 21))
    empty = np.full((SIDE, SIDE, 3), 128, np.int16)
    at_once = _demo(rng, start, end, moves_at=1, T=20)  # already on its way at step 1
    later = _demo(rng, start, end, moves_at=8, T=20)  # still until the hand arrives
    assert moves_early(still_there(at_once, _block(start))) and not moves_early(still_there(later, _block(start)))
    assert np.isnan(moved_object_targets(at_once, _block(start), _block(end), empty)).all()
    targets = moved_object_targets(later, _block(start), _block(end), empty)
    assert np.isfinite(targets[:8]).all()  # at rest: where it starts, and where it ends


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


def test_on_real_demos_the_targets_are_the_named_block_and_its_goal_and_a_reach_has_none(tiny_dataset):
    """The scripted experts' episodes: every target found is where the simulator says the named block is, at rest
    and on its way; a push's end is its target zone."""
    tok = fit_tokenizers(tiny_dataset, "train", ObsKeys(), action_bins=64, action_mode="uniform")
    ds = WindowDataset(tiny_dataset, "train", tok, window=1, chunk=1, instruction_len=12, moved_object=True)
    labelled = {}
    with h5py.File(tiny_dataset) as f:
        for d, name in enumerate(ds.names):
            target = ds.keypoint_targets[d][:, 0]  # (T, 2)
            block = f["data"][name]["obs"]["object_px"][:, :2]  # what the simulator recorded, never trained on
            found = np.isfinite(target[:, 0])
            np.testing.assert_allclose(target[found], block[found], atol=0.1)  # the hand may cover a part
            moved = np.linalg.norm(block - block[0], axis=1) > 0.1  # (T,): the block has left its start
            if (found & moved).any():
                labelled.setdefault("followed", []).append(True)  # where it was carried or pushed to
            task = ds.tasks[d].split("/")[1].split("-")[0]
            labelled.setdefault(task, []).append(found.any())
            goal = ds.keypoint_targets[d][:, 1]  # (T, 2): where the thing ends
            if task == "Push" and np.isfinite(goal).all():
                target = f["data"][name]["obs"]["object_px"][:, 2:]  # the push's target zone
                np.testing.assert_allclose(goal, target, atol=0.1)
                labelled.setdefault("Push goal", []).append(True)
    assert not any(labelled["Reach"])  # a reach moves nothing
    for task in ("Push", "PickPlace", "Stack", "Push goal", "followed"):
        assert sum(labelled.get(task, [])) >= 2, labelled  # of 3 training demos each


def test_config_rejects_two_sources_of_the_first_keypoints_targets():
    with pytest.raises(ValueError, match="both give the first keypoints' targets"):
        load_config("configs/real.yaml", ["data.moved_object_targets=true", "data.keypoint_key=object_px"])
    with pytest.raises(ValueError, match="augment_shift"):
        load_config("configs/real.yaml", ["data.moved_object_targets=true", "data.augment_shift=4"])
    with pytest.raises(ValueError, match="moved_object_targets=true needs model.keypoints >= 2"):
        load_config("configs/real.yaml", ["data.moved_object_targets=true", "model.keypoints=1"])


def test_training_says_how_many_demos_the_video_labelled(tiny_dataset, capsys):
    """A moving camera or a wrist-only dataset labels nothing and its heat-map loss is then 0: the count is printed."""
    from vla.training.train import prepare_data

    cfg = load_config("configs/tiny.yaml", ["data.aux_key=", "data.keypoint_key=", "data.moved_object_targets=true"])
    _, data = prepare_data(cfg, str(tiny_dataset), None, None)
    assert not data.spec.keypoint_targets  # the label-free keypoint net, as measured
    found = sum(bool(np.isfinite(t[:, 0, 0]).any()) for t in data.train_set.keypoint_targets)
    assert 6 <= found < len(data.train_set.names)  # the pushes, pick-and-places and stacks, not the reaches
    goals = sum(bool(np.isfinite(t[:, 1, 0]).any()) for t in data.train_set.keypoint_targets)
    assert 6 <= goals <= found  # a push ends on its target, a pick-and-place in its bin, a stack on its base
    said = f"moved-object targets in {found} of {len(data.train_set.names)} training demos, where they end in {goals}"
    assert said in capsys.readouterr().err
