"""`vla-collect`: run the scripted experts in worker processes and write an HDF5 dataset, crash-safely.

    vla-collect --tasks all --episodes-per-task 50 --workers 2 --out data/demo.hdf5 --seed 0

Seeds. Task k's episodes use reset seeds `--seed`, `--seed`+1, ... (the same numbers for every task;
a demo is identified by its (task, seed) pair). A seed whose episode fails is recorded in the
dataset (`failed_seeds`) and the next unused seed is drawn, until the task has N successful
episodes or has used `--max-attempts` seeds (then the run says so and exits 1). Seeds are handed
out in order and only while fewer than N are done or running, so a task's demos are always its
first N successful seeds: reruns and resumes give the same episodes. The expert's action noise is
seeded with the episode's seed too. For collection on several machines, give each a disjoint range
(e.g. `--seed 0` and `--seed 1000000`) and combine the files with `vla-data merge`.

Episodes end when the env reports success (it terminates the episode then) or at the task's time
limit. Failed episodes are discarded unless `--keep-failed`, which keeps every attempt (attrs
`success` False) and counts attempts, not successes, toward N.

Crash safety. Every finished episode is written by its worker as a complete one-demo dataset in
`OUT.parts/` (temporary name, fsync, atomic rename); a failed seed leaves a small marker file there.
Every `--merge-every` seconds and at the end, the parent writes a NEW output containing the old
output's demos plus the finished parts (temporary name, fsync, atomic rename over OUT), and only then
deletes those parts. OUT is never modified in place, so `kill -9` at any moment leaves the previous
complete OUT (or none) plus finished parts; it loses only episodes in progress. `--resume` reads OUT
and the leftover parts, skips every (task, seed) already tried, and completes the counts.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco (workers inherit it)

import h5py  # noqa: E402
import numpy as np  # noqa: E402

from vla.cli import common as cli  # noqa: E402
from vla.data.hdf5_format import (  # noqa: E402
    DatasetError,
    Episode,
    dataset_env_args,
    demo_meta,
    demo_names,
    env_args_compatible,
    merge_env_args,
    open_dataset,
    read_env_args,
    read_failed_seeds,
    write_dataset,
    write_episode_file,
)
from vla.errors import UserError  # noqa: E402
from vla.files import atomic_write  # noqa: E402

PART_SUFFIX = ".hdf5"
FAILED_SUFFIX = ".failed.json"


class CollectError(UserError):
    """A problem with the request or the files, phrased for the user."""


# ------------------------------------------------------------------------------------ one episode


def rollout(
    env, expert, task: str, seed: int, labelled: bool = False, driver=None, takeover: int | None = None
) -> Episode:
    """Run the expert for one episode from `env.reset(seed=seed)` and return it as arrays; `labelled`:
    keep its noise-free actions too (`expert_actions`; with any noise, perturbation or detour).
    `driver`: a policy that acts instead (DAgger): the states are the ones the policy visits, the expert
    only labels them (always `labelled`); `takeover`: the tick from which the expert acts again (its way out
    of wherever the policy led; None: never).

    Step t stores the observation and physics state BEFORE action t; the episode ends when the env
    terminates (success) or truncates (time limit).
    """
    base = env.unwrapped
    obs, info = env.reset(seed=seed)
    expert.reset()
    instruction = obs["instruction"]
    if driver is not None:
        driver.reset(instruction)
    keys = [k for k in obs if k != "instruction"]
    frames: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    privileged = [k for k in ("object", "object_px") if k in info]  # robomimic's obs/object: training targets
    for k in privileged:
        frames[k] = []
    states, actions, rewards, labels = [], [], [], []
    success = False
    while True:
        states.append(base.get_state())
        for k in keys:
            frames[k].append(obs[k])
        for k in privileged:
            frames[k].append(np.asarray(info[k], dtype=np.float32))
        action = np.clip(np.asarray(expert.act(obs), dtype=np.float32), -1.0, 1.0)  # the expert's phases advance
        if driver is not None and (takeover is None or len(actions) < takeover):
            action = np.clip(np.asarray(driver.act(obs), dtype=np.float32), -1.0, 1.0)
        labels.append(expert.clean_action)
        obs, reward, terminated, truncated, info = env.step(action)
        actions.append(action)
        rewards.append(reward)
        success = bool(info.get("success", False))
        if terminated or truncated:
            break
    t = len(actions)
    dones = np.zeros(t, dtype=np.uint8)
    dones[-1] = 1
    return Episode(
        task=task,
        seed=int(seed),
        instruction=instruction,
        actions=np.stack(actions),
        rewards=np.asarray(rewards, dtype=np.float32),
        dones=dones,
        states=np.stack(states).astype(np.float64),
        obs={k: np.stack(v) for k, v in frames.items()},
        success=success,
        expert_actions=np.stack(labels) if labelled or driver is not None else None,
    )


# ------------------------------------------------------------------------------------ workers

_ENVS: dict[tuple[str, int, bool], Any] = {}  # per worker process: one env per (task, image_size, wrist_camera)
_DRIVERS: dict[str, Any] = {}  # per worker process: the --driver policy, loaded once


def _init_worker() -> None:
    os.environ.setdefault("MUJOCO_GL", "egl")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def make_env(task: str, image_size: int, wrist_camera: bool = False):
    """The env for `task` (cached per process), built the way `env_args` says to rebuild it."""
    key = (task, image_size, wrist_camera)
    if key not in _ENVS:
        import gymnasium as gym

        import envs  # noqa: F401  (registers the tasks)

        extra = {"wrist_camera": True} if wrist_camera else {}  # a tabletop option; other suites have none
        _ENVS[key] = gym.make(task, image_size=image_size, **extra)
    return _ENVS[key]


def load_driver(checkpoint: str):
    """The --driver policy (cached per process), on the CPU with one thread: workers run side by side."""
    if checkpoint not in _DRIVERS:
        import torch

        from vla.policy.torch_policy import load_policy

        torch.set_num_threads(1)
        _DRIVERS[checkpoint] = load_policy(checkpoint, device="cpu")
    return _DRIVERS[checkpoint]


def probe_env_args(tasks: list[str], image_size: int, wrist_camera: bool = False) -> dict[str, dict]:
    """Each task's `env.unwrapped.env_args` (run in a worker, so the parent never touches GL)."""
    return {t: make_env(t, image_size, wrist_camera).unwrapped.env_args for t in tasks}


