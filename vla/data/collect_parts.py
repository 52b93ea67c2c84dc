"""`OUT.parts/`: what vla-collect's workers finished and the parent has not merged into OUT yet.

Every `--merge-every` seconds and at the end, the parent writes a NEW output containing the old output's demos
plus the finished parts (temporary name, fsync, atomic rename over OUT), and only then deletes those parts.
OUT is never modified in place, so `kill -9` at any moment leaves the previous complete OUT (or none) plus
finished parts. One collector per output: an exclusive flock, released by the kernel even on kill -9.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import h5py

from vla.data.collect_worker import FAILED_SUFFIX, PART_SUFFIX
from vla.data.hdf5_format import (
    DatasetError,
    demo_meta,
    demo_names,
    merge_env_args,
    open_dataset,
    read_env_args,
    read_failed_seeds,
    write_dataset,
)
from vla.errors import UserError


class CollectError(UserError):
    """A problem with the request or the files, phrased for the user."""


class PartsDir:
    """`OUT.parts/`: finished episode files and failed-seed markers not yet merged into OUT."""

    def __init__(self, out: Path):
        self.out = out
        self.path = out.with_name(out.name + ".parts")

    def parts(self) -> list[Path]:
        return sorted(self.path.glob(f"*{PART_SUFFIX}")) if self.path.is_dir() else []

    def markers(self) -> list[Path]:
        return sorted(self.path.glob(f"*{FAILED_SUFFIX}")) if self.path.is_dir() else []

    def has_leftovers(self) -> bool:
        return bool(self.parts() or self.markers())

    def remove_stale_temps(self) -> None:
        """Temporary files of a killed run (only called while holding the lock)."""
        for p in [*self.out.parent.glob(f"{self.out.name}.tmp-*"), *self.path.glob("*.tmp-*")]:
            p.unlink(missing_ok=True)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One collector per output: an exclusive flock, released by the kernel even on kill -9."""
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / ".lock", "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CollectError(f"another vla-collect is writing {self.out} (lock {self.path}/.lock)") from None
            try:
                yield
            finally:
                if not self.has_leftovers():
                    (self.path / ".lock").unlink(missing_ok=True)
                    with contextlib.suppress(OSError):
                        self.path.rmdir()


def read_part(path: Path) -> tuple[dict, dict] | None:
    """(env_args, demo meta) of a finished part, or None (with a warning) if it cannot be read."""
    try:
        with open_dataset(path) as f:
            return read_env_args(f), demo_meta(f, demo_names(f)[0])
    except (DatasetError, OSError, KeyError, IndexError, ValueError) as e:
        bad = path.with_name(path.name + ".bad")
        os.replace(path, bad)
        print(f"vla-collect: warning: unreadable part {path} moved to {bad.name} ({e})", file=sys.stderr)
        return None


def merge_parts(parts_dir: PartsDir, env_args: dict, failed: dict[str, set[int]], valid_fraction: float) -> int:
    """Write a new OUT = old OUT + finished parts (atomically), then delete those parts; `failed` (task -> seeds)
    gains the markers' seeds. Returns the number of parts merged."""
    out = parts_dir.out
    parts, markers = parts_dir.parts(), parts_dir.markers()
    if not parts and not markers:
        return 0
    merged_failed = {t: set(s) for t, s in failed.items()}
    for p in markers:
        with contextlib.suppress(OSError, ValueError, KeyError):
            m = json.loads(p.read_text())
            merged_failed.setdefault(m["task"], set()).add(int(m["seed"]))
    with contextlib.ExitStack() as stack:
        demos: dict[tuple[str, int], h5py.Group] = {}
        all_args = [env_args]
        if out.exists():
            f = stack.enter_context(open_dataset(out))
            all_args.insert(0, read_env_args(f))
            for task, seeds in read_failed_seeds(f).items():
                merged_failed.setdefault(task, set()).update(seeds)
            for name in demo_names(f):
                m = demo_meta(f, name)
                demos[(m["task"], m["seed"])] = f["data"][name]
        for p in parts:
            try:
                f = stack.enter_context(open_dataset(p))
                name = demo_names(f)[0]
                m = demo_meta(f, name)
            except (DatasetError, OSError, IndexError, KeyError) as e:
                print(f"vla-collect: warning: skipping unreadable part {p} ({e})", file=sys.stderr)
                continue
            demos.setdefault((m["task"], m["seed"]), f["data"][name])
        if not demos:
            return 0  # only failures so far: keep the markers, write no empty dataset
        merged_args = merge_env_args(all_args)
        order = merged_args["tasks"]
        ranked = sorted(demos, key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k[0], k[1]))
        write_dataset(
            out,
            merged_args,
            [demos[k] for k in ranked],
            valid_fraction=valid_fraction,
            failed_seeds={t: sorted(s) for t, s in merged_failed.items()},
        )
    failed.clear()
    failed.update(merged_failed)
    for p in [*parts, *markers]:  # only now that the new OUT is on disk
        p.unlink(missing_ok=True)
    return len(parts)
