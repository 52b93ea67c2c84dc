"""Execution strategies: which action a chunked policy executes at each control tick while inference takes time.

Time is counted in control ticks. An inference started at tick j works on the observation of tick j
and returns a chunk whose row r is the policy's action for tick j + r. It takes `delay` ticks, so its
result is first usable at tick j + delay and its rows 0 .. delay-1 are already in the past (stale)
when it arrives. Every strategy indexes a chunk by absolute tick (row = tick - j), never by how many
policy calls have been made, and never executes a row past a chunk's end (that is a hold).

One object serves both clocks: the evaluation's simulated time (`vla.control.delay.DelayedPolicy`: every
inference takes exactly `delay` ticks while the environment keeps stepping) and vla-deploy's
wall-clock loop (`vla.control.controller`: results land at whatever tick they finish, and the measured
inference time decides the delay estimate `delay`). The loop calls, every tick k:

    strategy.receive(j, chunk, k)      for each inference that finished (started on tick j's observation)
    strategy.wants_inference(k, d)     the inference worker is idle: start one on this tick's observation?
    strategy.committed(k, d)           the actions ticks k .. k+d-1 will execute (handed to delay_aware policies)
    strategy.act(k)                    -> (action (A,) or None = hold still, source)
    strategy.policy_step(k)            the step index an inference started on tick k stamps on the policy

The strategies (`STRATEGIES`, the names `--strategy` takes):
- blocking: the naive deployment. Infer whenever idle; each chunk's row 0 (the decision for an
  observation `delay` ticks old) is executed at the tick it arrives; hold still while waiting.
- chunk: execute `execute` actions of each chunk, rows delay .. delay+execute-1; the next inference starts
  `delay` ticks before they run out, on the newest observation, so its chunk arrives as they end (if it
  is late, the current chunk continues while it has rows). `execute` is capped at chunk - delay.
- ensemble: infer whenever idle; the action at tick k is the weighted mean of every received chunk's
  prediction for tick k (ACT's temporal ensembling aligned by absolute tick: stale rows and ticks that
  no inference covered simply have no votes), weights exp(-coeff * i), i = 0 the oldest.
- synchronous: stop and think (the synchronous inference RTC compares against). Execute `execute` rows
  of each chunk (0 = all of it) from row 0, the tick it arrives; only then start the next inference, on
  the observation the last of them left, and hold still until it arrives. The hand does not move while
  the policy thinks, so the chunk still fits the world when it lands: success as at d = 0, bought with
  time (holds `delay / (execute + delay)` of the ticks) and stop-and-go motion. The policy runs as
  configured (its own temporal ensembling too) on a clock that stops while it thinks: its step index
  counts the actions executed, so at any delay it decides as it would at d = 0.
- delay_aware: chunk's schedule, and the actions that will execute while the inference runs (the
  current chunk's rows for ticks k .. k+d-1) go to the policy as committed: a model trained with
  committed action slots (`model.committed_actions`, `train.delay_aware_max`) conditions its new
  chunk on them (RTC's idea for tokens). See vla/training/delay_prefix.py for how it is trained and tested.
With delay 0, blocking, ensemble (coeff as the policy's) and chunk/delay_aware with execute 1 execute
exactly what today's evaluation does (the policy called every tick); tests/test_delay.py checks it.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from vla.config import ConfigError
from vla.policy.ensemble import ensemble_mean


class Strategy:
    """The shared bookkeeping: received chunks by the tick of their observation, newest last."""

    name: ClassVar[str] = ""
    raw_chunks: ClassVar[bool] = True  # schedules the network's whole chunks (`policy.predict_chunk`) itself

    def __init__(self, chunk: int, execute: int = 0, ensemble_coeff: float = 0.0):
        if chunk < 1:
            raise ConfigError(f"strategy {self.name}: chunk={chunk} must be >= 1")
        if execute < 0 or execute > chunk:
            raise ConfigError(f"--execute {execute} must be in 0..{chunk} (the policy's chunk; 0 = chunk - delay)")
        self.chunk, self.execute, self.ensemble_coeff = chunk, execute, ensemble_coeff
        self.reset()

    def reset(self) -> None:
        self.chunks: list[tuple[int, np.ndarray, int]] = []  # (obs tick j, (chunk, A) actions, arrival tick)

    def receive(self, tick: int, actions: np.ndarray, now: int) -> None:
        """A chunk computed from tick `tick`'s observation, usable from tick `now` on."""
        if now < tick:
            raise ValueError(f"a chunk for tick {tick} cannot arrive before it, at tick {now}")
        self.chunks.append((tick, np.asarray(actions, dtype=np.float32), now))
        self.chunks = self.chunks[-self.chunk - 1 :]  # older chunks have no row for any tick still to come

    def execute_for(self, delay: int) -> int:
        """Actions executed per chunk at this delay: `execute` (0 = as many as the chunk has left), at most
        chunk - delay (rows later than that cannot arrive in time), at least 1."""
        room = max(1, self.chunk - delay)
        return min(self.execute or room, room)

    def wants_inference(self, tick: int, delay: int) -> bool:
        return True

    def committed(self, tick: int, delay: int) -> np.ndarray | None:
        return None

    def policy_step(self, tick: int) -> int:
        """The policy's step index for an inference started on `tick`: the tick itself (time runs on while
        it thinks, so its chunk's rows stay aligned with the ticks they are for)."""
        return tick

    def act(self, tick: int) -> tuple[np.ndarray | None, str]:
        raise NotImplementedError

    def _newest_row(self, tick: int) -> tuple[np.ndarray | None, str]:
        """Row `tick - j` of the newest chunk, or a hold when that chunk has no row for this tick."""
        if not self.chunks:
            return None, "hold"
        j, actions, _ = self.chunks[-1]
        r = tick - j
        return (actions[r], "policy") if r < len(actions) else (None, "hold")

    @property
    def newest_tick(self) -> int | None:
        """The observation tick of the chunk acted on (boundaries between chunks are where it changes)."""
        return self.chunks[-1][0] if self.chunks else None


