"""The episode loop every closed-loop caller shares: evaluation, attention figures, export parity, collection.

    for step in episode_steps(env, actor, seed):
        ...  # step.obs -> step.action -> step.next_obs, step.reward, step.info

`actor` is anything with `reset(instruction)` and `act(obs) -> action`: a policy, or a small adapter (the
expert that labels, the pair of policies parity compares). The loop resets the env with `seed`, resets the
actor with the episode's instruction, and steps until the env terminates (success) or truncates (time limit),
or `max_steps` have run. A caller that has seen enough simply stops iterating.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class Actor(Protocol):
    def reset(self, instruction: str) -> None: ...

    def act(self, obs: dict) -> np.ndarray: ...


@dataclass
class Step:
    """One tick: the observation the action was chosen from, the action, and what the env returned for it."""

    t: int  # tick index, 0 = the first action after reset
    obs: dict  # observation before the action
    obs_info: dict  # the info that came with `obs` (reset's for t = 0)
    action: Any
    next_obs: dict
    reward: float
    terminated: bool
    truncated: bool
    info: dict  # the info that came with `next_obs` ("success")
    instruction: str  # what the actor was given at reset

    @property
    def last(self) -> bool:
        return self.terminated or self.truncated


def episode_steps(
    env, actor: Actor, seed: int, max_steps: int | None = None, instruction: Callable[[dict], str] | None = None
) -> Iterator[Step]:
    """Yield the ticks of one episode from `env.reset(seed=seed)`; `instruction(obs)`: what the actor is given
    instead of the episode's own (a grounding probe; called after the reset, so it may read the scene)."""
    obs, obs_info = env.reset(seed=seed)
    text = obs["instruction"] if instruction is None else instruction(obs)
    actor.reset(text)
    limit = env.spec.max_episode_steps if env.spec is not None else None
    if max_steps is not None:
        limit = max_steps if limit is None else min(limit, max_steps)
    for t in range(limit) if limit is not None else itertools.count():
        action = actor.act(obs)
        next_obs, reward, terminated, truncated, info = env.step(action)
        step = Step(t, obs, obs_info, action, next_obs, reward, terminated, truncated, info, text)
        yield step
        if step.last:
            return
        obs, obs_info = next_obs, info
