"""The demonstration dataset layout, in one place: writing episodes, reading demos, merging.

Layout (robomimic-compatible; robomimic/LIBERO files are readable through `ObsKeys`)::

    data                      attrs: total (sum of num_samples), env_args (JSON), vla_format,
                                     failed_seeds (JSON {task: [seed, ...]}, optional)
    data/demo_<i>/            attrs: num_samples, instruction, task, seed, success
        actions  (T, A) float32 in [-1, 1]; action t is applied in state t
        expert_actions (T, A) float32, with --noise only: the expert's action before its noise
                 (DART labels: the data visits perturbed states, the labels say how to recover)
        rewards  (T,)   float32
        dones    (T,)   uint8, 1 on the last step
        states   (T, S) float64, full physics state BEFORE action t (exact replay)
        obs/image    (T, H, W, 3) uint8, one chunk per frame, gzip
        obs/proprio  (T, P) float32
        obs/wrist_image (T, H, W, 3) uint8, when the env has a wrist camera
    mask/train, mask/valid    demo names (fixed-length byte strings, as robomimic writes them)

Every dataset carries a Fletcher-32 checksum per chunk, so a flipped bit in stored data is an
error on read instead of a silently wrong number. Files are only ever written whole, to a
temporary name that is fsynced and atomically renamed (`atomic_h5`): a reader sees the old file
or the new one, never half of one.

Demos are identified by `(task, seed)`: replay is `env.reset(seed=seed)` then
`set_state(states[0])` then the recorded actions. Demo names are positions (`demo_0` ...), not
identities; a merge renumbers them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from vla.files import fsync, tmp_sibling

FORMAT_VERSION = 1
# HDF5 1.10 file format (readable by any HDF5 >= 1.10, i.e. every h5py 3): checksummed object headers and
# chunk indexes, so a flipped bit in metadata is an error, not a silently moved frame.
LIBVER = ("v110", "v110")
DEMO_PREFIX = "demo_"
IMAGE_KEYS = ("image", "wrist_image")  # our camera observation keys (uint8 frames)
IMAGE_COMPRESSION = {"compression": "gzip", "compression_opts": 4}


class DatasetError(Exception):
    """A dataset problem phrased for the user (one line, names the file and, if any, demo/key)."""


# ----------------------------------------------------------------------------------------- writing


@dataclass
class Episode:
    """One demonstration as arrays; T = number of actions (= stored observations)."""

    task: str  # gymnasium id, e.g. "tabletop/Reach-v0"
    seed: int  # env.reset(seed=...) that produced the scene and instruction
    instruction: str  # the language instruction the env gave
    actions: np.ndarray  # (T, A) float32 in [-1, 1]
    rewards: np.ndarray  # (T,) float32
    dones: np.ndarray  # (T,) uint8, 1 on the last step
    states: np.ndarray  # (T, S) float64, physics state before action t
    obs: dict[str, np.ndarray]  # "image" (T, H, W, 3) uint8, "proprio" (T, P) float32, ...
    success: bool = True  # did the episode reach the task's success condition
    expert_actions: np.ndarray | None = None  # (T, A) the expert's noise-free action in state t (DART labels)

    @property
    def num_samples(self) -> int:
        return int(len(self.actions))


def set_str_attr(obj: h5py.HLObject, key: str, value: str) -> None:
    """A fixed-length UTF-8 string attribute: stored inside the (checksummed) object header, unlike a
    variable-length one, whose bytes live in the unchecksummed global heap. Reads back as bytes."""
    raw = str(value).encode("utf-8")
    obj.attrs.create(key, np.bytes_(raw), dtype=h5py.string_dtype("utf-8", max(1, len(raw))))


def write_episode(group: h5py.Group, ep: Episode) -> None:
    """Write `ep` into an (empty) demo group, with the layout's dtypes, chunking and checksums."""
    t = ep.num_samples
    if t < 1:
        raise ValueError(f"episode {ep.task} seed {ep.seed} has no steps")
    group.attrs["num_samples"] = t
    set_str_attr(group, "instruction", ep.instruction)
    set_str_attr(group, "task", ep.task)
    group.attrs["seed"] = int(ep.seed)
    group.attrs["success"] = bool(ep.success)

    def put(g: h5py.Group, name: str, arr: np.ndarray, dtype: Any, **kw: Any) -> None:
        arr = np.asarray(arr, dtype=dtype)
        if len(arr) != t:
            raise ValueError(f"{name} has {len(arr)} rows, expected {t}")
        if arr.size == 0:  # e.g. (T, 0) states of a converted dataset that has none: no chunks to checksum
            g.create_dataset(name, shape=arr.shape, dtype=arr.dtype)
            return
        g.create_dataset(name, data=arr, fletcher32=True, chunks=kw.pop("chunks", True), **kw)

    put(group, "actions", ep.actions, np.float32)
    if ep.expert_actions is not None:
        put(group, "expert_actions", ep.expert_actions, np.float32)
    put(group, "rewards", ep.rewards, np.float32)
    put(group, "dones", ep.dones, np.uint8)
    put(group, "states", ep.states, np.float64)
    obs = group.create_group("obs")
    for key, arr in ep.obs.items():
        arr = np.asarray(arr)
        if key in IMAGE_KEYS or (arr.ndim == 4 and arr.dtype == np.uint8):
            put(obs, key, arr, np.uint8, chunks=(1, *arr.shape[1:]), **IMAGE_COMPRESSION)
        else:
            put(obs, key, arr, np.float32)


