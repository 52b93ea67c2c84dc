"""`vla.data.validate`: a real collected file passes; each kind of damage is found with its own message."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest

from vla.cli.collect import main as collect_main
from vla.data.validate import validate

# One worker builds the module-scoped datasets once (pytest-xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("validate")


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate") / "good.hdf5"
    rc = collect_main(["--tasks", "tabletop/Reach-v0", "--episodes-per-task", "3", "--out", str(out), "--quiet"])
    assert rc == 0
    return out


@pytest.fixture
def copy(good, tmp_path):
    """A fresh copy of the good file to damage."""
    dst = tmp_path / "bad.hdf5"
    shutil.copy(good, dst)
    return dst


def test_collected_file_is_valid(good):
    assert validate(good) == []


def test_truncated_file(copy):
    size = copy.stat().st_size
    with open(copy, "r+b") as fh:
        fh.truncate(size // 2)
    problems = validate(copy)
    assert len(problems) == 1
    assert str(copy) in problems[0] and "truncated" in problems[0]


def test_not_hdf5_and_empty_and_missing(tmp_path):
    junk = tmp_path / "junk.hdf5"
    junk.write_bytes(b"not an hdf5 file\n" * 10)
    assert "cannot open as HDF5" in validate(junk)[0]
    empty = tmp_path / "empty.hdf5"
    empty.write_bytes(b"")
    assert len(validate(empty)) == 1
    assert "no such file" in validate(tmp_path / "nope.hdf5")[0]


def test_bit_flip_in_image_chunk_is_caught(copy):
    with h5py.File(copy, "r") as f:
        info = f["data/demo_1/obs/image"].id.get_chunk_info(2)
    with open(copy, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x10]))
    problems = validate(copy)
    assert len(problems) == 1
    assert "demo_1/obs/image: unreadable data, the file is damaged" in problems[0]


def test_missing_key(copy):
    with h5py.File(copy, "r+") as f:
        del f["data/demo_0/actions"]
    problems = validate(copy)
    assert any("demo_0/actions: missing" in p for p in problems), problems


def test_wrong_dtype(copy):
    with h5py.File(copy, "r+") as f:
        a = f["data/demo_0/actions"][()]
        del f["data/demo_0/actions"]
        f["data/demo_0/actions"] = a.astype(np.float64)
    problems = validate(copy)
    assert problems == [f"{copy}: demo_0/actions: wrong dtype float64 (expected float32)"]


def test_nan_action(copy):
    with h5py.File(copy, "r+") as f:
        f["data/demo_2/actions"][3, 1] = np.nan
    problems = validate(copy)
    assert problems == [f"{copy}: demo_2/actions: 1 NaN/Inf values (first at step 3)"]


def test_out_of_bounds_action(copy):
    with h5py.File(copy, "r+") as f:
        f["data/demo_1/actions"][2, 0] = 1.5
    problems = validate(copy)
    assert len(problems) == 1
    assert "demo_1/actions: 1 values outside [-1, 1] (first at step 2, dim 0: 1.5)" in problems[0]


def test_wrong_image_dtype_and_length(copy):
    with h5py.File(copy, "r+") as f:
        img = f["data/demo_0/obs/image"][()]
        del f["data/demo_0/obs/image"]
        f["data/demo_0/obs/image"] = img[:-1].astype(np.float32)
    problems = validate(copy)
    assert any("demo_0/obs/image: wrong dtype float32" in p for p in problems), problems
    assert any("demo_0/obs/image: has" in p and "num_samples" in p for p in problems), problems


def test_mask_and_total_and_env_args(copy):
    with h5py.File(copy, "r+") as f:
        train = [n.decode() for n in f["mask/train"][()]]
        del f["mask/valid"]
        f["mask/valid"] = np.array([train[0], "demo_9"], dtype="S")
        f["data"].attrs["total"] = 1
        f["data"].attrs["env_args"] = "{not json"
    problems = "\n".join(validate(copy))
    assert "mask/valid: names demos that do not exist: ['demo_9']" in problems
    assert "train and valid overlap" in problems
    assert "attrs['total'] = 1 but the demos hold" in problems
    assert "attrs['env_args'] is not valid env_args JSON" in problems


def test_mask_must_cover_all_demos(copy):
    with h5py.File(copy, "r+") as f:
        del f["mask/train"]
        f["mask/train"] = np.array([], dtype="S")
    problems = validate(copy)
    assert any("demos in neither train nor valid" in p for p in problems), problems


def test_duplicate_task_seed(copy):
    with h5py.File(copy, "r+") as f:
        f["data/demo_1"].attrs["seed"] = int(f["data/demo_0"].attrs["seed"])
    problems = validate(copy)
    assert any("demo_1: duplicates (task, seed)" in p for p in problems), problems


def test_task_not_in_env_args(copy):
    with h5py.File(copy, "r+") as f:
        args = json.loads(f["data"].attrs["env_args"])
        args["tasks"] = ["tabletop/Push-v0"]
        f["data"].attrs["env_args"] = json.dumps(args)
    problems = validate(copy)
    assert len(problems) == 3 and all("is not in env_args['tasks']" in p for p in problems)
