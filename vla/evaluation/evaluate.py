"""Closed-loop evaluation, what `vla-eval --checkpoint DIR --episodes-per-task N --json FILE` runs (vla/cli/eval.py).

Runs the policy on every task it was trained on, with seeds it has not seen (`--seed`, default
100000, far from the collector's), and reports the success rate per task with a Wilson 95% interval,
the mean episode length, and the overall rate, as a table and as JSON:
    {"tasks": {ID: {"success_rate", "episodes", "ci95": [lo, hi], "mean_length"}},
     "overall": {"success_rate", "episodes", "ci95"},
     "policy": {"device", "kv_cache", "readout", ...},   (the settings the policy ran with, in every worker)
     "torch_threads": N}   (per process: --threads in process, 1 in each --workers process)
`--delay-ticks D --strategy NAME [--execute S]` simulates D control ticks of inference delay in simulated
time (vla/control/delay.py, strategies in vla/policy/strategies.py) and adds the smoothness of the executed actions
(mean absolute jerk, the jump at chunk boundaries) per task under "smoothness".
`--server URL [--token T]` evaluates the policy a `vla-serve` runs instead of a local `--checkpoint` (over the
network, vla/policy/remote.py: the same actions, so the same episodes; the server chose the backend and device).
`--instructions` probes language grounding: "swap_colour" names a distractor block instead of the
target, "other_task" gives the instruction of another task in the same scene; a policy that reads
the instruction should then fail. "paraphrase" rephrases the episode's own instruction with the
held-out part of envs/language.py's grammar (same task, same colour words, frames and words training
never used): a policy that understands instructions, not just their templates, should still succeed.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

import envs
from vla.errors import UserError
from vla.evaluation.episode import episode_steps

EVAL_SEED = 100_000  # first evaluation seed; the collector counts up from its own (small) seeds


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (sound at 0% and 100%, unlike p ± z·se)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def summarize(outcomes: dict[str, list[dict]]) -> dict:
    """Per-task and overall success rates with Wilson intervals, from per-episode outcomes."""
    tasks = {}
    for task, eps in outcomes.items():
        wins = sum(e["success"] for e in eps)
        tasks[task] = {
            "success_rate": wins / max(len(eps), 1),
            "episodes": len(eps),
            "ci95": list(wilson_interval(wins, len(eps))),
            "mean_length": float(np.mean([e["length"] for e in eps])) if eps else 0.0,
        }
    wins = sum(e["success"] for eps in outcomes.values() for e in eps)
    n = sum(len(eps) for eps in outcomes.values())
    overall = {"success_rate": wins / max(n, 1), "episodes": n, "ci95": list(wilson_interval(wins, n))}
    return {"tasks": tasks, "overall": overall}


def probe_instruction(env, mode: str, rng: np.random.Generator) -> str:
    """The instruction a grounding probe gives instead of the episode's own (see module doc)."""
    base = env.unwrapped
    layout, own = base.layout, base.instruction
    if mode == "swap_colour":
        target = layout.block_colours[layout.roles["block"]]
        others = [c for i, c in enumerate(layout.block_colours) if c != target and i not in layout.roles.values()]
        others = others or [c for c in layout.block_colours if c != target] or [c for c in envs.PALETTE if c != target]
        return own.replace(f"{target} block", f"{others[rng.integers(len(others))]} block", 1)
    if mode == "other_task":
        names = [n for n in envs.TASK_CLASSES if n != base.task_name]
        other = names[rng.integers(len(names))]
        block = layout.block_colours[layout.roles["block"]]
        words = {
            "block": block,
            "target": layout.target_colours[0],
            "base": next(c for c in layout.block_colours if c != block),
        }
        return envs.instruction_for(other, rng, **words)
    if mode == "paraphrase":
        task = getattr(base, "task_name", env.spec.id)
        colours = envs.parse_instruction(task, own)
        if colours is None:
            raise UserError(f"--instructions paraphrase needs a tabletop task's instruction; {task}: {own!r}")
        return envs.paraphrase(task, colours, rng, envs.HELD_OUT_GRAMMAR)
    raise ValueError(f"unknown instruction probe {mode!r}")


DETAIL_KEYS = ("seed", "success", "length", "instruction")  # what the JSON keeps of each episode


def run_episode(env, policy, seed: int, instructions: str = "own", record: bool = False) -> dict:
    """One closed-loop episode; returns success, length, and the frames if `record`."""
    probe = None
    if instructions != "own":
        probe = lambda obs: probe_instruction(env, instructions, np.random.default_rng(seed))  # noqa: E731
    frames = [] if record else None
    for step in episode_steps(env, policy, seed, instruction=probe):
        if record:
            frames += [step.obs["image"], step.next_obs["image"]] if step.t == 0 else [step.next_obs["image"]]
    success = bool(step.info["success"])
    return {"seed": seed, "success": success, "length": step.t + 1, "instruction": step.instruction, "frames": frames}


