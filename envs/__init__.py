"""MuJoCo tabletop task suite: `import envs` registers the tasks with gymnasium (see README)."""

import os

# Offscreen rendering by default (EGL, falling back to OSMesa); must be chosen before mujoco loads GL.
os.environ.setdefault("MUJOCO_GL", "egl")

import gymnasium as gym  # noqa: E402

from envs.rendering import RenderingUnavailable  # noqa: E402
from envs.scene import CONTROL_HZ  # noqa: E402
from envs.tabletop_env import EXPERT_CLASSES, TASK_CLASSES, TabletopEnv, UnknownTask  # noqa: E402

_IDS = {"reach": "tabletop/Reach-v0", "push": "tabletop/Push-v0", "pick_place": "tabletop/PickPlace-v0",
        "stack": "tabletop/Stack-v0"}  # fmt: skip
TASKS: list[str] = list(_IDS.values())

for _task, _id in _IDS.items():
    if _id not in gym.registry:
        gym.register(
            id=_id,
            entry_point="envs.tabletop_env:TabletopEnv",
            kwargs={"task": _task},
            max_episode_steps=TASK_CLASSES[_task].max_episode_steps,
        )


def make_expert(env: gym.Env, noise: float = 0.0, seed: int | None = None):
    """The scripted expert for `env`'s task. `noise` is the std of Gaussian noise added to a[:3]."""
    base = env.unwrapped
    if not isinstance(base, TabletopEnv):
        raise TypeError(f"make_expert needs a tabletop environment, got {type(base).__name__}")
    return EXPERT_CLASSES[base.task_name](base, noise=noise, seed=seed)


def task_id(name: str) -> str:
    """Gymnasium id of a task given its short name ("pick_place") or id."""
    if name in TASKS:
        return name
    if name in _IDS:
        return _IDS[name]
    raise UnknownTask(f"unknown task {name!r}; choose from {', '.join(TASKS)} (or {', '.join(_IDS)})")


__all__ = ["TASKS", "CONTROL_HZ", "TabletopEnv", "make_expert", "task_id", "RenderingUnavailable", "UnknownTask"]
