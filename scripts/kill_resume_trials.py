"""kill -9 at random instants during vla-train, then --resume: does every run end exactly where an
uninterrupted one does?

    python scripts/kill_resume_trials.py --data data/tiny.hdf5 --trials 10 --json runs/kill_trials.json

Trains one uninterrupted reference run, then, per trial, starts the same run, sends SIGKILL after a
random delay (drawn over the reference's wall-clock, so kills land in steps, in checkpoint writes and
in start-up alike), resumes it with `--resume` until it finishes, and compares the final loss and a
digest of the final weights with the reference's. Checkpoints are written every 2 steps so that many
kills land inside one.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


def train_cmd(data: str, out: Path, config: str, overrides: list[str], resume: bool) -> list[str]:
    if resume:
        return [sys.executable, "-m", "vla.cli.train", "--out", str(out), "--resume"]
    return [
        sys.executable,
        "-m",
        "vla.cli.train",
        "--config",
        config,
        "--data",
        data,
        "--out",
        str(out),
        *overrides,
    ]


def finish(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    return {"final_loss": summary["final_loss"], "digest": summary["rank_weight_digests"][0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a dataset (e.g. vla-collect --episodes-per-task 4)")
    parser.add_argument("--out", default="runs/kill_trials", help="where the runs go (default runs/kill_trials)")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill instants")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    if not Path(args.data).exists():
        parser.error(f"--data {args.data}: no such dataset")
    overrides = [f"train.steps={args.steps}", "train.checkpoint_every=2", "train.log_every=10"]
    root = Path(args.out)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}

    t0 = time.perf_counter()
    subprocess.run(train_cmd(args.data, root / "reference", args.config, overrides, False), check=True, **quiet)
    duration = time.perf_counter() - t0
    reference = finish(root / "reference")
    print(f"reference: final loss {reference['final_loss']:.6f}, {duration:.1f} s", flush=True)

    rng, trials, attempt = random.Random(args.seed), [], 0
    while len(trials) < args.trials:
        out = root / f"trial{len(trials)}"
        shutil.rmtree(out, ignore_errors=True)
        attempt += 1
        delay = rng.uniform(0.5, duration)
        with open(root / f"attempt{attempt}.log", "w") as log:
            proc = subprocess.Popen(train_cmd(args.data, out, args.config, overrides, False), stdout=log, stderr=log)
            try:
                proc.wait(timeout=delay)  # finished before the kill: not a trial, draw another instant
                print(f"attempt {attempt}: the run finished before {delay:.1f} s (exit {proc.returncode}); redrawn")
                duration = min(duration, delay)
                continue
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        step = json.loads((out / "latest" / "config.json").read_text())["step"] if (out / "latest").exists() else 0
        resumes = 0
        while not (out / "summary.json").exists() or not json.loads((out / "summary.json").read_text())["finished"]:
            resume = (out / "latest").exists()  # killed before the first checkpoint: start again
            subprocess.run(train_cmd(args.data, out, args.config, overrides, resume), check=True, **quiet)
            resumes += 1
        got = finish(out)
        trial = {"kill_after_s": round(delay, 2), "last_checkpoint_step": step, "resumes": resumes, **got,
                 "exact": got == reference}  # fmt: skip
        trials.append(trial)
        print(f"trial {len(trials) - 1}: SIGKILL at {delay:.2f} s (last complete checkpoint: step {step}) -> "
              f"final loss {got['final_loss']:.6f}, exact={trial['exact']}", flush=True)  # fmt: skip
    result = {"reference": reference, "trials": trials, "exact": sum(t["exact"] for t in trials)}
    print(f"{result['exact']}/{len(trials)} resumed runs end exactly at the uninterrupted run's loss and weights")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["exact"] == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
