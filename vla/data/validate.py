"""Check a demonstration dataset against the layout in `vla.data.hdf5_format`.

`validate(path)` returns a list of one-line problems (empty = valid), each naming the file and,
where it applies, the demo and key. It reads every stored byte, so a truncated file, a flipped
bit (every dataset is Fletcher-32 checksummed) or a NaN anywhere is found; it never raises.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from vla.data.hdf5_format import (
    DEMO_PREFIX,
    DatasetError,
    _attr_str,
    _short,
    demo_sort_key,
    open_dataset,
)

ACTION_LIMIT = 1.0  # actions live in the env's Box(-1, 1)
ACTION_TOL = 1e-6  # float32 rounding slack on the bounds
FRAMES_PER_READ = 256  # images are checked in slices of this many frames (bounded memory)

# key -> (allowed dtype kinds or exact dtypes, ndim); None ndim = checked separately
_SCHEMA: dict[str, tuple[tuple[Any, ...], int]] = {
    "actions": ((np.float32,), 2),
    "rewards": (("f",), 1),
    "dones": (("b", "u", "i"), 1),
    "states": ((np.float64,), 2),
    "obs/image": ((np.uint8,), 4),
    "obs/proprio": ((np.float32,), 2),
}
_OPTIONAL = {"obs/wrist_image": ((np.uint8,), 4), "expert_actions": ((np.float32,), 2)}
_FINITE = ("actions", "expert_actions", "rewards", "states", "obs/proprio")


def _dtype_ok(dtype: np.dtype, allowed: tuple[Any, ...]) -> bool:
    return any(dtype.kind == a if isinstance(a, str) else dtype == np.dtype(a) for a in allowed)


def _dtype_name(allowed: tuple[Any, ...]) -> str:
    kinds = {"f": "floating", "b": "bool", "u": "unsigned int", "i": "int"}
    return " or ".join(kinds[a] if isinstance(a, str) else np.dtype(a).name for a in allowed)


class _Checker:
    def __init__(self, path: Path):
        self.path = path
        self.problems: list[str] = []

    def add(self, where: str, msg: str) -> None:
        self.problems.append(f"{self.path}: {where + ': ' if where else ''}{msg}")

    # ---------------------------------------------------------------------------------- file level
    def run(self) -> list[str]:
        try:
            f = open_dataset(self.path)
        except DatasetError as e:
            return [str(e)]
        try:
            with f:
                self.check_file(f)
        except Exception as e:  # anything the HDF5 library throws at a damaged file: one line, no trace
            self.add("", f"unreadable ({type(e).__name__}: {_short(e)}); the file is damaged")
        return self.problems

    def check_file(self, f: h5py.File) -> None:
        data = f["data"]
        env_args = self.check_data_attrs(data)
        names = sorted((k for k in data if k.startswith(DEMO_PREFIX)), key=demo_sort_key)
        others = sorted(k for k in data if not k.startswith(DEMO_PREFIX))
        if others:
            self.add("data", f"unexpected members {others} (demo groups are named {DEMO_PREFIX}<i>)")
        if not names:
            self.add("data", "contains no demos")
        tasks = env_args.get("tasks") if isinstance(env_args, dict) else None
        shapes: dict[str, tuple] = {}  # per key (and per task for states): the shape all demos share
        seen: dict[tuple[str, int], str] = {}
        total, damaged = 0, False
        for name in names:
            try:
                n, ident = self.check_demo(data[name], name, shapes, tasks)
            except Exception as e:
                self.add(name, f"unreadable ({type(e).__name__}: {_short(e)}); the demo is damaged")
                damaged = True
                continue
            total += n
            if ident is not None:
                if ident in seen:
                    self.add(name, f"duplicates (task, seed) {ident} of {seen[ident]}")
                else:
                    seen[ident] = name
        if "total" in data.attrs and int(data.attrs["total"]) != total and names and not damaged:
            self.add("data", f"attrs['total'] = {int(data.attrs['total'])} but the demos hold {total} samples")
        self.check_masks(f, names)

    def check_data_attrs(self, data: h5py.Group) -> dict | None:
        if "total" not in data.attrs:
            self.add("data", "missing attrs['total']")
        elif not np.issubdtype(np.asarray(data.attrs["total"]).dtype, np.integer):
            self.add("data", f"attrs['total'] is not an integer: {data.attrs['total']!r}")
        env_args = None
        if "env_args" not in data.attrs:
            self.add("data", "missing attrs['env_args']")
        else:
            try:
                env_args = json.loads(_attr_str(data.attrs["env_args"]))
                if not isinstance(env_args, dict):
                    raise ValueError("not a JSON object")
                if "tasks" in env_args and not isinstance(env_args["tasks"], list):
                    raise ValueError("'tasks' is not a list")
            except ValueError as e:
                self.add("data", f"attrs['env_args'] is not valid env_args JSON ({_short(e)})")
                env_args = None
        if "failed_seeds" in data.attrs:
            try:
                fs = json.loads(_attr_str(data.attrs["failed_seeds"]))
                if not isinstance(fs, dict) or not all(isinstance(v, list) for v in fs.values()):
                    raise ValueError("expected {task: [seed, ...]}")
            except ValueError as e:
                self.add("data", f"attrs['failed_seeds'] is not valid JSON ({_short(e)})")
        return env_args

    # ---------------------------------------------------------------------------------- demo level
    def check_demo(
        self, g: h5py.Group, name: str, shapes: dict[str, tuple], tasks: list | None
    ) -> tuple[int, tuple[str, int] | None]:
        if not isinstance(g, h5py.Group):
            self.add(name, "is not a group")
            return 0, None
        a = g.attrs
        n = None
        for key in ("num_samples", "instruction", "task", "seed"):
            if key not in a:
                self.add(name, f"missing attrs['{key}']")
        if "num_samples" in a:
            v = np.asarray(a["num_samples"])
            if not np.issubdtype(v.dtype, np.integer) or v.shape != () or int(v) < 1:
                self.add(name, f"attrs['num_samples'] must be a positive integer, got {a['num_samples']!r}")
            else:
                n = int(v)
        if "seed" in a and not np.issubdtype(np.asarray(a["seed"]).dtype, np.integer):
            self.add(name, f"attrs['seed'] is not an integer: {a['seed']!r}")
        for key in ("instruction", "task"):
            if key in a and not _attr_str(a[key]).strip():
                self.add(name, f"attrs['{key}'] is empty")
        task = _attr_str(a.get("task"))
        if tasks is not None and task and task not in tasks:
            self.add(name, f"task '{task}' is not in env_args['tasks'] {tasks}")

        for key, (allowed, ndim) in {**_SCHEMA, **{k: v for k, v in _OPTIONAL.items() if k in g}}.items():
            if key not in g:
                self.add(f"{name}/{key}", "missing")
                continue
            ds = g[key]
            if not isinstance(ds, h5py.Dataset):
                self.add(f"{name}/{key}", "is not a dataset")
                continue
            if not _dtype_ok(ds.dtype, allowed):
                self.add(f"{name}/{key}", f"wrong dtype {ds.dtype} (expected {_dtype_name(allowed)})")
            if ds.ndim != ndim:
                self.add(f"{name}/{key}", f"wrong shape {ds.shape} (expected {ndim} dims)")
                continue
            if n is not None and ds.shape[0] != n:
                self.add(f"{name}/{key}", f"has {ds.shape[0]} steps but num_samples = {n}")
            if key.endswith("image") and ds.shape[-1] != 3:
                self.add(f"{name}/{key}", f"wrong shape {ds.shape} (expected (T, H, W, 3))")
            shape_key = f"{key}@{task}" if key == "states" else key
            if shape_key in shapes and ds.shape[1:] != shapes[shape_key]:
                self.add(
                    f"{name}/{key}", f"shape {ds.shape[1:]} per step differs from other demos' {shapes[shape_key]}"
                )
            shapes.setdefault(shape_key, ds.shape[1:])
            try:
                self.check_values(ds, name, key)
            except Exception as e:  # a failed checksum or decompression: the stored bytes changed
                self.add(f"{name}/{key}", f"unreadable data, the file is damaged ({type(e).__name__}: {_short(e)})")
        seed = a.get("seed")
        ident = (task, int(seed)) if task and seed is not None and np.ndim(seed) == 0 else None
        return (n or 0), ident

    def check_values(self, ds: h5py.Dataset, name: str, key: str) -> None:
        """Read every byte (checksums verified by HDF5); check finiteness and action bounds."""
        where = f"{name}/{key}"
        if ds.ndim == 4:  # images: read in slices so memory stays bounded
            for i in range(0, ds.shape[0], FRAMES_PER_READ):
                ds[i : i + FRAMES_PER_READ]
            return
        x = ds[()]
        if key not in _FINITE or x.dtype.kind != "f":
            return
        bad = ~np.isfinite(x)
        if bad.any():
            steps = np.unique(np.nonzero(bad)[0])
            self.add(where, f"{int(bad.sum())} NaN/Inf values (first at step {int(steps[0])})")
        if key in ("actions", "expert_actions"):
            over = np.abs(np.where(bad, 0.0, x)) > ACTION_LIMIT + ACTION_TOL
            if over.any():
                t, d = (int(v[0]) for v in np.nonzero(over))
                self.add(
                    where,
                    f"{int(over.sum())} values outside [-{ACTION_LIMIT:g}, {ACTION_LIMIT:g}] "
                    f"(first at step {t}, dim {d}: {float(x[t, d]):.4g})",
                )

    # ---------------------------------------------------------------------------------- masks
    def check_masks(self, f: h5py.File, names: list[str]) -> None:
        if "mask" not in f:
            self.add("mask", "missing (expected mask/train and mask/valid)")
            return
        splits: dict[str, list[str]] = {}
        for split in ("train", "valid"):
            if split not in f["mask"]:
                self.add(f"mask/{split}", "missing")
                continue
            try:
                splits[split] = [_attr_str(v) for v in np.atleast_1d(f["mask"][split][()])]
            except Exception as e:
                self.add(f"mask/{split}", f"unreadable ({_short(e)})")
                continue
            lst = splits[split]
            unknown = sorted(set(lst) - set(names), key=demo_sort_key)
            if unknown:
                self.add(f"mask/{split}", f"names demos that do not exist: {unknown[:5]}")
            if len(set(lst)) != len(lst):
                self.add(f"mask/{split}", "lists a demo more than once")
        if len(splits) == 2:
            both = sorted(set(splits["train"]) & set(splits["valid"]), key=demo_sort_key)
            if both:
                self.add("mask", f"train and valid overlap: {both[:5]}")
            missing = sorted(set(names) - set(splits["train"]) - set(splits["valid"]), key=demo_sort_key)
            if missing:
                self.add("mask", f"demos in neither train nor valid: {missing[:5]}")


def _check_source(path: Path, **source_options: Any) -> list[str]:
    """What training needs from a foreign layout (robomimic, LIBERO, LeRobot), read through `vla.data.sources`:
    every episode readable (every frame decoded), the mapped keys present, shapes that agree across
    episodes, finite actions and proprio, a non-empty train split."""
    from vla.data.sources import open_source

    problems: list[str] = []
    try:
        src = open_source(path, **source_options)
    except DatasetError as e:
        return [str(e)]
    with src:
        names = src.names("")
        if not names:
            return [f"{path}: contains no episodes"]
        shapes: dict[str, tuple] = {}
        for name in names:
            try:
                demo = src.read(name, images=True)
            except DatasetError as e:
                problems.append(str(e))
                continue
            except Exception as e:  # a damaged file: one line, no trace
                problems.append(f"{path}: {name}: unreadable ({type(e).__name__}: {_short(e)})")
                continue
            T = demo.num_samples
            for key, arr in (("actions", demo.actions), ("proprio", demo.proprio), ("image", demo.image)):
                if len(arr) != T:
                    problems.append(f"{path}: {name}/{key}: {len(arr)} steps but {T} actions")
                if shapes.setdefault(key, arr.shape[1:]) != arr.shape[1:]:
                    problems.append(f"{path}: {name}/{key}: shape {arr.shape[1:]} per step differs from {shapes[key]}")
            if demo.image.dtype != np.uint8 or demo.image.ndim != 4 or demo.image.shape[-1] != 3:
                problems.append(f"{path}: {name}/image: expected (T, H, W, 3) uint8, got {demo.image.shape}")
            for key, arr in (("actions", demo.actions), ("proprio", demo.proprio)):
                bad = ~np.isfinite(arr)
                if bad.any():
                    problems.append(f"{path}: {name}/{key}: {int(bad.sum())} NaN/Inf values")
        try:
            if not src.names("train"):
                problems.append(f"{path}: the train split is empty")
        except DatasetError as e:
            problems.append(str(e))
    return problems


def validate(path: str | os.PathLike, **source_options: Any) -> list[str]:
    """Problems with the dataset at `path`, one line each; an empty list means it is valid.

    Our own HDF5 layout gets the full schema check below; robomimic, LIBERO and LeRobot layouts
    (detected, or `layout=...`) are checked for what training reads, through the same key mapping
    as `vla-train` (`source_options` of `vla.data.sources.open_source`: layout, image, proprio, ...)."""
    try:
        from vla.data.sources import detect_layout

        layout = source_options.get("layout") or "auto"
        if layout == "auto":
            try:
                layout = detect_layout(path)
            except DatasetError:
                layout = "ours"  # let the full check below phrase the problem
        if layout != "ours":
            return _check_source(Path(path), **{**source_options, "layout": layout})
        problems = _Checker(Path(path)).run()
        if not problems and any(source_options.get(k) for k in ("image", "proprio", "actions")):
            problems = _check_source(Path(path), **source_options)  # and the keys the caller maps
        return problems
    except Exception as e:  # last resort: validate never raises
        return [f"{path}: cannot check ({type(e).__name__}: {_short(e)})"]
