"""Meta-World MT10 with this project's observation contract: `gym.make("metaworld/reach-v3", image_size=64)`.

Meta-World (`pip install -e '.[metaworld]'`, metaworld 3.1.1) is an external benchmark nobody here wrote:
a Sawyer arm, 50 tasks, a scripted expert for each. `import envs` registers the ten MT10 tasks as
`metaworld/<task>-v3` when the package is importable (it is imported lazily, on the first `gym.make`);
without it the ids are absent and `import envs` works as before.

What changes from Meta-World's own env, and why:
- Observation: `image` from one fixed camera (see CAMERA), `proprio` = hand xyz, gripper opening (0..1)
  and the task's goal xyz: the multi-task setting's obs[0:4] and obs[36:39]. Never the object state
  obs[4:18]: a pixel policy must find the objects in the image.
- Seeds: Meta-World ignores `reset(seed=...)`; its benchmarks draw 50 goal variants ("rand_vec": object
  and goal positions) per task with `make(seed=...)` and `set_task` picks one. Here every reset seed draws
  its own variant with Meta-World's own sampler (the same box and the same rejection rules that make its
  50), from a generator seeded by the seed. So training seeds (the collector's, from 0) and evaluation
  seeds (vla-eval's, from 100000) are DISJOINT SEEDS, and their variants differ (continuous draws): the
  policy is scored on object and goal positions it never saw, a stricter test than MT10's usual one
  (evaluating on the 50 training variants). The same seed always gives the same episode.
- Episodes terminate at the first success (a scripted expert that keeps acting sometimes undoes it) and
  are truncated at MAX_EPISODE_STEPS (Meta-World's 500 is 3-10x what its experts need).
- Rendering is ours (envs.rendering: its GL context is made current before every render, so several envs
  in one process each get their own frames) with the costly parts off: no shadows, no multisampling, no
  reflections, the offscreen buffer sized to the image. Measured with `python -m envs --render-bench
  reach-v3` on the 2-core dev box (EGL, Mesa in software), which other jobs were sharing (load average
  2.8, then 6): 64x64 frames from the stock scene through gymnasium's renderer 213 / 366 ms, from this
  one 10.0 / 22.6 ms (16-21x less); 128x128: 374 vs 40 ms. The arm's meshes (67k triangles) dominate.
- `instruction`: plain sentences of our own, one picked per seed (Meta-World has no language).
- `info["object"]` / `info["object_px"]`: the task's main object and its goal (xyz, and where they appear in
  the image), privileged training targets like the tabletop tasks'; datasets record them, policies never
  see them, and nothing requires them.

`protocol="lerobot"` (the `metaworld-lerobot/<task>-v3` ids, all 50 v3 tasks; envs/metaworld_lerobot.py):
LeRobot's observation instead, the moved corner2 camera and obs[:4] only, LeRobot's task description as the
one instruction, and LeRobot's 500-step episodes. Seeds, rendering, experts and privileged targets as above.
"""

from __future__ import annotations

import importlib.util
import string
import warnings

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium import spaces

from envs import metaworld_lerobot as lerobot
from envs.rendering import CameraRenderer
from envs.tasks.base import Bursts

MT10 = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)
PREFIX = "metaworld/"
SUITE = "metaworld/mt10"  # what `vla-collect --tasks` and `python -m envs --tasks` expand to the ten ids
# The same ten tasks with the goal left out of the proprio (hand and gripper only): where the goal is, the
# policy must see (the goal marker, the door, the drawer ...). Same scenes, seeds, experts and frames.
PIXELS_PREFIX = "metaworld-pixels/"
PIXELS_SUITE = "metaworld-pixels/mt10"

# The "corner" camera: the table, the arm and every MT10 object are in view and large at 64 px (corner2,
# LeRobot's choice, shows the workspace at half the size; topview hides heights and the arm covers half of
# it). Meta-World's corner cameras are rolled by 180 degrees, so frames are rotated back (both axes flipped:
# a rotation, not a mirror, so left and right stay as they are).
CAMERA = "corner"

# Our steps are Meta-World's (frame_skip 5 x 2.5 ms = 80 Hz). The experts need 30-150 steps (peg-insert-side
# the most); the limits leave a policy about twice the expert's longest episode on the 20 seeds measured.
MAX_EPISODE_STEPS = {
    "reach-v3": 150,
    "push-v3": 200,
    "pick-place-v3": 200,
    "door-open-v3": 250,
    "drawer-open-v3": 200,
    "drawer-close-v3": 150,
    "button-press-topdown-v3": 200,
    "peg-insert-side-v3": 300,
    "window-open-v3": 200,
    "window-close-v3": 200,
}

