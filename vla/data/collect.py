"""Collection: run the scripted experts in worker processes and write an HDF5 dataset, crash-safely (`vla-collect`).

    vla-collect --tasks all --episodes-per-task 50 --workers 2 --out data/demo.hdf5 --seed 0

Seeds. Task k's episodes use reset seeds `--seed`, `--seed`+1, ... (the same numbers for every task;
a demo is identified by its (task, seed) pair). A seed whose episode fails is recorded in the
dataset (`failed_seeds`) and the next unused seed is drawn, until the task has N successful
episodes or has used `--max-attempts` seeds (then the run says so and exits 4). Seeds are handed
out in order and only while fewer than N are done or running, so a task's demos are always its
first N successful seeds: reruns and resumes give the same episodes. The expert's action noise is
seeded with the episode's seed too. For collection on several machines, give each a disjoint range
(e.g. `--seed 0` and `--seed 1000000`) and combine the files with `vla-data merge`.

Episodes end when the env reports success (it terminates the episode then) or at the task's time
limit. Failed episodes are discarded unless `--keep-failed`, which keeps every attempt (attrs
`success` False) and counts attempts, not successes, toward N.

Crash safety. Every finished episode is written by its worker as a complete one-demo dataset in
`OUT.parts/` (vla/data/collect_worker.py); the parent merges the parts into a new OUT and renames it over the
old one (vla/data/collect_parts.py), so `kill -9` at any moment loses only episodes in progress. `--resume` reads OUT
and the leftover parts, skips every (task, seed) already tried, and completes the counts.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

from vla.data.collect_parts import CollectError, PartsDir, merge_parts, read_part
from vla.data.collect_worker import Job, init_worker, probe_env_args, run_job
from vla.data.hdf5_format import (
    dataset_env_args,
    demo_meta,
    demo_names,
    env_args_compatible,
    open_dataset,
    read_env_args,
    read_failed_seeds,
)

SHORT_EXIT = 4  # a collection that ended short of its counts: a check that did not pass (vla/cli/common.py)


@dataclass
class CollectRequest:
    """What to collect (vla-collect's flags, checked there)."""

    out: Path
    episodes_per_task: int  # episodes to keep per task (the default target)
    seed: int = 0  # first reset seed of every task
    workers: int = 1
    image_size: int = 64
    wrist_camera: bool = False  # record obs/wrist_image too (tabletop tasks)
    noise: float = 0.0  # std of the expert's action noise
    perturb: float = 0.0  # chance per tick of a perturbation burst
    detour: float = 0.0  # chance per episode of a detour pose first
    driver: str | None = None  # checkpoint of a policy that acts (DAgger)
    takeover: int = 0  # with a driver: the expert takes over after 0..takeover ticks (0: never)
    keep_failed: bool = False  # keep failed episodes too (N counts attempts)
    resume: bool = False  # complete an existing output and its leftover parts
    max_attempts: int | None = None  # seeds to try per task at most (None: 3N + 10)
    valid_fraction: float = 0.1  # share of each task's demos in mask/valid
    merge_every: float = 30.0  # seconds between merges of finished parts into OUT
    quiet: bool = False  # no progress bar

    def __post_init__(self):
        self.out = Path(self.out)


@dataclass
class TaskState:
    done: int = 0  # episodes that count toward N (successes; every kept attempt with --keep-failed)
    successes: int = 0
    tried: set[int] = field(default_factory=set)  # seeds finished (kept or failed) or in flight
    in_flight: int = 0
    next_seed: int = 0


class Collector:
    def __init__(self, request: CollectRequest, tasks: list[str], targets: dict[str, int] | None = None):
        self.args = args = request
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
            got = read_part(p)
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
        self.last_merge = time.monotonic()
        return merge_parts(self.parts, self.env_args, self.failed, self.args.valid_fraction)

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
            with ProcessPoolExecutor(a.workers, mp_context=ctx, initializer=init_worker) as pool:
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
        return SHORT_EXIT if short else 0


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
