"""How does a policy fail at Push? Run it on fresh Push episodes and sort every failure into one kind, from the
simulator's block positions (read here only to measure; no policy sees them):

- untouched: the named block moved less than 1 cm (the policy never got behind it and pushed);
- wrong block: another block moved more than the named one;
- off target: the named block was pushed but ended outside the target (its final and closest distance say how far).

    python scripts/push_failures.py --checkpoint runs/real9 --episodes 50
    python scripts/push_failures.py --checkpoint runs/real6_wrist --episodes 50 --wrist-camera
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from envs import make_env
from vla import load_policy
from vla.cli.common import Parser, run

MOVED_M = 0.01  # a block that moved less than this was not pushed


def run_episode(env, policy, seed: int) -> dict:
    """One episode to success or the time limit; the named block's and the others' displacement, in metres."""
    obs, _ = env.reset(seed=seed)
    task = env.unwrapped
    block_i, target = task.layout.roles["block"], task.layout.target_xy[task.layout.roles["target"]]
    start = np.array([task.scene.block_pos(i)[:2] for i in range(3)])  # (3, 2)
    policy.reset(obs["instruction"])
    closest, success = float(np.linalg.norm(start[block_i] - target)), False
    for _ in range(task.task.max_episode_steps):
        obs, _, success, _, _ = env.step(policy.act(obs))
        closest = min(closest, float(np.linalg.norm(task.scene.block_pos(block_i)[:2] - target)))
        if success:
            break
    end = np.array([task.scene.block_pos(i)[:2] for i in range(3)])  # (3, 2)
    moved = np.linalg.norm(end - start, axis=1)  # (3,)
    return {
        "success": success,
        "named_moved": float(moved[block_i]),
        "other_moved": float(max(m for i, m in enumerate(moved) if i != block_i)),
        "start": float(np.linalg.norm(start[block_i] - target)),
        "final": float(np.linalg.norm(end[block_i] - target)),
        "closest": closest,
    }


def kind(episode: dict) -> str:
    if episode["success"]:
        return "success"
    if episode["other_moved"] > max(episode["named_moved"], MOVED_M):
        return "wrong block"
    return "untouched" if episode["named_moved"] < MOVED_M else "off target"


def main() -> None:
    parser = Parser(prog="push_failures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a run directory trained by vla-train")
    parser.add_argument("--episodes", type=int, default=50, help="Push episodes")
    parser.add_argument("--seed", type=int, default=100000, help="first seed (vla-eval's default)")
    parser.add_argument("--wrist-camera", action="store_true", help="for a policy trained with the wrist camera")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sys.exit(run(parser.prog, lambda: report(args)))  # bad input (checkpoint, GL): one line, exit 2


def report(args) -> None:
    policy = load_policy(args.checkpoint)
    env = make_env("tabletop/Push-v0", wrist_camera=args.wrist_camera)
    episodes = []
    for seed in range(args.seed, args.seed + args.episodes):
        episode = run_episode(env, policy, seed)
        episodes.append(episode)
        print(
            f"seed {seed}: {kind(episode):11s} named block moved {episode['named_moved'] * 100:5.1f} cm, "
            f"to target {episode['start'] * 100:5.1f} -> {episode['final'] * 100:5.1f} cm "
            f"(closest {episode['closest'] * 100:5.1f})",
            flush=True,
        )
    env.close()
    kinds = [kind(e) for e in episodes]
    print(f"\n{args.checkpoint}: {len(episodes)} Push episodes from seed {args.seed}")
    for name in ("success", "untouched", "off target", "wrong block"):
        chosen = [e for e, k in zip(episodes, kinds, strict=True) if k == name]
        detail = ""
        if name == "off target" and chosen:
            finals = np.array([e["final"] for e in chosen]) * 100
            closest = np.array([e["closest"] for e in chosen]) * 100
            detail = f"  (final distance median {np.median(finals):.1f} cm, closest median {np.median(closest):.1f} cm)"
        print(f"  {name:11s} {len(chosen):3d}{detail}")


if __name__ == "__main__":
    main()