# Plain sentences, lowercase (the tabletop charset); one is picked per reset seed. reach, push and
# pick-place share one scene: the words are what tells them apart, besides the goal marker's colour.
INSTRUCTIONS = {
    "reach-v3": ("reach the goal", "move the gripper to the red target", "put your hand on the goal point"),
    "push-v3": ("push the puck to the goal", "slide the puck onto the green target", "push the object to the goal"),
    "pick-place-v3": (
        "pick up the puck and place it at the goal",
        "lift the puck and put it on the blue target",
        "grasp the object and carry it to the goal",
    ),
    "door-open-v3": ("open the door", "pull the door open", "swing the door open by its handle"),
    "drawer-open-v3": ("open the drawer", "pull the drawer out", "slide the drawer open"),
    "drawer-close-v3": ("close the drawer", "push the drawer shut", "slide the drawer closed"),
    "button-press-topdown-v3": ("press the button", "push the button down", "press the button from above"),
    "peg-insert-side-v3": (
        "insert the peg into the hole",
        "put the peg in the box from the side",
        "push the peg into the slot",
    ),
    "window-open-v3": ("open the window", "slide the window open", "push the window to open it"),
    "window-close-v3": ("close the window", "slide the window shut", "push the window closed"),
}
INSTRUCTION_CHARSET = string.ascii_lowercase + string.digits + " "

HAND, GRIPPER, OBJECT, GOAL = slice(0, 3), 3, slice(4, 7), slice(36, 39)  # the multi-task observation's layout
REACH_TASKS = ("reach-v3", "reach-wall-v3")  # no object to move: the goal is the point of interest
PROTOCOLS = ("project", "lerobot")  # this project's MT10 observation, or LeRobot's MT50 one
PREFIXES = (PREFIX, PIXELS_PREFIX, lerobot.PREFIX)  # the id prefixes register() uses


def available() -> bool:
    """Whether the `metaworld` package is importable (the `[metaworld]` extra)."""
    return importlib.util.find_spec("metaworld") is not None


def register() -> dict[str, list[str]]:
    """Register the MT10 ids (and their pixels-only twins) with gymnasium when Meta-World is installed;
    returns {suite: ids} ({} without it)."""
    if not available():
        return {}
    suites: dict[str, list[str]] = {SUITE: [], PIXELS_SUITE: [], **lerobot.suites()}
    for suite, prefix, goal_in_proprio in ((SUITE, PREFIX, True), (PIXELS_SUITE, PIXELS_PREFIX, False)):
        for task in MT10:
            task_id = prefix + task
            if task_id not in gym.registry:
                gym.register(
                    id=task_id,
                    entry_point="envs.metaworld:MetaWorldEnv",
                    kwargs={"task": task, "goal_in_proprio": goal_in_proprio},
                    max_episode_steps=MAX_EPISODE_STEPS[task],
                )
            suites[suite].append(task_id)
    for task in lerobot.TASKS:  # LeRobot's MT50: all 50 v3 tasks, its observation and episode length
        if lerobot.PREFIX + task not in gym.registry:
            gym.register(
                id=lerobot.PREFIX + task,
                entry_point="envs.metaworld:MetaWorldEnv",
                kwargs={"task": task, "protocol": "lerobot"},
                max_episode_steps=lerobot.MAX_EPISODE_STEPS,
            )
    return suites


class FastRenderer(CameraRenderer):
    """CameraRenderer with the expensive defaults off; `model.vis` must be set before the GL context exists."""

    def __init__(self, model: mujoco.MjModel, camera: str, size: int):
        model.vis.quality.shadowsize = 0  # the stock 4096 map alone costs tens of ms in software GL
        model.vis.quality.offsamples = 0  # no multisampling
        model.vis.global_.offwidth = size  # an offscreen buffer the size of the image, not 640x480
        model.vis.global_.offheight = size
        super().__init__(model, camera, size, size)
        self._scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        self._scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0

    def render(self, data: mujoco.MjData) -> np.ndarray:
        frame = super().render(data)
        return np.ascontiguousarray(frame[::-1, ::-1])  # the corner cameras are rolled by 180 degrees


