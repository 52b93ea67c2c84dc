"""Write a LeRobot v3.0 dataset (layout: vla/data/lerobot_format.py): frames to parquet, cameras to video,
per-feature stats, episode and task metadata."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vla.data.hdf5_format import DatasetError
from vla.data.lerobot_format import (
    ACTION,
    CHUNK_SIZE,
    CODEBASE_VERSION,
    DATA_FILE_MB,
    DATA_PATH,
    DEFAULT_FEATURES,
    EPISODES_PATH,
    IMAGES,
    STATE,
    TASKS_PATH,
    VIDEO_FILE_MB,
    VIDEO_PATH,
)
from vla.data.lerobot_video import CODECS, VideoWriter, default_codec, video_info
from vla.files import atomic_dir


@dataclass
class _RunningStats:
    """min/max/mean/std/count of a feature over frames (images: per channel, in 0..1, shape (3, 1, 1))."""

    image: bool = False
    n: int = 0
    total: Any = 0.0
    total_sq: Any = 0.0
    lo: Any = None
    hi: Any = None

    def add(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64)
        x = x.reshape(-1, 3) / 255.0 if self.image else x.reshape(len(x), -1)  # images: per channel, in [0, 1]
        self.n += len(x)
        self.total = self.total + x.sum(0)
        self.total_sq = self.total_sq + (x * x).sum(0)
        self.lo = x.min(0) if self.lo is None else np.minimum(self.lo, x.min(0))
        self.hi = x.max(0) if self.hi is None else np.maximum(self.hi, x.max(0))

    def to_dict(self) -> dict[str, list]:
        mean = self.total / self.n
        std = np.sqrt(np.maximum(self.total_sq / self.n - mean * mean, 0.0))
        shape = (3, 1, 1) if self.image else (-1,)
        out = {k: np.reshape(v, shape).tolist() for k, v in (("min", self.lo), ("max", self.hi))}
        out.update({"mean": np.reshape(mean, shape).tolist(), "std": np.reshape(std, shape).tolist()})
        out["count"] = [self.n]
        return out


# ------------------------------------------------------------------------------------------ writing


@dataclass
class LeRobotEpisode:
    """One episode to write. Arrays have T rows; `cameras` maps a camera name to (T, H, W, 3) uint8."""

    task: str  # the language instruction (LeRobot's "task")
    state: np.ndarray  # (T, P) float32 -> observation.state
    action: np.ndarray  # (T, A) float32 -> action
    cameras: dict[str, np.ndarray]  # name -> frames, written to observation.images.<name>
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # feature name -> (T, ...) per-frame values
    meta: dict[str, Any] = field(default_factory=dict)  # vla/... columns of meta/episodes


@contextlib.contextmanager
def new_dataset_dir(path: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes `path` only once complete (`vla.files.atomic_dir`);
    an existing `path` is replaced only with `force`."""
    if Path(path).exists() and not force:
        raise DatasetError(f"{path} already exists; pass --force to replace it")
    with atomic_dir(path) as tmp:
        yield tmp


def _feature(arr: np.ndarray, name: str) -> dict[str, Any]:
    shape = list(arr.shape[1:]) or [1]
    dtype = "bool" if arr.dtype == np.bool_ else str(arr.dtype)
    names = [f"{name.split('.')[-1]}_{i}" for i in range(shape[0])] if len(shape) == 1 and shape[0] > 1 else None
    return {"dtype": dtype, "shape": shape, "names": names}


def _pa_column(arr: np.ndarray):
    """(T,) -> a plain column; (T, n) -> fixed_size_list<n> (what `datasets.Sequence(length=n)` stores)."""
    import pyarrow as pa

    arr = np.ascontiguousarray(arr)
    if arr.ndim == 1:
        return pa.array(arr)
    flat = arr.reshape(len(arr), -1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])


