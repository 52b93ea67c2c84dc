"""The gymnasium environment: one tabletop scene, one task, language instructions, pixels."""

from __future__ import annotations

import string

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs import scene as sc
from envs.tasks.base import Task
from envs.tasks.pick_place import PickPlace, PickPlaceExpert
from envs.tasks.push import Push, PushExpert
from envs.tasks.reach import Reach, ReachExpert
from envs.tasks.stack import Stack, StackExpert

TASK_CLASSES: dict[str, type[Task]] = {"reach": Reach, "push": Push, "pick_place": PickPlace, "stack": Stack}
EXPERT_CLASSES = {
    "reach": ReachExpert,
    "push": PushExpert,
    "pick_place": PickPlaceExpert,
    "stack": StackExpert,
}
SUCCESS_BONUS = 10.0
INSTRUCTION_CHARSET = string.ascii_lowercase + string.digits + " "


class UnknownTask(ValueError):
    """A task name that is not in the suite (the CLIs report it as one line)."""


class TabletopEnv(gym.Env):
    """A language-conditioned tabletop task for a 5-joint arm with a two-finger gripper.

    Observation (dict):
        image        uint8 (image_size, image_size, 3), the fixed front camera
        wrist_image  uint8 (image_size, image_size, 3), only with wrist_camera=True
        proprio      float32 (9,): grip point xyz (m), gripper opening (m), five arm joint angles (rad)
        instruction  str, e.g. "put the red block in the bin"
    Action: Box(-1, 1, (4,), float32) at 20 Hz. a[:3] moves the end-effector target by a * 0.02 m
        (so at most 0.4 m/s per axis); a[3] commands the gripper: -1 fully open ... +1 closed.
    Reward: the sum of the task's dense shaped terms (reported one by one in `info`), plus 10 on success.
    Episodes terminate on success and are truncated at the task's `max_episode_steps` (TimeLimit).
    info: "success" (bool), "task" (str), "instruction", the task's reward terms ("reward_*"), and
        "object": float32 (6,), the named block's xyz and its goal's xyz, and "object_px": float32 (4,),
        the same two points in the front image as (row, column) pairs, -1..1 edge to edge (privileged
        state: datasets record them for auxiliary training losses; policies never see them).
    Every reset draws colours (from a palette of 6), positions and yaw of three blocks, two target
    zones and a bin, so the instruction is needed to know which object and which task is meant.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": sc.CONTROL_HZ}

    def __init__(self, task: str, image_size: int = 64, wrist_camera: bool = False, render_mode: str | None = None):
        if task not in TASK_CLASSES:
            raise UnknownTask(f"unknown task {task!r}; choose from {sorted(TASK_CLASSES)}")
        if not 16 <= image_size <= 640:
            raise ValueError(f"image_size must be between 16 and 640 pixels, got {image_size}")
        self.task_name = task
        self.task = TASK_CLASSES[task]()
        self.image_size = image_size
        self.wrist_camera = wrist_camera
        self.render_mode = render_mode
        self.scene = sc.TabletopScene(image_size=image_size, wrist_camera=wrist_camera)
        image = spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
        obs_spaces = {
            "image": image,
            "proprio": spaces.Box(-4.0, 4.0, (9,), np.float32),  # metres and radians, all within ±4
            "instruction": spaces.Text(max_length=128, min_length=1, charset=INSTRUCTION_CHARSET),
        }
        if wrist_camera:
            obs_spaces["wrist_image"] = image
        self.observation_space = spaces.Dict(obs_spaces)
        self.action_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.layout = None
        self.instruction = ""
        self._last_frame: np.ndarray | None = None

    @property
    def control_hz(self) -> int:
        return sc.CONTROL_HZ

    @property
    def env_args(self) -> dict:
        """Everything needed to rebuild this environment (robomimic's `env_args`)."""
        return {
            "type": "vla-tabletop",
            "env_name": self.spec.id if self.spec is not None else self.task_name,
            "env_kwargs": {"image_size": self.image_size, "wrist_camera": self.wrist_camera},
            "control_hz": sc.CONTROL_HZ,
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.layout, self.instruction = self.task.sample(self.np_random)
        self.scene.reset()
        self.layout.apply(self.scene)
        self.scene.settle()
        return self._observation(), self._info(success=False)

    def step(self, action):
        action = np.asarray(action, dtype=np.float32)
        if action.shape != (4,):
            raise ValueError(f"action must have shape (4,), got {action.shape}")
        if not np.all(np.isfinite(action)):
            raise ValueError(f"action must be finite, got {action}")
        self.scene.apply_action(action)
        self.scene.step_physics()
        return self._transition()

    def advance(self, seconds: float):
        """Let the robot keep moving for `seconds` of sim time under its last command (real-time loops)."""
        self.scene.step_physics(max(0, round(seconds / self.scene.model.opt.timestep)))

    def _transition(self):
        success = self.task.success(self.scene, self.layout)
        info = self._info(success)
        reward = float(sum(v for k, v in info.items() if k.startswith("reward_"))) + SUCCESS_BONUS * success
        return self._observation(), reward, success, False, info

    def _observation(self) -> dict:
        self._last_frame = self.scene.render()
        obs = {"image": self._last_frame, "proprio": self.scene.proprio(), "instruction": self.instruction}
        if self.wrist_camera:
            obs["wrist_image"] = self.scene.render_wrist()
        return obs

    def _info(self, success: bool) -> dict:
        terms = self.task.reward_terms(self.scene, self.layout)
        info = {f"reward_{k}": v for k, v in terms.items()}
        info.update(success=bool(success), task=self.task_name, instruction=self.instruction)
        info["object"] = self.task.key_positions(self.scene, self.layout)
        info["object_px"] = self.scene.project(info["object"].reshape(-1, 3)).astype(np.float32).reshape(-1)
        return info

    # Exact replay: the full physics state; colours and roles come from the reset seed.
    def get_state(self) -> np.ndarray:
        return self.scene.get_state()

    def set_state(self, state: np.ndarray) -> None:
        self.scene.set_state(state)

    def render(self):
        if self._last_frame is None:
            self._last_frame = self.scene.render()
        return self._last_frame

    def close(self):
        self.scene.close()