class MetaWorldEnv(gym.Env):
    """One Meta-World task from pixels, proprioception and an instruction.

    Observation (dict):
        image        uint8 (image_size, image_size, 3), the "corner" camera (see CAMERA); with
                     `protocol="lerobot"` LeRobot's moved "corner2" (envs/metaworld_lerobot.py)
        proprio      float32 (7,): hand xyz (m), gripper opening (0 closed .. 1 open), the task's goal xyz (m);
                     (4,) without the goal when `goal_in_proprio` is False (the metaworld-pixels/ ids) and
                     always with `protocol="lerobot"` (LeRobot's obs[:4])
        instruction  str, e.g. "open the drawer"; with `protocol="lerobot"` LeRobot's task description
    Action: Box(-1, 1, (4,), float32) at 80 Hz, Meta-World's: a[:3] moves the hand's mocap target by
        a * 1 cm, a[3] is the grip effort (-1 open .. +1 closed).
    Reward: Meta-World's shaped reward (0..10). Episodes terminate on success and are truncated at the
        task's `max_episode_steps` (TimeLimit).
    info: "success" (bool), "task", "instruction", Meta-World's own terms ("mw_near_object", ...), and the
        privileged "object" float32 (6,): the task's main object xyz (for reach, the goal) and the goal xyz,
        and "object_px" float32 (4,): those two points in the image as (row, column), -1..1 edge to edge.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}

    def __init__(
        self,
        task: str,
        image_size: int = 64,
        render_mode: str | None = None,
        goal_in_proprio: bool | None = None,
        protocol: str = "project",
    ):
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        lerobot_protocol = protocol == "lerobot"
        tasks = lerobot.TASKS if lerobot_protocol else MT10
        if task not in tasks:
            raise ValueError(f"unknown Meta-World task {task!r} for protocol {protocol!r}; it has {', '.join(tasks)}")
        if lerobot_protocol and goal_in_proprio:
            raise ValueError("protocol 'lerobot' observes obs[:4] only: goal_in_proprio=True contradicts it")
        if not 16 <= image_size <= 640:
            raise ValueError(f"image_size must be between 16 and 640 pixels, got {image_size}")
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS

        self.task_name = task
        self.image_size = image_size
        self.render_mode = render_mode
        self.protocol = protocol
        self.goal_in_proprio = not lerobot_protocol if goal_in_proprio is None else bool(goal_in_proprio)
        self.camera = lerobot.CAMERA if lerobot_protocol else CAMERA
        cls = ALL_V3_ENVIRONMENTS[task]
        cls = type(cls.__name__, (cls,), {"reset_mocap_welds": _reset_mocap_welds})
        mw = cls()  # no render_mode: gymnasium's renderer is never created
        # The multi-task setting: the goal is in obs[36:39] (Meta-World's MT benchmarks set this in set_task).
        mw._partially_observable = False
        mw.__dict__.pop("sawyer_observation_space", None)  # cached with [0, 0] goal bounds: recompute
        mw._set_task_called = True
        # Variants drawn at reset by Meta-World's sampler from mw.np_random (seeded per reset below).
        mw._freeze_rand_vec = False
        mw.seeded_rand_vec = True
        self._mw = mw
        self.control_hz = round(1.0 / (mw.model.opt.timestep * mw.frame_skip))
        self.metadata = {**self.metadata, "render_fps": self.control_hz}
        self._camera_id = mw.model.camera(self.camera).id
        if lerobot_protocol:  # LeRobot moves corner2 before rendering (envs/metaworld_lerobot.py, CAMERA_POS)
            mw.model.cam_pos[self._camera_id] = lerobot.CAMERA_POS
        self._renderer = FastRenderer(mw.model, self.camera, image_size)
        charset = lerobot.INSTRUCTION_CHARSET if lerobot_protocol else INSTRUCTION_CHARSET
        self.observation_space = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (image_size, image_size, 3), np.uint8),
                "proprio": spaces.Box(-2.0, 2.0, (7 if self.goal_in_proprio else 4,), np.float32),  # metres
                "instruction": spaces.Text(max_length=128, min_length=1, charset=charset),
            }
        )
        self.action_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.instruction = ""
        self.raw_obs: np.ndarray | None = None  # Meta-World's 39-d state observation: the expert's input
        self._last_frame: np.ndarray | None = None
        self._state_spec = mujoco.mjtState.mjSTATE_INTEGRATION

    @property
    def env_args(self) -> dict:
        """Everything needed to rebuild this environment (robomimic's `env_args`)."""
        return {
            "type": "vla-metaworld",
            "env_name": self.spec.id if self.spec is not None else PREFIX + self.task_name,
            # goal_in_proprio only when off, so datasets collected before the option existed still match
            "env_kwargs": {"image_size": self.image_size, **self._non_default_kwargs()},
            "control_hz": self.control_hz,
            "metaworld": {"camera": self.camera, "version": _metaworld_version()},
        }

    def _non_default_kwargs(self) -> dict:
        if self.protocol == "lerobot":
            return {"protocol": "lerobot"}
        return {} if self.goal_in_proprio else {"goal_in_proprio": False}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        variant_seed, phrase = self.np_random.integers(2**63), self.np_random.integers(1 << 30)
        self._mw.seed(int(variant_seed))  # Meta-World's sampler draws this episode's rand_vec from it
        self._mw.reset()
        mujoco.mj_forward(self._mw.model, self._mw.data)  # site positions (push-v3's goal marker) are stale until now
        self.raw_obs = self._mw._get_obs()
        templates = (
            (lerobot.TASK_DESCRIPTIONS[self.task_name],) if self.protocol == "lerobot" else INSTRUCTIONS[self.task_name]
        )
        self.instruction = templates[phrase % len(templates)]
        return self._observation(), self._info({"success": 0.0})

    def step(self, action):
        action = np.asarray(action, dtype=np.float32)
        if action.shape != (4,):
            raise ValueError(f"action must have shape (4,), got {action.shape}")
        if not np.all(np.isfinite(action)):
            raise ValueError(f"action must be finite, got {action}")
        raw, reward, _, _, mw_info = self._mw.step(np.clip(action, -1.0, 1.0))
        self.raw_obs = raw
        info = self._info(mw_info)
        return self._observation(), float(reward), info["success"], False, info

    def step_physics(self, action: np.ndarray) -> bool:
        """One step without rendering (for timing the physics alone); returns success."""
        self.raw_obs, _, _, _, mw_info = self._mw.step(np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0))
        return bool(mw_info["success"] > 0.5)

    def _observation(self) -> dict:
        self._last_frame = self._renderer.render(self._mw.data)
        return {"image": self._last_frame, "proprio": self.proprio(), "instruction": self.instruction}

    def proprio(self) -> np.ndarray:
        """float32 (7,): hand xyz, gripper opening, goal xyz ((4,) without the goal). Never the object state
        obs[4:18]."""
        r = self.raw_obs
        goal = r[GOAL] if self.goal_in_proprio else []
        return np.concatenate([r[HAND], [r[GRIPPER]], goal]).astype(np.float32)

    def key_positions(self) -> np.ndarray:
        """float32 (6,): the main object's xyz (reach: the goal) and the goal's xyz. Privileged."""
        goal = self.raw_obs[GOAL]
        obj = goal if self.task_name in REACH_TASKS else self.raw_obs[OBJECT]
        return np.concatenate([obj, goal]).astype(np.float32)

    def project(self, points: np.ndarray) -> np.ndarray:
        """World points (n, 3) -> (n, 2) (row, column) in the (rotated) image, -1 / +1 at the edges."""
        data, cam = self._mw.data, self._camera_id
        axes = data.cam_xmat[cam].reshape(3, 3)  # columns: camera x (right), y (up), z (backward)
        rel = (np.asarray(points, dtype=np.float64) - data.cam_xpos[cam]) @ axes  # (n, 3) camera frame
        focal = 1.0 / np.tan(np.radians(self._mw.model.cam_fovy[cam]) / 2)
        row_col = np.stack([-rel[:, 1], rel[:, 0]], axis=1) * focal / -rel[:, 2:3]  # (n, 2) as rendered
        return -row_col  # the frame is rotated by 180 degrees

    def _info(self, mw_info: dict) -> dict:
        info = {f"mw_{k}": float(v) for k, v in mw_info.items() if k != "success" and np.isscalar(v)}
        info.update(success=bool(mw_info.get("success", 0.0) > 0.5), task=self.task_name, instruction=self.instruction)
        info["object"] = self.key_positions()
        info["object_px"] = self.project(info["object"].reshape(2, 3)).astype(np.float32).reshape(-1)
        return info

    # Exact replay: MuJoCo's integration state (qpos, qvel, mocap targets, ...); the variant (object and
    # goal placement, partly model fields) comes from the reset seed, as for the tabletop tasks.
    def get_state(self) -> np.ndarray:
        m, d = self._mw.model, self._mw.data
        state = np.empty(mujoco.mj_stateSize(m, self._state_spec))
        mujoco.mj_getState(m, d, state, self._state_spec)
        return state

    def set_state(self, state: np.ndarray) -> None:
        m, d = self._mw.model, self._mw.data
        mujoco.mj_setState(m, d, np.asarray(state, dtype=np.float64), self._state_spec)
        mujoco.mj_forward(m, d)

    def expert(self, noise: float = 0.0, seed: int | None = None, perturb: float = 0.0) -> MetaWorldExpert:
        return MetaWorldExpert(self, noise=noise, seed=seed, perturb=perturb)

    def render(self):
        if self._last_frame is None:
            self._last_frame = self._renderer.render(self._mw.data)
        return self._last_frame

    def close(self):
        self._renderer.close()
        self._mw.close()


