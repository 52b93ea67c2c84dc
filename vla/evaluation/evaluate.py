"""Closed-loop evaluation: `vla-eval --checkpoint DIR --episodes-per-task N --json FILE`.

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

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from vla.cli import common as cli
from vla.errors import UserError

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
    from envs.tasks.base import PALETTE

    base = env.unwrapped
    layout, own = base.layout, base.instruction
    if mode == "swap_colour":
        target = layout.block_colours[layout.roles["block"]]
        others = [c for i, c in enumerate(layout.block_colours) if c != target and i not in layout.roles.values()]
        others = others or [c for c in layout.block_colours if c != target] or [c for c in PALETTE if c != target]
        return own.replace(f"{target} block", f"{others[rng.integers(len(others))]} block", 1)
    if mode == "other_task":
        from envs.tabletop_env import TASK_CLASSES

        names = [n for n in TASK_CLASSES if n != base.task_name]
        other = TASK_CLASSES[names[rng.integers(len(names))]]()
        block = layout.block_colours[layout.roles["block"]]
        words = {
            "block": block,
            "target": layout.target_colours[0],
            "base": next(c for c in layout.block_colours if c != block),
        }
        return other.phrase(rng, **words)
    if mode == "paraphrase":
        from envs import language

        task = getattr(base, "task_name", env.spec.id)
        colours = language.parse(task, own)
        if colours is None:
            raise UserError(f"--instructions paraphrase needs a tabletop task's instruction; {task}: {own!r}")
        return language.paraphrase(task, colours, rng, language.HELD_OUT)
    raise ValueError(f"unknown instruction probe {mode!r}")


DETAIL_KEYS = ("seed", "success", "length", "instruction")  # what the JSON keeps of each episode


def run_episode(env, policy, seed: int, instructions: str = "own", record: bool = False) -> dict:
    """One closed-loop episode; returns success, length, and the frames if `record`."""
    obs, info = env.reset(seed=seed)
    instruction = obs["instruction"]
    if instructions != "own":
        instruction = probe_instruction(env, instructions, np.random.default_rng(seed))
    policy.reset(instruction)
    frames = [obs["image"]] if record else None
    success, length = False, 0
    for length in range(1, env.spec.max_episode_steps + 1):  # noqa: B007 - length is the result
        obs, _, terminated, truncated, info = env.step(policy.act(obs))
        if record:
            frames.append(obs["image"])
        if terminated or truncated:
            break
    success = bool(info["success"])
    return {"seed": seed, "success": success, "length": length, "instruction": instruction, "frames": frames}


def video_path(video_dir: str | Path, task: str, seed: int, success: bool) -> Path:
    """Where an episode's video goes: <dir>/<Task-v0>_seed<S>_<success|fail>.mp4."""
    return Path(video_dir) / f"{task.split('/')[-1]}_seed{seed}_{'success' if success else 'fail'}.mp4"


def save_video(path: str | Path, frames: list[np.ndarray], fps: int = 20, scale: int = 4) -> None:
    import imageio.v2 as imageio

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    big = [np.kron(f, np.ones((scale, scale, 1), dtype=np.uint8)) for f in frames]
    imageio.mimwrite(str(path), big, fps=fps, macro_block_size=1)


def policy_env(task: str, spec):
    """`task`'s env as a policy with data spec `spec` sees it: its image size, and the wrist camera when it
    reads two cameras (a tabletop option: `vla-collect --wrist-camera`)."""
    import gymnasium as gym

    import envs  # noqa: F401 - registers the tasks

    extra = {"wrist_camera": True} if spec.n_cameras > 1 else {}
    return gym.make(task, image_size=spec.image_size, **extra)


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
    bar = tqdm(total=len(tasks) * episodes, desc="eval", disable=not progress, file=sys.stderr)
    for task in tasks:
        env = policy_env(task, policy.spec)
        outcomes[task] = []
        for i in range(episodes):
            record = video_dir is not None and i < videos_per_task
            ep = run_episode(env, policy, seed + i, instructions, record)
            if record:
                save_video(video_path(video_dir, task, seed + i, ep["success"]), ep["frames"])
            ep.pop("frames")
            if delay is not None:
                ep.update(policy.episode_metrics())
            outcomes[task].append(ep)
            bar.update(1)
            rate = np.mean([e["success"] for e in outcomes[task]])
            bar.set_postfix_str(f"{task.split('/')[-1]} {rate:.0%}")
        env.close()
    bar.close()
    result = summarize(outcomes)
    result["episodes_detail"] = {t: [{k: e[k] for k in DETAIL_KEYS} for e in eps] for t, eps in outcomes.items()}
    if delay is not None:
        from vla.control.delay import summarize_smoothness

        result["smoothness"] = summarize_smoothness(outcomes)
    return result


