"""One CLI error convention (vla/cli/common.py): a user error is one line and exit 2; a bug keeps its traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import pytest

import envs
from vla.checkpoint import CheckpointError
from vla.cli import common as cli
from vla.cli import data as data_cli
from vla.config import ConfigError
from vla.control import deploy
from vla.data.collect import main as collect_main
from vla.data.hdf5_format import DatasetError
from vla.errors import UserError
from vla.evaluation import evaluate


def raising(exc: BaseException):
    def body(*args, **kwargs):
        raise exc

    return body


@pytest.mark.parametrize(
    "exc",
    [
        UserError("--steps must be at least 1, got 0"),
        ConfigError("unknown key 'train.stpes' (did you mean 'steps'?)"),
        DatasetError("x.hdf5: no such file"),
        CheckpointError("runs/x: not a checkpoint directory (no config.json)"),
        envs.UnknownTask("unknown task 'fly'"),
        envs.RenderingUnavailable("no offscreen GL backend:\n  egl: failed\n  osmesa: failed"),
        FileNotFoundError(2, "No such file or directory", "configs/nope.yaml"),
        IsADirectoryError(21, "Is a directory", "runs"),
        PermissionError(13, "Permission denied", "/root/x.json"),
    ],
)
def test_a_user_error_is_one_line_and_exit_2(exc, capsys):
    assert cli.run("vla-x", raising(exc)) == 2
    err = capsys.readouterr().err
    assert err.startswith("vla-x: error: ") and err.count("\n") == 1, err
    assert " ".join(str(exc).split()) in err  # the message itself, on one line


@pytest.mark.parametrize(
    "exc",
    [ValueError("bad shape"), KeyError("proprio"), OSError("disk on fire"), TypeError("x"), RuntimeError("y")],
)
def test_a_bug_keeps_its_traceback(exc, capsys):
    with pytest.raises(type(exc)):
        cli.run("vla-x", raising(exc))
    assert capsys.readouterr().err == ""  # nothing swallowed, nothing half-reported


def test_interrupt_and_closed_pipe(capsys):
    assert cli.run("vla-x", raising(KeyboardInterrupt()), "interrupted; rerun with --resume") == 130
    assert capsys.readouterr().err == "vla-x: interrupted; rerun with --resume\n"
    assert cli.run("vla-x", lambda: 0) == 0 and cli.run("vla-x", lambda: None) == 0 and cli.run("x", lambda: 3) == 3


def test_device_flag_is_checked_up_front():
    assert cli.device(None) is None and cli.device("auto") is None
    assert str(cli.device("cpu")) == "cpu"
    with pytest.raises(UserError, match="--device tpu"):
        cli.device("tpu")


# ------------------------------------------------------------------ the CLIs: bugs propagate through main()


def test_vla_eval_bug_propagates(monkeypatch, tmp_path):
    import vla.policy.load

    monkeypatch.setattr(vla.policy.load, "load_policy", raising(KeyError("a bug, not bad input")))
    with pytest.raises(KeyError, match="a bug"):
        evaluate.main(["--checkpoint", str(tmp_path), "--episodes-per-task", "1"])


def test_vla_deploy_bug_propagates(monkeypatch, tmp_path):
    import vla.policy.load

    monkeypatch.setattr(vla.policy.load, "load_policy", raising(ValueError("a bug, not bad input")))
    with pytest.raises(ValueError, match="a bug"):
        deploy.main(["--checkpoint", str(tmp_path), "--task", "reach", "--json", str(tmp_path / "d.json")])


def test_vla_collect_bug_propagates(monkeypatch, tmp_path):
    import vla.data.collect

    monkeypatch.setattr(vla.data.collect.Collector, "run", raising(OSError("a bug")))
    with pytest.raises(OSError, match="a bug"):
        collect_main(["--tasks", "reach", "--episodes-per-task", "1", "--out", str(tmp_path / "a.hdf5")])


def test_vla_data_bug_propagates_but_a_damaged_file_is_one_line(monkeypatch, tmp_path, capsys):
    damaged = tmp_path / "damaged.hdf5"
    with h5py.File(damaged, "w") as f:  # a demo without its arrays: the file is wrong, not the code
        f.create_group("data/demo_0").attrs["task"] = "tabletop/Reach-v0"
    assert data_cli.main(["info", str(damaged)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "damaged.hdf5: cannot read" in err and "vla-data validate" in err, err

    monkeypatch.setattr(data_cli, "summarize", raising(ValueError("a bug, not bad input")))
    with pytest.raises(ValueError, match="a bug"):
        data_cli.main(["info", str(damaged)])


@pytest.mark.parametrize(
    "script, says",
    [
        ("vla-collect", "--episodes-per-task"),
        ("vla-data", "validate"),
        ("vla-eval", "--checkpoint"),
        ("vla-deploy", "--budget-ms"),
    ],  # fmt: skip
)
def test_console_script_is_installed_and_starts_in_its_own_process(script, says):
    """The installed entry point, in a fresh process. (The whole runs of these commands are tested in process;
    vla-train and vla-export run as processes in test_smoke and test_export.)"""
    exe = Path(sys.executable).parent / script
    assert exe.exists(), f"no {exe}: install the package (make setup) so the console scripts exist"
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"usage: {script}" in r.stdout and says in r.stdout, r.stderr
