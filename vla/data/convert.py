"""`vla-data convert SRC DST`: any layout we read (ours, robomimic, LIBERO HDF5, LeRobot dir) to a
LeRobot v3.0 directory or to our HDF5 layout (DST ending in .hdf5 / .h5).

HDF5 -> LeRobot: the main camera and every other camera (uint8 (T, H, W, 3) obs) become videos
`observation.images.<obs key>`, the proprio keys `observation.state`, the actions `action`, the
instruction the task; other per-step float obs become `observation.<key>`, rewards `next.reward`,
dones `next.done`; task id, seed, split and success go to `vla/...` episode columns and env_args to
info.json, so the way back is exact. Physics states are not exported (replay needs the HDF5).
LeRobot -> HDF5: the reverse; a directory without our columns gets seeds = episode index and a hash split.

The output appears only when complete (a temporary sibling, renamed): a failed conversion leaves
nothing that looks like a dataset, and the source is only ever read.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from vla.data.hdf5_format import DatasetError, Episode, write_dataset
from vla.data.lerobot_format import IMAGES, STATE, lerobot_fps
from vla.data.lerobot_writer import LeRobotEpisode, LeRobotWriter, new_dataset_dir
from vla.data.sources import EpisodeSource, HDF5Source, LeRobotSource, open_source

# Frames smaller than this get a note when written as lossy video: a block a few pixels wide is then one or two
# chroma samples, and the label-free recipe lost most of PickPlace and Stack to it at 64 px (docs/data.md).
SMALL_FRAME = 128

HDF5_SUFFIXES = (".hdf5", ".h5")


def _progress(total: int, desc: str, quiet: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="frame", file=sys.stderr, dynamic_ncols=True, disable=quiet)


def _splits(src: EpisodeSource) -> dict[str, str]:
    """{episode name: "train" | "valid"} as training would split `src` (masks, or the hash split)."""
    out: dict[str, str] = {}
    for split in ("train", "valid"):
        with contextlib.suppress(DatasetError):  # e.g. a file with a mask group but no mask/valid
            out.update(dict.fromkeys(src.names(split), split))
    return out


def _check_drop(drop: tuple[str, ...], present: list[str], src: EpisodeSource) -> None:
    """One line naming a `drop` key the source does not have (a typo would otherwise keep a label silently)."""
    for key in drop:
        if key not in present:
            has = ", ".join(present) or "none this conversion copies"
            raise DatasetError(f"{src.path}: --drop {key}: no such observation key (it has: {has})")


def to_lerobot(
    src: EpisodeSource, dst: Path, codec: str = "", force: bool = False, quiet: bool = False, drop: tuple = ()
) -> dict:
    names = src.names("")
    if not names:
        raise DatasetError(f"{src.path}: no episodes to convert")
    env_args = src.env_args()
    fps = lerobot_fps(env_args)
    splits = _splits(src)
    first = src.obs_keys(names[0]) if isinstance(src, HDF5Source) else {}
    keys = src.keys
    _check_drop(drop, [k for k in first if k not in (keys.image, *keys.proprio)], src)
    kept = {k: v for k, v in first.items() if k not in drop}
    cameras = [k for k, (dt, shape) in kept.items() if dt == "uint8" and len(shape) == 3 and k != keys.image]
    extra = [
        k for k, (dt, shape) in kept.items()
        if dt.startswith("float") and len(shape) == 1 and k not in keys.proprio
    ]  # fmt: skip
    frames = sum(src.meta(n)["num_samples"] for n in names)
    obs_keys = {"image": keys.image, "proprio": list(keys.proprio), "cameras": cameras, "extra": extra}
    vla_info = {"env_args": env_args, "source": str(src.path), "source_layout": src.layout, "obs_keys": obs_keys}
    t0 = time.perf_counter()
    with new_dataset_dir(dst, force=force) as tmp:
        writer = LeRobotWriter(tmp, fps, codec, robot_type=env_args.get("type") or src.layout, vla=vla_info)
        side = min(src.frames(names[0], 0, 1).shape[1:3])  # one frame: (1, H, W, 3)
        if writer.codec != "lossless" and side < SMALL_FRAME and not quiet:
            print(
                f"note: {writer.codec} video of {side}-pixel frames changes the colours of objects a few pixels wide "
                "(4:2:0 chroma); --codec lossless keeps every pixel (docs/data.md)",
                file=sys.stderr,
            )
        bar = _progress(frames, f"convert -> {dst.name}", quiet)
        for name in names:
            demo = src.read(name, images=True)
            cams = {keys.image.removeprefix(IMAGES): demo.image}
            for c in cameras:
                cams[c] = src.frames_of(name, c)
            ex: dict[str, np.ndarray] = {f"observation.{k}": np.asarray(src.obs(name, k), np.float32) for k in extra}
            T = demo.num_samples
            ex["next.reward"] = np.asarray(demo.rewards if demo.rewards is not None else np.zeros(T), np.float32)
            dones = demo.dones if demo.dones is not None else (np.arange(T) == T - 1)
            ex["next.done"] = np.asarray(dones).astype(bool)
            expert = src.demo_array(name, "expert_actions") if isinstance(src, HDF5Source) else None
            if expert is not None:  # DART labels (vla-collect --noise): data.action_key=expert_actions
                ex["expert_actions"] = np.asarray(expert, np.float32)
            meta: dict[str, Any] = {"name": name, "task": demo.task, "split": splits.get(name, "")}
            meta["seed"] = -1 if demo.seed is None else int(demo.seed)
            if demo.success is not None:
                meta["success"] = bool(demo.success)
            writer.add_episode(
                LeRobotEpisode(
                    task=demo.instruction, state=demo.proprio, action=demo.actions, cameras=cams, extra=ex, meta=meta
                )  # fmt: skip
            )
            bar.update(T)
        writer.finalize()
        bar.close()
    seconds = time.perf_counter() - t0
    return {"episodes": len(names), "frames": frames, "seconds": seconds, "frames_per_s": frames / seconds,
            "fps": fps, "codec": writer.codec, "out": str(dst)}  # fmt: skip


def to_hdf5(src: EpisodeSource, dst: Path, force: bool = False, quiet: bool = False, drop: tuple = ()) -> dict:
    names = src.names("")
    if not names:
        raise DatasetError(f"{src.path}: no episodes to convert")
    if dst.exists() and not force:
        raise DatasetError(f"{dst} already exists; pass --force to replace it")
    splits = _splits(src)
    frames = sum(src.meta(n)["num_samples"] for n in names)
    env_args = src.env_args()
    other_cams: list[tuple[str, str]] = []  # (source camera, obs key)
    extra: list[tuple[str, str]] = []  # (source feature, obs key)
    if isinstance(src, LeRobotSource):
        feats = src.dir.features
        if not env_args:
            env_args = {"type": "lerobot", "control_hz": src.dir.fps, "robot_type": src.dir.info.get("robot_type")}
        for k in src.dir.video_keys:
            if k != src.keys.image:
                other_cams.append((k, k[len(IMAGES) :]))
        for k, f in feats.items():
            if (
                k.startswith("observation.")
                and f["dtype"] not in ("video", "image")
                and k != STATE
                and k not in src.keys.proprio
            ):
                extra.append((k, k[len("observation.") :]))
    elif isinstance(src, HDF5Source):
        for k, (dt, shape) in src.obs_keys(names[0]).items():
            if k in (src.keys.image, *src.keys.proprio):
                continue
            (other_cams if dt == "uint8" and len(shape) == 3 else extra).append((k, k))
    _check_drop(drop, [key for _, key in other_cams + extra], src)
    other_cams = [(feat, key) for feat, key in other_cams if key not in drop]
    extra = [(feat, key) for feat, key in extra if key not in drop]
    t0 = time.perf_counter()
    bar = _progress(frames, f"convert -> {dst.name}", quiet)
    masks: dict[str, str] = {}

    def episodes():
        for i, name in enumerate(names):
            demo = src.read(name, images=True)
            T = demo.num_samples
            obs = {"image": demo.image, "proprio": demo.proprio}
            for cam, key in other_cams:
                obs[key] = src.frames_of(name, cam)
            for feat, key in extra:
                obs[key] = np.asarray(src.obs(name, feat), np.float32).reshape(T, -1)
            seed = demo.seed if demo.seed is not None and demo.seed >= 0 else i
            masks[f"demo_{i}"] = splits.get(name, "")
            rewards = demo.rewards if demo.rewards is not None else np.zeros(T, np.float32)
            dones = demo.dones if demo.dones is not None else (np.arange(T) == T - 1)
            states = demo.states if demo.states is not None else np.zeros((T, 0))
            expert = None
            if isinstance(src, LeRobotSource) and "expert_actions" in src.dir.features:
                expert = src.dir.column(src.dir_episode(name), "expert_actions").astype(np.float32).reshape(T, -1)
            yield Episode(task=demo.task, seed=int(seed), instruction=demo.instruction, actions=demo.actions,
                          rewards=rewards, dones=np.asarray(dones, np.uint8), states=states, obs=obs,
                          success=True if demo.success is None else bool(demo.success),
                          expert_actions=expert)  # fmt: skip
            bar.update(T)

    # `masks` fills in while write_dataset consumes the generator; it reads them after the last demo
    n = write_dataset(dst, env_args, episodes(), masks=masks)
    bar.close()
    seconds = time.perf_counter() - t0
    return {"episodes": n, "frames": frames, "seconds": seconds, "frames_per_s": frames / seconds, "out": str(dst)}


def convert(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    codec: str = "",
    force: bool = False,
    quiet: bool = False,
    drop: tuple[str, ...] = (),
    **source_options: Any,
) -> dict:
    """Convert `src` to `dst` (a LeRobot directory, or HDF5 when `dst` ends in .hdf5/.h5), leaving out the
    observation keys in `drop` (e.g. simulator-only labels: ("object", "object_px")).
    `source_options` go to `open_source` (layout, image, proprio, instruction, image_size, ...)."""
    src_path, dst = Path(src), Path(dst)
    if src_path.resolve() == dst.resolve():
        raise DatasetError(f"{dst}: source and destination are the same")
    with open_source(src_path, **source_options) as source:
        if dst.suffix.lower() in HDF5_SUFFIXES:
            return to_hdf5(source, dst, force=force, quiet=quiet, drop=drop)
        return to_lerobot(source, dst, codec=codec, force=force, quiet=quiet, drop=drop)
