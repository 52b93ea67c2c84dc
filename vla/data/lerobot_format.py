"""LeRobot dataset format v3.0, read and written with pyarrow and PyAV (no `lerobot` import).

Layout (as `lerobot==0.4.4` writes it; episodes share files, and index into them)::

    meta/info.json                 codebase_version "v3.0", fps, features, totals, path templates
    meta/stats.json                {feature: {min, max, mean, std, count}} over the whole dataset
    meta/tasks.parquet             one row per task string (the pandas index) with its task_index
    meta/episodes/chunk-000/file-000.parquet
                                   one row per episode: episode_index, tasks, length,
                                   data/chunk_index, data/file_index, dataset_from_index, dataset_to_index,
                                   videos/<key>/{chunk_index, file_index, from_timestamp, to_timestamp},
                                   meta/episodes/{chunk_index, file_index}, stats/<feature>/<stat>
    data/chunk-000/file-000.parquet
                                   one row per frame: observation.state, action, timestamp, frame_index,
                                   episode_index, index (global), task_index, and any other feature
    videos/<key>/chunk-000/file-000.mp4
                                   every episode's frames of camera <key>, back to back; frame i of an
                                   episode is at from_timestamp + i / fps

We add a few `vla/...` columns to meta/episodes (task id, seed, split, success) and a `vla` entry to
info.json (the env_args), so a round trip HDF5 -> LeRobot -> HDF5 keeps what our layout holds;
LeRobot ignores them.

Video encoding and decoding: vla/data/lerobot_video.py; writing: vla/data/lerobot_writer.py.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from vla.data.hdf5_format import DatasetError
from vla.data.lerobot_video import decode_frames, short_message

CODEBASE_VERSION = "v3.0"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
CHUNK_SIZE = 1000  # files per chunk directory (LeRobot's DEFAULT_CHUNK_SIZE)
DATA_FILE_MB = 100  # a data parquet file is closed after about this size (LeRobot's default)
VIDEO_FILE_MB = 200  # a video file is closed after about this size (LeRobot's default)
STATE, ACTION, IMAGES = "observation.state", "action", "observation.images."
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


def is_lerobot_dir(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and ((p / "meta").is_dir() or (p / "data").is_dir())


# ------------------------------------------------------------------------------------------ reading


def _read_parquet(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DatasetError(f"{path}: missing")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{path}: cannot read parquet (truncated or corrupted file?): {short_message(e)}") from e


def column_array(table, name: str) -> np.ndarray:
    """A parquet column as numpy: scalars (N,), fixed or variable lists (N, n)."""
    import pyarrow as pa

    col = table.column(name).combine_chunks()
    if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) or pa.types.is_large_list(col.type):
        flat = np.asarray(col.flatten().to_numpy(zero_copy_only=False))
        return flat.reshape(len(col), -1) if len(col) else flat.reshape(0, 0)
    return np.asarray(col.to_numpy(zero_copy_only=False))


class LeRobotDir:
    """A LeRobot v3.0 dataset directory, read: info, tasks, per-episode rows, frames by episode.

    Opening reads the metadata and every data parquet file (small: no images), checks that they agree
    with info.json, and raises DatasetError with one line otherwise. Video frames are decoded on demand."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetError(f"{self.root}: no such directory")
        info_path = self.root / INFO_PATH
        if not info_path.is_file():
            raise DatasetError(f"{self.root}: missing {INFO_PATH}; not a LeRobot dataset directory")
        try:
            self.info = json.loads(info_path.read_text())
        except ValueError as e:
            raise DatasetError(f"{info_path}: not valid JSON ({short_message(e)})") from e
        version = str(self.info.get("codebase_version", ""))
        if not version.startswith("v3"):
            raise DatasetError(f"{info_path}: codebase_version {version!r}; only LeRobot v3.x datasets are supported")
        for k in ("fps", "features", "data_path"):
            if k not in self.info:
                raise DatasetError(f"{info_path}: missing '{k}'")
        self.fps = float(self.info["fps"])
        self.features: dict[str, dict] = self.info["features"]
        self.video_keys = [k for k, f in self.features.items() if f.get("dtype") == "video"]
        if any(f.get("dtype") == "image" for f in self.features.values()):
            raise DatasetError(f"{info_path}: image features stored as PNG in parquet are not supported (only video)")
        self.tasks = self._read_tasks()
        ep_files = sorted((self.root / "meta" / "episodes").glob("*/*.parquet"))
        if not ep_files:
            raise DatasetError(f"{self.root}: no meta/episodes/*/*.parquet")
        import pyarrow as pa

        eps = pa.concat_tables([_read_parquet(p) for p in ep_files], promote_options="default")
        self.episodes = eps.drop_columns([c for c in eps.column_names if c.startswith("stats/")]).to_pylist()
        self.episodes.sort(key=lambda r: r["episode_index"])
        self._tables: dict[tuple[int, int], Any] = {}
        for k in ("dataset_from_index", "dataset_to_index", "data/chunk_index", "data/file_index"):
            if self.episodes and k not in self.episodes[0]:
                raise DatasetError(f"{ep_files[0]}: missing column '{k}'")
        for ep in self.episodes:
            self._table(ep)  # read (and check) every data file now: errors at open, not mid-training
        if int(self.info.get("total_episodes", len(self.episodes))) != len(self.episodes):
            raise DatasetError(
                f"{info_path}: total_episodes = {self.info['total_episodes']} "
                f"but meta/episodes has {len(self.episodes)}"
            )

    def _read_tasks(self) -> list[str]:
        t = _read_parquet(self.root / TASKS_PATH)
        text_cols = [c for c in t.column_names if c != "task_index"]
        if "task_index" not in t.column_names or not text_cols:
            raise DatasetError(f"{self.root / TASKS_PATH}: expected a task_index column and the task strings")
        text = "task" if "task" in text_cols else text_cols[0]
        out = [""] * t.num_rows
        for i, s in zip(column_array(t, "task_index"), t.column(text).to_pylist(), strict=True):
            if not 0 <= int(i) < len(out):
                raise DatasetError(f"{self.root / TASKS_PATH}: task_index {int(i)} out of range")
            out[int(i)] = str(s)
        return out

    def _table(self, ep: dict):
        key = (int(ep["data/chunk_index"]), int(ep["data/file_index"]))
        if key not in self._tables:
            path = self.root / self.info["data_path"].format(chunk_index=key[0], file_index=key[1])
            t = _read_parquet(path)
            missing = [k for k, f in self.features.items() if f.get("dtype") != "video" and k not in t.column_names]
            if missing:
                raise DatasetError(f"{path}: info.json lists features {missing} that the data file lacks")
            self._tables[key] = (t, column_array(t, "index"))
        return self._tables[key]

    def episode_rows(self, ep: dict) -> tuple[Any, int, int]:
        """(data table, first row, stop row) of episode `ep` inside its data file."""
        table, index = self._table(ep)
        lo, hi = int(ep["dataset_from_index"]), int(ep["dataset_to_index"])
        start = int(np.searchsorted(index, lo))
        if hi - lo != ep.get("length", hi - lo) or start + (hi - lo) > len(index) or index[start] != lo:
            raise DatasetError(
                f"{self.root}: episode {ep['episode_index']} rows {lo}..{hi} are not in its data file "
                "(truncated data or wrong meta/episodes?)"
            )
        return table, start, start + (hi - lo)

    def column(self, ep: dict, name: str) -> np.ndarray:
        """Per-frame values of feature `name` for episode `ep`: (T,) or (T, n)."""
        if name not in self.features:
            raise DatasetError(f"{self.root}: no feature '{name}' (features: {', '.join(self.features)})")
        table, a, b = self.episode_rows(ep)
        return column_array(table.slice(a, b - a), name)

    def instruction(self, ep: dict) -> str:
        idx = self.column(ep, "task_index")
        if len(idx) and 0 <= int(idx[0]) < len(self.tasks):
            return self.tasks[int(idx[0])]
        tasks = ep.get("tasks") or [""]
        return str(tasks[0])

    def frames(self, ep: dict, key: str) -> np.ndarray:
        """(T, H, W, 3) uint8: episode `ep`'s frames of video feature `key`."""
        if key not in self.video_keys:
            have = ", ".join(self.video_keys) or "none"
            raise DatasetError(f"{self.root}: no video feature '{key}' (videos: {have})")
        ci, fi = int(ep[f"videos/{key}/chunk_index"]), int(ep[f"videos/{key}/file_index"])
        path = self.root / self.info["video_path"].format(video_key=key, chunk_index=ci, file_index=fi)
        if not path.is_file():
            raise DatasetError(f"{path}: missing")
        T = int(ep["dataset_to_index"]) - int(ep["dataset_from_index"])
        lo = float(ep[f"videos/{key}/from_timestamp"])
        hi = float(ep.get(f"videos/{key}/to_timestamp") or lo + T / self.fps)
        hi = min(hi, lo + T / self.fps)  # some writers round the episode's duration up
        return decode_frames(path, lo, hi, self.fps, T)


def lerobot_fps(env_args: dict) -> int:
    """The control rate of the env that recorded a dataset: the rate LeRobot calls fps."""
    hz = env_args.get("control_hz") or env_args.get("env_kwargs", {}).get("control_freq") or 20
    return int(math.floor(float(hz) + 0.5))
