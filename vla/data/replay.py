"""`vla-data replay`: re-simulate a recorded demo from its states and actions, and measure the drift."""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np

from vla.data.hdf5_format import DEMO_PREFIX, demo_meta, demo_names, open_dataset, read_env_args
from vla.data.inspect import reading
from vla.errors import UserError


def _demo_name(f: h5py.File, demo: str) -> str:
    name = demo if demo.startswith(DEMO_PREFIX) else f"{DEMO_PREFIX}{demo}"
    if name not in f["data"]:
        names = demo_names(f)
        have = f"{names[0]} .. {names[-1]}" if names else "none"
        raise UserError(f"{f.filename}: no demo {demo!r} (demos: {have})")
    return name


def replay(path: str | os.PathLike, demo: str, video: str | None = None, scale: int = 4) -> dict[str, Any]:
    """Re-simulate a demo: `reset(seed)`, `set_state(states[0])`, step the recorded actions, and
    compare the physics state after action t with the recorded `states[t + 1]`.

    Returns drift per step (max |state difference|), whether the instruction and the success
    outcome are reproduced, and the largest image difference (recorded vs re-rendered). With
    `video`, writes an mp4 with the recorded (left) and replayed (right) frames side by side.
    """
    import envs

    with open_dataset(path) as f, reading(path):
        name = _demo_name(f, demo)
        env_args = read_env_args(f)
        m = demo_meta(f, name)
        g = f["data"][name]
        states = g["states"][()]
        actions = g["actions"][()]
        images = g["obs/image"][()]
    env = envs.make_env(m["task"], **env_args.get("env_kwargs", {}))
    try:
        obs, _ = env.reset(seed=m["seed"])
        instruction_ok = obs["instruction"] == m["instruction"]
        base = env.unwrapped
        base.set_state(states[0])
        frames = [obs["image"]]  # the reset state is states[0]
        drift, info = [], {}
        for t, a in enumerate(actions):
            obs, _, terminated, truncated, info = env.step(a)
            if t + 1 < len(actions):
                drift.append(float(np.max(np.abs(base.get_state() - states[t + 1]))))
                frames.append(obs["image"])
        image_diff = max(
            int(np.max(np.abs(fr.astype(int) - im.astype(int)))) for fr, im in zip(frames, images, strict=True)
        )
        if video:
            import imageio.v2 as imageio

            up = lambda x: np.repeat(np.repeat(x, scale, axis=0), scale, axis=1)
            fps = env_args.get("control_hz", 20)
            with imageio.get_writer(video, fps=fps, macro_block_size=1) as w:
                for rec, rep in zip(images, frames, strict=True):
                    w.append_data(up(np.concatenate([rec, rep], axis=1)))
    finally:
        env.close()
    return {
        "file": str(path),
        "demo": name,
        "task": m["task"],
        "seed": m["seed"],
        "steps": len(actions),
        "max_drift": max(drift, default=0.0),
        "final_drift": drift[-1] if drift else 0.0,
        "drift_per_step": drift,
        "max_image_diff": image_diff,
        "instruction_reproduced": bool(instruction_ok),
        "recorded_success": m["success"],
        "replayed_success": bool(info.get("success", False)),
        "video": video,
    }
