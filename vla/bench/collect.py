"""Collection throughput: 1 vs 2 workers, and the cost of writing vs. stepping the experts alone.

Four measurements on the same (task, seed) jobs:
  collect_1_worker / collect_2_workers  `vla-collect` end to end (process start-up, episodes, parts,
                                        merge), episodes/s and env steps/s;
  expert_only       the same episodes in this process, nothing written;
  expert_and_write  the same pass, plus each episode written as a part file (fsync, rename) and the
                    parts merged into one dataset, what a worker and the parent do. Stepping and
                    writing are timed separately within one pass (so load from other processes
                    skews both alike); the write time over the stepping time is the write overhead;
and the peer, `raw_physics_render`: the scene's `mj_step` x substeps + one camera render per control
step, without gymnasium, task logic or the expert: the ceiling on env steps/s for one core.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from vla.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", default="all", help="'all' or comma-separated task ids (default all)")
    parser.add_argument("--episodes-per-task", type=int, default=15, help="episodes per task per run (default 15)")
    parser.add_argument("--image-size", type=int, default=64, help="camera resolution (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="first reset seed (default 0)")
    parser.add_argument("--raw-steps", type=int, default=500, help="control steps for the raw peer (default 500)")


def _rates(seconds: float, episodes: int, steps: int) -> dict[str, float]:
    return {
        "seconds": round(seconds, 3),
        "episodes": episodes,
        "steps": steps,
        "episodes_per_s": round(episodes / seconds, 2),
        "steps_per_s": round(steps / seconds, 1),
    }


def _collect(tasks: str, n: int, workers: int, image_size: int, seed: int, out: Path) -> dict[str, Any]:
    """One `vla-collect` run; end-to-end rates plus the steady state (workers up, no start-up/merge)."""
    import contextlib

    from vla.data.collect import Collector, CollectRequest, resolve_tasks

    request = CollectRequest(out, n, seed=seed, workers=workers, image_size=image_size, quiet=True, merge_every=1e9)
    collector = Collector(request, resolve_tasks(tasks))
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        rc = collector.run()
    if rc != 0:
        raise UserError(f"the collection of {n} episodes per task ({tasks}) into {out} exited with {rc}")
    t = collector.timing
    episodes = sum(st.done for st in collector.state.values())
    steady = _rates(t["episodes_s"], episodes, collector.steps)
    return {
        **_rates(t["total_s"], episodes, collector.steps),
        "startup_s": round(t["startup_s"], 3),
        "final_merge_s": round(t["final_merge_s"], 3),
        "steady_episodes_per_s": steady["episodes_per_s"],
        "steady_steps_per_s": steady["steps_per_s"],
    }


def _jobs(path: Path) -> list[tuple[str, int]]:
    """Every (task, seed) the collection tried, kept or failed, so the in-process runs redo the same work."""
    from vla.data.hdf5_format import demo_meta, demo_names, open_dataset, read_failed_seeds

    with open_dataset(path) as f:
        jobs = [(m["task"], m["seed"]) for m in (demo_meta(f, n) for n in demo_names(f))]
        jobs += [(t, s) for t, seeds in read_failed_seeds(f).items() for s in seeds]
    return sorted(jobs)


def _in_process(jobs, image_size: int, env_args: dict, write_dir: Path) -> tuple[dict, dict, float]:
    """Step every job's expert in this process, timing stepping and writing separately.
    Returns (expert_only rates, expert_and_write rates, write seconds)."""
    import contextlib

    import envs
    from vla.data.collect_worker import make_env, rollout
    from vla.data.hdf5_format import open_dataset, write_dataset, write_episode_file

    for task, _ in jobs:  # build (and warm up) every env outside the timed region
        make_env(task, image_size).reset(seed=0)
    steps, t_step, t_write = 0, 0.0, 0.0
    for i, (task, seed) in enumerate(jobs):
        t0 = time.perf_counter()
        env = make_env(task, image_size)
        ep = rollout(env, envs.make_expert(env, noise=0.0, seed=seed), task, seed)
        t1 = time.perf_counter()
        write_episode_file(write_dir / f"part{i}.hdf5", ep, {**env_args, "tasks": [task]})
        t_step += t1 - t0
        t_write += time.perf_counter() - t1
        steps += ep.num_samples
    t0 = time.perf_counter()  # the parent's merge of the parts into one dataset
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open_dataset(write_dir / f"part{i}.hdf5")) for i in range(len(jobs))]
        write_dataset(write_dir / "merged.hdf5", env_args, [f["data/demo_0"] for f in files])
    t_write += time.perf_counter() - t0
    return _rates(t_step, len(jobs), steps), _rates(t_step + t_write, len(jobs), steps), t_write


def _raw_peer(task: str, image_size: int, steps: int) -> dict[str, float]:
    import mujoco

    from vla.data.collect_worker import make_env

    env = make_env(task, image_size)
    env.reset(seed=0)
    scene = env.unwrapped.scene
    scene.render()
    t0 = time.perf_counter()
    for _ in range(steps):
        mujoco.mj_step(scene.model, scene.data, nstep=scene.n_substeps)
        scene.render()
    seconds = time.perf_counter() - t0
    return {
        "seconds": round(seconds, 3),
        "steps": steps,
        "substeps_per_step": int(scene.n_substeps),
        "steps_per_s": round(steps / seconds, 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vla.data.hdf5_format import open_dataset, read_env_args

    if args.episodes_per_task < 1:
        raise UserError(f"--episodes-per-task must be at least 1, got {args.episodes_per_task}")
    load = os.getloadavg()[0]  # other work on the machine skews the 2-vs-1 figure; it is reported
    with tempfile.TemporaryDirectory(prefix="vla-bench-collect-") as tmp:
        tmp = Path(tmp)
        one = _collect(args.tasks, args.episodes_per_task, 1, args.image_size, args.seed, tmp / "w1.hdf5")
        two = _collect(args.tasks, args.episodes_per_task, 2, args.image_size, args.seed, tmp / "w2.hdf5")
        jobs = _jobs(tmp / "w1.hdf5")
        with open_dataset(tmp / "w1.hdf5") as f:
            env_args = read_env_args(f)
        (tmp / "parts").mkdir()
        only, write, t_write = _in_process(jobs, args.image_size, env_args, tmp / "parts")
        peer = _raw_peer(env_args["tasks"][0], args.image_size, args.raw_steps)
        size_mb = (tmp / "w1.hdf5").stat().st_size / 1e6
    return {
        "config": {
            "tasks": env_args["tasks"],
            "episodes_per_task": args.episodes_per_task,
            "image_size": args.image_size,
            "cpu_count": os.cpu_count(),
            "dataset_mb": round(size_mb, 2),
            "load_avg_before": round(load, 2),
        },
        "collect_1_worker": one,
        "collect_2_workers": two,
        "speedup_2_vs_1": round(one["seconds"] / two["seconds"], 2),
        "steady_speedup_2_vs_1": round(two["steady_steps_per_s"] / one["steady_steps_per_s"], 2),
        "expert_only": only,
        "expert_and_write": write,
        "write_overhead_pct": round(100 * t_write / only["seconds"], 1),
        "write_ms_per_episode": round(1000 * t_write / max(1, len(jobs)), 2),
        "raw_physics_render": peer,
        "env_vs_raw_pct": round(100 * (peer["steps_per_s"] / only["steps_per_s"] - 1), 1),
    }


def format_markdown(r: dict[str, Any]) -> str:
    c = r["config"]
    rows = [
        ("vla-collect, 1 worker", r["collect_1_worker"]),
        ("vla-collect, 2 workers", r["collect_2_workers"]),
        ("expert only, in process (no writing)", r["expert_only"]),
        ("expert + part files + merge, in process (same pass)", r["expert_and_write"]),
    ]
    lines = [
        f"# vla-bench collect ({len(c['tasks'])} tasks x {c['episodes_per_task']} episodes, "
        f"{c['image_size']} px, {c['cpu_count']} CPUs, load {c['load_avg_before']}, dataset {c['dataset_mb']} MB)",
        "",
        "| run | seconds | episodes/s | env steps/s | steady env steps/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, v in rows:
        steady = v.get("steady_steps_per_s", "-")
        lines.append(f"| {name} | {v['seconds']} | {v['episodes_per_s']} | {v['steps_per_s']} | {steady} |")
    p = r["raw_physics_render"]
    one = r["collect_1_worker"]
    lines += [
        f"| peer: raw mj_step x{p['substeps_per_step']} + render | {p['seconds']} | - | {p['steps_per_s']} | - |",
        "",
        f"- 2 workers vs 1: {r['speedup_2_vs_1']}x end to end (start-up {one['startup_s']} s and the final "
        f"merge {one['final_merge_s']} s included), {r['steady_speedup_2_vs_1']}x once the workers run",
        f"- writing (part file + merge) vs stepping alone: +{r['write_overhead_pct']}% "
        f"({r['write_ms_per_episode']} ms per episode)",
        f"- raw physics+render is {r['env_vs_raw_pct']}% faster than env + expert stepping",
        "",
    ]
    return "\n".join(lines)
