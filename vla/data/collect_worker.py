"""What a vla-collect worker process runs: one expert episode (vla/evaluation/episode.py's loop), written as a
complete one-demo dataset in `OUT.parts/` (temporary name, fsync, atomic rename), or a small marker file for a
failed seed. vla/data/collect.py schedules the jobs and merges the parts.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vla.data.hdf5_format import Episode, write_episode_file
from vla.evaluation.episode import episode_steps
from vla.files import atomic_write

PART_SUFFIX = ".hdf5"
FAILED_SUFFIX = ".failed.json"


class Demonstrator:
    """The episode loop's actor for collection: the expert acts (or a `driver` policy does, DAgger, until
    `takeover`), and every tick records the physics state before the action and the expert's clean label."""

    def __init__(self, env, expert, driver=None, takeover: int | None = None):
        self.base, self.expert, self.driver, self.takeover = env.unwrapped, expert, driver, takeover
        self.states: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []

    def reset(self, instruction: str) -> None:
        self.expert.reset()
        if self.driver is not None:
            self.driver.reset(instruction)

    def act(self, obs: dict) -> np.ndarray:
        self.states.append(self.base.get_state())
        action = np.clip(np.asarray(self.expert.act(obs), dtype=np.float32), -1.0, 1.0)  # the expert's phases advance
        if self.driver is not None and (self.takeover is None or len(self.labels) < self.takeover):
            action = np.clip(np.asarray(self.driver.act(obs), dtype=np.float32), -1.0, 1.0)
        self.labels.append(self.expert.clean_action)
        return action


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
    actor = Demonstrator(env, expert, driver, takeover)
    frames: dict[str, list[np.ndarray]] = {}
    actions, rewards = [], []
    for step in episode_steps(env, actor, seed):
        if step.t == 0:
            keys = [k for k in step.obs if k != "instruction"]
            privileged = [k for k in ("object", "object_px") if k in step.obs_info]  # robomimic's obs/object
            frames = {k: [] for k in keys + privileged}
        for k in keys:
            frames[k].append(step.obs[k])
        for k in privileged:
            frames[k].append(np.asarray(step.obs_info[k], dtype=np.float32))
        actions.append(step.action)
        rewards.append(step.reward)
    dones = np.zeros(len(actions), dtype=np.uint8)
    dones[-1] = 1
    return Episode(
        task=task,
        seed=int(seed),
        instruction=step.instruction,
        actions=np.stack(actions),
        rewards=np.asarray(rewards, dtype=np.float32),
        dones=dones,
        states=np.stack(actor.states).astype(np.float64),
        obs={k: np.stack(v) for k, v in frames.items()},
        success=bool(step.info.get("success", False)),
        expert_actions=np.stack(actor.labels) if labelled or driver is not None else None,
    )


_ENVS: dict[tuple[str, int, bool], Any] = {}  # per worker process: one env per (task, image_size, wrist_camera)
_DRIVERS: dict[str, Any] = {}  # per worker process: the --driver policy, loaded once


def init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def make_env(task: str, image_size: int, wrist_camera: bool = False):
    """The env for `task` (cached per process), built the way `env_args` says to rebuild it."""
    key = (task, image_size, wrist_camera)
    if key not in _ENVS:
        import envs

        _ENVS[key] = envs.make_env(task, image_size, wrist_camera)
    return _ENVS[key]


def load_driver(checkpoint: str):
    """The --driver policy (cached per process), on the CPU with one thread: workers run side by side."""
    if checkpoint not in _DRIVERS:
        import torch

        from vla.policy.load import load_policy

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