class LeRobotWriter:
    """Write episodes into a LeRobot v3.0 directory (`root` must be new and empty); call `finalize`.

    Features are fixed by the first episode; a later episode with other shapes is an error."""

    def __init__(self, root: Path, fps: int, codec: str = "", robot_type: str | None = None, vla: dict | None = None):
        self.root, self.fps, self.codec = Path(root), int(fps), codec or default_codec()
        if self.codec not in CODECS:
            raise DatasetError(f"unknown codec {self.codec!r} (choose from {', '.join(CODECS)})")
        self.robot_type, self.vla = robot_type, vla or {}
        self.features: dict[str, dict] | None = None
        self.tasks: dict[str, int] = {}
        self.episodes: list[dict[str, Any]] = []
        self.stats: dict[str, _RunningStats] = {}
        self.frames = 0
        self._data_file = (0, 0)
        self._data_writer = None
        self._data_frames_in_file = 0
        self._videos: dict[str, VideoWriter] = {}
        self._video_file: dict[str, tuple[int, int]] = {}

    # per-frame columns of one episode, in LeRobot's order
    def _columns(self, ep: LeRobotEpisode, episode_index: int, task_index: int) -> dict[str, np.ndarray]:
        T = len(ep.action)
        cols = {STATE: np.asarray(ep.state, np.float32), ACTION: np.asarray(ep.action, np.float32)}
        cols.update({k: np.asarray(v) for k, v in ep.extra.items()})
        cols.update(
            {
                "timestamp": (np.arange(T) / self.fps).astype(np.float32),
                "frame_index": np.arange(T, dtype=np.int64),
                "episode_index": np.full(T, episode_index, np.int64),
                "index": np.arange(self.frames, self.frames + T, dtype=np.int64),
                "task_index": np.full(T, task_index, np.int64),
            }
        )
        return cols

    def _init_features(self, cols: dict[str, np.ndarray], ep: LeRobotEpisode) -> None:
        self.features = {}
        for k, v in cols.items():
            self.features[k] = DEFAULT_FEATURES[k] if k in DEFAULT_FEATURES else _feature(v, k)
        for cam, frames in ep.cameras.items():
            h, w = frames.shape[1:3]
            self.features[IMAGES + cam] = {
                "dtype": "video",
                "shape": [int(h), int(w), 3],
                "names": ["height", "width", "channels"],
                "info": None,
            }

    def _check_features(self, cols: dict[str, np.ndarray], ep: LeRobotEpisode, i: int) -> None:
        have = {k: (list(v.shape[1:]) or [1]) for k, v in cols.items()}
        have.update({IMAGES + c: [*f.shape[1:3], 3] for c, f in ep.cameras.items()})
        want = {k: f["shape"] for k, f in self.features.items()}
        if have != want:
            diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
            raise DatasetError(
                f"episode {i}: features differ from the first episode's in {diff}: "
                + "; ".join(f"{k} {have.get(k)} vs {want.get(k)}" for k in diff[:4])
            )

    def add_episode(self, ep: LeRobotEpisode) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        T = len(ep.action)
        if T < 1:
            raise DatasetError(f"episode {len(self.episodes)} has no frames")
        i = len(self.episodes)
        task_index = self.tasks.setdefault(ep.task, len(self.tasks))
        cols = self._columns(ep, i, task_index)
        if self.features is None:
            self._init_features(cols, ep)
            for k, f in self.features.items():
                if k not in DEFAULT_FEATURES:
                    self.stats[k] = _RunningStats(image=f["dtype"] == "video")
        self._check_features(cols, ep, i)
        row: dict[str, Any] = {"episode_index": i, "tasks": [ep.task], "length": T}

        # ---- frames -> the current data file (a new one once the current passes DATA_FILE_MB)
        table = pa.table({k: _pa_column(v) for k, v in cols.items()})
        if self._data_writer is not None and self._data_writer_bytes() > DATA_FILE_MB * 2**20:
            self._data_writer.close()
            self._data_writer, self._data_file = None, _next_file(*self._data_file)
        if self._data_writer is None:
            path = self.root / DATA_PATH.format(chunk_index=self._data_file[0], file_index=self._data_file[1])
            path.parent.mkdir(parents=True, exist_ok=True)
            self._data_writer = pq.ParquetWriter(path, table.schema, compression="snappy")
            self._data_path = path
        self._data_writer.write_table(table)
        row["data/chunk_index"], row["data/file_index"] = self._data_file
        row["dataset_from_index"], row["dataset_to_index"] = self.frames, self.frames + T

        # ---- frames of each camera -> the current video file of that camera
        for cam, frames in ep.cameras.items():
            key = IMAGES + cam
            w = self._videos.get(key)
            if w is not None and w.size_mb() > VIDEO_FILE_MB:
                w.close()
                w, self._video_file[key] = None, _next_file(*self._video_file[key])
            if w is None:
                ci, fi = self._video_file.setdefault(key, (0, 0))
                path = self.root / VIDEO_PATH.format(video_key=key, chunk_index=ci, file_index=fi)
                h, wd = frames.shape[1:3]
                w = self._videos[key] = VideoWriter(path, self.fps, h, wd, self.codec)
            start = w.frames
            w.write(frames)
            ci, fi = self._video_file[key]
            row.update(
                {
                    f"videos/{key}/chunk_index": ci,
                    f"videos/{key}/file_index": fi,
                    f"videos/{key}/from_timestamp": start / self.fps,
                    f"videos/{key}/to_timestamp": (start + T) / self.fps,
                }
            )
        row["meta/episodes/chunk_index"], row["meta/episodes/file_index"] = 0, 0

        # ---- statistics: per episode (meta/episodes columns) and running totals (stats.json)
        per_frame = {**cols, **{IMAGES + c: f for c, f in ep.cameras.items()}}
        for k, s in self.stats.items():
            s.add(per_frame[k])
            one = _RunningStats(image=s.image)
            one.add(per_frame[k])
            row.update({f"stats/{k}/{stat}": v for stat, v in one.to_dict().items()})
        row.update({f"vla/{k}": v for k, v in ep.meta.items()})
        self.episodes.append(row)
        self.frames += T

    def _data_writer_bytes(self) -> int:
        return self._data_path.stat().st_size if self._data_path.exists() else 0

    def finalize(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.episodes:
            raise DatasetError("no episodes to write")
        if self._data_writer is not None:
            self._data_writer.close()
        for key, w in self._videos.items():
            w.close()
            self.features[key]["info"] = video_info(w.path)
        meta = self.root / "meta"
        meta.mkdir(parents=True, exist_ok=True)
        # meta/episodes: one row per episode (every row has every column: same cameras each episode)
        path = self.root / EPISODES_PATH.format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(self.episodes), path)
        write_tasks(self.root / TASKS_PATH, list(self.tasks))
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": len(self.episodes),
            "total_frames": self.frames,
            "total_tasks": len(self.tasks),
            "chunks_size": CHUNK_SIZE,
            "data_files_size_in_mb": DATA_FILE_MB,
            "video_files_size_in_mb": VIDEO_FILE_MB,
            "fps": self.fps,
            "splits": {"train": f"0:{len(self.episodes)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if self._videos else None,
            "features": self.features,
        }
        if self.vla:
            info["vla"] = self.vla
        (meta / "info.json").write_text(json.dumps(info, indent=4))
        (meta / "stats.json").write_text(json.dumps({k: s.to_dict() for k, s in self.stats.items()}, indent=4))


def _next_file(chunk: int, file: int) -> tuple[int, int]:
    return (chunk + 1, 0) if file == CHUNK_SIZE - 1 else (chunk, file + 1)


def write_tasks(path: Path, tasks: list[str]) -> None:
    """meta/tasks.parquet as pandas writes `DataFrame({"task_index": ...}, index=tasks)`: the task strings
    are the index (`__index_level_0__` plus pandas metadata), which LeRobot reads with `pd.read_parquet`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pandas_meta = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object", "metadata": None}
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],  # fmt: skip
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "__index_level_0__": pa.array(tasks)})
    table = table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
