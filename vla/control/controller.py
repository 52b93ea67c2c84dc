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

Execution strategies (`strategy`, vla/policy/strategies.py; the same objects vla-eval runs in simulated time).
"blocking" (the default) is the synchronous loop above. "chunk", "ensemble" and "delay_aware" run the
policy in a worker thread while the robot executes: tick k collects the inferences that finished (a
chunk from tick j's observation is usable while it has a row for the current tick, row k - j; its
budget is not the criterion, since in this loop nothing waits for it), lets the strategy start the next
one on tick k's observation when the worker is idle, and acts at once on the strategy's action for
tick k. The delay d the strategies plan with (when to start the next inference, how many actions
delay_aware commits) is measured: the largest number of ticks any of the last 5 inferences took to
arrive (the first tick infers synchronously, to fill the pipeline and give the first measurement).
A tick the strategy has no action for is a deadline miss and a hold (`robot.hold()`: the hand stays
where it is); too many in a row make the safe stop as above. `async_inference=True` (the old flag)
is strategy "chunk" with execute=1: act on the newest chunk, re-plan whenever the worker is idle.
Why not the old async rule: it judged each chunk by the budget of its own tick (so with inference
slower than the budget every chunk was thrown away, though its later rows were still ahead of the
robot) and, once a chunk ran out, kept re-sending its last row as a fresh decision for up to
ceil(budget / period) ticks (a delta action re-sent moves the hand again: stale motion, never a miss).

A policy that cannot answer (`vla.errors.PolicyUnavailable`: a remote policy server gone or silent,
vla/policy/remote.py) is an inference that never arrives: its ticks fall back and count as misses like a late
one's, so a lost server ends in the safe stop within `max_consecutive_misses` ticks, and the result says
why (`policy_unavailable`, `unavailable_reason`). Any other policy error ends the loop (robot holding).

Action guard (`ActionGuard`, vla/control/guard.py): every action is made safe before it is sent.

Latency injection (`inject_latency_ms`, `inject_jitter_ms`) sleeps inside every inference, uniform in
[X - J, X + J] ms, to test all of the above against a slow policy.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from vla.config import ConfigError
from vla.control.guard import ActionGuard
from vla.control.robot import Robot
from vla.control.smoothness import smoothness
from vla.errors import PolicyUnavailable
from vla.policy.strategies import STRATEGIES, Strategy, check_strategy_options, make_strategy


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
    strategy: str = (
        "blocking"  # blocking (the synchronous loop), chunk, ensemble, delay_aware (vla/policy/strategies.py)
    )
    execute: int = 0  # actions executed per chunk by chunk / delay_aware (0 = chunk - measured delay)

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
        check_strategy_options(self.strategy, self.execute)
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    @property
    def period_s(self) -> float:
        return 1.0 / self.hz

    @property
    def worker_strategy(self) -> tuple[str, int] | None:
        """(strategy, execute) of the worker-thread loop, or None for the synchronous (blocking) loop."""
        if self.strategy != "blocking":
            return self.strategy, self.execute
        return ("chunk", 1) if self.async_inference else None