def policy_info(policy) -> dict:
    """How the evaluated policy runs (reported in the JSON, and checked equal across workers)."""
    from vla.config import to_dict

    return {"device": str(policy.device), **to_dict(policy.config)}


WORKER_THREADS = 1  # torch threads in each --workers process: N processes share the cores, one thread each


def _worker(job: tuple) -> tuple[str, list[dict], dict]:
    checkpoint, policy_kwargs, task, seeds, instructions, video_dir, n_videos, delay = job
    import torch

    torch.set_num_threads(WORKER_THREADS)
    policy = info_of = cli.open_policy(checkpoint, **policy_kwargs)
    if delay is not None:
        from vla.control.delay import DelayedPolicy

        policy = DelayedPolicy(policy, **delay)
    env = policy_env(task, policy.spec)
    eps = []
    for k, s in enumerate(seeds):
        record = video_dir is not None and k < n_videos
        ep = run_episode(env, policy, s, instructions, record)
        if record:
            save_video(video_path(video_dir, task, s, ep["success"]), ep["frames"])
        eps.append({k: ep[k] for k in DETAIL_KEYS})
        if delay is not None:
            eps[-1].update(policy.episode_metrics())
    env.close()
    return task, eps, policy_info(info_of)


def evaluate_parallel(
    checkpoint, tasks, episodes, seed, instructions, video_dir, workers, policy_kwargs: dict | None = None,
    delay: dict | None = None, progress: bool = True,
) -> dict:  # fmt: skip
    """Split (task, seed) jobs over `workers` processes, each with its own policy copy.

    `policy_kwargs` go to every worker's `cli.open_policy` (device, kv_cache; or server, token: each worker
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vla-eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (vla-train --out)")
    cli.add_server(parser)
    parser.add_argument("--episodes-per-task", type=int, default=50, help="episodes per task (default 50)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--seed", type=int, default=EVAL_SEED, help=f"first seed (default {EVAL_SEED})")
    parser.add_argument("--tasks", default="trained", help="'trained' (the checkpoint's tasks), 'all', or ids")
    parser.add_argument("--video", help="write a few episodes per task as mp4 into this directory")
    parser.add_argument("--workers", type=int, default=1, help="parallel worker processes (default 1)")
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda if available)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch threads of the in-process evaluation (default: torch's, every core; set 1 beside a training "
        "run); --workers processes use 1 each",
    )
    parser.add_argument("--no-kv-cache", action="store_true", help="recompute the window every step")
    cli.add_policy_overrides(parser)
    cli.add_backend(parser)
    parser.add_argument(
        "--instructions",
        choices=["own", "swap_colour", "other_task", "paraphrase"],
        default="own",
        help="grounding probe: give each episode a wrong instruction (swap_colour, other_task) or a held-out "
        "rephrasing of its own (paraphrase); default: its own",
    )
    parser.add_argument(
        "--delay-ticks",
        type=int,
        default=None,
        metavar="D",
        help="simulate D control ticks of inference delay (simulated time; see vla/control/delay.py)",
    )
    parser.add_argument(
        "--strategy",
        default=None,
        metavar="NAME",
        help="execution strategy under delay: blocking (default), chunk, synchronous, ensemble, delay_aware "
        "(vla/policy/strategies.py)",
    )
    parser.add_argument(
        "--execute",
        type=int,
        default=0,
        metavar="S",
        help="actions executed per chunk by chunk / delay_aware (default 0: as many as chunk - D)",
    )
    parser.add_argument(
        "--attention",
        metavar="DIR",
        help="save attention figures (first action token over image patches and words) for one episode per task",
    )
    parser.add_argument("--attention-steps", default="0,10,20", help="rollout steps to draw (default 0,10,20)")
    parser.add_argument(
        "--experts",
        metavar="FILE",
        help="`python -m envs --json` output for the same first seed: the expert's rate beside each task",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("MUJOCO_GL", "egl")
    return cli.run("vla-eval", lambda: _run(args))


def _evaluate_in_process(policy, tasks: list[str], args, delay: dict | None, before: int) -> dict:
    """`evaluate` at `--threads` torch threads (default: load_policy's), then the caller's count `before` again
    (tests and notebooks keep their own setting)."""
    import torch

    torch.set_num_threads(args.threads or torch.get_num_threads())
    try:
        result = evaluate(policy, tasks, args.episodes_per_task, args.seed, args.instructions, args.video, delay=delay)
        result["torch_threads"] = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    result["policy"] = policy_info(policy)
    return result


def _run(args) -> int:
    import torch

    import envs

    caller_threads = torch.get_num_threads()  # load_policy sets the step's; the in-process evaluation gives it back

    local = {"--backend": args.backend != "torch", "--device": args.device is not None,
             "--threads": args.threads is not None, "--attention": args.attention is not None}  # fmt: skip
    cli.check_policy_source(args, local)
    if args.episodes_per_task < 1:
        raise UserError(f"--episodes-per-task must be at least 1, got {args.episodes_per_task}")
    if args.workers < 1:
        raise UserError(f"--workers must be at least 1, got {args.workers}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    if args.threads is not None and args.workers > 1:
        raise UserError("--threads sets the in-process evaluation's threads; with --workers each process uses 1")
    if args.backend != "torch" and args.attention:
        raise UserError(f"--backend {args.backend} has no attention figures (they read torch's attention maps)")
    delay = delay_options(args.delay_ticks, args.strategy, args.execute)
    policy_kwargs = {"device": cli.device(args.device), "backend": args.backend, **cli.policy_overrides(args.policy)}
    if args.server is not None:  # the server's backend and device; ours are PolicyConfig overrides only
        policy_kwargs = {"server": args.server, "token": args.token, **cli.policy_overrides(args.policy)}
    if args.no_kv_cache:
        policy_kwargs["kv_cache"] = False
    policy = cli.open_policy(args.checkpoint, **policy_kwargs)
    trained = policy.meta.get("tasks") or envs.TASKS
    if args.tasks == "trained":
        tasks = list(trained)
    elif args.tasks == "all":
        tasks = list(envs.TASKS)
    else:
        tasks = envs.expand_tasks(args.tasks)  # ids, short names or a suite ("metaworld/mt10")
    if args.attention:
        from vla.evaluation.attention import attention_rollout

        try:
            steps = [int(s) for s in args.attention_steps.split(",") if s.strip()]
        except ValueError:
            got = args.attention_steps
            raise UserError(f"--attention-steps: expected comma-separated integers, got {got!r}") from None
        for task in tasks:
            paths = attention_rollout(policy, task, args.seed, steps, args.attention)
            print(f"{task}: {len(paths)} attention figures in {args.attention}")
        if not args.json:
            return 0  # figures only; pass --json to evaluate as well
    start = time.perf_counter()
    if args.workers > 1:
        result = evaluate_parallel(
            args.checkpoint, tasks, args.episodes_per_task, args.seed, args.instructions,
            args.video, args.workers, policy_kwargs, delay,
        )  # fmt: skip
        result["torch_threads"] = WORKER_THREADS
    else:
        result = _evaluate_in_process(policy, tasks, args, delay, caller_threads)
    if args.experts:
        add_expert_rates(result, json.loads(Path(args.experts).read_text()), args.seed, args.experts)
    result["seconds"] = time.perf_counter() - start
    result["instructions"] = args.instructions
    result["checkpoint"] = str(args.checkpoint if args.server is None else policy.metadata["checkpoint"])
    result["backend"] = args.backend if args.server is None else policy.metadata["backend"]
    result["server"] = args.server
    if delay is not None:
        result["delay"] = delay_report(delay, policy.chunk)
    title = f"checkpoint {result['checkpoint']}, instructions: {args.instructions}"
    if args.server is not None:
        title += f", served by {args.server}"
    if delay is not None:
        d, sm = result["delay"], result["smoothness"]["overall"]
        title += (f", delay {d['delay_ticks']} ticks, strategy {d['strategy']} (execute {d['execute_effective']}); "
                  f"jerk {sm['jerk']:.4f}, boundary jump {sm['boundary_jump']:.4f}")  # fmt: skip
    print(format_table(result, title))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