class MetaWorldExpert:
    """Meta-World's scripted policy for the task (metaworld.policies.ENV_POLICY_MAP), with our interface.

    It reads the simulator's 39-d state observation (privileged, like every scripted expert), not the
    pixels; `act(obs)` returns an action in [-1, 1] (Meta-World's gains exceed 1; its env clips, so do we).
    With `noise` > 0, Gaussian noise of that std is added to a[:3], with `perturb` > 0 bursts replace it
    now and then (envs/tasks/base.py, `Bursts`); `clean_action` keeps the label before either (DART).
    """

    def __init__(self, env: MetaWorldEnv, noise: float = 0.0, seed: int | None = None, perturb: float = 0.0):
        from metaworld.policies import ENV_POLICY_MAP

        # Its gains exceed the action range on purpose and it warns on every step that they do.
        warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high", category=UserWarning)
        self.env = env
        self.policy = ENV_POLICY_MAP[env.task_name]()
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.bursts = Bursts(perturb, self.rng)
        self.clean_action = np.zeros(4, dtype=np.float32)

    def reset(self) -> None:
        """Meta-World's experts are stateless functions of the observation: only a running burst ends."""
        self.bursts.reset()

    def act(self, obs=None) -> np.ndarray:
        if self.env.raw_obs is None:
            raise RuntimeError("reset the environment before asking the expert for an action")
        action = np.clip(np.asarray(self.policy.get_action(self.env.raw_obs), dtype=np.float32), -1.0, 1.0)
        self.clean_action = action.copy()
        if self.noise > 0:
            action[:3] += self.rng.normal(0.0, self.noise, size=3).astype(np.float32)
        action[:3] = self.bursts(action[:3])
        return np.clip(action, -1.0, 1.0)


