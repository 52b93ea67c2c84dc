"""LeRobot videos: one mp4 per camera and file, episodes back to back, written with PyAV and decoded by
timestamp.

AV1 (libsvtav1, crf 30, g 2, yuv420p) is LeRobot's default and ours when PyAV can encode it;
`h264` (libx264, yuv420p) is the common fallback; `lossless` is H.264 in RGB at qp 0 (libx264rgb),
which decodes to the exact stored pixels, at about ten times the size.
"""

from __future__ import annotations

import contextlib
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from vla.data.hdf5_format import DatasetError

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


def short_message(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return msg[:200] + ("..." if len(msg) > 200 else "")


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
        raise DatasetError(f"{path}: cannot decode video (truncated or corrupted file?): {short_message(e)}") from e
    if len(frames) != expected:
        raise DatasetError(
            f"{path}: {len(frames)} frames between t={from_ts:.3f}s and t={to_ts:.3f}s, expected {expected} "
            "(truncated or corrupted video?)"
        )
    return np.stack(frames)
