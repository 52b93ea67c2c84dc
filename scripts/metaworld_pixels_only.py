"""Derive the pixels-only MT10 dataset from a collected one, without collecting again.

    python scripts/metaworld_pixels_only.py data/metaworld.hdf5 data/metaworld-pixels.hdf5

`metaworld-pixels/<task>` is the same environment as `metaworld/<task>` with the goal left out of the
proprio (envs/metaworld.py): the same seed gives the same frames, the same expert actions and the first
four proprio values (tests/test_metaworld.py checks it). So the file `vla-collect --tasks
metaworld-pixels/mt10` would write with the same seeds and noise is this one: every demo copied as it is
(raw chunks, checksums, train/valid split), `obs/proprio` cut to hand xyz and gripper, and the task ids
renamed. Written atomically; the source is only read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import h5py
import numpy as np

from envs.metaworld import PIXELS_PREFIX, PREFIX
from vla.data.hdf5_format import (
    DatasetError,
    demo_names,
    open_dataset,
    read_env_args,
    set_str_attr,
    write_dataset,
)
from vla.files import tmp_sibling

ROBOT_DIMS = 4  # hand xyz, gripper opening: what the proprio keeps


def pixels_only_id(task: str | bytes) -> str:
    task = task.decode() if isinstance(task, bytes) else str(task)
    if not task.startswith(PREFIX):
        raise DatasetError(f"{task!r} is not a Meta-World task ({PREFIX}...)")
    return PIXELS_PREFIX + task.removeprefix(PREFIX)


def derive(source: str, out: str) -> int:
    tmp = tmp_sibling(Path(out))
    with open_dataset(source) as f:
        env_args = read_env_args(f)
        names = demo_names(f)
        split = {n: s for s in ("train", "valid") for n in demo_names(f, s)}
        masks = {f"demo_{i}": split[n] for i, n in enumerate(names) if n in split}
        env_args = {
            **env_args,
            "tasks": [pixels_only_id(t) for t in env_args.get("tasks", [])],
            "env_kwargs": {**env_args.get("env_kwargs", {}), "goal_in_proprio": False},
        }
        if "env_name" in env_args:  # a one-task dataset's
            env_args["env_name"] = pixels_only_id(env_args["env_name"])
        n = write_dataset(tmp, env_args, [f["data"][name] for name in names], masks=masks)
    try:
        with h5py.File(tmp, "r+") as g:  # fix up the copy, still under its temporary name
            for name in demo_names(g):
                demo = g["data"][name]
                kept = np.asarray(demo["obs/proprio"][:, :ROBOT_DIMS], dtype=np.float32)
                del demo["obs/proprio"]
                demo["obs"].create_dataset("proprio", data=kept, chunks=True, fletcher32=True)
                set_str_attr(demo, "task", pixels_only_id(demo.attrs["task"]))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="an MT10 dataset collected with --tasks metaworld/mt10")
    p.add_argument("out", help="the pixels-only dataset to write")
    args = p.parse_args(argv)
    try:
        n = derive(args.source, args.out)
    except DatasetError as e:  # anything else is a bug and keeps its traceback
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": args.out, "demos": n}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