@dataclass
class _Chunk:
    actions: np.ndarray  # (chunk, A): the action for tick `tick`, then the predicted next ones
    tick: int  # the tick whose observation it was computed from (only chunks ready within its budget are kept)


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
    strategy: str = "blocking"  # the execution strategy the loop ran
    delay_ticks: list = field(default_factory=list)  # per collected inference: ticks from its observation to use
    executed: list = field(default_factory=list)  # per tick: the action sent (None = a hold)
    chunk_ticks: list = field(default_factory=list)  # per tick: observation tick of the chunk it came from, -1 = none
    policy_unavailable: int = 0  # inferences the policy could not answer (PolicyUnavailable: a remote server gone)
    unavailable_reason: str = ""  # the last one's message

    def summary(self) -> dict:
        """JSON-ready figures (percentiles instead of the per-tick lists, which stay under "ticks")."""
        d = asdict(self)
        for key in ("executed", "chunk_ticks"):
            d.pop(key)
        sent = [a for a in self.executed if a is not None]
        src = [c for a, c in zip(self.executed, self.chunk_ticks, strict=True) if a is not None]
        d["smoothness"] = smoothness(np.stack(sent), src) if sent else None
        d["delay_ticks"] = (
            {"max": max(self.delay_ticks), "mean": float(np.mean(self.delay_ticks))} if self.delay_ticks else None
        )
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

    The interface the async loop uses: `submit(obs, tick, deadline, committed=None) -> bool` (False while busy),
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

    def submit(self, obs: dict, tick: int, deadline: float, committed: np.ndarray | None = None) -> bool:
        """Start inferring on `obs` (and `committed` actions: delay_aware) unless busy; returns whether it was taken."""
        with self._cv:
            if self._busy:
                return False
            self._busy, self._job = True, (obs, tick, deadline, committed)
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
                (obs, tick, deadline, committed), self._job = self._job, None
            start = self._clock()
            try:
                out = self._infer(obs, tick, committed)
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
        self._policy_step: Callable[[int], int] = int  # tick -> the policy's step index (the strategy's, once built)
        self._raw_chunks = False  # does the loop's strategy schedule the network's whole chunks itself

    def _infer(self, obs: dict, tick: int, committed: np.ndarray | None = None) -> np.ndarray:
        """One policy decision (chunk, A), stamped with the tick's index, plus any injected latency: the network's
        whole chunk (`predict_chunk`) for a strategy that schedules chunks itself, else the policy as configured."""
        if hasattr(self.policy, "t"):
            self.policy.t = self._policy_step(tick)  # real ticks, also across skipped ones (synchronous: its moves)
        infer = self.policy.predict_chunk if self._raw_chunks else self.policy.act_chunk
        actions = np.asarray(infer(obs, committed=committed), dtype=np.float32)
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
        self._warm_up(obs, result.instruction)
        guard.reset()
        period, budget = cfg.period_s, cfg.budget_ms / 1e3
        plan = cfg.worker_strategy
        self._raw_chunks = plan is not None and STRATEGIES[plan[0]].raw_chunks
        worker = self.make_worker(self._infer, self.clock) if plan is not None else None
        self._policy_step = int
        strategy: Strategy | None = None  # the worker loop's, built once the first chunk tells its length
        measured: deque[int] = deque(maxlen=5)  # ticks the last inferences took to arrive
        result.strategy = plan[0] if plan else "blocking"
        current: _Chunk | None = None  # the newest on-time chunk (synchronous loop)
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

                # ---- infer: inline (sync, and the first tick of the worker loop) or collect the worker's results
                late_first = False
                if worker is None or k == 0:
                    actions, took, late = self._infer_inline(obs, k, deadline, result)
                    if worker is None:
                        current = current if late else _Chunk(actions, k)
                    else:
                        strategy = self._strategy(plan, self.policy.chunk if actions is None else len(actions))
                        self._policy_step = strategy.policy_step  # the worker stamps its inferences with it
                        measured.append(math.ceil(took / period - 1e-9))
                        if actions is not None:  # its later rows serve the next ticks even if tick 0's is late
                            strategy.receive(0, actions, 0)
                        late_first = late
                else:
                    self._collect(worker, strategy, measured, result, k)
                    d = max(measured)
                    if strategy.wants_inference(k, d):
                        worker.submit(obs, k, deadline, strategy.committed(k, d))

                # ---- choose: a fresh decision, else the current chunk's next action, else hold
                raw, source = self._choose(k, strategy, current, late_first)
                consecutive = self._count_miss(result, source, consecutive)
                if cfg.max_consecutive_misses and consecutive >= cfg.max_consecutive_misses:
                    robot.hold()
                    result.safe_stop, result.end_reason = True, "safe_stop"
                    self._record(result, t_tick, "safe_stop")
                    break
                if source != "policy":
                    result.fallbacks += 1
                    result.fallback_kinds[source] += 1

                # ---- guard and apply
                result.executed.append(self._apply(raw, held=strategy is not None and raw is None))
                result.chunk_ticks.append(self._chunk_tick(strategy, current, source))
                self._record(result, t_tick, source)
                k = self._sleep_to_next_tick(t0, k, period, result)
        finally:
            robot.hold()  # whatever ended the loop, leave the robot holding still
            if worker is not None:
                worker.close()
            result.elapsed_s = self.clock() - t0
            result.guard = dict(guard.counts)
        result.success = robot.success()
        return result

    def _warm_up(self, obs: dict, instruction: str) -> None:
        """First calls are slow (allocation, kernel selection): made before the clock starts, then forgotten."""
        self.policy.reset(instruction)
        for _ in range(self.cfg.warmup):
            self.policy.act_chunk(obs)
        self.policy.reset(instruction)

    @staticmethod
    def _collect(worker: InferenceWorker, strategy: Strategy, measured: deque, result: RunResult, k: int) -> None:
        """Hand the worker's finished inferences to the strategy; `measured` gets the ticks each took."""
        for tick, _, out, start, done in worker.poll():
            if isinstance(out, PolicyUnavailable):  # it never arrives: the strategy runs out of rows and holds
                Controller._unavailable(result, out)
                continue
            if isinstance(out, Exception):
                raise out
            result.inference_ms.append((done - start) * 1e3)
            measured.append(k - tick)
            result.delay_ticks.append(k - tick)
            if k - tick < len(out):
                strategy.receive(tick, out, k)
            else:
                result.late_inferences += 1  # every row is for a tick already past

    def _infer_inline(self, obs: dict, k: int, deadline: float, result: RunResult) -> tuple[np.ndarray, float, bool]:
        """Infer on this thread (the synchronous loop; the worker loop's first tick): the chunk (None when the
        policy was unavailable), the seconds it took and whether it came after the deadline."""
        start = self.clock()
        try:
            actions = self._infer(obs, k)
        except PolicyUnavailable as e:  # as late as an inference can be: this tick falls back
            self._unavailable(result, e)
            return None, self.clock() - start, True
        done = self.clock()
        result.inference_ms.append((done - start) * 1e3)
        result.late_inferences += done > deadline
        return actions, done - start, done > deadline

    @staticmethod
    def _unavailable(result: RunResult, e: PolicyUnavailable) -> None:
        result.policy_unavailable += 1
        result.unavailable_reason = str(e)

    @staticmethod
    def _count_miss(result: RunResult, source: str, consecutive: int) -> int:
        """Count a tick without a fresh decision as a deadline miss; returns the consecutive misses so far."""
        if source == "policy":
            return 0
        result.deadline_misses += 1
        result.max_consecutive_misses_seen = max(result.max_consecutive_misses_seen, consecutive + 1)
        return consecutive + 1

    @staticmethod
    def _chunk_tick(strategy: Strategy | None, current: _Chunk | None, source: str) -> int:
        """The tick whose chunk this tick's action came from; -1 for none (a hold, a fallback of the worker loop)."""
        if strategy is not None:
            return strategy.newest_tick if source == "policy" else -1
        return -1 if current is None or source == "hold" else current.tick

    @staticmethod
    def _choose(k: int, strategy: Strategy | None, current: _Chunk | None, late_first: bool):
        """Tick k's raw action and its source: "policy" (a decision for this tick), "chunk" (the current
        chunk's row for it, synchronous loop) or "hold" (None)."""
        if strategy is not None:
            return (None, "hold") if late_first else strategy.act(k)
        age = None if current is None else k - current.tick
        if age == 0:
            return current.actions[0], "policy"
        if current is not None and age < len(current.actions):
            return current.actions[age], "chunk"
        return None, "hold"

    def _apply(self, raw: np.ndarray | None, held: bool) -> np.ndarray | None:
        """Guard and send one action; returns what was sent (None: the robot held still). `held`: a
        strategy's hold, where the hand stays put (no stale motion re-sent); otherwise a missing action
        repeats the last safe one."""
        action = None if held else self.guard.last_safe if raw is None else self.guard(raw)
        if action is None:
            self.robot.hold()  # nothing safe has been sent yet: stay where we are
        else:
            self.robot.apply(action)
        return action

    def _sleep_to_next_tick(self, t0: float, k: int, period: float, result: RunResult) -> int:
        """Sleep to the next boundary on the absolute schedule, skipping those already past; its index."""
        k += 1
        now = self.clock()
        if now > t0 + k * period:
            behind = math.floor((now - t0) / period) + 1
            result.skipped_ticks += behind - k
            k = behind
        self.sleep(max(0.0, t0 + k * period - self.clock()))
        return k

    def _strategy(self, plan: tuple[str, int], chunk: int) -> Strategy:
        """The worker loop's strategy for chunks of `chunk` rows (the network's whole chunks: `_infer(raw=True)`)."""
        name, execute = plan
        cfg = getattr(self.policy, "config", None)
        return make_strategy(name, chunk, min(execute, chunk), getattr(cfg, "ensemble_coeff", 0.0))

    def _record(self, result: RunResult, t_tick: float, source: str) -> None:
        result.steps += 1
        result.latency_ms.append((self.clock() - t_tick) * 1e3)
        result.sources.append(source)
