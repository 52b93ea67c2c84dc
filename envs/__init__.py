"""MuJoCo tabletop task suite: `import envs` registers the tasks with gymnasium (see README).

This module is envs' public API: code outside envs/ (vla/ in particular) imports only what `__all__` lists,
never envs' submodules, so the scene, the tasks and the rendering can change behind it.
"""

import os

# Offscreen rendering by default (EGL, falling back to OSMesa); must be chosen before mujoco loads GL.
os.environ.setdefault("MUJOCO_GL", "egl")

import gymnasium as gym  # noqa: E402

from envs import metaworld as _metaworld  # noqa: E402
from envs.language import HELD_OUT as HELD_OUT_GRAMMAR  # noqa: E402
from envs.language import (
    TRAIN_VOCABULARY,  # noqa: E402
    paraphrase,  # noqa: E402
)
from envs.language import augment as augment_instruction  # noqa: E402
from envs.language import parse as parse_instruction  # noqa: E402
from envs.language import task_name as tabletop_task_name  # noqa: E402
from envs.rendering import RenderingUnavailable  # noqa: E402
from envs.scene import CONTROL_HZ, WORKSPACE_HIGH, WORKSPACE_LOW  # noqa: E402
from envs.tabletop_env import EXPERT_CLASSES, TASK_CLASSES, TabletopEnv, UnknownTask  # noqa: E402
from envs.tasks.base import PALETTE  # noqa: E402

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

# External benchmarks: registered only when their package is installed (`pip install -e '.[metaworld]'`).
# Kept out of TASKS, so `--tasks all` and the tabletop suite's tests mean what they meant.
SUITES: dict[str, list[str]] = _metaworld.register()  # {} without Meta-World
METAWORLD_TASKS: list[str] = SUITES.get(_metaworld.SUITE, [])  # MT10 (goal in the proprio)
_EXTERNAL: list[str] = [t for ids in SUITES.values() for t in ids]  # ... and the pixels-only twins
_EXTERNAL_PREFIXES = _metaworld.PREFIXES  # metaworld/, metaworld-pixels/, metaworld-lerobot/
# LeRobot's MT50 difficulty splits as task ids, {"easy": [...28], "medium": [...11], "hard": [...6],
# "very_hard": [...5]} (envs/metaworld_lerobot.py): constants, present without Meta-World too, so a report
# can group a copied run's results anywhere.
_MT50 = _metaworld.lerobot
MT50_SPLITS: dict[str, list[str]] = {
    split: [_MT50.PREFIX + t for t in tasks] for split, tasks in _MT50.DIFFICULTY_TO_TASKS.items()
}


def make_env(task: str, image_size: int = 64, wrist_camera: bool = False, **options) -> gym.Env:
    """`task`'s env (gymnasium id or short name) rendering `image_size` pixels square; `wrist_camera`: the
    gripper's camera too (obs["wrist_image"]; a tabletop option, other suites have none). `options`: the rest
    of a dataset's `env_args["env_kwargs"]`, to rebuild the env it was collected in."""
    extra = {"wrist_camera": True} if wrist_camera else {}
    return gym.make(task_id(task), image_size=image_size, **extra, **options)


def instruction_for(task: str, rng, **colours: str) -> str:
    """An instruction for the tabletop task `task` (short name) naming these colour words (block, target, base)."""
    return TASK_CLASSES[task]().phrase(rng, **colours)


def make_expert(env: gym.Env, noise: float = 0.0, seed: int | None = None, perturb: float = 0.0, detour: float = 0.0):
    """The scripted expert for `env`'s task. `noise` is the std of Gaussian noise added to a[:3];
    `perturb` the chance per tick of a burst of a few ticks in one random direction; `detour` the chance
    per episode of starting from where cloned policies fail (envs/tasks/base.py, `Expert`)."""
    base = env.unwrapped
    if hasattr(base, "expert"):  # envs that bring their own expert (envs/metaworld.py)
        if detour:
            raise ValueError(f"{base.task_name}: its expert has no detour pose (detour={detour})")
        extra = {"perturb": perturb} if perturb else {}  # the env contract is expert(noise, seed)
        return base.expert(noise=noise, seed=seed, **extra)
    if not isinstance(base, TabletopEnv):
        raise TypeError(f"make_expert needs a tabletop environment, got {type(base).__name__}")
    return EXPERT_CLASSES[base.task_name](base, noise=noise, seed=seed, perturb=perturb, detour=detour)


def check_detour(tasks: list[str], detour: float) -> None:
    """Refuse a detour for tasks whose expert has none to take (the external suites): ValueError, one line."""
    if detour and (external := [t for t in tasks if t not in TASKS]):
        raise ValueError(f"--detour is for the tabletop tasks; {', '.join(external)} have no detour pose")


def task_id(name: str) -> str:
    """Gymnasium id of a task given its short name ("pick_place") or id."""
    if name in TASKS:
        return name
    if name in _IDS:
        return _IDS[name]
    if name in _EXTERNAL:
        return name
    if name.startswith(_EXTERNAL_PREFIXES) and not _EXTERNAL:
        raise UnknownTask(f"{name} needs Meta-World: pip install -e '.[metaworld]'")
    raise UnknownTask(f"unknown task {name!r}; choose from {', '.join(TASKS + METAWORLD_TASKS)} (or {', '.join(_IDS)})")


def expand_tasks(spec: str) -> list[str]:
    """Task ids from "all" (the tabletop suite), a suite ("metaworld/mt10") or comma-separated ids/names."""
    tasks: list[str] = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        if name.startswith(_EXTERNAL_PREFIXES) and not _EXTERNAL:
            raise UnknownTask(f"{name} needs Meta-World: pip install -e '.[metaworld]'")
        ids = TASKS if name == "all" else SUITES.get(name) or [task_id(name)]
        tasks += [t for t in ids if t not in tasks]
    return tasks


__all__ = [
    # tasks and how to build them
    "TASKS", "METAWORLD_TASKS", "SUITES", "MT50_SPLITS", "CONTROL_HZ", "TabletopEnv", "make_env", "make_expert",
    "task_id", "expand_tasks", "check_detour", "WORKSPACE_LOW", "WORKSPACE_HIGH",
    # instructions: the tabletop grammar (envs/language.py)
    "PALETTE", "TASK_CLASSES", "instruction_for", "tabletop_task_name", "parse_instruction", "paraphrase",
    "augment_instruction", "HELD_OUT_GRAMMAR", "TRAIN_VOCABULARY",
    # errors
    "RenderingUnavailable", "UnknownTask",
]  # fmt: skip
