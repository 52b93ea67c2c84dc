"""`vla-data info | validate | merge | replay`, their --help and their one-line errors."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest

from vla.cli.collect import main as collect_main
from vla.cli.data import main

# One worker builds the module-scoped datasets once (pytest-xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("data_cli")

REACH, PUSH = "tabletop/Reach-v0", "tabletop/Push-v0"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Two small datasets with disjoint seed ranges (as two machines would collect them)."""
    d = tmp_path_factory.mktemp("data_cli")
    a, b = d / "a.hdf5", d / "b.hdf5"
    assert collect_main(["--tasks", f"{REACH},{PUSH}", "--episodes-per-task", "2", "--out", str(a), "--quiet"]) == 0
    assert (
        collect_main(["--tasks", REACH, "--episodes-per-task", "2", "--seed", "100", "--out", str(b), "--quiet"]) == 0
    )
    return a, b


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("cmd", [[], ["info"], ["validate"], ["merge"], ["replay"]])
def test_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([*cmd, "--help"])
    assert e.value.code == 0
    assert "usage: vla-data" in capsys.readouterr().out


def test_info_text_and_json(files, capsys):
    a, _ = files
    rc, out, _ = run(capsys, "info", a)
    assert rc == 0
    assert "4 demos" in out and REACH in out and PUSH in out and "action statistics" in out
    rc, out, _ = run(capsys, "info", a, "--json")
    s = json.loads(out)
    assert s["demos"] == 4 and s["tasks"][REACH]["demos"] == 2 and s["tasks"][PUSH]["demos"] == 2
    assert s["steps"] == sum(t["steps"] for t in s["tasks"].values())
    assert len(s["action_stats"]["mean"]) == 4 and len(s["instructions"][REACH]) >= 1
    assert s["shapes"]["obs/image"] == [64, 64, 3]


def test_validate_exit_codes_and_lines(files, tmp_path, capsys):
    a, _ = files
    rc, out, _ = run(capsys, "validate", a)
    assert rc == 0 and "valid (4 demos" in out
    bad = tmp_path / "bad.hdf5"
    shutil.copy(a, bad)
    with h5py.File(bad, "r+") as f:
        f["data/demo_1/actions"][0, 0] = np.inf
        f["data/demo_3/actions"][1, 2] = -3.0
    rc, out, err = run(capsys, "validate", bad)
    assert rc == 4  # validate found problems: a check that did not pass
    lines = out.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{bad}: demo_1/actions: 1 NaN/Inf")
    assert lines[1].startswith(f"{bad}: demo_3/actions: 1 values outside [-1, 1]")
    assert "INVALID (2 problems)" in err


def test_merge(files, tmp_path, capsys):
    a, b = files
    out = tmp_path / "m.hdf5"
    rc, stdout, _ = run(capsys, "merge", out, a, b)
    assert rc == 0 and "6 demos" in stdout
    rc, _, _ = run(capsys, "validate", out)
    assert rc == 0
    with h5py.File(out, "r") as f:
        got = [(f[f"data/demo_{i}"].attrs["task"].decode(), int(f[f"data/demo_{i}"].attrs["seed"])) for i in range(6)]
        assert json.loads(f["data"].attrs["env_args"])["tasks"] == [REACH, PUSH]
    assert got == [(REACH, 0), (REACH, 1), (PUSH, 0), (PUSH, 1), (REACH, 100), (REACH, 101)]
    # OUT exists: refused without --force
    rc, _, err = run(capsys, "merge", out, a, b)
    assert rc == 2 and "already exists; pass --force" in err


def test_merge_refuses_duplicates_and_mismatched_env_args(files, tmp_path, capsys):
    a, b = files
    rc, _, err = run(capsys, "merge", tmp_path / "d.hdf5", a, b, a)
    assert rc == 2
    assert err.count("\n") == 1 and "duplicate (task, seed) = ('tabletop/Reach-v0', 0)" in err
    other = tmp_path / "other.hdf5"
    shutil.copy(b, other)
    with h5py.File(other, "r+") as f:
        args = json.loads(f["data"].attrs["env_args"])
        args["env_kwargs"]["image_size"] = 96
        f["data"].attrs["env_args"] = json.dumps(args)
    rc, _, err = run(capsys, "merge", tmp_path / "e.hdf5", a, other)
    assert rc == 2 and "env_args differ" in err and "env_kwargs" in err
    assert not (tmp_path / "d.hdf5").exists() and not (tmp_path / "e.hdf5").exists()


def test_replay_reproduces_a_demo(files, tmp_path, capsys):
    a, _ = files
    video = tmp_path / "replay.mp4"
    rc, out, _ = run(capsys, "replay", a, "--demo", "demo_3", "--video", video, "--json")
    assert rc == 0
    r = json.loads(out)
    assert r["ok"] and r["task"] == PUSH and r["seed"] == 1
    assert r["max_drift"] == 0.0 and len(r["drift_per_step"]) == r["steps"] - 1
    assert r["max_image_diff"] == 0 and r["instruction_reproduced"] and r["replayed_success"]
    import imageio.v2 as imageio

    with imageio.get_reader(video) as reader:
        frame = reader.get_data(0)
    assert frame.shape == (256, 512, 3)  # recorded | replayed, 64 px upscaled x4


def test_replay_detects_a_tampered_demo(files, tmp_path, capsys):
    a, _ = files
    bad = tmp_path / "tampered.hdf5"
    shutil.copy(a, bad)
    with h5py.File(bad, "r+") as f:
        f["data/demo_2/actions"][5] = -f["data/demo_2/actions"][5]
    rc, out, err = run(capsys, "replay", bad, "--demo", "2")
    assert rc == 4 and "does not reproduce" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["info", "{tmp}/missing.hdf5"], "no such file"),
        (["info", "{tmp}"], "is a directory"),
        (["info", "{tmp}/junk.hdf5"], "cannot open as HDF5"),
        (["replay", "{a}", "--demo", "demo_99"], "no demo 'demo_99'"),
        (["merge", "{tmp}/x.hdf5", "{tmp}/missing.hdf5"], "no such file"),
        (["info"], "the following arguments are required"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_on_stderr(files, tmp_path, capsys, argv, message):
    (tmp_path / "junk.hdf5").write_text("junk")
    argv = [x.format(tmp=tmp_path, a=files[0]) for x in argv]
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse errors
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