def part_stem(task: str, seed: int) -> str:
    return f"{task.replace('/', '--')}__seed{seed}"


def _write_json_atomic(path: Path, obj: Any) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj)))


@dataclass
class Job:
    task: str
    seed: int
    image_size: int
    noise: float
    perturb: float
    detour: float
    parts_dir: str
    keep_failed: bool
    env_args: dict  # the dataset's env_args (written into every part)
    driver: str | None = None  # checkpoint of the policy that acts (DAgger); None: the expert acts
    takeover: int = 0  # with a driver: the expert takes over after a random number of ticks up to this (0: never)
    wrist_camera: bool = False  # record obs/wrist_image too (tabletop tasks)


def run_job(job: Job) -> dict:
    """Worker: one expert episode, written to its own part file (or a failed-seed marker)."""
    import envs

    t0 = time.perf_counter()
    env = make_env(job.task, job.image_size, job.wrist_camera)
    expert = envs.make_expert(env, noise=job.noise, seed=job.seed, perturb=job.perturb, detour=job.detour)
    driver = load_driver(job.driver) if job.driver else None
    labelled = job.noise > 0 or job.perturb > 0 or job.detour > 0
    takeover = None
    if driver is not None and job.takeover:  # drawn from the episode's seed, so a rerun gives the same episode
        takeover = int(np.random.default_rng([job.seed, 7]).integers(0, job.takeover + 1))
    ep = rollout(env, expert, job.task, job.seed, labelled=labelled, driver=driver, takeover=takeover)
    t_sim = time.perf_counter() - t0
    stem = Path(job.parts_dir) / part_stem(job.task, job.seed)
    kept = ep.success or job.keep_failed
    if kept:
        write_episode_file(stem.with_name(stem.name + PART_SUFFIX), ep, {**job.env_args, "tasks": [job.task]})
    else:
        marker = {"task": job.task, "seed": job.seed, "steps": ep.num_samples}
        _write_json_atomic(stem.with_name(stem.name + FAILED_SUFFIX), marker)
    return {
        "task": job.task,
        "seed": job.seed,
        "success": ep.success,
        "kept": kept,
        "steps": ep.num_samples,
        "sim_s": t_sim,
        "total_s": time.perf_counter() - t0,
    }


