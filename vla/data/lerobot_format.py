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

Video: AV1 (libsvtav1, crf 30, g 2, yuv420p) is LeRobot's default and ours when PyAV can encode it;
`h264` (libx264, yuv420p) is the common fallback; `lossless` is H.264 in RGB at qp 0 (libx264rgb),
which decodes to the exact stored pixels, at about ten times the size.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from vla.data.hdf5_format import DatasetError
from vla.files import atomic_dir

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
# name -> (PyAV encoder, pixel format, encoder options). LeRobot's own settings for av1 and h264.
CODECS: dict[str, tuple[str, str, dict[str, str]]] = {
    "av1": ("libsvtav1", "yuv420p", {"g": "2", "crf": "30", "preset": "12"}),
    "h264": ("libx264", "yuv420p", {"g": "2", "crf": "23"}),
    "lossless": ("libx264rgb", "rgb24", {"g": "2", "qp": "0"}),
}


def available_codecs() -> list[str]:
    """The CODECS names this PyAV build can encode."""
    import av

    out = []
    for name, (encoder, _, _) in CODECS.items():
        with contextlib.suppress(Exception):
            av.codec.Codec(encoder, "w")
            out.append(name)
    return out


def default_codec() -> str:
    have = available_codecs()
    for name in ("av1", "h264", "lossless"):
        if name in have:
            return name
    raise DatasetError("this PyAV build can encode none of libsvtav1, libx264, libx264rgb")


def is_lerobot_dir(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and ((p / "meta").is_dir() or (p / "data").is_dir())


def _short(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return msg[:200] + ("..." if len(msg) > 200 else "")


# ------------------------------------------------------------------------------------------ video


class VideoWriter:
    """One mp4 file: frames appended in order at `fps`, frame n at pts n (time base 1/fps)."""

    def __init__(self, path: Path, fps: int, height: int, width: int, codec: str):
        import av

        encoder, self.pix_fmt, options = CODECS[codec]
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints a banner per file otherwise; keep errors only
        if self.pix_fmt == "yuv420p" and (height % 2 or width % 2):
            raise DatasetError(f"{path}: {codec} needs even frame sizes, got {height}x{width} (try --codec lossless)")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.frames = path, 0
        self.container = av.open(str(path), "w")
        self.stream = self.container.add_stream(encoder, rate=fps, options=dict(options))
        self.stream.width, self.stream.height, self.stream.pix_fmt = width, height, self.pix_fmt
        self.stream.time_base = Fraction(1, fps)

    def write(self, frames: np.ndarray) -> None:
        import av

        for img in frames:  # (H, W, 3) uint8
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
            frame.pts = self.frames
            self.frames += 1
            self.container.mux(self.stream.encode(frame))

    def size_mb(self) -> float:
        return self.path.stat().st_size / 2**20 if self.path.exists() else 0.0

    def close(self) -> None:
        self.container.mux(self.stream.encode(None))  # flush the encoder's delayed frames
        self.container.close()


def video_info(path: Path) -> dict[str, Any]:
    """The `info` entry LeRobot keeps for a video feature, read from the file."""
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return {
            "video.height": s.height,
            "video.width": s.width,
            "video.codec": s.codec_context.codec.canonical_name,
            "video.pix_fmt": s.pix_fmt,
            "video.is_depth_map": False,
            "video.fps": int(s.base_rate),
            "video.channels": 3,
            "has_audio": False,
        }


def decode_frames(path: Path, from_ts: float, to_ts: float, fps: float, expected: int) -> np.ndarray:
    """(expected, H, W, 3) uint8: the frames of `path` with from_ts <= t < to_ts (seek, then decode)."""
    import av

    half = 0.5 / fps  # a frame belongs to the range if its time is within half a frame of a slot
    frames = []
    try:
        with av.open(str(path)) as c:
            stream = c.streams.video[0]
            stream.thread_type = "AUTO"
            if from_ts > 0:
                c.seek(max(0, int((from_ts - half) / stream.time_base)), stream=stream, backward=True)
            for frame in c.decode(stream):
                t = float(frame.pts * stream.time_base)
                if t < from_ts - half:
                    continue
                if t >= to_ts - half:
                    break
                frames.append(frame.to_ndarray(format="rgb24"))
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise DatasetError(f"{path}: cannot decode video (truncated or corrupted file?): {_short(e)}") from e
    if len(frames) != expected:
        raise DatasetError(
            f"{path}: {len(frames)} frames between t={from_ts:.3f}s and t={to_ts:.3f}s, expected {expected} "
            "(truncated or corrupted video?)"
        )
    return np.stack(frames)


# ------------------------------------------------------------------------------------------ stats


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


# ------------------------------------------------------------------------------------------ reading


def _read_parquet(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DatasetError(f"{path}: missing")
    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{path}: cannot read parquet (truncated or corrupted file?): {_short(e)}") from e


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
            raise DatasetError(f"{info_path}: not valid JSON ({_short(e)})") from e
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