class Blocking(Strategy):
    name = "blocking"
    raw_chunks = False  # the naive deployment runs the policy as configured (its own ensembling, if any)

    def act(self, tick):
        if self.chunks and self.chunks[-1][2] == tick:  # a decision arrived this tick: its row 0
            return self.chunks[-1][1][0], "policy"
        return None, "hold"


class Chunked(Strategy):
    name = "chunk"

    def wants_inference(self, tick, delay):
        if not self.chunks:
            return True
        _, _, arrived = self.chunks[-1]
        return tick >= arrived + self.execute_for(delay) - delay  # arrives as the executed rows run out

    def act(self, tick):
        return self._newest_row(tick)


class Synchronous(Strategy):
    name = "synchronous"
    raw_chunks = False  # the policy runs as configured: nothing moves while it thinks, so nothing is stale

    def reset(self):
        super().reset()
        self.moves = 0  # ticks that executed a policy row (not a hold)

    def policy_step(self, tick):
        return self.moves  # held ticks do not count: the policy sees the episode as at d = 0

    def execute_for(self, delay):
        return super().execute_for(0)  # rows count from the arrival, so none is stale whatever the delay

    def wants_inference(self, tick, delay):
        if not self.chunks:
            return True
        _, _, arrived = self.chunks[-1]
        return tick >= arrived + self.execute_for(delay)  # its rows have all run: the world is still from here on

    def act(self, tick):
        if not self.chunks:
            return None, "hold"
        _, actions, arrived = self.chunks[-1]
        r = tick - arrived  # counted from the arrival: the world held still while it was computed
        if r >= self.execute_for(0):
            return None, "hold"
        self.moves += 1
        return actions[r], "policy"


class Ensemble(Strategy):
    name = "ensemble"

    def act(self, tick):
        guesses = [c[tick - j] for j, c, _ in self.chunks if 0 <= tick - j < len(c)]  # oldest first
        if not guesses:
            return None, "hold"
        return ensemble_mean(guesses, self.ensemble_coeff).astype(np.float32), "policy"


class DelayAware(Chunked):
    name = "delay_aware"

    def committed(self, tick, delay):
        """What `act` will return at ticks tick .. tick+delay-1 (the current chunk's rows), (n <= delay, A);
        None when nothing is committed (delay 0, or no chunk yet). Stops at the first tick that would hold."""
        if delay == 0 or not self.chunks:
            return None
        j, actions, _ = self.chunks[-1]
        rows = actions[tick - j : min(tick - j + delay, len(actions))]
        return rows.copy() if len(rows) else None


STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (Blocking, Chunked, Synchronous, Ensemble, DelayAware)}


def check_strategy_options(strategy: str, execute: int) -> None:
    """`--strategy` and `--execute` as vla-eval, vla-bench delay and vla-deploy take them (ConfigError: one line)."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"--strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if execute < 0:
        raise ConfigError(f"--execute must be >= 0 (0 = chunk - delay), got {execute}")


def make_strategy(name: str, chunk: int, execute: int = 0, ensemble_coeff: float = 0.0) -> Strategy:
    """A strategy by its name; an unknown name is a ConfigError that lists the valid ones."""
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name](chunk, execute, ensemble_coeff)