# ------------------------------------------------------------------------------------ the parent


@dataclass
class TaskState:
    done: int = 0  # episodes that count toward N (successes; every kept attempt with --keep-failed)
    successes: int = 0
    tried: set[int] = field(default_factory=set)  # seeds finished (kept or failed) or in flight
    in_flight: int = 0
    next_seed: int = 0


class PartsDir:
    """`OUT.parts/`: finished episode files and failed-seed markers not yet merged into OUT."""

    def __init__(self, out: Path):
        self.out = out
        self.path = out.with_name(out.name + ".parts")

    def parts(self) -> list[Path]:
        return sorted(self.path.glob(f"*{PART_SUFFIX}")) if self.path.is_dir() else []

    def markers(self) -> list[Path]:
        return sorted(self.path.glob(f"*{FAILED_SUFFIX}")) if self.path.is_dir() else []

    def has_leftovers(self) -> bool:
        return bool(self.parts() or self.markers())

    def remove_stale_temps(self) -> None:
        """Temporary files of a killed run (only called while holding the lock)."""
        for p in [*self.out.parent.glob(f"{self.out.name}.tmp-*"), *self.path.glob("*.tmp-*")]:
            p.unlink(missing_ok=True)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One collector per output: an exclusive flock, released by the kernel even on kill -9."""
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / ".lock", "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CollectError(f"another vla-collect is writing {self.out} (lock {self.path}/.lock)") from None
            try:
                yield
            finally:
                if not self.has_leftovers():
                    (self.path / ".lock").unlink(missing_ok=True)
                    with contextlib.suppress(OSError):
                        self.path.rmdir()


def _read_part(path: Path) -> tuple[dict, dict] | None:
    """(env_args, demo meta) of a finished part, or None (with a warning) if it cannot be read."""
    try:
        with open_dataset(path) as f:
            return read_env_args(f), demo_meta(f, demo_names(f)[0])
    except (DatasetError, OSError, KeyError, IndexError, ValueError) as e:
        bad = path.with_name(path.name + ".bad")
        os.replace(path, bad)
        print(f"vla-collect: warning: unreadable part {path} moved to {bad.name} ({e})", file=sys.stderr)
        return None


class Collector:
    def __init__(self, args: argparse.Namespace, tasks: list[str], targets: dict[str, int] | None = None):
        self.args = args
        self.tasks = tasks
        targets = targets or {}
        self.target = {t: targets.get(t, args.episodes_per_task) for t in tasks}  # episodes to keep, per task
        self.out = Path(args.out)
        self.parts = PartsDir(self.out)
        self.env_args: dict = {}
        self.state = {t: TaskState(next_seed=args.seed) for t in tasks}
        self.failed: dict[str, set[int]] = {}
        self.last_merge = time.monotonic()
        self.steps = 0  # env steps run by this invocation
        self.timing: dict[str, float] = {}
        self.leftover_env_args: dict[str, dict] = {}  # env_args of unmerged parts from an earlier run

    # ---- what is already there (the output and leftover parts)
    def scan_existing(self) -> dict | None:
        """Fill the task states from OUT and the parts; return OUT's env_args (None if no OUT)."""
        out_env_args = None
        if self.out.exists():
            from vla.data.validate import validate

            problems = validate(self.out)
            if problems:
                raise CollectError(
                    f"{self.out} is not a valid dataset, so it cannot be resumed ({problems[0]}); "
                    "move it away or write to another --out"
                )
            with open_dataset(self.out) as f:
                out_env_args = read_env_args(f)
                for name in demo_names(f):
                    m = demo_meta(f, name)
                    self._count(m["task"], m["seed"], bool(m["success"]))
                for task, seeds in read_failed_seeds(f).items():
                    for s in seeds:
                        self._count(task, s, False, marker=True)
        for p in self.parts.parts():
            got = _read_part(p)
            if got is None:
                continue
            part_env_args, m = got
            if out_env_args is not None and not env_args_compatible(part_env_args, out_env_args):
                raise CollectError(f"leftover part {p} was collected with other env_args than {self.out}")
            self.leftover_env_args.setdefault(str(p), part_env_args)
            self._count(m["task"], m["seed"], bool(m["success"]))
        for p in self.parts.markers():
            try:
                m = json.loads(p.read_text())
                self._count(m["task"], int(m["seed"]), False, marker=True)
            except (OSError, ValueError, KeyError) as e:
                print(f"vla-collect: warning: ignoring unreadable marker {p} ({e})", file=sys.stderr)
        return out_env_args

    def _count(self, task: str, seed: int, success: bool, marker: bool = False) -> None:
        st = self.state.setdefault(task, TaskState(next_seed=self.args.seed))
        if seed in st.tried:
            return  # a part already merged into OUT before the kill: counted once
        st.tried.add(seed)
        if marker:
            self.failed.setdefault(task, set()).add(seed)
            return
        st.successes += success
        st.done += success or self.args.keep_failed

    # ---- scheduling
    def next_job(self) -> Job | None:
        """The next (task, seed): the task furthest from its target, its lowest untried seed."""
        open_tasks = [
            t
            for t in self.tasks
            if self.state[t].done + self.state[t].in_flight < self.target[t] and len(self.state[t].tried) < self.cap(t)
        ]
        if not open_tasks:
            return None

        # the task with the smallest share of its target done (equal targets: the fewest episodes)
        def share(t: str) -> tuple[float, int]:
            return (self.state[t].done + self.state[t].in_flight) / self.target[t], self.tasks.index(t)

        task = min(open_tasks, key=share)
        st = self.state[task]
        while st.next_seed in st.tried:
            st.next_seed += 1
        seed = st.next_seed
        st.tried.add(seed)
        st.in_flight += 1
        a = self.args
        return Job(
            task, seed, a.image_size, a.noise, a.perturb, a.detour, str(self.parts.path), a.keep_failed, self.env_args,
            a.driver, a.takeover, a.wrist_camera,
        )  # fmt: skip

    def cap(self, task: str) -> int:
        """Seeds to try for `task` at most."""
        return self.args.max_attempts or 3 * self.target[task] + 10

    # ---- merging
    def merge(self) -> int:
        """Write a new OUT = old OUT + finished parts (atomically), then delete those parts."""
        parts, markers = self.parts.parts(), self.parts.markers()
        self.last_merge = time.monotonic()
        if not parts and not markers:
            return 0
        failed = {t: set(s) for t, s in self.failed.items()}
        for p in markers:
            with contextlib.suppress(OSError, ValueError, KeyError):
                m = json.loads(p.read_text())
                failed.setdefault(m["task"], set()).add(int(m["seed"]))
        with contextlib.ExitStack() as stack:
            demos: dict[tuple[str, int], h5py.Group] = {}
            env_args = [self.env_args]
            if self.out.exists():
                f = stack.enter_context(open_dataset(self.out))
                env_args.insert(0, read_env_args(f))
                for task, seeds in read_failed_seeds(f).items():
                    failed.setdefault(task, set()).update(seeds)
                for name in demo_names(f):
                    m = demo_meta(f, name)
                    demos[(m["task"], m["seed"])] = f["data"][name]
            for p in parts:
                try:
                    f = stack.enter_context(open_dataset(p))
                    name = demo_names(f)[0]
                    m = demo_meta(f, name)
                except (DatasetError, OSError, IndexError, KeyError) as e:
                    print(f"vla-collect: warning: skipping unreadable part {p} ({e})", file=sys.stderr)
                    continue
                demos.setdefault((m["task"], m["seed"]), f["data"][name])
            if not demos:
                return 0  # only failures so far: keep the markers, write no empty dataset
            merged_args = merge_env_args(env_args)
            order = merged_args["tasks"]
            ranked = sorted(demos, key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k[0], k[1]))
            write_dataset(
                self.out,
                merged_args,
                [demos[k] for k in ranked],
                valid_fraction=self.args.valid_fraction,
                failed_seeds={t: sorted(s) for t, s in failed.items()},
            )
        self.failed = failed
        for p in [*parts, *markers]:  # only now that the new OUT is on disk
            p.unlink(missing_ok=True)
        return len(parts)

    # ---- progress
    def postfix(self) -> str:
        cells = []
        for t in self.tasks:
            st = self.state[t]
            finished = len(st.tried) - st.in_flight
            rate = f"{100 * st.successes / finished:.0f}%" if finished else "-"
            cells.append(f"{t.split('/')[-1].removesuffix('-v0')} {st.done}/{self.target[t]} ({rate})")
        return " | ".join(cells)

    def run(self) -> int:
        from tqdm import tqdm

        a = self.args
        with self.parts.lock():
            self.parts.remove_stale_temps()
            if not a.resume and (self.out.exists() or self.parts.has_leftovers()):
                what = self.out if self.out.exists() else self.parts.path
                raise CollectError(f"{what} already exists; pass --resume to complete it, or choose another --out")
            out_env_args = self.scan_existing()
            ctx = mp.get_context("spawn")  # MuJoCo GL contexts do not survive fork
            n_total = sum(self.target.values())
            already = sum(min(self.state[t].done, self.target[t]) for t in self.tasks)
            t0 = time.perf_counter()
            with ProcessPoolExecutor(a.workers, mp_context=ctx, initializer=_init_worker) as pool:
                try:
                    per_task = pool.submit(probe_env_args, self.tasks, a.image_size, a.wrist_camera).result()
                except Exception as e:
                    raise CollectError(f"could not build the envs in a worker: {type(e).__name__}: {e}") from e
                self.env_args = dataset_env_args(per_task)
                self.timing["startup_s"] = time.perf_counter() - t0  # first worker up, envs built
                earlier = {str(self.out): out_env_args} if out_env_args is not None else {}
                for where, old in {**earlier, **self.leftover_env_args}.items():
                    if not env_args_compatible(old, self.env_args):
                        raise CollectError(
                            f"{where} was collected with env_args {old}, this run would use "
                            f"{self.env_args}; use the same --image-size or another --out"
                        )
                bar = tqdm(total=n_total, initial=already, unit="ep", dynamic_ncols=True, disable=a.quiet)
                pending: dict[Future, Job] = {}
                try:
                    t1 = time.perf_counter()
                    self._loop(pool, pending, bar)
                    self.timing["episodes_s"] = time.perf_counter() - t1  # all episodes, periodic merges
                except KeyboardInterrupt:
                    bar.close()
                    for fut in pending:
                        fut.cancel()
                    self.merge()
                    print(f"\ninterrupted; finished episodes are in {self.out}; rerun with --resume", file=sys.stderr)
                    return 130
                finally:
                    bar.close()
            t2 = time.perf_counter()
            self.merge()
            self.timing["final_merge_s"] = time.perf_counter() - t2
        self.timing["total_s"] = time.perf_counter() - t0
        return self.report(self.timing["total_s"])

    def _loop(self, pool: ProcessPoolExecutor, pending: dict[Future, Job], bar) -> None:
        a = self.args
        while True:
            while len(pending) < 2 * a.workers and (job := self.next_job()) is not None:
                pending[pool.submit(run_job, job)] = job
            if not pending:
                return
            done, _ = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for fut in done:
                job = pending.pop(fut)
                st = self.state[job.task]
                st.in_flight -= 1
                try:
                    r = fut.result()
                except BrokenProcessPool as e:
                    raise CollectError(f"a worker process died ({e}); finished episodes are kept, use --resume") from e
                except Exception as e:
                    raise CollectError(f"{job.task} seed {job.seed}: the episode raised {type(e).__name__}: {e}") from e
                self.steps += r["steps"]
                st.successes += r["success"]
                if r["kept"]:
                    st.done += 1
                    bar.update(1)
                bar.set_postfix_str(self.postfix(), refresh=True)
            if time.monotonic() - self.last_merge > a.merge_every:
                self.merge()

    def report(self, seconds: float) -> int:
        short = []
        for t in self.tasks:
            st, n = self.state[t], self.target[t]
            tried = len(st.tried)
            print(f"{t}: {st.done}/{n} episodes ({st.successes} successes in {tried} attempts)")
            if st.done < n:
                short.append(
                    f"{t}: only {st.done}/{n} episodes after {tried} attempts (the cap is --max-attempts "
                    f"{self.cap(t)}); lower --noise or raise --max-attempts, then rerun with --resume"
                )
        if self.out.exists():
            print(f"wrote {self.out} ({self.steps} new env steps in {seconds:.1f} s)")
        else:
            print(f"no successful episode yet, so {self.out} was not written (failed seeds: {self.parts.path})")
        for line in short:
            print(f"vla-collect: error: {line}", file=sys.stderr)
        return 1 if short else 0


