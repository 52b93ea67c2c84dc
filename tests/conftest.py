import os
import subprocess
import sys

import pytest

# Offscreen rendering for every test; EGL (Mesa software) unless the caller chose otherwise.
os.environ.setdefault("MUJOCO_GL", "egl")
# One BLAS/OpenMP thread per process: tests run tiny tensors, often in several processes at once on
# a 2-core machine, where oversubscribed threads cost far more than they give.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A real dataset: the scripted experts, 4 episodes of every task, collected by vla-collect."""
    path = tmp_path_factory.mktemp("data") / "tiny.hdf5"
    cmd = [sys.executable, "-m", "vla.collect", "--tasks", "all", "--episodes-per-task", "4",
           "--workers", "1", "--out", str(path), "--quiet", "--valid-fraction", "0.25"]  # fmt: skip
    subprocess.run(cmd, check=True, timeout=300)
    return path


def run_cli(*args, timeout=300, env=None):
    """Run `python -m <module> args...` in a fresh process; returns CompletedProcess with text output."""
    return subprocess.run(
        [sys.executable, "-m", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_dataset, tmp_path_factory):
    """A real (tiny, briefly trained) checkpoint directory made by vla-train from `tiny_dataset`."""
    from vla.train import main as train_main

    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    code = train_main(["--config", "configs/tiny.yaml", "--data", str(tiny_dataset), "--out", str(out),
                       "train.steps=20", "train.log_every=10"])  # fmt: skip
    assert code == 0
    return out
