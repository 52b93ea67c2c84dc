"""The tabletop scene: MuJoCo physics of `assets/tabletop.xml` and named accessors. No task logic.

Control: an action is an end-effector displacement and a gripper command. The displacement moves the
mocap target that the hand is welded to (clamped to the workspace and kept close to the hand so the
weld never winds up); the arm's joints follow through the weld, and objects move only through contact
and friction. Physics runs at 500 Hz; one control step is 25 physics steps (20 Hz).
"""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np

from envs.rendering import CameraRenderer

ASSET = Path(__file__).parent / "assets" / "tabletop.xml"

CONTROL_HZ = 20  # policy decisions per second
MAX_STEP_M = 0.02  # end-effector displacement for an action of 1.0 on x, y or z, in metres
GRIPPER_MAX_M = 0.035  # opening of each finger at command -1 (fully open), in metres
WORKSPACE_LOW = np.array([-0.28, -0.24, 0.005])  # bounds of the end-effector target, metres
WORKSPACE_HIGH = np.array([0.28, 0.24, 0.30])
MAX_LEAD_M = 0.04  # how far the target may run ahead of the hand (anti wind-up)
HOME_M = np.array([0.0, -0.12, 0.20])  # where each episode starts the end effector

BLOCKS = ("block0", "block1", "block2")
TARGETS = ("target0", "target1")
ARM_JOINTS = ("j_yaw", "j_shoulder", "j_elbow", "j_wrist", "j_roll")
BLOCK_HALF_M = 0.02  # half the edge of a block
BIN_INNER_HALF_M = 0.05  # half the inside width of the bin
BIN_WALL_TOP_M = 0.06  # height of the bin's rim above the table
TARGET_RADIUS_M = 0.04

_STATE_SPEC = mujoco.mjtState.mjSTATE_INTEGRATION  # everything the integrator reads: exact replay
_HOME_QPOS: dict[str, np.ndarray] = {}  # arm configuration at HOME_M, settled once per process