# ------------------------------------------------------------------------------------ CLI


def resolve_tasks(spec: str) -> list[str]:
    import envs

    if spec.strip() == "all":
        return list(envs.TASKS)
    tasks = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        try:  # a suite ("metaworld/mt10") stands for its tasks
            ids = envs.expand_tasks(name)
        except envs.UnknownTask as e:
            raise CollectError(str(e)) from None
        tasks += [tid for tid in ids if tid not in tasks]
    if not tasks:
        raise CollectError("--tasks is empty; give 'all' or a comma-separated list of task ids")
    return tasks


def parse_task_episodes(items: list[str], tasks: list[str]) -> dict[str, int]:
    """`--task-episodes` values ("push=900", "tabletop/Push-v0=900") -> {task id: N}, each a task of `tasks`."""
    targets = {}
    for item in items:
        name, sep, count = item.partition("=")
        if not sep or not count.strip().lstrip("-").isdigit():
            raise CollectError(f"--task-episodes {item!r}: expected TASK=N, e.g. push=900")
        try:
            ids = resolve_tasks(name)
        except CollectError as e:
            raise CollectError(f"--task-episodes {item!r}: {e}") from None
        if len(ids) != 1 or ids[0] not in tasks:
            raise CollectError(f"--task-episodes {item!r}: {name} is not one of the collected tasks {tasks}")
        if int(count) < 1:
            raise CollectError(f"--task-episodes {item!r}: N must be at least 1")
        targets[ids[0]] = int(count)
    return targets


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not the usage block
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="vla-collect",
        description="Collect scripted-expert demonstrations into an HDF5 dataset (crash-safe, resumable).",
        epilog="Seeds --seed, --seed+1, ... per task; failed seeds are recorded and skipped. "
        "After a crash or Ctrl-C, rerun the same command with --resume.",
    )
    p.add_argument("--tasks", default="all", help="'all', 'metaworld/mt10' or comma-separated task ids / short names")
    p.add_argument("--episodes-per-task", type=int, required=True, metavar="N", help="episodes to keep per task")
    p.add_argument(
        "--task-episodes", action="append", default=[], metavar="TASK=N",
        help="keep N episodes of TASK instead of --episodes-per-task (repeatable; e.g. push=900)",
    )  # fmt: skip
    p.add_argument("--workers", type=int, default=1, metavar="W", help="worker processes (default 1)")
    p.add_argument("--out", required=True, metavar="FILE.hdf5", help="output dataset")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="first reset seed of every task (default 0)")
    p.add_argument("--image-size", type=int, default=64, help="camera resolution in pixels (default 64)")
    p.add_argument(
        "--wrist-camera", action="store_true",
        help="record the gripper's wrist camera too (obs/wrist_image; tabletop tasks); train on both cameras "
        "with data.wrist_image_key=wrist_image",
    )  # fmt: skip
    p.add_argument("--noise", type=float, default=0.0, help="std of the expert's action noise (default 0)")
    p.add_argument(
        "--perturb", type=float, default=0.0, metavar="P",
        help="chance per tick of a perturbation: 2-5 ticks in one random direction (default 0)",
    )  # fmt: skip
    p.add_argument(
        "--detour", type=float, default=0.0, metavar="P",
        help="chance per episode of first driving the gripper where cloned policies fail "
        "(Push: low just past the block, or on its top); tabletop tasks without such a pose ignore it "
        "(default 0)",
    )  # fmt: skip
    p.add_argument(
        "--driver", metavar="CHECKPOINT",
        help="a trained policy acts and the expert labels the states it visits (DAgger; the expert's labels "
        "go to expert_actions); without --takeover it implies --keep-failed: a failed episode's labels are the point",
    )  # fmt: skip
    p.add_argument(
        "--takeover", type=int, default=0, metavar="T",
        help="with --driver: the expert takes over after a random number of ticks, 0..T, and shows the way out "
        "(--noise applies to it; successes kept as usual); default 0: the policy drives to the end",
    )  # fmt: skip
    p.add_argument("--keep-failed", action="store_true", help="keep failed episodes too (N counts attempts)")
    p.add_argument("--resume", action="store_true", help="complete an existing output and its leftover parts")
    p.add_argument(
        "--max-attempts", type=int, default=None, metavar="M", help="seeds to try per task at most (default 3N+10)"
    )
    p.add_argument("--valid-fraction", type=float, default=0.1, help="share of each task's demos in mask/valid")
    p.add_argument(
        "--merge-every", type=float, default=30.0, metavar="SEC", help="merge finished episodes into OUT this often"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run("vla-collect", lambda: _run(args), "interrupted; rerun with --resume to complete the dataset")


def _run(args: argparse.Namespace) -> int:
    for name, v in (("--episodes-per-task", args.episodes_per_task), ("--workers", args.workers)):
        if v < 1:
            raise CollectError(f"{name} must be at least 1, got {v}")
    if not 0 <= args.valid_fraction < 1:
        raise CollectError(f"--valid-fraction must be in [0, 1), got {args.valid_fraction}")
    if args.noise < 0:
        raise CollectError(f"--noise must be >= 0, got {args.noise}")
    if not 0 <= args.perturb < 1:
        raise CollectError(f"--perturb must be in [0, 1), got {args.perturb}")
    if not 0 <= args.detour <= 1:
        raise CollectError(f"--detour must be in [0, 1], got {args.detour}")
    if args.driver:
        from vla.checkpoint import CheckpointError, load_checkpoint

        try:
            load_checkpoint(args.driver)
        except CheckpointError as e:
            raise CollectError(f"--driver: {e}") from None
        if args.detour or (not args.takeover and (args.noise or args.perturb)):
            raise CollectError(
                "--driver: the policy acts, so --detour (and --noise and --perturb, without --takeover) have "
                "nothing to change"
            )
        args.keep_failed = args.keep_failed or not args.takeover  # without a takeover the failures are the point
    elif args.takeover:
        raise CollectError("--takeover needs --driver (the policy the expert takes over from)")
    if args.takeover < 0:
        raise CollectError(f"--takeover must be >= 0, got {args.takeover}")
    out = Path(args.out)
    if out.is_dir():
        raise CollectError(f"--out {out} is a directory; give a file name like {out}/demo.hdf5")
    if not out.parent.is_dir():
        raise CollectError(f"--out: directory {out.parent} does not exist")
    tasks = resolve_tasks(args.tasks)
    targets = parse_task_episodes(args.task_episodes, tasks)
    import envs

    try:
        envs.check_detour(tasks, args.detour)
    except ValueError as e:
        raise CollectError(str(e)) from None
    return Collector(args, tasks, targets).run()


if __name__ == "__main__":
    sys.exit(main())
