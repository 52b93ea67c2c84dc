"""The action guard: what makes any policy output safe to send to the robot, one action at a time.

A non-finite action is rejected (the last safe action is held), every
action is clamped to the action space, and each motion dim may change by at most `max_delta` per tick
(gripper dims are exempt by default: they are open/close set-points whose actuator already limits
speed, and a smoothed close would pass through half-open grips that drop the object).
"""

from __future__ import annotations

import numpy as np

from vla.control.robot import Robot


class ActionGuard:
    """Makes any policy output safe to send: rejects NaN/Inf, clamps to [low, high], limits the rate.

    `max_delta`: largest change per tick of each rate-limited dim (action units; None = no limit).
    `free_dims`: dims exempt from the rate limit (the gripper's, by default in `from_robot`).
    `start_from_rest`: the first action is rate-limited from zero (delta actions: zero is no motion).
    `counts` tallies each intervention: nonfinite (rejected), clamped, rate_limited.
    """

    def __init__(
        self,
        low,
        high,
        max_delta: float | None = 1.0,
        free_dims: tuple[int, ...] = (),
        start_from_rest: bool = True,
    ):
        self.low = np.asarray(low, dtype=np.float32)
        self.high = np.asarray(high, dtype=np.float32)
        if self.low.shape != self.high.shape or np.any(self.low > self.high):
            raise ValueError(f"bad action bounds: low {self.low}, high {self.high}")
        if max_delta is not None and not max_delta > 0:
            raise ValueError(f"max_delta must be positive (or None for no rate limit), got {max_delta}")
        self.max_delta = max_delta
        self.limited = np.ones(self.low.shape, dtype=bool)  # which dims the rate limit applies to
        for d in free_dims:
            self.limited[d] = False
        self.start_from_rest = start_from_rest
        self.reset()

    @classmethod
    def from_robot(cls, robot: Robot, max_delta: float | None = 1.0, limit_gripper: bool = False) -> ActionGuard:
        free = () if limit_gripper else tuple(getattr(robot, "gripper_dims", ()))
        space = robot.action_space
        return cls(space.low, space.high, max_delta=max_delta, free_dims=free)

    def reset(self) -> None:
        self.last_safe: np.ndarray | None = None  # the last action let through, (A,)
        self.counts = {"nonfinite": 0, "clamped": 0, "rate_limited": 0}

    def __call__(self, action) -> np.ndarray | None:
        """The safe version of `action` (A,); the last safe action (None before any) if it is rejected."""
        a = np.asarray(action, dtype=np.float32)
        if a.shape != self.low.shape:
            raise ValueError(f"action has shape {a.shape}, the action space {self.low.shape}")
        if not np.all(np.isfinite(a)):
            self.counts["nonfinite"] += 1
            return None if self.last_safe is None else self.last_safe.copy()
        out = np.clip(a, self.low, self.high)
        if not np.array_equal(out, a):
            self.counts["clamped"] += 1
        reference = self.last_safe
        if reference is None and self.start_from_rest:
            reference = np.zeros_like(out)
        if self.max_delta is not None and reference is not None:
            limited = np.where(self.limited, np.clip(out, reference - self.max_delta, reference + self.max_delta), out)
            if not np.array_equal(limited, out):
                self.counts["rate_limited"] += 1
            out = np.clip(limited, self.low, self.high).astype(np.float32)
        self.last_safe = out
        return out.copy()
