"""Episode sources: one reader interface over every dataset layout we accept.

    ours       our HDF5 (`vla.data.hdf5_format`): obs/image, obs/proprio, instruction per demo
    robomimic  robomimic HDF5: obs/agentview_image (84x84), robot0_eef_pos + robot0_gripper_qpos, no instruction
    libero     LIBERO HDF5: obs/agentview_rgb (128x128), ee_states + gripper_states,
               instruction in data.attrs["problem_info"], usually no mask group
    lerobot    a LeRobot v3.0 directory (`vla.data.lerobot_format`): observation.images.<camera>, observation.state

`open_source(path, ...)` detects the layout and returns an `EpisodeSource`; the dataset, the tokenizer
fit, `vla-data info/validate/convert` all read through it, with one observation-key mapping
(`ObsKeys`) whose blank fields take the layout's defaults. Splits: a file's own masks when it has
them; otherwise a deterministic split by a hash of each episode's identity (`valid_fraction`);
split "" means every episode.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from vla.data.hdf5_format import (
    DatasetError,
    Demo,
    ObsKeys,
    demo_meta,
    demo_names,
    demo_sort_key,
    open_dataset,
    read_demo,
    read_env_args,
    split_masks,
)
from vla.data.lerobot_format import IMAGES, STATE, LeRobotDir, is_lerobot_dir

LAYOUTS = ("ours", "robomimic", "libero", "lerobot")
# The observation keys each layout uses for its main camera and the proprio we train on.
LAYOUT_KEYS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ours": ("image", ("proprio",)),
    "robomimic": ("agentview_image", ("robot0_eef_pos", "robot0_gripper_qpos")),
    "libero": ("agentview_rgb", ("ee_states", "gripper_states")),
    "lerobot": ("", (STATE,)),  # "" = the first observation.images.* feature
}


def detect_layout(path: str | os.PathLike) -> str:
    """Which of LAYOUTS a file or directory is (DatasetError when it is none of them)."""
    path = Path(path)
    if is_lerobot_dir(path):
        return "lerobot"
    with open_dataset(path) as f:
        data = f["data"]
        if "vla_format" in data.attrs:
            return "ours"
        if "problem_info" in data.attrs or "bddl_file_name" in data.attrs:
            return "libero"
        names = demo_names(f)
        obs = data[names[0]]["obs"] if names and "obs" in data[names[0]] else {}
        if "agentview_rgb" in obs:
            return "libero"
        if "agentview_image" in obs or any(k.startswith("robot0_") for k in obs):
            return "robomimic"
        return "ours"


def resolve_keys(
    layout: str,
    image: str = "",
    proprio: tuple[str, ...] | list[str] = (),
    instruction: str = "",
    actions: str = "actions",
    wrist_image: str = "",
) -> ObsKeys:
    """The one observation-key mapping, blanks filled with `layout`'s defaults."""
    if layout not in LAYOUT_KEYS:
        raise DatasetError(f"unknown layout {layout!r} (choose from {', '.join(LAYOUTS)})")
    default_image, default_proprio = LAYOUT_KEYS[layout]
    return ObsKeys(
        image=image or default_image,
        proprio=tuple(proprio) or default_proprio,
        wrist_image=wrist_image or None,
        instruction=instruction or None,
        actions=actions or "actions",
    )


def resize_frames(frames: np.ndarray, size: int) -> np.ndarray:
    """(T, H, W, 3) uint8 -> (T, size, size, 3) uint8, antialiased bilinear (a no-op at the same size)."""
    if not size or frames.shape[1:3] == (size, size):
        return frames
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()  # (T, 3, H, W)
    y = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()  # (T, size, size, 3)


def hash_split(idents: list[tuple[str, str, int]], split: str, valid_fraction: float) -> list[str]:
    """Deterministic train/valid split of (name, task, seed) episodes for files without masks."""
    train, valid = split_masks(idents, valid_fraction)
    return train if split == "train" else valid


