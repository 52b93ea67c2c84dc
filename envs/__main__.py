"""Run the scripted experts and show what they did: `python -m envs --episodes 100`.

Prints, per task, the expert's success rate over seeded episodes, its mean episode length, and the
environment's speed with rendering vs. raw physics (the same expert actions, no pixels); optionally
writes a contact sheet of the tasks' first frames.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import gymnasium as gym
import numpy as np
from tqdm import tqdm

import envs


def expert_episode(env, expert, seed: int, render: bool) -> tuple[bool, int]:
    """One expert episode; with render=False only physics runs (the expert reads the true state)."""
    base = env.unwrapped
    obs, _ = env.reset(seed=seed)
    expert.reset()
    for t in range(1, env.spec.max_episode_steps + 1):
        action = expert.act(obs)
        if render:
            obs, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                return info["success"], t
        elif hasattr(base, "step_physics"):  # external envs (envs/metaworld.py) time their physics alone
            if base.step_physics(action):
                return True, t
        else:
            base.scene.apply_action(action)
            base.scene.step_physics()
            if base.task.success(base.scene, base.layout):
                return True, t
    return False, env.spec.max_episode_steps


def measure(
    task_id: str, episodes: int, seed: int, image_size: int, noise: float, physics_only: bool = False, **expert_args
) -> dict:
    """The expert's success and episode length over `episodes` seeds, and the env's speed. With
    `physics_only` the episodes run without pixels (the same outcomes: the experts read the true state)
    and the rendered speed is timed on the first 5 seeds only."""
    env = gym.make(task_id, image_size=image_size)
    expert = envs.make_expert(env, noise=noise, seed=seed, **expert_args)
    outcomes, steps, start = [], 0, time.perf_counter()
    for i in tqdm(range(min(episodes, 5) if physics_only else episodes), desc=task_id, leave=False, file=sys.stderr):
        success, length = expert_episode(env, expert, seed + i, render=True)
        outcomes.append((success, length))
        steps += length
    rendered_sps = steps / (time.perf_counter() - start)
    if physics_only:  # a fresh expert: its noise stream from the start, as in a rendered run
        expert = envs.make_expert(env, noise=noise, seed=seed, **expert_args)
        outcomes = [expert_episode(env, expert, seed + i, render=False) for i in range(episodes)]
    physics_steps, start = 0, time.perf_counter()
    for i in range(min(episodes, 20)):
        physics_steps += expert_episode(env, expert, seed + i, render=False)[1]
    physics_sps = physics_steps / (time.perf_counter() - start)
    env.close()
    successes = [s for s, _ in outcomes]
    return {
        "task": task_id,
        "episodes": episodes,
        "success_rate": float(np.mean(successes)),
        "mean_length": float(np.mean([n for _, n in outcomes])),
        "max_episode_steps": gym.spec(task_id).max_episode_steps,
        "steps_per_s_rendered": rendered_sps,
        "steps_per_s_physics": physics_sps,
    }


def contact_sheet(path: str, image_size: int, seed: int, tasks: list[str]) -> None:
    """First frames of every task side by side, with their instructions, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks), 3.6), squeeze=False)
    for k, (ax, task_id) in enumerate(zip(axes[0], tasks, strict=True)):
        env = gym.make(task_id, image_size=image_size)
        obs, _ = env.reset(seed=seed + k)
        ax.imshow(obs["image"])
        ax.set_title(f'{task_id.split("/")[1]}\n"{obs["instruction"]}"', fontsize=8)
        ax.axis("off")
        env.close()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


class _Parser(argparse.ArgumentParser):
    """argparse with the console scripts' convention (vla/cli/common.py): a usage error is one line, exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m envs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="all", help="all, metaworld/mt10, or comma-separated task ids/names")
    parser.add_argument("--episodes", type=int, default=20, help="seeded episodes per task")
    parser.add_argument("--seed", type=int, default=0, help="first seed; episode i uses seed + i")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--noise", type=float, default=0.0, help="std of the expert's action noise")
    parser.add_argument("--perturb", type=float, default=0.0, help="chance per tick of a 2-5 tick perturbation")
    parser.add_argument("--detour", type=float, default=0.0, help="chance per episode of a detour (vla-collect)")
    parser.add_argument("--json", help="also write the table as JSON here")
    parser.add_argument("--contact-sheet", help="write a PNG of every task's first frame here")
    parser.add_argument(
        "--physics-only", action="store_true", help="success rates without rendering (same outcomes, much faster)"
    )
    parser.add_argument(
        "--render-bench", metavar="TASK", help="only time Meta-World's stock vs. fast rendering of TASK (e.g. reach-v3)"
    )
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be at least 1, got {args.episodes}")
    if not 0 <= args.perturb < 1 or not 0 <= args.detour <= 1:
        parser.error(f"--perturb must be in [0, 1) and --detour in [0, 1], got {args.perturb} and {args.detour}")
    if not 16 <= args.image_size <= 640:
        parser.error(f"--image-size must be between 16 and 640 pixels, got {args.image_size}")
    try:
        if args.render_bench:
            from envs.metaworld import bench_render

            print(json.dumps(bench_render(args.render_bench.removeprefix("metaworld/"), args.image_size)))
            return 0
        tasks = envs.expand_tasks(args.tasks)
        try:
            envs.check_detour(tasks, args.detour)
        except ValueError as e:
            parser.error(str(e))
        if args.contact_sheet:
            contact_sheet(args.contact_sheet, max(args.image_size, 128), args.seed, tasks)
        expert_args = {"perturb": args.perturb, "detour": args.detour}
        rows = [
            measure(t, args.episodes, args.seed, args.image_size, args.noise, args.physics_only, **expert_args)
            for t in tasks
        ]
    except (envs.UnknownTask, envs.RenderingUnavailable) as e:  # bad input or no GL; anything else is a bug
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    header = [
        "task",
        "expert success",
        "mean length",
        "max steps",
        f"steps/s ({args.image_size}px)",
        "physics steps/s",
    ]
    print("| " + " | ".join(header) + " |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        cells = [
            r["task"],
            f"{r['success_rate']:.0%} ({r['episodes']} seeds)",
            f"{r['mean_length']:.1f}",
            str(r["max_episode_steps"]),
            f"{r['steps_per_s_rendered']:.0f}",
            f"{r['steps_per_s_physics']:.0f}",
        ]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "seed": args.seed}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