def split_masks(demos: Sequence[tuple[str, str, int]], valid_fraction: float) -> tuple[list, list]:
    """Train/valid split of `(name, task, seed)` demos, stratified per task and stable under merges.

    Within each task the demos with the smallest hash of `(task, seed)` go to valid: about
    `valid_fraction` of them, at least one when the task has two or more demos (and the fraction
    is positive). A demo's split depends only on its identity and its task's demo count.
    """
    by_task: dict[str, list[tuple[str, str, int]]] = {}
    for d in demos:
        by_task.setdefault(d[1], []).append(d)
    valid: set[str] = set()
    for task, items in by_task.items():
        n = len(items)
        k = 0 if valid_fraction <= 0 or n < 2 else min(n - 1, max(1, round(n * valid_fraction)))
        ranked = sorted(items, key=lambda d: hashlib.sha1(f"{task}:{d[2]}".encode()).hexdigest())
        valid.update(d[0] for d in ranked[:k])
    names = [d[0] for d in demos]
    return [n for n in names if n not in valid], [n for n in names if n in valid]


@contextlib.contextmanager
def atomic_h5(path: str | os.PathLike) -> Iterator[h5py.File]:
    """Yield a new HDF5 file that replaces `path` only once it is complete and on disk.

    Written to a temporary sibling, closed, fsynced, renamed over `path` (atomic on POSIX), then
    the directory is fsynced. On any error (or a kill) the temporary file is all that is left.
    """
    path = Path(path)
    tmp = tmp_sibling(path)
    try:
        with h5py.File(tmp, "w", libver=LIBVER) as f:
            yield f
        fsync(tmp)
        os.replace(tmp, path)
        fsync(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_dataset(
    path: str | os.PathLike,
    env_args: dict,
    demos: Iterable[Episode | h5py.Group],
    *,
    valid_fraction: float = 0.1,
    failed_seeds: dict[str, list[int]] | None = None,
    masks: dict[str, str] | None = None,
) -> int:
    """Atomically write a complete dataset: demos (new `Episode`s or demo groups copied from
    other files, in the given order, renamed `demo_0..`), masks, `total` and `env_args`.
    `masks` ({new demo name: "train" | "valid"}) keeps a split made elsewhere instead of recomputing it.
    Returns the number of demos written."""
    with atomic_h5(path) as f:
        data = f.create_group("data")
        index: list[tuple[str, str, int]] = []
        total = 0
        for i, d in enumerate(demos):
            name = f"{DEMO_PREFIX}{i}"
            if isinstance(d, Episode):
                write_episode(data.create_group(name), d)
            else:
                d.file.copy(d, data, name=name)  # raw chunks, filters and attrs copied as they are
            g = data[name]
            index.append((name, _attr_str(g.attrs.get("task")), int(g.attrs.get("seed", -1))))
            total += int(g.attrs["num_samples"])
        data.attrs["total"] = total
        set_str_attr(data, "env_args", json.dumps(env_args, sort_keys=True))
        data.attrs["vla_format"] = FORMAT_VERSION
        if failed_seeds:
            clean = {t: sorted({int(s) for s in v}) for t, v in sorted(failed_seeds.items()) if v}
            set_str_attr(data, "failed_seeds", json.dumps(clean))
        if masks is not None:
            train = [n for n, _, _ in index if masks.get(n) == "train"]
            valid = [n for n, _, _ in index if masks.get(n) == "valid"]
        else:
            train, valid = split_masks(index, valid_fraction)
        mask = f.create_group("mask")
        for split, names in (("train", train), ("valid", valid)):
            kw = {"chunks": True, "fletcher32": True} if names else {}
            mask.create_dataset(split, data=np.array(names, dtype="S"), shape=(len(names),), **kw)
    return len(index)


def write_episode_file(path: str | os.PathLike, ep: Episode, env_args: dict) -> None:
    """One finished episode as its own complete single-demo dataset (a collection "part")."""
    write_dataset(path, env_args, [ep], valid_fraction=0.0)


PER_TASK_KEYS = ("env_name", "tasks")  # env_args keys that name tasks; everything else must agree


def dataset_env_args(per_task: dict[str, dict]) -> dict:
    """A dataset's env_args from each task's `env.unwrapped.env_args`: the shared settings plus the
    ordered task list (a demo's own `task` attr says which env to rebuild:
    `gym.make(task, **env_args["env_kwargs"])`). Raises ValueError if the tasks' settings differ."""
    shared = [{k: v for k, v in a.items() if k not in PER_TASK_KEYS} for a in per_task.values()]
    for (task, _), s in zip(per_task.items(), shared, strict=True):
        if s != shared[0]:
            raise ValueError(f"env_args of {task} ({s}) differ from {next(iter(per_task))} ({shared[0]})")
    return {**shared[0], "tasks": list(per_task)}


def env_args_compatible(a: dict, b: dict) -> bool:
    """Two datasets can be combined when their env_args agree on everything but the task list."""
    strip = lambda d: {k: v for k, v in d.items() if k not in PER_TASK_KEYS}
    return strip(a) == strip(b)


def merge_env_args(args: Sequence[dict]) -> dict:
    """Combined env_args of compatible datasets: the first one's, with the ordered union of tasks."""
    out = dict(args[0])
    tasks: list[str] = []
    for a in args:
        tasks += [t for t in a.get("tasks", [a["env_name"]] if "env_name" in a else []) if t not in tasks]
    out["tasks"] = tasks
    return out


# ----------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class ObsKeys:
    """Where a file keeps each observation, so robomimic/LIBERO-style files are usable as is.

    Ours are the defaults. A robomimic/LIBERO file, for example:
    `ObsKeys(image="agentview_image", proprio=("robot0_eef_pos", "robot0_gripper_qpos"),
    wrist_image="robot0_eye_in_hand_image")`.
    """

    image: str = "image"  # obs/<image>: (T, H, W, 3) uint8
    proprio: tuple[str, ...] = ("proprio",)  # obs/<key> arrays, flattened and concatenated
    wrist_image: str | None = None  # obs/<key>: optional second camera
    instruction: str | None = None  # used when a demo has no instruction (nor LIBERO problem_info)
    actions: str = "actions"  # <demo>/<key> the policy learns: "expert_actions" = noise-free DART labels

    def __post_init__(self) -> None:
        if isinstance(self.proprio, str):  # a single key is fine too
            object.__setattr__(self, "proprio", (self.proprio,))
        if not self.proprio:
            raise ValueError("ObsKeys.proprio needs at least one observation key")


@dataclass
class Demo:
    """One demo read back. `proprio` is the concatenation of `ObsKeys.proprio`."""

    name: str
    task: str
    seed: int | None
    instruction: str
    actions: np.ndarray  # (T, A) float32
    proprio: np.ndarray  # (T, P) float32
    image: np.ndarray | None  # (T, H, W, 3) uint8; None when read with images=False
    wrist_image: np.ndarray | None = None  # (T, H, W, 3) uint8
    rewards: np.ndarray | None = None  # (T,)
    dones: np.ndarray | None = None  # (T,)
    states: np.ndarray | None = None  # (T, S) float64
    success: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        return int(len(self.actions))


def _attr_str(v: Any, default: str = "") -> str:
    if v is None:
        return default
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray) and v.shape == ():
        return _attr_str(v.item(), default)
    return str(v)


