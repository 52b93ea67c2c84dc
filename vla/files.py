"""Writes a kill -9 cannot tear: a file or directory is built under a temporary sibling name, fsynced, then
renamed into place (atomic on POSIX), and its directory fsynced; a reader sees the old version or the new,
never half of one, and an interrupted write leaves only a `NAME.tmp-...` sibling behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def fsync(path: str | os.PathLike) -> None:
    """Flush a file's (or a directory's entries') data to disk."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_sibling(path: str | os.PathLike) -> Path:
    """A unique temporary sibling of `path`: `NAME.tmp-PID-XXXXXXXX` (`*.tmp-*` marks leftovers to clean)."""
    path = Path(path)
    return path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any]) -> None:
    """Call `write(tmp)` to create a file, fsync it, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_sibling(path)
    try:
        write(tmp)
        fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync(path.parent)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2) + "\n"))


def atomic_symlink(link: str | os.PathLike, target: str) -> None:
    """Point `link` at `target` (kept as given, so relative targets stay relative), replacing what was there."""
    link = Path(link)
    tmp = tmp_sibling(link)
    os.symlink(target, tmp)
    os.replace(tmp, link)
    fsync(link.parent)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory that replaces `path` (if any) only once it is complete and on disk.

    On any error the temporary directory is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_sibling(path)
    tmp.mkdir()
    try:
        yield tmp
        for root, _, names in os.walk(tmp):
            for name in names:
                fsync(Path(root) / name)
            fsync(root)
        old = None
        if path.exists():  # moved aside, not deleted first: a kill here leaves the old version in place
            old = tmp_sibling(path)
            os.replace(path, old)
        os.replace(tmp, path)
        fsync(path.parent)
        if old is not None:
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
