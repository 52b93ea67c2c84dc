"""`vla-data merge`: combine datasets collected separately (same env_args, disjoint seeds) into one, atomically."""

from __future__ import annotations

import contextlib
import os
from collections import defaultdict
from pathlib import Path

import h5py

from vla.data.hdf5_format import (
    demo_meta,
    demo_names,
    env_args_compatible,
    merge_env_args,
    open_dataset,
    read_env_args,
    read_failed_seeds,
    write_dataset,
)
from vla.errors import UserError


def merge(out: str | os.PathLike, inputs: list[str], valid_fraction: float = 0.1, force: bool = False) -> int:
    """Combine datasets into `out` (written atomically); refuse mismatched env_args or duplicate
    (task, seed) pairs. Inputs must be valid. Returns the number of demos written."""
    from vla.data.validate import validate

    out = Path(out)
    if len(inputs) < 1:
        raise UserError("merge needs at least one input file")
    if out.exists() and not force and not any(out.resolve() == Path(i).resolve() for i in inputs):
        raise UserError(f"{out} already exists; pass --force to replace it")
    for p in inputs:
        problems = validate(p)
        if problems:
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise UserError(f"input is not valid: {problems[0]}{more}; run `vla-data validate {p}`")
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open_dataset(p)) for p in inputs]
        all_args = [read_env_args(f) for f in files]
        for p, a in zip(inputs[1:], all_args[1:], strict=True):
            if not env_args_compatible(all_args[0], a):
                diff = sorted(k for k in set(a) | set(all_args[0]) if a.get(k) != all_args[0].get(k) and k != "tasks")
                raise UserError(
                    f"env_args differ between {inputs[0]} and {p} in {diff}: "
                    + "; ".join(f"{k}: {all_args[0].get(k)!r} vs {a.get(k)!r}" for k in diff)
                )
        seen: dict[tuple[str, int], str] = {}
        demos: list[h5py.Group] = []
        failed: dict[str, set[int]] = defaultdict(set)
        for p, f in zip(inputs, files, strict=True):
            for name in demo_names(f):
                m = demo_meta(f, name)
                key = (m["task"], m["seed"])
                if key in seen:
                    raise UserError(
                        f"duplicate (task, seed) = {key}: {seen[key]} and {p}:{name}; "
                        "collect with disjoint --seed ranges"
                    )
                seen[key] = f"{p}:{name}"
                demos.append(f["data"][name])
            for task, seeds in read_failed_seeds(f).items():
                failed[task].update(seeds)
        for task, seed in seen:
            failed[task].discard(seed)
        return write_dataset(
            out,
            merge_env_args(all_args),
            demos,
            valid_fraction=valid_fraction,
            failed_seeds={t: sorted(s) for t, s in failed.items()},
        )