def demo_sort_key(name: str) -> tuple[int, str]:
    """`demo_2` before `demo_10`; unknown names after, alphabetically."""
    tail = name[len(DEMO_PREFIX) :]
    return (int(tail), "") if name.startswith(DEMO_PREFIX) and tail.isdigit() else (1 << 62, name)


def open_dataset(path: str | os.PathLike) -> h5py.File:
    """Open a dataset read-only, or raise DatasetError with a one-line reason."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file")
    if path.is_dir():
        raise DatasetError(f"{path}: is a directory, not an HDF5 file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DatasetError(f"{path}: cannot open as HDF5 (truncated or corrupted file?): {_short(e)}") from e
    if "data" not in f or not isinstance(f["data"], h5py.Group):
        f.close()
        raise DatasetError(f"{path}: no 'data' group; not a demonstration dataset")
    return f


def _short(e: BaseException) -> str:
    """An h5py/HDF5 error message on one line, without the C-level error stack."""
    msg = " ".join(str(e).split())
    return msg[:200] + ("..." if len(msg) > 200 else "")


def demo_names(f: h5py.File, split: str | None = None) -> list[str]:
    """Demo names in index order; `split` ("train", "valid", or any mask/<key>) selects a mask."""
    if split is None:
        return sorted((k for k in f["data"] if k.startswith(DEMO_PREFIX)), key=demo_sort_key)
    if f"mask/{split}" not in f:
        have = sorted(f["mask"]) if "mask" in f else []
        raise DatasetError(f"{f.filename}: no mask/{split} (masks: {', '.join(have) or 'none'})")
    return [_attr_str(n) for n in f[f"mask/{split}"][()]]


def read_env_args(f: h5py.File) -> dict:
    """`data.attrs["env_args"]` parsed; `{}` when absent."""
    raw = f["data"].attrs.get("env_args")
    return {} if raw is None else json.loads(_attr_str(raw))


def read_failed_seeds(f: h5py.File) -> dict[str, list[int]]:
    raw = f["data"].attrs.get("failed_seeds")
    return {} if raw is None else {t: [int(s) for s in v] for t, v in json.loads(_attr_str(raw)).items()}


def _default_instruction(f: h5py.File, keys: ObsKeys) -> str:
    info = f["data"].attrs.get("problem_info")  # LIBERO keeps the instruction here
    if info is not None:
        with contextlib.suppress(ValueError, TypeError):
            text = json.loads(_attr_str(info)).get("language_instruction")
            if text:
                return " ".join(text) if isinstance(text, list) else str(text)
    return keys.instruction or ""


def demo_meta(f: h5py.File, name: str, keys: ObsKeys = ObsKeys()) -> dict[str, Any]:
    """A demo's attributes without reading arrays: task, seed, instruction, num_samples, success."""
    g = f["data"][name]
    a = g.attrs
    env_name = read_env_args(f).get("env_name", "") if "env_args" in f["data"].attrs else ""
    instruction = _attr_str(a.get("instruction")) or _default_instruction(f, keys)
    return {
        "name": name,
        "task": _attr_str(a.get("task"), env_name),
        "seed": int(a["seed"]) if "seed" in a else None,
        "instruction": instruction,
        "num_samples": int(a["num_samples"]) if "num_samples" in a else int(g["actions"].shape[0]),
        "success": bool(a["success"]) if "success" in a else None,
    }


