"""Inference delay in simulated time: a policy that "thinks" for `delay` control ticks while the world moves on.

    delayed = DelayedPolicy(policy, "chunk", delay=2)      # vla-eval --delay-ticks 2 --strategy chunk
    delayed.reset(instruction); action = delayed.act(obs)  # one call per environment step, as any policy

Each `act(obs)` call is one control tick k. An inference the strategy starts at tick k runs the policy
on obs_k at once but hands its chunk to the strategy only at tick k + delay, so in the meantime the
environment keeps stepping with the actions the strategy had already committed (`vla.policy.strategies`).
Nothing here reads a clock: the outcome depends only on the seeds, never on the machine's speed.
One inference runs at a time, as on a robot with one accelerator.

A hold (the strategy has nothing to execute) sends zero motion with the gripper where it was: the
last dim of the action is the gripper set-point in every task of this suite (tabletop and Meta-World).
`episode_metrics()` after an episode: the smoothness of what was executed (`vla.control.smoothness`) and how
many ticks held.
"""

from __future__ import annotations

import numpy as np

from vla.config import ConfigError
from vla.control.smoothness import smoothness
from vla.policy.strategies import make_strategy


class DelayedPolicy:
    def __init__(self, policy, strategy: str, delay: int = 0, execute: int = 0):
        if delay < 0:
            raise ConfigError(f"--delay-ticks must be >= 0, got {delay}")
        cfg = getattr(policy, "config", None)
        self.strategy = make_strategy(strategy, policy.chunk, execute, getattr(cfg, "ensemble_coeff", 0.0))
        if strategy == "delay_aware" and not policy.reads_committed:
            raise ConfigError(
                "strategy 'delay_aware' needs a checkpoint trained with committed action slots "
                "(model.committed_actions=true train.delay_aware_max=N) on the torch backend; this one has none"
            )
        self.policy, self.delay = policy, delay
        self.reset_state()

    def __getattr__(self, name):  # spec, meta, device, config, chunk, action_dim: the wrapped policy's
        if name == "policy":
            raise AttributeError(name)
        return getattr(self.policy, name)

    def reset_state(self) -> None:
        self.tick = 0
        self._pending: tuple[int, np.ndarray] | None = None  # (obs tick, chunk) of the inference under way
        self.executed: list[np.ndarray] = []
        self.chunk_ticks: list[int] = []  # per tick: the obs tick of the chunk the action came from, -1 = hold

    def reset(self, instruction: str) -> None:
        self.policy.reset(instruction)
        self.strategy.reset()
        self.reset_state()

    def _infer(self, obs: dict, k: int) -> np.ndarray:
        if hasattr(self.policy, "t"):
            self.policy.t = self.strategy.policy_step(k)  # the ticks, also those it skipped (synchronous: its moves)
        # a strategy that schedules chunks itself takes the network's whole chunk, else the policy runs as configured
        infer = self.policy.predict_chunk if self.strategy.raw_chunks else self.policy.act_chunk
        return np.asarray(infer(obs, committed=self.strategy.committed(k, self.delay)), dtype=np.float32)

    def act(self, obs: dict) -> np.ndarray:
        k, s = self.tick, self.strategy
        if self._pending is not None and self._pending[0] + self.delay <= k:
            s.receive(*self._pending, k)
            self._pending = None
        if self._pending is None and s.wants_inference(k, self.delay):
            self._pending = (k, self._infer(obs, k))
            if self.delay == 0:
                s.receive(*self._pending, k)
                self._pending = None
        action, source = s.act(k)
        if action is None:
            action = np.zeros(self.policy.action_dim, np.float32)
            if self.executed:
                action[-1] = self.executed[-1][-1]  # the gripper stays as it was
        self.executed.append(np.asarray(action, np.float32))
        self.chunk_ticks.append(s.newest_tick if source == "policy" else -1)
        self.tick += 1
        return self.executed[-1]

    def episode_metrics(self) -> dict:
        """Smoothness of the executed actions and the share of ticks that held, for the episode just run."""
        if not self.executed:
            return {"jerk": 0.0, "boundary_jump": 0.0, "step_change": 0.0, "boundaries": 0, "hold_fraction": 0.0}
        out = smoothness(np.stack(self.executed), self.chunk_ticks)
        out["hold_fraction"] = float(np.mean(np.asarray(self.chunk_ticks) < 0))
        return out


METRICS = ("jerk", "boundary_jump", "step_change", "hold_fraction")


def summarize_smoothness(outcomes: dict[str, list[dict]]) -> dict:
    """Mean of each episode metric per task and overall, from per-episode outcomes carrying them."""
    out = {}
    for task, eps in outcomes.items():
        out[task] = {m: float(np.mean([e[m] for e in eps])) if eps else 0.0 for m in METRICS}
    every = [e for eps in outcomes.values() for e in eps]
    out["overall"] = {m: float(np.mean([e[m] for e in every])) if every else 0.0 for m in METRICS}
    return out