class EpisodeSource:
    """Episodes of one dataset, by name; what the dataset and the CLIs read. Subclasses per format."""

    layout: str
    path: Path
    keys: ObsKeys
    image_size: int  # frames resized to image_size x image_size on read (0 = as stored)
    valid_fraction: float

    def names(self, split: str | None = "") -> list[str]:
        """Episode names of `split` ("" or None: all; "train"/"valid": masks or a hash split)."""
        raise NotImplementedError

    def meta(self, name: str) -> dict[str, Any]:
        """task, seed, instruction, num_samples, success, without reading arrays."""
        raise NotImplementedError

    def read(self, name: str, images: bool = True) -> Demo:
        raise NotImplementedError

    def frames(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(stop - start, H, W, 3) uint8 of the main camera (resized)."""
        raise NotImplementedError

    def obs(self, name: str, key: str) -> np.ndarray | None:
        """A per-step observation array by its key, or None if the episode has none."""
        raise NotImplementedError

    def env_args(self) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> EpisodeSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self):  # DataLoader workers reopen the file themselves
        state = self.__dict__.copy()
        state["_handle"] = None
        return state


class HDF5Source(EpisodeSource):
    def __init__(self, path: Path, layout: str, keys: ObsKeys, image_size: int, valid_fraction: float):
        self.path, self.layout, self.keys = Path(path), layout, keys
        self.image_size, self.valid_fraction = image_size, valid_fraction
        self._handle, self._pid = None, None
        self._f()

    def _f(self) -> h5py.File:
        if self._handle is None or self._pid != os.getpid():  # h5py handles do not survive fork
            self._handle, self._pid = open_dataset(self.path), os.getpid()
        return self._handle

    def names(self, split: str | None = "") -> list[str]:
        f = self._f()
        if not split:
            return demo_names(f)
        if "mask" in f or split not in ("train", "valid"):
            return demo_names(f, split)
        idents = []
        for i, n in enumerate(demo_names(f)):
            m = demo_meta(f, n, self.keys)
            idents.append((n, m["task"], m["seed"] if m["seed"] is not None else i))
        return hash_split(idents, split, self.valid_fraction)

    def meta(self, name: str) -> dict[str, Any]:
        return demo_meta(self._f(), name, self.keys)

    def read(self, name: str, images: bool = True) -> Demo:
        demo = read_demo(self._f(), name, self.keys, images)
        if images:
            demo.image = resize_frames(demo.image, self.image_size)
            if demo.wrist_image is not None:
                demo.wrist_image = resize_frames(demo.wrist_image, self.image_size)
        return demo

    def frames(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        obs = self._f()["data"][name]["obs"]
        if self.keys.image not in obs:
            raise DatasetError(f"{self.path}: {name}/obs has no '{self.keys.image}' (has: {', '.join(sorted(obs))})")
        return resize_frames(obs[self.keys.image][start:stop], self.image_size)

    def demo_array(self, name: str, key: str) -> np.ndarray | None:
        """<demo>/<key> (e.g. expert_actions), or None."""
        g = self._f()["data"][name]
        return np.asarray(g[key][()]) if key in g and isinstance(g[key], h5py.Dataset) else None

    def frames_of(self, name: str, camera: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(stop - start, H, W, 3) uint8 of any camera obs/<camera> (resized)."""
        return resize_frames(np.asarray(self._f()["data"][name]["obs"][camera][start:stop]), self.image_size)

    def obs(self, name: str, key: str) -> np.ndarray | None:
        obs = self._f()["data"][name]["obs"]
        return np.asarray(obs[key][()]) if key in obs else None

    def obs_keys(self, name: str) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Every obs/<key> of a demo: key -> (dtype, shape per step)."""
        obs = self._f()["data"][name]["obs"]
        return {k: (str(v.dtype), tuple(v.shape[1:])) for k, v in obs.items() if isinstance(v, h5py.Dataset)}

    def env_args(self) -> dict:
        return read_env_args(self._f())

    def close(self) -> None:
        if self._handle is not None and self._pid == os.getpid():
            self._handle.close()
        self._handle = None


class LeRobotSource(EpisodeSource):
    """A LeRobot directory as episodes `demo_<episode_index>`; frames decoded per episode, the last one cached."""

    layout = "lerobot"

    def __init__(self, path: Path, keys: ObsKeys, image_size: int, valid_fraction: float):
        self.path, self.image_size, self.valid_fraction = Path(path), image_size, valid_fraction
        self.dir = LeRobotDir(path)
        self._by_name = {f"demo_{int(ep['episode_index'])}": ep for ep in self.dir.episodes}
        self.keys = dataclasses.replace(
            keys,
            image=self._feature(keys.image, video=True),
            proprio=tuple(self._feature(k) for k in keys.proprio),
            wrist_image=self._feature(keys.wrist_image, video=True) if keys.wrist_image else None,
            actions="action" if keys.actions in ("actions", "action") else self._feature(keys.actions),
        )
        self._cache: tuple[str, np.ndarray] | None = None

    def _feature(self, key: str, video: bool = False) -> str:
        """Map a key to a feature name: as is, `observation.images.<key>` / `observation.<key>`, our
        `proprio` -> observation.state, a blank camera -> the first video feature."""
        feats = self.dir.features
        if video:
            if not key:
                if not self.dir.video_keys:
                    raise DatasetError(f"{self.path}: no video features to train on")
                return self.dir.video_keys[0]
            for cand in (key, IMAGES + key):
                if cand in self.dir.video_keys:
                    return cand
            raise DatasetError(f"{self.path}: no camera '{key}' (videos: {', '.join(self.dir.video_keys) or 'none'})")
        for cand in (key, f"observation.{key}", STATE if key == "proprio" else None):
            if cand in feats:
                return cand
        raise DatasetError(f"{self.path}: no feature '{key}' (features: {', '.join(feats)})")

    def dir_episode(self, name: str) -> dict:
        """The meta/episodes row of episode `name`."""
        return self._ep(name)

    def _ep(self, name: str) -> dict:
        if name not in self._by_name:
            raise DatasetError(f"{self.path}: no episode {name!r}")
        return self._by_name[name]

    def names(self, split: str | None = "") -> list[str]:
        names = sorted(self._by_name, key=demo_sort_key)
        if not split:
            return names
        if self.dir.episodes and "vla/split" in self.dir.episodes[0]:
            return [n for n in names if self._by_name[n]["vla/split"] == split]
        if split not in ("train", "valid"):
            raise DatasetError(f"{self.path}: no split '{split}' (a LeRobot directory has train and valid)")
        idents = [(n, self.meta(n)["task"], int(self._by_name[n]["episode_index"])) for n in names]
        return hash_split(idents, split, self.valid_fraction)

    def meta(self, name: str) -> dict[str, Any]:
        ep = self._ep(name)
        instruction = self.dir.instruction(ep) or self.keys.instruction or ""
        seed = ep.get("vla/seed")
        return {
            "name": name,
            "task": ep.get("vla/task") or instruction,
            "seed": int(seed) if seed is not None else None,
            "instruction": instruction,
            "num_samples": int(ep["dataset_to_index"]) - int(ep["dataset_from_index"]),
            "success": ep.get("vla/success"),
        }

    def read(self, name: str, images: bool = True) -> Demo:
        ep, m = self._ep(name), self.meta(name)
        T = m["num_samples"]
        col = lambda k: self.dir.column(ep, k).astype(np.float32).reshape(T, -1)
        opt = lambda k: self.dir.column(ep, k).reshape(T) if k in self.dir.features else None
        return Demo(
            name=name,
            task=m["task"],
            seed=m["seed"],
            instruction=m["instruction"],
            actions=col(self.keys.actions),
            proprio=np.concatenate([col(k) for k in self.keys.proprio], axis=1),
            image=self.frames(name) if images else None,
            wrist_image=(
                resize_frames(self.dir.frames(ep, self.keys.wrist_image), self.image_size)
                if images and self.keys.wrist_image
                else None
            ),
            rewards=opt("next.reward"),
            dones=opt("next.done"),
            success=m["success"],
        )

    def frames(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        if self._cache is None or self._cache[0] != name:  # decode the episode once, slice it many times
            self._cache = (name, resize_frames(self.dir.frames(self._ep(name), self.keys.image), self.image_size))
        return self._cache[1][start:stop]

    def frames_of(self, name: str, camera: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        frames = self.dir.frames(self._ep(name), self._feature(camera, video=True))[start:stop]  # decoded whole
        return resize_frames(frames, self.image_size)

    def obs(self, name: str, key: str) -> np.ndarray | None:
        for cand in (f"observation.{key}", key):
            if cand in self.dir.features and self.dir.features[cand].get("dtype") != "video":
                return self.dir.column(self._ep(name), cand)
        return None

    def env_args(self) -> dict:
        return dict(self.dir.info.get("vla", {}).get("env_args", {}))

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = None
        return state


def open_source(
    path: str | os.PathLike,
    keys: ObsKeys | None = None,
    *,
    layout: str = "auto",
    image: str = "",
    proprio: tuple[str, ...] | list[str] = (),
    instruction: str = "",
    actions: str = "actions",
    image_size: int = 0,
    valid_fraction: float = 0.1,
    wrist_image: str = "",
) -> EpisodeSource:
    """Open any supported dataset. Either pass a full `keys`, or key names (blank = layout default)."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file or directory")
    layout = detect_layout(path) if layout in ("", "auto") else layout
    if layout not in LAYOUTS:
        raise DatasetError(f"unknown layout {layout!r} (choose from auto, {', '.join(LAYOUTS)})")
    if keys is None:
        keys = resolve_keys(layout, image, proprio, instruction, actions, wrist_image)
    if not 0 <= valid_fraction < 1:
        raise DatasetError(f"valid_fraction must be in [0, 1), got {valid_fraction}")
    if layout == "lerobot":
        if not path.is_dir():
            raise DatasetError(f"{path}: layout 'lerobot' needs a directory")
        return LeRobotSource(path, keys, image_size, valid_fraction)
    return HDF5Source(path, layout, keys, image_size, valid_fraction)