def read_demo(f: h5py.File, name: str, keys: ObsKeys = ObsKeys(), images: bool = True) -> Demo:
    """Read one demo into memory, mapping observation keys through `keys`."""
    g = f["data"][name]
    meta = demo_meta(f, name, keys)
    if "obs" not in g:
        raise DatasetError(f"{f.filename}: {name} has no obs group")
    obs = g["obs"]
    if images and keys.wrist_image and keys.wrist_image not in obs:
        raise DatasetError(f"{f.filename}: {name}/obs has no '{keys.wrist_image}' (the wrist camera key)")
    if keys.actions not in g:
        raise DatasetError(f"{f.filename}: {name} has no '{keys.actions}' (collect with --noise for expert_actions)")
    for k in (*keys.proprio, *((keys.image,) if images else ())):
        if k not in obs:
            have = ", ".join(sorted(obs))
            raise DatasetError(f"{f.filename}: {name}/obs has no '{k}' (has: {have}); map keys: data.image_key, ...")
    proprio = np.concatenate(
        [np.asarray(obs[k][()], dtype=np.float32).reshape(len(g["actions"]), -1) for k in keys.proprio],
        axis=1,
    )
    opt = lambda k: np.asarray(g[k][()]) if k in g else None
    return Demo(
        name=name,
        task=meta["task"],
        seed=meta["seed"],
        instruction=meta["instruction"],
        actions=np.asarray(g[keys.actions][()], dtype=np.float32),
        proprio=proprio,
        image=np.asarray(obs[keys.image][()]) if images else None,
        wrist_image=np.asarray(obs[keys.wrist_image][()]) if images and keys.wrist_image else None,
        rewards=opt("rewards"),
        dones=opt("dones"),
        states=opt("states"),
        success=meta["success"],
    )
