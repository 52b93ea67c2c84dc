import contextlib
import importlib
import io
import os
import subprocess
import sys
import warnings

import pytest

# Offscreen rendering for every test; EGL (Mesa software) unless the caller chose otherwise.
os.environ.setdefault("MUJOCO_GL", "egl")
# One BLAS/OpenMP thread per process: tests run tiny tensors, often in several processes at once on
# a 2-core machine (pytest-xdist workers, DDP ranks, collector workers), where oversubscribed threads
# cost far more than they give. Set before anything imports torch, so it holds in every xdist worker.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A real dataset: the scripted experts, 4 episodes of every task, collected by vla-collect (in process:
    test_smoke runs it as its own process)."""
    from vla.cli.collect import main as collect_main

    path = tmp_path_factory.mktemp("data") / "tiny.hdf5"
    argv = ["--tasks", "all", "--episodes-per-task", "4", "--workers", "1", "--out", str(path), "--quiet",
            "--valid-fraction", "0.25"]  # fmt: skip
    assert collect_main(argv) == 0
    return path


def run_cli(*args, timeout=300, env=None):
    """Run `python -m <module> args...` in a fresh process; returns CompletedProcess with text output.

    For what needs a real process: an entry point's own run (test_smoke, one per console script), exit codes
    of a killed process, a fresh interpreter. Everything else uses `run_main`, which skips the ~3-7 s that
    each new process spends importing torch."""
    return subprocess.run(
        [sys.executable, "-m", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def run_main(module: str, *args) -> subprocess.CompletedProcess:
    """`run_cli`'s result from `module.main(args)` called in this process: the exit code main returns (or
    argparse's SystemExit code) and what it printed to stdout and stderr. A bug's exception propagates."""
    main = importlib.import_module(module).main
    argv = list(map(str, args))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: --help, usage errors
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    return subprocess.CompletedProcess([module, *argv], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_dataset, tmp_path_factory):
    """A real (tiny, briefly trained) checkpoint directory made by vla-train from `tiny_dataset`."""
    from vla.cli.train import main as train_main

    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    code = train_main(["--config", "configs/tiny.yaml", "--data", str(tiny_dataset), "--out", str(out),
                       "train.steps=20", "train.log_every=10"])  # fmt: skip
    assert code == 0
    return out


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook, which tags each grouped test's id
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, tests marked `slow` first: the long ones start while the other workers still have
    short ones to balance with, instead of leaving one worker running them at the end. Every worker collects
    and sorts alike; a single process keeps the file order (so module-scoped fixtures are built once).

    With --dist loadgroup, a test marked xdist_group must carry its group in its id ("...@group"), which is
    what keeps the group on one worker; pytest 9.2 broke that for pytest-xdist 3.8 silently (each worker
    then built the group's module fixture again: slower, not wrong), so a lost tag is a warning in the summary."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if config.getvalue("loadgroup"):
        untagged = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
        if untagged:
            message = (f"pytest-xdist did not tag {untagged[0]} with its xdist_group (pytest {pytest.__version__}): "
                       "its group is split across workers, each building its fixtures")  # fmt: skip
            warnings.warn(pytest.PytestWarning(message), stacklevel=1)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order otherwise
