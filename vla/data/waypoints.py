"""Waypoint targets: where a demonstration's hand goes next, read from its own proprio and gripper actions.

A user's robot data has no object positions, but every demonstration says where the objects were: the hand
closes the gripper at the thing it picks up, opens it where the thing belongs, and ends where the task is
done. So for each step t the targets are the proprio at three moments, relative to the proprio at t:

- the next grasp: the first step >= t where the gripper command turns to closed (while it is closed, the
  held thing is at the hand: the proprio at t itself, a zero offset);
- the next release: the first step > t where the command turns to open;
- the demonstration's last step;
- the step `HORIZON` steps ahead (or the last): where the hand is heading, which on a push passes the thing
  pushed, a thing no grasp marks.

A moment the rest of the demonstration does not hold falls back to the last step (a reach, a push with a
closed gripper). Offsets are in the proprio normalizer's units, every proprio dimension (a joint-space robot
works as well as one that records its hand's position). These are training targets only: an auxiliary head
predicts them from the keypoints and the proprio, which teaches the keypoints to find the named object.
"""

from __future__ import annotations

import numpy as np

N_WAYPOINTS = 4  # next grasp, next release, last step, HORIZON steps ahead
HORIZON = 8  # steps


def gripper_closed(actions: np.ndarray, dim: int, low: float, high: float) -> np.ndarray:
    """(T,) bool: the gripper command (action dimension `dim`) above the middle of its range [low, high]."""
    return actions[:, dim] > 0.5 * (low + high)


def turns_closed(closed: np.ndarray) -> np.ndarray:
    """closed (T,) bool -> the steps where the gripper command turns to closed (a grasp)."""
    return np.flatnonzero(closed[1:] & ~closed[:-1]) + 1


def still_held(closed: np.ndarray) -> bool:
    """closed (T,) bool -> whether the hand still holds at the last step what it grasped (the command turned to
    closed during the demonstration and stays so): its last frame shows the hand over the thing, not where it lies."""
    return bool(closed[-1] and len(turns_closed(closed)))


def waypoint_targets(proprio: np.ndarray, closed: np.ndarray) -> np.ndarray:
    """proprio (T, P) normalized, closed (T,) bool -> (T, 4 * P) float32: the proprio at the next grasp,
    the next release, the last step and HORIZON steps ahead, each minus the proprio at t."""
    T = len(proprio)
    last = T - 1
    turns_open = np.flatnonzero(~closed[1:] & closed[:-1]) + 1  # steps where the command opens (a release)
    steps = np.arange(T)
    grasp = _next_at_or_after(turns_closed(closed), steps, last)
    grasp = np.where(closed, steps, grasp)  # holding: the thing is at the hand now
    release = _next_at_or_after(turns_open, steps + 1, last)
    ahead = np.minimum(steps + HORIZON, last)
    waypoints = np.stack([grasp, release, np.full(T, last), ahead], axis=1)  # (T, 4) step indices
    offsets = proprio[waypoints] - proprio[:, None, :]  # (T, 4, P)
    return offsets.reshape(T, -1).astype(np.float32)  # (T, 4 * P)


def _next_at_or_after(events: np.ndarray, steps: np.ndarray, fallback: int) -> np.ndarray:
    """For each of `steps`, the first of the sorted `events` >= it, or `fallback` when none is left."""
    padded = np.append(events, fallback)  # searchsorted past the last event lands on the fallback
    return padded[np.searchsorted(events, steps, side="left")]
