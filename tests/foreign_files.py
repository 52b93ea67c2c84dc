"""Small HDF5 files in the exact layouts robomimic and LIBERO write (key names, dtypes, attrs), for tests.

robomimic (robomimic/scripts/dataset_states_to_obs.py): data.attrs total, env_args (JSON with env_name and
env_kwargs.control_freq); data/demo_<i> attrs num_samples, model_file; actions (T, 7) float64, rewards,
dones, states; obs/ and next_obs/ with agentview_image (84, 84, 3) uint8, robot0_eye_in_hand_image,
robot0_eef_pos, robot0_eef_quat, robot0_gripper_qpos, object; mask/train, mask/valid (byte strings).
No instruction anywhere.

LIBERO (LIBERO/scripts/create_dataset.py): data.attrs problem_info (JSON with language_instruction),
env_args, bddl_file_name, macros_image_convention, num_demos, total; data/demo_<i> attrs num_samples,
model_file, init_state; obs/agentview_rgb and eye_in_hand_rgb (128, 128, 3) uint8, gripper_states (2),
joint_states (7), ee_states (6), ee_pos (3), ee_ori (3); actions (T, 7), states, robot_states,
rewards, dones. No mask group.

The values are smooth synthetic trajectories (a moving square in the image, actions that depend on it),
so a model has something learnable, while every key, dtype and attribute is as the real projects write it.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np


def _frames(T: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """(T, size, size, 3) uint8: a coloured square moving across a textured background."""
    img = np.full((T, size, size, 3), 40, np.uint8)
    img[..., 1] = np.linspace(30, 90, size, dtype=np.uint8)[None, None, :]
    x0, y0 = rng.integers(0, size // 2, 2)
    s = max(4, size // 8)
    for t in range(T):
        x, y = (x0 + t) % (size - s), (y0 + t // 2) % (size - s)
        img[t, y : y + s, x : x + s] = (220, 40, 40)
    return img


def write_robomimic(path: Path, demos: int = 4, T: int = 12, size: int = 84, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    env_args = {
        "env_name": "Lift",
        "type": 1,
        "env_kwargs": {"has_renderer": False, "control_freq": 20, "camera_heights": size, "camera_widths": size,
                       "camera_names": ["agentview", "robot0_eye_in_hand"], "robots": ["Panda"]},
    }  # fmt: skip
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        total = 0
        for i in range(demos):
            g = data.create_group(f"demo_{i}")
            g.attrs["num_samples"] = T
            g.attrs["model_file"] = "<mujoco model='base'></mujoco>"
            g.create_dataset("actions", data=rng.uniform(-1, 1, (T, 7)))  # float64, as robomimic stores them
            g.create_dataset("rewards", data=np.zeros(T))
            g.create_dataset("dones", data=(np.arange(T) == T - 1).astype(np.int64))
            g.create_dataset("states", data=rng.normal(size=(T, 32)))
            for obs_name in ("obs", "next_obs"):
                o = g.create_group(obs_name)
                o.create_dataset("agentview_image", data=_frames(T, size, rng))
                o.create_dataset("robot0_eye_in_hand_image", data=_frames(T, size, rng))
                o.create_dataset("robot0_eef_pos", data=rng.normal(size=(T, 3)))
                o.create_dataset("robot0_eef_quat", data=rng.normal(size=(T, 4)))
                o.create_dataset("robot0_gripper_qpos", data=rng.normal(size=(T, 2)))
                o.create_dataset("object", data=rng.normal(size=(T, 10)))
            total += T
        data.attrs["total"] = total
        data.attrs["env_args"] = json.dumps(env_args)
        names = [f"demo_{i}" for i in range(demos)]
        mask = f.create_group("mask")
        mask.create_dataset("train", data=np.array(names[:-1], dtype="S"))
        mask.create_dataset("valid", data=np.array(names[-1:], dtype="S"))
    return path


LIBERO_INSTRUCTION = "put the black bowl on the plate"


def write_libero(path: Path, demos: int = 4, T: int = 12, size: int = 128, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    problem_info = {"problem_name": "libero_tabletop_manipulation", "domain_name": "robosuite",
                    "language_instruction": LIBERO_INSTRUCTION}  # fmt: skip
    env_args = {"type": 1, "env_name": "Libero_Tabletop_Manipulation", "problem_name": "libero_tabletop_manipulation",
                "bddl_file": "put_the_black_bowl_on_the_plate.bddl",
                "env_kwargs": {"control_freq": 20, "camera_heights": size, "camera_widths": size}}  # fmt: skip
    with h5py.File(path, "w") as f:
        grp = f.create_group("data")
        grp.attrs["problem_info"] = json.dumps(problem_info)
        grp.attrs["macros_image_convention"] = "opengl"
        grp.attrs["env_args"] = json.dumps(env_args)
        grp.attrs["bddl_file_name"] = "put_the_black_bowl_on_the_plate.bddl"
        grp.attrs["bddl_file_content"] = "(define (problem LIBERO_Tabletop_Manipulation))"
        total = 0
        for i in range(demos):
            ep = grp.create_group(f"demo_{i}")
            obs = ep.create_group("obs")
            obs.create_dataset("gripper_states", data=rng.normal(size=(T, 2)))
            obs.create_dataset("joint_states", data=rng.normal(size=(T, 7)))
            obs.create_dataset("ee_states", data=rng.normal(size=(T, 6)))
            obs.create_dataset("ee_pos", data=rng.normal(size=(T, 3)))
            obs.create_dataset("ee_ori", data=rng.normal(size=(T, 3)))
            obs.create_dataset("agentview_rgb", data=_frames(T, size, rng))
            obs.create_dataset("eye_in_hand_rgb", data=_frames(T, size, rng))
            ep.create_dataset("actions", data=rng.uniform(-1, 1, (T, 7)))
            ep.create_dataset("states", data=rng.normal(size=(T, 40)))
            ep.create_dataset("robot_states", data=rng.normal(size=(T, 9)))
            ep.create_dataset("rewards", data=(np.arange(T) == T - 1).astype(np.uint8))
            ep.create_dataset("dones", data=(np.arange(T) == T - 1).astype(np.uint8))
            ep.attrs["num_samples"] = T
            ep.attrs["model_file"] = "<mujoco model='base'></mujoco>"
            ep.attrs["init_state"] = rng.normal(size=40)
            total += T
        grp.attrs["num_demos"] = demos
        grp.attrs["total"] = total
    return path