def run_task(env, policy, task: str, seeds: list[int], instructions: str, video_dir, n_videos: int,
             delayed: bool = False, done: Callable[[list[dict]], None] | None = None) -> list[dict]:  # fmt: skip
    """Episodes of `task` from each seed; the first `n_videos` saved as videos in `video_dir` (None: none).
    `delayed`: add the DelayedPolicy's smoothness metrics; `done(outcomes)`: called after each episode."""
    outcomes = []
    for k, seed in enumerate(seeds):
        record = video_dir is not None and k < n_videos
        ep = run_episode(env, policy, seed, instructions, record)
        if record:
            save_video(video_path(video_dir, task, seed, ep["success"]), ep["frames"])
        outcomes.append({key: ep[key] for key in DETAIL_KEYS})
        if delayed:
            outcomes[-1].update(policy.episode_metrics())
        if done is not None:
            done(outcomes)
    return outcomes


def video_path(video_dir: str | Path, task: str, seed: int, success: bool) -> Path:
    """Where an episode's video goes: <dir>/<Task-v0>_seed<S>_<success|fail>.mp4."""
    return Path(video_dir) / f"{task.split('/')[-1]}_seed{seed}_{'success' if success else 'fail'}.mp4"


def save_video(path: str | Path, frames: list[np.ndarray], fps: int = 20, scale: int = 4) -> None:
    import imageio.v2 as imageio

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    big = [np.kron(f, np.ones((scale, scale, 1), dtype=np.uint8)) for f in frames]
    imageio.mimwrite(str(path), big, fps=fps, macro_block_size=1)


def evaluate(
    policy,
    tasks: list[str],
    episodes: int,
    seed: int = EVAL_SEED,
    instructions: str = "own",
    video_dir: str | Path | None = None,
    videos_per_task: int = 2,
    progress: bool = True,
    delay: dict | None = None,
) -> dict:
    """Evaluate a loaded policy in this process; returns `summarize`'s dict plus per-episode detail.

    `delay`: DelayedPolicy's arguments (strategy, delay, execute) to run under simulated inference delay."""
    from tqdm import tqdm

    if delay is not None:
        from vla.control.delay import DelayedPolicy

        policy = DelayedPolicy(policy, **delay)
    outcomes: dict[str, list[dict]] = {}
    with tqdm(total=len(tasks) * episodes, desc="eval", disable=not progress, file=sys.stderr) as bar:
        for task in tasks:

            def done(eps: list[dict], name: str = task.split("/")[-1]) -> None:
                bar.update(1)
                bar.set_postfix_str(f"{name} {np.mean([e['success'] for e in eps]):.0%}")

            env = policy_env(task, policy.spec)
            try:
                outcomes[task] = run_task(env, policy, task, [seed + i for i in range(episodes)], instructions,
                                          video_dir, videos_per_task, delay is not None, done)  # fmt: skip
            finally:
                env.close()
    result = summarize(outcomes)
    result["episodes_detail"] = {t: [{k: e[k] for k in DETAIL_KEYS} for e in eps] for t, eps in outcomes.items()}
    if delay is not None:
        from vla.control.delay import summarize_smoothness

        result["smoothness"] = summarize_smoothness(outcomes)
    return result


def open_policy(checkpoint=None, server: str | None = None, token: str | None = None, timeout: float = 10.0,
                **kwargs):  # fmt: skip
    """The checkpoint's policy in this process (`load_policy(checkpoint, **kwargs)`), or the one a vla-serve at
    `server` runs, over the network (`RemotePolicy`; kwargs are then PolicyConfig overrides only)."""
    if server is None:
        from vla.policy.load import load_policy

        return load_policy(checkpoint, **kwargs)
    from vla.policy.remote import RemotePolicy

    return RemotePolicy(server, token=token, timeout=timeout, **kwargs)


def policy_env(task: str, spec):
    """`task`'s env as a policy with data spec `spec` sees it: its image size, and the wrist camera when it
    reads two cameras."""
    return envs.make_env(task, spec.image_size, wrist_camera=spec.n_cameras > 1)


def policy_info(policy) -> dict:
    """How the evaluated policy runs (reported in the JSON, and checked equal across workers)."""
    from vla.config import to_dict

    return {"device": str(policy.device), **to_dict(policy.config)}


WORKER_THREADS = 1  # torch threads in each --workers process: N processes share the cores, one thread each


def _worker(job: tuple) -> tuple[str, list[dict], dict]:
    checkpoint, policy_kwargs, task, seeds, instructions, video_dir, n_videos, delay = job
    import torch

    torch.set_num_threads(WORKER_THREADS)
    policy = info_of = open_policy(checkpoint, **policy_kwargs)
    if delay is not None:
        from vla.control.delay import DelayedPolicy

        policy = DelayedPolicy(policy, **delay)
    env = policy_env(task, policy.spec)
    eps = run_task(env, policy, task, seeds, instructions, video_dir, n_videos, delay is not None)
    env.close()
    return task, eps, policy_info(info_of)


