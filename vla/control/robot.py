"""The robot a controller drives: a small interface, and MuJoCo as its simulated implementation.

A real driver implements `Robot` (structural typing: no base class needed) and drops into
`vla.control.controller.Controller` unchanged:

    observe()   the observation dict the policy was trained on ("image", "proprio", "instruction")
    apply(a)    send one action (A,) in the action space; returns at once, never waits for motion
    hold()      safe stop: hold the current position, gripper unchanged
    success()   True/False when the robot can tell (a simulator can), None when it cannot
    start()     the loop's clock starts now (the robot moves in real time from here on)
    close()
    action_space  a gymnasium Box; gripper_dims: the action dims that command a gripper (absolute
                  open/close set-points rather than motion; the action guard treats them apart)

`SimRobot` runs a tabletop env in real time: simulated time follows the wall clock. Every call
first advances physics by the wall time elapsed since the previous call (in whole physics steps,
the remainder carried over), so the arm keeps moving under its last command while the policy
thinks, and an action that comes late lands in a world that has moved on, as on a real robot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Robot(Protocol):
    action_space: object  # gymnasium.spaces.Box: low, high, shape
    gripper_dims: tuple[int, ...]  # action dims that are gripper set-points (not rate limited by default)

    def start(self) -> None: ...

    def observe(self) -> dict: ...

    def apply(self, action: np.ndarray) -> None: ...

    def hold(self) -> None: ...

    def success(self) -> bool | None: ...

    def close(self) -> None: ...


class SimRobot:
    """A tabletop env (`gym.make(task_id, ...)`) driven in wall-clock time, behind the `Robot` interface.

    Uses the scene directly instead of `env.step()` (which always advances exactly one 50 ms control
    period and renders). Before `start()` time is frozen, so loading and warming up a policy costs
    the episode nothing; `sim_time` is the physics time advanced since `start()`, seconds.
    """

    def __init__(self, env, seed: int | None = None, clock: Callable[[], float] = time.perf_counter):
        self.env = env
        self.base = env.unwrapped
        self.scene = self.base.scene
        self.action_space = env.action_space
        self.gripper_dims = (3,)  # a[3]: -1 open ... +1 closed (envs.scene.TabletopScene.apply_action)
        self.clock = clock
        self.dt = float(self.scene.model.opt.timestep)  # one physics step, seconds
        self._mocap = self.scene.model.body("ee_target").mocapid[0]
        obs, _ = env.reset(seed=seed)
        self.instruction: str = obs["instruction"]
        self._last: float | None = None  # wall time physics is synced to; None until start()
        self._remainder = 0.0  # wall time not yet simulated (less than one physics step), seconds
        self.physics_steps = 0
        self._success = False

    @property
    def sim_time(self) -> float:
        return self.physics_steps * self.dt

    def start(self) -> None:
        self._last = self.clock()
        self._remainder = 0.0

    def _sync(self) -> None:
        """Advance physics by the wall time since the last call, in whole physics steps."""
        if self._last is None:
            return
        now = self.clock()
        elapsed = now - self._last + self._remainder
        self._last = now
        n = int(elapsed // self.dt)
        self._remainder = elapsed - n * self.dt
        if n > 0:
            self.scene.step_physics(n)
            self.physics_steps += n
            # success is checked at every sync, so a goal reached between two ticks still counts
            self._success = self._success or bool(self.base.task.success(self.scene, self.base.layout))

    def observe(self) -> dict:
        self._sync()
        return {"image": self.scene.render(), "proprio": self.scene.proprio(), "instruction": self.instruction}

    def apply(self, action: np.ndarray) -> None:
        self._sync()
        action = np.asarray(action, dtype=np.float32)
        if action.shape != self.action_space.shape or not np.all(np.isfinite(action)):
            raise ValueError(f"SimRobot.apply needs a finite action of shape {self.action_space.shape}, got {action}")
        self.scene.apply_action(action)

    def hold(self) -> None:
        """Safe stop: the end-effector target snaps to where the hand is now; the gripper keeps its command."""
        self._sync()
        import envs

        self.scene.data.mocap_pos[self._mocap] = np.clip(self.scene.ee_pos, envs.WORKSPACE_LOW, envs.WORKSPACE_HIGH)

    def success(self) -> bool:
        self._sync()
        return self._success

    def close(self) -> None:
        self.env.close()