def _reset_mocap_welds(self) -> None:
    """Meta-World's own, for any MuJoCo 3: it writes 11 numbers per weld row, and newer MuJoCo rows are
    longer (metaworld 3.1.1 pins mujoco 3.3.0; the rest of this project runs on the current 3.x)."""
    weld = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 5.0]  # anchor, relative pose, torque scale
    if self.model.nmocap > 0:
        for i in range(self.model.neq):
            if self.model.eq_type[i] == mujoco.mjtEq.mjEQ_WELD:
                self.model.eq_data[i, : len(weld)] = weld


def _metaworld_version() -> str:
    from importlib.metadata import version

    return version("metaworld")


def bench_render(task: str = "reach-v3", size: int = 64, frames: int = 100) -> dict[str, float]:
    """ms per frame of the same scene: Meta-World's stock rendering (gymnasium's renderer, the model's
    shadows, multisampling, reflections and 640x480 buffer) vs. this adapter's FastRenderer."""
    import time

    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    def per_frame(render) -> float:
        render()  # the first frame builds the GL context and uploads the meshes
        start = time.perf_counter()
        for _ in range(frames):
            render()
        return (time.perf_counter() - start) / frames * 1e3

    stock = ALL_V3_ENVIRONMENTS[task](render_mode="rgb_array", camera_name=CAMERA, width=size, height=size)
    stock._set_task_called, stock._freeze_rand_vec = True, False
    stock.reset()
    stock_ms = per_frame(stock.render)
    stock.close()
    env = MetaWorldEnv(task, image_size=size)
    env.reset(seed=0)
    fast_ms = per_frame(lambda: env._renderer.render(env._mw.data))
    env.close()
    return {"task": task, "image_size": size, "stock_ms": stock_ms, "fast_ms": fast_ms}