def evaluate_parallel(
    checkpoint, tasks, episodes, seed, instructions, video_dir, workers, policy_kwargs: dict | None = None,
    delay: dict | None = None, progress: bool = True,
) -> dict:  # fmt: skip
    """Split (task, seed) jobs over `workers` processes, each with its own policy copy.

    `policy_kwargs` go to every worker's `open_policy` (device, kv_cache; or server, token: each worker
    its own connection), as in the single-process path; `delay` as in `evaluate`."""
    import multiprocessing as mp

    from tqdm import tqdm

    jobs = []
    per_job = max(1, episodes // workers)
    for task in tasks:
        seeds = [seed + i for i in range(episodes)]
        for k in range(0, episodes, per_job):
            n_videos = 2 if k == 0 else 0
            job = (str(checkpoint), policy_kwargs or {}, task, seeds[k : k + per_job], instructions, video_dir,
                   n_videos, delay)  # fmt: skip
            jobs.append(job)
    outcomes: dict[str, list[dict]] = {t: [] for t in tasks}
    infos = []
    with mp.get_context("spawn").Pool(workers) as pool:
        results = pool.imap_unordered(_worker, jobs)
        for task, eps, info in tqdm(results, total=len(jobs), desc="eval", file=sys.stderr, disable=not progress):
            outcomes[task].extend(eps)
            infos.append(info)
    for eps in outcomes.values():
        eps.sort(key=lambda ep: ep["seed"])  # the jobs finish in any order; the JSON lists episodes by seed
    if any(info != infos[0] for info in infos):
        raise RuntimeError(f"the eval workers ran different policy settings: {infos}")
    result = summarize(outcomes)
    result["episodes_detail"] = outcomes
    result["policy"] = infos[0]
    if delay is not None:
        from vla.control.delay import summarize_smoothness

        result["smoothness"] = summarize_smoothness(outcomes)
    return result


def add_expert_rates(result: dict, experts: dict, seed: int, where: str) -> None:
    """Put the scripted expert's success rate (`python -m envs --json`) beside each evaluated task."""
    if experts.get("seed", seed) != seed:
        raise ValueError(f"{where} was measured from seed {experts['seed']}, this evaluation starts at {seed}")
    rows = {r["task"]: r for r in experts.get("rows", [])}
    for task, r in result["tasks"].items():
        if task in rows:
            r["expert_success_rate"] = rows[task]["success_rate"]
            r["expert_episodes"] = rows[task]["episodes"]


def format_table(result: dict, title: str = "") -> str:
    lines = [title] if title else []
    with_expert = any("expert_success_rate" in r for r in result["tasks"].values())
    lines += [
        "| task | success | 95% CI | episodes | mean length |" + (" expert (same seeds) |" if with_expert else "")
    ]
    lines += ["|---|---|---|---|---|" + ("---|" if with_expert else "")]
    for task, r in result["tasks"].items():
        lo, hi = r["ci95"]
        cells = [
            task,
            f"{r['success_rate']:.0%}",
            f"[{lo:.0%}, {hi:.0%}]",
            str(r["episodes"]),
            f"{r['mean_length']:.1f}",
        ]
        if with_expert:
            e = r.get("expert_success_rate")
            cells.append("-" if e is None else f"{e:.0%} ({r['expert_episodes']})")
        lines.append("| " + " | ".join(cells) + " |")
    o = result["overall"]
    lo, hi = o["ci95"]
    row = f"| **overall** | **{o['success_rate']:.0%}** | [{lo:.0%}, {hi:.0%}] | {o['episodes']} | |"
    if with_expert:
        rates = [r["expert_success_rate"] for r in result["tasks"].values() if "expert_success_rate" in r]
        row += f" {sum(rates) / len(rates):.0%} (mean) |"
    lines.append(row)
    return "\n".join(lines)


def delay_options(delay_ticks: int | None, strategy: str | None, execute: int) -> dict | None:
    """`--delay-ticks/--strategy/--execute` checked (UserError on bad input) -> DelayedPolicy's arguments,
    or None when neither a delay nor a strategy was asked for (today's evaluation)."""
    from vla.policy.strategies import check_strategy_options

    if delay_ticks is None and strategy is None:
        return None
    delay_ticks = 0 if delay_ticks is None else delay_ticks
    strategy = strategy or "blocking"
    if delay_ticks < 0:
        raise UserError(f"--delay-ticks must be >= 0, got {delay_ticks}")
    check_strategy_options(strategy, execute)
    return {"strategy": strategy, "delay": delay_ticks, "execute": execute}


def delay_report(delay: dict, chunk: int) -> dict:
    """What the delay simulation ran with, for the JSON (execute as requested and as capped by the chunk)."""
    from vla.policy.strategies import make_strategy

    s = make_strategy(delay["strategy"], chunk, min(delay["execute"], chunk))
    return {"delay_ticks": delay["delay"], "strategy": delay["strategy"], "execute": delay["execute"],
            "execute_effective": s.execute_for(delay["delay"]), "chunk": chunk}  # fmt: skip
