"""The fixed-rate control loop: a policy meets real time under a latency budget.

Every tick k starts on an absolute schedule, t0 + k / hz (sleeping to the boundary, so errors never
accumulate into drift), and does: observe -> infer (streaming KV cache) -> guard -> apply.

Deadlines. A decision is due `budget_ms` after its tick starts. An inference that finishes later is
too late: its result is thrown away and the tick falls back to the next action of the current chunk
(the last on-time chunk, indexed by the ticks elapsed since its observation) if one remains, else it
holds the last safe action (re-sends it: a zero-order hold). Each such tick counts as a deadline miss
and a fallback. After `max_consecutive_misses` misses in a row the loop makes a safe stop
(`robot.hold()`: hold position, gripper unchanged) and ends with `safe_stop=True`.
The synchronous loop cannot pre-empt a running inference, so its fallback goes out when the late
inference returns; the asynchronous loop below never waits for one. A tick that overruns the period
makes the schedule skip the boundaries already past (`skipped_ticks`).

Asynchronous inference (`async_inference=True`): a worker thread computes the next chunk while the
current one executes. Tick k hands its observation to the worker (if idle) and acts at once from the
newest on-time chunk: chunk_j[k - j] for an observation taken at tick j, normally j = k - 1, i.e. the
action the policy predicted for this step one tick ago. A chunk is on time if it was ready within the
budget of its own tick, and fresh while k - j <= max(1, ceil(budget / period)); a tick without a fresh
chunk is a miss and falls back as above. The first tick infers synchronously to fill the pipeline.

Action guard (`ActionGuard`): a non-finite action is rejected (the last safe action is held), every
action is clamped to the action space, and each motion dim may change by at most `max_delta` per tick
(gripper dims are exempt by default: they are open/close set-points whose actuator already limits
speed, and a smoothed close would pass through half-open grips that drop the object).

Latency injection (`inject_latency_ms`, `inject_jitter_ms`) sleeps inside every inference, uniform in
[X - J, X + J] ms, to test all of the above against a slow policy.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from vla.config import ConfigError
from vla.robot import Robot


@dataclass
class ControllerConfig:
    hz: float = 20.0  # control rate, ticks per second
    budget_ms: float = 50.0  # a decision is due this long after its tick starts, ms
    seconds: float = 10.0  # episode length, wall-clock seconds (it ends earlier on success)
    max_consecutive_misses: int = 5  # safe stop after this many deadline misses in a row; 0 = never
    async_inference: bool = False  # compute the next chunk in a worker thread while the current one executes
    inject_latency_ms: float = 0.0  # extra sleep added to every inference, ms (testing)
    inject_jitter_ms: float = 0.0  # the injected latency is uniform in [latency - jitter, latency + jitter], ms
    warmup: int = 3  # policy calls before the clock starts (the policy is reset afterwards)
    stop_on_success: bool = True  # end the episode as soon as the robot reports success
    seed: int | None = None  # seeds the injected jitter

    def __post_init__(self):
        checks = [
            (self.hz > 0 and math.isfinite(self.hz), f"hz must be positive, got {self.hz}"),
            (self.budget_ms > 0, f"budget_ms must be positive, got {self.budget_ms}"),
            (self.seconds > 0, f"seconds must be positive, got {self.seconds}"),
            (
                self.max_consecutive_misses >= 0,
                f"max_consecutive_misses must be >= 0, not {self.max_consecutive_misses}",
            ),
            (self.inject_latency_ms >= 0, f"inject_latency_ms must be >= 0, got {self.inject_latency_ms}"),
            (self.inject_jitter_ms >= 0, f"inject_jitter_ms must be >= 0, got {self.inject_jitter_ms}"),
            (self.warmup >= 0, f"warmup must be >= 0, got {self.warmup}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    @property
    def period_s(self) -> float:
        return 1.0 / self.hz


class ActionGuard:
    """Makes any policy output safe to send: rejects NaN/Inf, clamps to [low, high], limits the rate.

    `max_delta`: largest change per tick of each rate-limited dim (action units; None = no limit).
    `free_dims`: dims exempt from the rate limit (the gripper's, by default in `from_robot`).
    `start_from_rest`: the first action is rate-limited from zero (delta actions: zero is no motion).
    `counts` tallies each intervention: nonfinite (rejected), clamped, rate_limited.
    """

    def __init__(
        self,
        low,
        high,
        max_delta: float | None = 1.0,
        free_dims: tuple[int, ...] = (),
        start_from_rest: bool = True,
    ):
        self.low = np.asarray(low, dtype=np.float32)
        self.high = np.asarray(high, dtype=np.float32)
        if self.low.shape != self.high.shape or np.any(self.low > self.high):
            raise ValueError(f"bad action bounds: low {self.low}, high {self.high}")
        if max_delta is not None and not max_delta > 0:
            raise ValueError(f"max_delta must be positive (or None for no rate limit), got {max_delta}")
        self.max_delta = max_delta
        self.limited = np.ones(self.low.shape, dtype=bool)  # which dims the rate limit applies to
        for d in free_dims:
            self.limited[d] = False
        self.start_from_rest = start_from_rest
        self.reset()

    @classmethod
    def from_robot(cls, robot: Robot, max_delta: float | None = 1.0, limit_gripper: bool = False) -> ActionGuard:
        free = () if limit_gripper else tuple(getattr(robot, "gripper_dims", ()))
        space = robot.action_space
        return cls(space.low, space.high, max_delta=max_delta, free_dims=free)

    def reset(self) -> None:
        self.last_safe: np.ndarray | None = None  # the last action let through, (A,)
        self.counts = {"nonfinite": 0, "clamped": 0, "rate_limited": 0}

    def __call__(self, action) -> np.ndarray | None:
        """The safe version of `action` (A,); the last safe action (None before any) if it is rejected."""
        a = np.asarray(action, dtype=np.float32)
        if a.shape != self.low.shape:
            raise ValueError(f"action has shape {a.shape}, the action space {self.low.shape}")
        if not np.all(np.isfinite(a)):
            self.counts["nonfinite"] += 1
            return None if self.last_safe is None else self.last_safe.copy()
        out = np.clip(a, self.low, self.high)
        if not np.array_equal(out, a):
            self.counts["clamped"] += 1
        reference = self.last_safe
        if reference is None and self.start_from_rest:
            reference = np.zeros_like(out)
        if self.max_delta is not None and reference is not None:
            limited = np.where(self.limited, np.clip(out, reference - self.max_delta, reference + self.max_delta), out)
            if not np.array_equal(limited, out):
                self.counts["rate_limited"] += 1
            out = np.clip(limited, self.low, self.high).astype(np.float32)
        self.last_safe = out
        return out.copy()


@dataclass
class _Chunk:
    actions: np.ndarray  # (chunk, A): the action for tick `tick`, then the predicted next ones
    tick: int  # the tick whose observation it was computed from
    on_time: bool  # ready within that tick's budget


@dataclass
class RunResult:
    """What one episode of the loop measured (deploy writes it as JSON)."""

    instruction: str
    steps: int = 0  # ticks executed
    skipped_ticks: int = 0  # tick boundaries skipped because a tick overran the period
    deadline_misses: int = 0  # ticks with no on-time decision
    late_inferences: int = 0  # inference results discarded for being too late
    fallbacks: int = 0  # ticks that acted on a fallback (next chunk action or held action)
    fallback_kinds: dict = field(default_factory=lambda: {"chunk": 0, "hold": 0})
    max_consecutive_misses_seen: int = 0
    guard: dict = field(default_factory=dict)  # ActionGuard.counts
    safe_stop: bool = False
    success: bool | None = None
    end_reason: str = ""  # "success", "time" or "safe_stop"
    elapsed_s: float = 0.0
    latency_ms: list = field(default_factory=list)  # per tick: tick start -> action sent, ms
    inference_ms: list = field(default_factory=list)  # per inference: policy call (+ injected), ms
    wake_ms: list = field(default_factory=list)  # per tick: how late the loop woke after the boundary, ms
    observe_ms: list = field(default_factory=list)  # per tick: robot.observe() (sim: physics + render), ms
    sources: list = field(default_factory=list)  # per tick: "policy", "chunk" or "hold"

    def summary(self) -> dict:
        """JSON-ready figures (percentiles instead of the per-tick lists, which stay under "ticks")."""
        d = asdict(self)
        d["latency_ms"] = percentiles(self.latency_ms)
        for key in ("inference_ms", "wake_ms", "observe_ms"):
            d[key] = percentiles(getattr(self, key))
        d["ticks"] = {"latency_ms": [round(x, 3) for x in self.latency_ms], "source": self.sources}
        d.pop("sources")
        return d


def percentiles(values) -> dict:
    """p50/p95/p99/max/mean of a list of ms figures (None for an empty list)."""
    if len(values) == 0:
        return {k: None for k in ("p50", "p95", "p99", "max", "mean")}
    v = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(v, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(v.max()), "mean": float(v.mean())}


class InferenceWorker:
    """One background thread that runs `infer(obs, tick)` on the observations it is handed.

    The interface the async loop uses: `submit(obs, tick, deadline) -> bool` (False while busy),
    `poll() -> [(tick, deadline, actions | exception, t_start, t_done)]` (results since the last
    poll, stamped with `clock`), and `close()`.
    """

    def __init__(self, infer: Callable, clock: Callable[[], float]):
        self._infer, self._clock = infer, clock
        self._cv = threading.Condition()
        self._job: tuple | None = None
        self._done: list[tuple] = []  # (tick, deadline, actions | exception, t_start, t_done)
        self._busy = False
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="vla-inference", daemon=True)
        self._thread.start()

    def submit(self, obs: dict, tick: int, deadline: float) -> bool:
        """Start inferring on `obs` unless busy; returns whether it was taken."""
        with self._cv:
            if self._busy:
                return False
            self._busy, self._job = True, (obs, tick, deadline)
            self._cv.notify()
            return True

    def poll(self) -> list[tuple]:
        with self._cv:
            done, self._done = self._done, []
        return done

    def close(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                (obs, tick, deadline), self._job = self._job, None
            start = self._clock()
            try:
                out = self._infer(obs, tick)
            except Exception as e:  # noqa: BLE001 - handed to the control thread, which re-raises it
                out = e
            with self._cv:
                self._done.append((tick, deadline, out, start, self._clock()))
                self._busy = False


class Controller:
    """Drives `robot` with `policy` (anything with `reset(instruction)` and `act_chunk(obs) -> (chunk, A)`)."""

    def __init__(
        self,
        policy,
        robot: Robot,
        config: ControllerConfig | None = None,
        guard: ActionGuard | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        worker: Callable[[Callable, Callable[[], float]], InferenceWorker] = InferenceWorker,
    ):
        """`clock`/`sleep` are the loop's time (seconds) and `worker(infer, clock)` builds the async inference
        worker: injectable so that tests run the schedule on a virtual clock, deterministic and instant."""
        self.policy, self.robot = policy, robot
        self.cfg = config or ControllerConfig()
        self.guard = guard or ActionGuard.from_robot(robot)
        self.clock, self.sleep, self.make_worker = clock, sleep, worker
        self._rng = np.random.default_rng(self.cfg.seed)

    def _infer(self, obs: dict, tick: int) -> np.ndarray:
        """One policy decision (chunk, A), stamped with the tick's index, plus any injected latency."""
        if hasattr(self.policy, "t"):
            self.policy.t = tick  # the model's step index follows real ticks, also across skipped ones
        actions = np.asarray(self.policy.act_chunk(obs), dtype=np.float32)
        if actions.ndim == 1:
            actions = actions[None]  # a policy without chunks: (A,) -> (1, A)
        cfg = self.cfg
        if cfg.inject_latency_ms > 0 or cfg.inject_jitter_ms > 0:
            jitter = self._rng.uniform(-cfg.inject_jitter_ms, cfg.inject_jitter_ms) if cfg.inject_jitter_ms else 0.0
            self.sleep(max(0.0, cfg.inject_latency_ms + jitter) / 1e3)
        return actions

    def run(self) -> RunResult:
        cfg, robot, guard = self.cfg, self.robot, self.guard
        obs = robot.observe()
        result = RunResult(instruction=obs["instruction"])
        self.policy.reset(result.instruction)
        for _ in range(cfg.warmup):  # first calls are slow (allocation, kernel selection): not on the clock
            self.policy.act_chunk(obs)
        self.policy.reset(result.instruction)
        guard.reset()
        period, budget = cfg.period_s, cfg.budget_ms / 1e3
        fresh_age = max(1, math.ceil(budget / period - 1e-9)) if cfg.async_inference else 0
        worker = self.make_worker(self._infer, self.clock) if cfg.async_inference else None
        current: _Chunk | None = None  # the newest on-time chunk
        consecutive = 0
        robot.start()
        t0 = self.clock()
        k = 0
        try:
            while True:
                t_tick = t0 + k * period
                if t_tick - t0 >= cfg.seconds - 1e-9:
                    result.end_reason = "time"
                    break
                deadline = t_tick + budget
                woke = self.clock()
                obs = robot.observe()
                result.wake_ms.append((woke - t_tick) * 1e3)
                result.observe_ms.append((self.clock() - woke) * 1e3)
                if cfg.stop_on_success and robot.success():
                    result.end_reason = "success"
                    break

                # ---- infer: inline (sync, and the first async tick) or collect the worker's results
                if worker is None or k == 0:
                    start = self.clock()
                    actions = self._infer(obs, k)
                    done = self.clock()
                    result.inference_ms.append((done - start) * 1e3)
                    fresh = _Chunk(actions, k, done <= deadline)
                    result.late_inferences += not fresh.on_time
                    current = fresh if fresh.on_time else current
                else:
                    for tick, due, out, start, done in worker.poll():
                        if isinstance(out, Exception):
                            raise out
                        result.inference_ms.append((done - start) * 1e3)
                        if done <= due:
                            current = _Chunk(out, tick, True)
                        else:
                            result.late_inferences += 1
                    worker.submit(obs, k, deadline)

                # ---- choose: a fresh decision, else the current chunk's next action, else hold
                age = None if current is None else k - current.tick
                if current is not None and age <= fresh_age:
                    raw, source = current.actions[min(age, len(current.actions) - 1)], "policy"
                    consecutive = 0
                else:
                    result.deadline_misses += 1
                    consecutive += 1
                    result.max_consecutive_misses_seen = max(result.max_consecutive_misses_seen, consecutive)
                    if current is not None and age < len(current.actions):
                        raw, source = current.actions[age], "chunk"
                    else:
                        raw, source = None, "hold"
                if cfg.max_consecutive_misses and consecutive >= cfg.max_consecutive_misses:
                    robot.hold()
                    result.safe_stop, result.end_reason = True, "safe_stop"
                    self._record(result, t_tick, "safe_stop")
                    break
                if source != "policy":
                    result.fallbacks += 1
                    result.fallback_kinds[source] += 1

                # ---- guard and apply
                action = guard.last_safe if raw is None else guard(raw)
                if action is None:
                    robot.hold()  # nothing safe has been sent yet: stay where we are
                else:
                    robot.apply(action)
                self._record(result, t_tick, source)

                # ---- sleep to the next boundary on the absolute schedule (skip the ones already past)
                k += 1
                now = self.clock()
                if now > t0 + k * period:
                    behind = math.floor((now - t0) / period) + 1
                    result.skipped_ticks += behind - k
                    k = behind
                self.sleep(max(0.0, t0 + k * period - self.clock()))
        finally:
            robot.hold()  # whatever ended the loop, leave the robot holding still
            if worker is not None:
                worker.close()
            result.elapsed_s = self.clock() - t0
            result.guard = dict(guard.counts)
        result.success = robot.success()
        return result

    def _record(self, result: RunResult, t_tick: float, source: str) -> None:
        result.steps += 1
        result.latency_ms.append((self.clock() - t_tick) * 1e3)
        result.sources.append(source)
