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
import signal
import subprocess
import sys
import time
from pathlib import Path


def train_cmd(data: str, out: Path, config: str, overrides: list[str], resume: bool) -> list[str]:
    if resume:
        return [sys.executable, "-m", "vla.train", "--out", str(out), "--resume"]
    return [sys.executable, "-m", "vla.train", "--config", config, "--data", data, "--out", str(out), *overrides]


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

    rng, trials = random.Random(args.seed), []
    for i in range(args.trials):
        out = root / f"trial{i}"
        delay = rng.uniform(0.2, duration)
        proc = subprocess.Popen(train_cmd(args.data, out, args.config, overrides, False), **quiet)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        killed = proc.wait() == -signal.SIGKILL  # False: it had already finished
        resumes = 0
        while not (out / "summary.json").exists() or not json.loads((out / "summary.json").read_text())["finished"]:
            resume = (out / "latest").exists()  # killed before the first checkpoint: start again
            subprocess.run(train_cmd(args.data, out, args.config, overrides, resume), check=True, **quiet)
            resumes += 1
        got = finish(out)
        trial = {"kill_after_s": round(delay, 2), "killed": killed, "resumes": resumes, **got,
                 "exact": got == reference}  # fmt: skip
        trials.append(trial)
        print(f"trial {i}: kill at {delay:.2f} s -> final loss {got['final_loss']:.6f} exact={trial['exact']}")
    result = {"reference": reference, "trials": trials, "exact": sum(t["exact"] for t in trials)}
    print(f"{result['exact']}/{len(trials)} resumed runs end exactly at the uninterrupted run's loss and weights")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["exact"] == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
