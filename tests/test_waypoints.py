"""Waypoint targets: what a demonstration's own proprio and gripper actions say about where things are."""

import numpy as np
import pytest

from vla.data.hdf5_format import ObsKeys, open_dataset
from vla.data.waypoints import N_WAYPOINTS, gripper_closed, waypoint_targets
from vla.data.windows import WindowDataset, fit_tokenizers


@pytest.fixture(scope="module")
def tokenizers(tiny_dataset):
    return fit_tokenizers(tiny_dataset, "train", ObsKeys(), action_bins=64, action_mode="uniform")


def _absolute(proprio, closed):
    """The waypoints as absolute positions: (T, 3) of a 1-D proprio."""
    return waypoint_targets(proprio, closed).reshape(len(proprio), N_WAYPOINTS) + proprio


def test_waypoints_are_the_hand_at_the_next_grasp_release_and_end():
    hand = np.arange(10, dtype=np.float32)[:, None] * 10  # the hand at step t is at 10 t
    closed = np.array([0, 0, 0, 1, 1, 1, 0, 0, 1, 1], bool)  # grasp at 3, release at 6, grasp again at 8
    got = _absolute(hand, closed) / 10
    np.testing.assert_array_equal(got[:, 0], [3, 3, 3, 3, 4, 5, 8, 8, 8, 9])  # next grasp; holding: the hand now
    np.testing.assert_array_equal(got[:, 1], [6, 6, 6, 6, 6, 6, 9, 9, 9, 9])  # next release; none left: the end
    np.testing.assert_array_equal(got[:, 2], [9] * 10)  # the last step
    np.testing.assert_array_equal(got[:, 3], [8, 9, 9, 9, 9, 9, 9, 9, 9, 9])  # HORIZON (8) steps ahead


def test_a_demo_without_grasps_points_at_its_end():
    hand = np.random.default_rng(0).normal(size=(7, 3)).astype(np.float32)
    offsets = waypoint_targets(hand, np.zeros(7, bool)).reshape(7, N_WAYPOINTS, 3)[:, :3]
    np.testing.assert_allclose(offsets, np.broadcast_to((hand[-1] - hand)[:, None], (7, 3, 3)), atol=1e-6)
    always_closed = waypoint_targets(hand, np.ones(7, bool)).reshape(7, N_WAYPOINTS, 3)
    np.testing.assert_array_equal(always_closed[:, 0], 0.0)  # a push: the thing is at the hand
    np.testing.assert_allclose(always_closed[:, 1], hand[-1] - hand, atol=1e-6)


def test_gripper_threshold_is_the_middle_of_its_range():
    actions = np.array([[0.0, -1.0], [0.0, 0.2], [0.0, 1.5]], np.float32)
    np.testing.assert_array_equal(gripper_closed(actions, -1, -1.0, 1.0), [False, True, True])
    np.testing.assert_array_equal(gripper_closed(actions, 1, 0.0, 2.0), [False, False, True])


def test_dataset_waypoints_match_the_recorded_grasp(tiny_dataset, tokenizers):
    """On real expert demos: the hand at the recorded gripper-close step is where the named block was."""
    ds = WindowDataset(tiny_dataset, "train", tokenizers, window=1, chunk=1, instruction_len=12, waypoints=True,
                       waypoint_dims=[0, 1, 2])  # fmt: skip
    d = next(i for i, task in enumerate(ds.tasks) if "PickPlace" in task)
    with open_dataset(tiny_dataset) as f:
        demo = f["data"][ds.names[d]]
        proprio, block = demo["obs"]["proprio"][()], demo["obs"]["object"][()][0, :3]
        closed = demo["actions"][()][:, 3] > 0  # the actions the dataset reads
    grasp = int(np.argmax(closed))
    first = int(np.flatnonzero(ds.index[:, 0] == d)[0])  # the demo's first window
    target = (ds[first]["aux"][0].numpy() * ds.waypoint_spread).reshape(N_WAYPOINTS, 3)  # undo the scaling
    norm = tokenizers.proprio
    hand_at_grasp = target[0] * norm.std[:3] + proprio[0, :3]  # back to metres
    np.testing.assert_allclose(hand_at_grasp, proprio[grasp, :3], atol=1e-5)
    assert np.linalg.norm(hand_at_grasp[:2] - block[:2]) < 0.03  # the expert grasps the named block
    with pytest.raises(Exception, match="gripper_dim=7"):
        WindowDataset(tiny_dataset, "train", tokenizers, 1, 1, 12, waypoints=True, gripper_dim=7)