class TabletopScene:
    """Owns the MjModel/MjData and renderers; exposes the quantities tasks and experts need."""

    def __init__(self, image_size: int = 64, wrist_camera: bool = False):
        self.model = mujoco.MjModel.from_xml_path(str(ASSET))
        self.data = mujoco.MjData(self.model)
        self.n_substeps = round(1.0 / (CONTROL_HZ * self.model.opt.timestep))
        m = self.model
        self._grip_site = m.site("grip").id
        self._mocap = m.body("ee_target").mocapid[0]
        self._target_mocap = [m.body(name).mocapid[0] for name in TARGETS]
        self._arm_qpos = np.array([m.jnt_qposadr[m.joint(j).id] for j in ARM_JOINTS])
        self._finger_qpos = np.array([m.jnt_qposadr[m.joint(j).id] for j in ("j_finger_left", "j_finger_right")])
        self._block_qpos = [m.jnt_qposadr[m.joint(b).id] for b in BLOCKS]
        self._bin_qpos = m.jnt_qposadr[m.joint("bin").id]
        self._block_body = [m.body(b).id for b in BLOCKS]
        self._finger_geoms = {m.geom("finger_left").id, m.geom("finger_right").id}
        self._block_geom = [m.geom(b).id for b in BLOCKS]
        self._state_size = mujoco.mj_stateSize(m, _STATE_SPEC)
        self.image_size = image_size
        self._front = CameraRenderer(m, "front", image_size, image_size)
        self._wrist = CameraRenderer(m, "wrist", image_size, image_size) if wrist_camera else None

    # ---- reading the scene -------------------------------------------------------------------
    def project(self, points: np.ndarray, camera: str = "front") -> np.ndarray:
        """World points (n, 3) metres -> where they appear in `camera`'s image: (n, 2) (row, column),
        scaled so -1 / +1 are the top / bottom and left / right image edges (pinhole, square image)."""
        cam = self.model.camera(camera).id
        axes = self.data.cam_xmat[cam].reshape(3, 3)  # columns: camera x (right), y (up), z (backward)
        rel = (np.asarray(points, dtype=np.float64) - self.data.cam_xpos[cam]) @ axes  # (n, 3) camera frame
        depth = -rel[:, 2]  # distance in front of the camera along its view axis
        focal = 1.0 / np.tan(np.radians(self.model.cam_fovy[cam]) / 2)  # edge of the image at +-1
        return np.stack([-rel[:, 1], rel[:, 0]], axis=1) * focal / depth[:, None]  # (n, 2)

    @property
    def ee_pos(self) -> np.ndarray:
        """Position of the grip point between the fingertips, metres (3,)."""
        return self.data.site_xpos[self._grip_site].copy()

    @property
    def gripper_opening(self) -> float:
        """Distance the fingers have opened, metres (0 closed, 0.07 fully open)."""
        return float(self.data.qpos[self._finger_qpos].sum())

    @property
    def arm_qpos(self) -> np.ndarray:
        return self.data.qpos[self._arm_qpos].copy()

    def proprio(self) -> np.ndarray:
        """float32 (9,): end-effector xyz, gripper opening, the five arm joint angles."""
        return np.concatenate([self.ee_pos, [self.gripper_opening], self.arm_qpos]).astype(np.float32)

    def block_pos(self, i: int) -> np.ndarray:
        return self.data.xpos[self._block_body[i]].copy()

    def bin_pos(self) -> np.ndarray:
        return self.data.qpos[self._bin_qpos : self._bin_qpos + 3].copy()

    def target_pos(self, i: int) -> np.ndarray:
        return self.data.mocap_pos[self._target_mocap[i]].copy()

    def fingers_touch_block(self, i: int) -> bool:
        """Whether either finger is in contact with block i."""
        geom = self._block_geom[i]
        for c in self.data.contact[: self.data.ncon]:
            pair = {c.geom1, c.geom2}
            if geom in pair and pair & self._finger_geoms:
                return True
        return False

    def grasped(self, i: int) -> bool:
        """Block i is held: both fingers touch it and it is off the table."""
        geom = self._block_geom[i]
        touching = set()
        for c in self.data.contact[: self.data.ncon]:
            if c.geom1 == geom:
                touching.add(c.geom2)
            elif c.geom2 == geom:
                touching.add(c.geom1)
        return self._finger_geoms <= touching and self.block_pos(i)[2] > BLOCK_HALF_M + 0.005

    # ---- setting up an episode ---------------------------------------------------------------
    def reset(self) -> None:
        """Arm at home with the gripper open; objects wherever the task puts them next."""
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[self._arm_qpos] = self._home_qpos()
        self.data.mocap_pos[self._mocap] = HOME_M
        self.data.ctrl[0] = GRIPPER_MAX_M
        self.data.qpos[self._finger_qpos] = GRIPPER_MAX_M
        mujoco.mj_forward(self.model, self.data)

    def _home_qpos(self) -> np.ndarray:
        # Settle the arm onto the home target once per process; every reset then starts identically.
        if "home" not in _HOME_QPOS:
            mujoco.mj_resetData(self.model, self.data)
            self.data.mocap_pos[self._mocap] = HOME_M
            for _ in range(2000):
                mujoco.mj_step(self.model, self.data)
            _HOME_QPOS["home"] = self.data.qpos[self._arm_qpos].copy()
            mujoco.mj_resetData(self.model, self.data)
        return _HOME_QPOS["home"]

    def place_block(self, i: int, xy: np.ndarray, yaw: float) -> None:
        adr = self._block_qpos[i]
        self.data.qpos[adr : adr + 3] = (xy[0], xy[1], BLOCK_HALF_M)
        self.data.qpos[adr + 3 : adr + 7] = (np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))

    def place_bin(self, xy: np.ndarray) -> None:
        self.data.qpos[self._bin_qpos : self._bin_qpos + 3] = (xy[0], xy[1], 0.0)
        self.data.qpos[self._bin_qpos + 3 : self._bin_qpos + 7] = (1.0, 0.0, 0.0, 0.0)

    def place_target(self, i: int, xy: np.ndarray) -> None:
        self.data.mocap_pos[self._target_mocap[i]] = (xy[0], xy[1], 0.0005)

    def set_colour(self, name: str, rgb) -> None:
        self.model.geom_rgba[self.model.geom(name).id, :3] = rgb

    def settle(self) -> None:
        """Let freshly placed objects come to rest (one control step of physics, arm holding)."""
        mujoco.mj_forward(self.model, self.data)
        mujoco.mj_step(self.model, self.data, nstep=self.n_substeps)

    # ---- acting ------------------------------------------------------------------------------
    def apply_action(self, action: np.ndarray) -> None:
        """Set the mocap target and gripper from an action in [-1, 1]^4; does not step physics."""
        a = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        target = self.data.mocap_pos[self._mocap] + a[:3] * MAX_STEP_M
        ee = self.ee_pos
        target = np.clip(target, ee - MAX_LEAD_M, ee + MAX_LEAD_M)
        self.data.mocap_pos[self._mocap] = np.clip(target, WORKSPACE_LOW, WORKSPACE_HIGH)
        self.data.ctrl[0] = GRIPPER_MAX_M * (1.0 - a[3]) / 2.0  # -1 open ... +1 closed

    def step_physics(self, n: int | None = None) -> None:
        mujoco.mj_step(self.model, self.data, nstep=self.n_substeps if n is None else n)

    # ---- state and pixels --------------------------------------------------------------------
    def get_state(self) -> np.ndarray:
        """float64 (S,): the full integration state (time, qpos, qvel, act, mocap, ctrl, warm start)."""
        state = np.empty(self._state_size)
        mujoco.mj_getState(self.model, self.data, state, _STATE_SPEC)
        return state

    def set_state(self, state: np.ndarray) -> None:
        state = np.asarray(state, dtype=np.float64)
        if state.shape != (self._state_size,):
            raise ValueError(f"state has shape {state.shape}; this scene's state is ({self._state_size},)")
        mujoco.mj_setState(self.model, self.data, state, _STATE_SPEC)
        mujoco.mj_forward(self.model, self.data)

    def render(self) -> np.ndarray:
        return self._front.render(self.data)

    def render_wrist(self) -> np.ndarray:
        if self._wrist is None:
            raise RuntimeError("this scene was built without the wrist camera (wrist_camera=False)")
        return self._wrist.render(self.data)

    def close(self) -> None:
        self._front.close()
        if self._wrist is not None:
            self._wrist.close()
