"""The real-time loop: action guard, deadlines under injected latency, safe stop, SimRobot, vla-deploy.

The loop's timing tests run on a virtual clock (`VirtualClock`: time moves only when something
sleeps), so every tick, deadline and latency is exact and a test takes no wall time. The async
loop's worker runs in the same virtual time (`VirtualWorker`); the real worker thread has its own
test, and the vla-deploy tests run everything for real."""

import contextlib
import json
import threading

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401 - registers the tasks
from vla.cli import deploy
from vla.control.controller import Controller, ControllerConfig, InferenceWorker
from vla.control.guard import ActionGuard
from vla.control.robot import Robot, SimRobot

# ------------------------------------------------------------------------------------- virtual time


class VirtualClock:
    """Seconds that pass only when someone sleeps: `clock()` reads them, `clock.sleep(s)` advances them."""

    def __init__(self):
        self.now = 0.0
        self._aside: list[float] | None = None  # sleeps of work done off the loop (see `elsewhere`)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        if self._aside is not None:
            self._aside[0] += max(0.0, seconds)
        else:
            self.now += max(0.0, seconds)

    @contextlib.contextmanager
    def elsewhere(self):
        """Sleeps inside happen on another thread's time: counted (yielded as [seconds]), the loop's clock stays."""
        self._aside = spent = [0.0]
        try:
            yield spent
        finally:
            self._aside = None


class VirtualWorker:
    """`InferenceWorker` in virtual time: a job runs at submit (its sleeps counted aside), and its result
    comes back from `poll` once the clock has passed the instant it would have finished; busy until then."""

    def __init__(self, infer, clock: VirtualClock):
        self.infer, self.clock = infer, clock
        self.jobs: list[tuple] = []  # (tick, deadline, actions | exception, t_start, t_done), not yet polled

    def submit(self, obs, tick, deadline, committed=None) -> bool:
        if any(done > self.clock() for *_, done in self.jobs):
            return False
        start = self.clock()
        with self.clock.elsewhere() as spent:
            try:
                out = self.infer(obs, tick, committed)
            except Exception as e:  # noqa: BLE001 - handed back like the real worker does
                out = e
        self.jobs.append((tick, deadline, out, start, start + spent[0]))
        return True

    def poll(self) -> list[tuple]:
        done = [j for j in self.jobs if j[-1] <= self.clock()]
        self.jobs = [j for j in self.jobs if j[-1] > self.clock()]
        return done

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------- fakes


class FakeRobot:
    """Records what the loop sends and when it observed; observation content does not matter to the fake policy."""

    action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    gripper_dims = (3,)

    def __init__(self, clock: VirtualClock, observe_s: float = 0.0):
        self.clock, self.observe_s = clock, observe_s
        self.events: list[tuple[str, np.ndarray | None]] = []
        self.observed_at: list[float] = []

    def start(self):
        self.events.append(("start", None))

    def observe(self):
        self.observed_at.append(self.clock())
        self.clock.sleep(self.observe_s)
        return {"image": np.zeros((8, 8, 3), np.uint8), "proprio": np.zeros(9, np.float32), "instruction": "go"}

    def apply(self, action):
        self.events.append(("apply", np.array(action)))

    def hold(self):
        self.events.append(("hold", None))

    def success(self):
        return False

    def close(self):
        pass

    def sent(self):
        """The commands after start: arrays for applied actions, "hold" for holds."""
        return [a if kind == "apply" else kind for kind, a in self.events if kind != "start"]


class FakePolicy:
    """Chunk row r decided at tick t is [t / 100, r / 10, 0, 0.5]; every call takes `cost_s`, chosen ticks
    take `slow_s`, chosen ticks give NaN, and `fail_tick` raises."""

    def __init__(self, clock, chunk=3, slow_ticks=(), slow_s=0.07, cost_s=0.0, nan_ticks=(), fail_tick=None):
        self.clock, self.chunk, self.slow_ticks, self.slow_s = clock, chunk, set(slow_ticks), slow_s
        self.cost_s, self.nan_ticks, self.fail_tick = cost_s, set(nan_ticks), fail_tick
        self.t = 0  # the controller stamps the tick here before each call
        self.calls: list[tuple[int, np.ndarray | None]] = []  # (tick, committed) of every call

    def reset(self, instruction):
        self.t = 0
        self.calls = []

    def act_chunk(self, obs, committed=None):
        t = self.t
        self.calls.append((t, committed))
        if t == self.fail_tick:
            raise RuntimeError("policy failed")
        self.clock.sleep(self.slow_s if t in self.slow_ticks else self.cost_s)
        rows = np.array([[t / 100, r / 10, 0.0, 0.5] for r in range(self.chunk)], np.float32)
        if t in self.nan_ticks:
            rows[:] = np.nan
        self.t += 1
        return rows

    predict_chunk = act_chunk  # no plan and no ensembling here: the whole chunk either way


def action(t, r):
    return np.array([t / 100, r / 10, 0.0, 0.5], np.float32)


def run(clock, policy, robot=None, **cfg):
    """One episode on the virtual clock: 20 Hz, 40 ms budget, 0.5 s unless `cfg` says otherwise."""
    robot = robot or FakeRobot(clock)
    config = ControllerConfig(**{"hz": 20, "budget_ms": 40, "seconds": 0.5, "warmup": 0, **cfg})
    guard = ActionGuard.from_robot(robot, max_delta=None)  # pass actions through unchanged
    controller = Controller(policy, robot, config, guard, clock=clock, sleep=clock.sleep, worker=VirtualWorker)
    return controller.run(), robot


@pytest.fixture
def clock():
    return VirtualClock()


# ------------------------------------------------------------------------------------- guard


def test_guard_rejects_nonfinite_and_holds_the_last_safe_action():
    guard = ActionGuard(-np.ones(4), np.ones(4), max_delta=None)
    assert guard([np.nan, 0, 0, 0]) is None  # nothing safe sent yet: the caller holds
    good = np.array([0.1, -0.2, 0.3, 1.0], np.float32)
    np.testing.assert_array_equal(guard(good), good)
    for bad in ([np.nan, 0, 0, 0], [0, np.inf, 0, 0], [0, 0, -np.inf, np.nan]):
        np.testing.assert_array_equal(guard(bad), good)
    assert guard.counts == {"nonfinite": 4, "clamped": 0, "rate_limited": 0}
    with pytest.raises(ValueError, match="shape"):
        guard(np.zeros(3))


def test_guard_clamps_to_the_action_space():
    guard = ActionGuard(-np.ones(4), np.ones(4), max_delta=None)
    np.testing.assert_array_equal(guard([2.0, -3.0, 0.5, 1.5]), [1.0, -1.0, 0.5, 1.0])
    guard([0.0, 0.0, 0.0, 0.0])
    assert guard.counts["clamped"] == 1


def test_guard_limits_the_rate_of_motion_dims_but_not_the_gripper(clock):
    robot = FakeRobot(clock)
    guard = ActionGuard.from_robot(robot, max_delta=0.25)
    np.testing.assert_allclose(guard([1.0, -1.0, 0.1, 1.0]), [0.25, -0.25, 0.1, 1.0])  # from rest
    np.testing.assert_allclose(guard([1.0, -1.0, 0.1, 1.0]), [0.5, -0.5, 0.1, 1.0])
    np.testing.assert_allclose(guard([1.0, 1.0, 0.1, -1.0]), [0.75, -0.25, 0.1, -1.0])  # gripper switches at once
    assert guard.counts["rate_limited"] == 3
    both = ActionGuard.from_robot(robot, max_delta=0.25, limit_gripper=True)
    np.testing.assert_allclose(both([0.0, 0.0, 0.0, 1.0]), [0.0, 0.0, 0.0, 0.25])
    with pytest.raises(ValueError, match="max_delta"):
        ActionGuard(-np.ones(4), np.ones(4), max_delta=0.0)


# ------------------------------------------------------------------------------------- deadlines


def test_late_inference_falls_back_to_the_next_chunk_action_then_recovers(clock):
    result, robot = run(clock, FakePolicy(clock, chunk=3, slow_ticks={2}), max_consecutive_misses=0)
    sent = robot.sent()
    np.testing.assert_allclose(sent[0], action(0, 0))
    np.testing.assert_allclose(sent[1], action(1, 0))
    np.testing.assert_allclose(sent[2], action(1, 1))  # tick 2 was late: tick 1's chunk, one step on
    np.testing.assert_allclose(sent[3], action(4, 0))  # tick 2 ended at 170 ms, so tick 3 (150 ms) was skipped
    assert result.sources == ["policy", "policy", "chunk"] + ["policy"] * 6  # ticks 0-2 and 4-9 of a 0.5 s run
    assert result.deadline_misses == 1 and result.late_inferences == 1 and result.skipped_ticks == 1
    assert result.fallbacks == 1 and result.fallback_kinds == {"chunk": 1, "hold": 0}
    assert not result.safe_stop and result.end_reason == "time"
    np.testing.assert_allclose(result.latency_ms, [0, 0, 70, 0, 0, 0, 0, 0, 0], atol=1e-9)
    np.testing.assert_allclose(result.inference_ms, result.latency_ms, atol=1e-9)  # nothing else costs time here


def test_consecutive_misses_hold_then_safe_stop(clock):
    result, robot = run(clock, FakePolicy(clock, chunk=2, slow_ticks=range(1, 100)), max_consecutive_misses=3)
    sent = robot.sent()
    np.testing.assert_allclose(sent[0], action(0, 0))
    np.testing.assert_allclose(sent[1], action(0, 1))  # miss 1: the chunk's next action
    np.testing.assert_allclose(sent[2], action(0, 1))  # miss 2: chunk used up, hold the last safe action
    assert sent[3:] == ["hold", "hold"]  # miss 3: safe stop (and the loop's final hold)
    assert result.safe_stop and result.end_reason == "safe_stop"
    assert result.deadline_misses == 3 and result.max_consecutive_misses_seen == 3
    assert result.fallback_kinds == {"chunk": 1, "hold": 1} and result.fallbacks == 2
    assert result.sources == ["policy", "chunk", "hold", "safe_stop"]
    assert result.skipped_ticks == 2  # each 70 ms tick overran the 50 ms period by one boundary
    assert result.elapsed_s == pytest.approx(0.25 + 0.07)  # the safe stop came after tick 5's late inference


def test_injected_latency_makes_every_decision_late(clock):
    result, robot = run(clock, FakePolicy(clock), inject_latency_ms=60, inject_jitter_ms=5, max_consecutive_misses=2,
                        seed=4)  # fmt: skip
    assert robot.sent() == ["hold", "hold", "hold"]  # nothing safe was ever decided: hold in place
    assert result.safe_stop and result.deadline_misses == 2 and result.steps == 2
    expected = 60 + np.random.default_rng(4).uniform(-5, 5, size=2)  # the seeded jitter, drawn per inference
    np.testing.assert_allclose(result.inference_ms, expected, rtol=1e-9)


def test_nonfinite_policy_output_is_rejected_and_the_last_safe_action_held(clock):
    result, robot = run(clock, FakePolicy(clock, nan_ticks={2}), seconds=0.2)
    sent = robot.sent()
    np.testing.assert_allclose(sent[2], sent[1])
    np.testing.assert_allclose(sent[3], action(3, 0))
    assert result.guard["nonfinite"] == 1 and result.deadline_misses == 0 and result.steps == 4


def test_a_policy_error_still_leaves_the_robot_holding(clock):
    robot = FakeRobot(clock)
    with pytest.raises(RuntimeError, match="policy failed"):
        run(clock, FakePolicy(clock, fail_tick=2), robot)
    assert robot.sent()[-1] == "hold" and len(robot.sent()) == 3  # ticks 0 and 1 applied, then the hold


def test_async_acts_on_the_previous_ticks_chunk_while_the_next_is_computed(clock):
    result, robot = run(clock, FakePolicy(clock, chunk=3, cost_s=0.03), async_inference=True, seconds=0.4)
    sent = robot.sent()
    assert result.steps == 8 and result.sources == ["policy"] * 8 and result.deadline_misses == 0
    np.testing.assert_allclose(sent[0], action(0, 0))  # the first tick fills the pipeline synchronously
    for k in range(1, result.steps):
        np.testing.assert_allclose(sent[k], action(k - 1, 1))  # decided one tick ago, for this tick
    np.testing.assert_allclose(result.latency_ms, [30] + [0] * 7, atol=1e-9)  # the loop never waits for inference
    np.testing.assert_allclose(result.inference_ms, [30] * 7, atol=1e-9)  # tick 7's chunk is never collected


def tick_of_each_command(clock_robot, result, period=0.05):
    """(tick index, command) per executed tick: the tick from when it observed (the first observation is
    the one before the clock starts)."""
    ticks = [round(t / period) for t in clock_robot.observed_at[1 : result.steps + 1]]
    return list(zip(ticks, clock_robot.sent()[: result.steps], strict=True))


def assert_each_action_is_for_its_own_tick(commands):
    """FakePolicy's row r of tick j's chunk is [j / 100, r / 10, ...]: it is meant for tick j + r."""
    for k, sent in commands:
        if not isinstance(sent, str):
            j, r = round(sent[0] * 100), round(sent[1] * 10)
            assert j + r == k, f"tick {k} executed row {r} of tick {j}'s chunk (meant for tick {j + r})"


def test_async_never_resends_a_used_up_chunks_last_row_as_a_fresh_decision(clock):
    """Inference of 110 ms (3 ticks to arrive) with a 4-action chunk: each chunk has one row left when it
    arrives. The old loop kept re-sending that last row as a fresh decision for up to ceil(budget/period)
    ticks (each re-sent delta moves the hand again); now a tick without a row for it holds still."""
    result, robot = run(clock, FakePolicy(clock, chunk=4, cost_s=0.11), async_inference=True, budget_ms=250,
                        seconds=1.0, max_consecutive_misses=0)  # fmt: skip
    commands = tick_of_each_command(robot, result)
    assert_each_action_is_for_its_own_tick(commands)
    assert [k for k, c in commands if isinstance(c, str)] == [4, 5, 7, 8, 10, 11, 13, 14, 16, 17, 19]
    assert result.sources.count("policy") == 7 and result.sources.count("hold") == 11
    assert result.delay_ticks == [3] * 5  # the measured delay: each result arrives 3 ticks after its observation


def test_async_acts_on_chunks_that_arrive_after_their_ticks_budget(clock):
    """Inference of 70 ms against a 40 ms budget: the old loop threw every chunk away (each was late for
    its own tick), so nothing ever moved; its later rows are still ahead of the robot and now drive it."""
    result, robot = run(clock, FakePolicy(clock, chunk=4, cost_s=0.07), async_inference=True, seconds=1.0,
                        max_consecutive_misses=0)  # fmt: skip
    commands = tick_of_each_command(robot, result)
    assert_each_action_is_for_its_own_tick(commands)
    assert result.sources[0] == "hold" and result.sources[1:] == ["policy"] * (result.steps - 1)
    assert result.late_inferences == 1 and result.deadline_misses == 1  # tick 0's own action was late
    assert [k for k, _ in commands[:3]] == [0, 2, 3]  # tick 0 inferred synchronously for 70 ms: tick 1 skipped


def test_async_inference_slower_than_the_chunk_ends_in_a_safe_stop(clock):
    result, _ = run(clock, FakePolicy(clock), async_inference=True, inject_latency_ms=160, max_consecutive_misses=4,
                    seconds=2)  # fmt: skip
    # 160 ms is 4 ticks: a 3-action chunk is all in the past when it arrives, so no tick has anything to do
    assert result.safe_stop and result.deadline_misses == 4 and result.fallbacks == 3
    assert result.late_inferences == 1 and result.sources == ["hold", "hold", "hold", "safe_stop"]
    assert result.skipped_ticks == 3  # tick 0's synchronous 160 ms


def test_chunk_strategy_in_wall_clock_replans_by_the_measured_delay(clock):
    """70 ms inference arrives 2 ticks later: with a 6-action chunk each chunk executes rows 2..5 and the next
    inference starts 2 ticks before they run out."""
    policy = FakePolicy(clock, chunk=6, cost_s=0.07)
    result, robot = run(clock, policy, strategy="chunk", seconds=1.0, max_consecutive_misses=0)
    commands = tick_of_each_command(robot, result)
    assert_each_action_is_for_its_own_tick(commands)
    assert [t for t, _ in policy.calls] == [0, 2, 6, 10, 14, 18]
    rows = [round(c[1] * 10) for _, c in commands[3:] if not isinstance(c, str)]
    assert set(rows) == {2, 3, 4, 5} and result.sources[1:] == ["policy"] * (result.steps - 1)
    assert result.strategy == "chunk" and set(result.delay_ticks) == {2}


def test_synchronous_in_wall_clock_holds_while_it_thinks_and_stamps_the_policy_with_its_moves(clock):
    """70 ms inference arrives 2 ticks later: each 3-action chunk runs rows 0..2 from the tick it arrives,
    then the hand holds for the 2 ticks of the next inference. FakePolicy's rows carry the step the
    controller stamped, which counts executed actions, not ticks."""
    policy = FakePolicy(clock, chunk=3, cost_s=0.07)
    result, robot = run(clock, policy, strategy="synchronous", seconds=1.0, max_consecutive_misses=0)
    commands = tick_of_each_command(robot, result)
    assert [t for t, _ in policy.calls] == [0, 1, 4, 7, 10]  # tick 0's chunk (inline, late) ran its last row only
    after = [c if isinstance(c, str) else (round(c[0] * 100), round(c[1] * 10)) for _, c in commands[2:]]
    assert after[:10] == ["hold", "hold", (1, 0), (1, 1), (1, 2), "hold", "hold", (4, 0), (4, 1), (4, 2)]
    assert result.strategy == "synchronous" and set(result.delay_ticks) == {2}


def test_delay_aware_in_wall_clock_commits_what_executes_during_the_inference(clock):
    policy = FakePolicy(clock, chunk=6, cost_s=0.07)
    result, robot = run(clock, policy, strategy="delay_aware", seconds=1.0, max_consecutive_misses=0)
    sent = dict(tick_of_each_command(robot, result))
    assert policy.calls[0][1] is None and len(policy.calls) > 3
    for tick, committed in policy.calls[1:]:
        assert committed.shape == (2, 4)  # d = 2 measured ticks of actions are already decided
        if tick + 1 in sent:
            np.testing.assert_allclose(committed, [sent[tick], sent[tick + 1]])


def test_a_strategy_takes_the_whole_chunks_whatever_the_policy_is_configured_to_execute(tiny_checkpoint):
    """The worker loop's strategy schedules the network's chunks itself (`predict_chunk`): a policy loaded to
    ensemble and re-plan on its own drives the robot exactly as one loaded without either."""
    from vla.policy.load import load_policy

    executed = []
    for options in ({}, {"temporal_ensemble": False}):  # the saved default ensembles
        policy, clock = load_policy(tiny_checkpoint, device="cpu", **options), VirtualClock()
        robot = SimRobot(gym.make("tabletop/Reach-v0", image_size=64), seed=0, clock=clock)
        config = ControllerConfig(strategy="ensemble", warmup=0, seconds=0.4)
        result = Controller(policy, robot, config, clock=clock, sleep=clock.sleep, worker=VirtualWorker).run()
        robot.close()
        executed.append(np.stack([a for a in result.executed if a is not None]))
    assert len(executed[0]) > 3
    np.testing.assert_array_equal(*executed)


def test_schedule_is_absolute_no_drift(clock):
    """Observing (3 ms) and inferring (5 ms) take time every tick; the ticks still start on t0 + k / hz."""
    robot = FakeRobot(clock, observe_s=0.003)
    result, _ = run(clock, FakePolicy(clock, cost_s=0.005), robot, hz=50, seconds=0.6)
    assert result.steps == 30 and result.skipped_ticks == 0
    start = robot.observed_at[1]  # [0] is the observation before the clock starts
    np.testing.assert_allclose(np.array(robot.observed_at[1:]) - start, np.arange(30) * 0.02, atol=1e-9)
    np.testing.assert_allclose(result.latency_ms, 8.0, atol=1e-9)


def test_the_real_worker_thread_runs_jobs_off_the_loop_and_hands_back_errors():
    release = threading.Event()
    stamps = iter(range(100))

    def infer(obs, tick, committed):
        assert threading.current_thread().name == "vla-inference"
        release.wait(10)
        if obs == "bad":
            raise RuntimeError("inference failed")
        return np.full((2, 4), tick, np.float32)

    worker = InferenceWorker(infer, clock=lambda: float(next(stamps)))
    try:
        assert worker.submit("obs", tick=3, deadline=9.0)
        assert not worker.submit("obs", tick=4, deadline=9.0)  # busy: one job at a time
        assert worker.poll() == []
        release.set()
        done = _wait_for(worker)
        (tick, deadline, out, t_start, t_done), = done  # fmt: skip
        assert (tick, deadline, t_start, t_done) == (3, 9.0, 0.0, 1.0)
        np.testing.assert_array_equal(out, np.full((2, 4), 3))
        assert worker.submit("bad", tick=5, deadline=9.0)  # free again once its result is in
        (_, _, error, _, _), = _wait_for(worker)  # fmt: skip
        assert isinstance(error, RuntimeError) and str(error) == "inference failed"
    finally:
        worker.close()
    assert not worker._thread.is_alive()


def _wait_for(worker, timeout=10.0):
    done = threading.Event()
    results = []
    for _ in range(int(timeout / 0.01)):
        results = worker.poll()
        if results:
            return results
        done.wait(0.01)
    raise AssertionError("the worker thread never finished its job")


def test_config_rejects_bad_values():
    for bad in ({"hz": 0}, {"budget_ms": -1}, {"seconds": 0}, {"max_consecutive_misses": -1}, {"strategy": "fly"},
                {"execute": -1}):  # fmt: skip
        with pytest.raises(ValueError, match=next(iter(bad))):
            ControllerConfig(**bad)


# ------------------------------------------------------------------------------------- SimRobot


def test_sim_robot_time_follows_its_clock(clock):
    robot = SimRobot(gym.make("tabletop/Reach-v0", image_size=64), seed=0, clock=clock)
    assert isinstance(robot, Robot)
    obs = robot.observe()
    assert obs["image"].shape == (64, 64, 3) and obs["proprio"].shape == (9,) and obs["instruction"]
    clock.sleep(1.0)
    robot.observe()
    assert robot.physics_steps == 0  # frozen until start()
    robot.start()
    start_ee = robot.scene.ee_pos
    robot.apply(np.array([1.0, 0.0, 0.0, -1.0], np.float32))
    clock.sleep(0.2)
    robot.observe()
    assert 0.2 - robot.dt - 1e-9 < robot.sim_time <= 0.2 + 1e-9  # the clock's time, in whole 2 ms steps
    moved = robot.scene.ee_pos - start_ee
    assert moved[0] > 0.015  # the arm moved under the last command while nobody was deciding
    gripper = robot.scene.data.ctrl[0]
    robot.hold()
    clock.sleep(0.1)
    robot.observe()
    assert 0.3 - robot.dt - 1e-9 < robot.sim_time <= 0.3 + 1e-9  # the remainder below one step is carried, not lost
    np.testing.assert_allclose(robot.scene.data.mocap_pos[0], robot.scene.ee_pos, atol=3e-3)  # holding still
    assert robot.scene.data.ctrl[0] == gripper  # gripper unchanged
    with pytest.raises(ValueError, match="finite"):
        robot.apply(np.array([np.nan, 0, 0, 0]))
    robot.close()


def test_sim_robot_reports_success_when_the_expert_reaches_the_goal(clock):
    robot = SimRobot(gym.make("tabletop/Reach-v0", image_size=64), seed=0, clock=clock)
    expert = envs.make_expert(robot.env, seed=0)
    robot.start()
    ticks = 0
    while not robot.success() and ticks < robot.env.spec.max_episode_steps:
        robot.apply(expert.act())
        clock.sleep(1 / envs.CONTROL_HZ)  # one control period of physics per action, as env.step does
        ticks += 1
    assert robot.success() is True and 0 < ticks < robot.env.spec.max_episode_steps
    robot.close()


# ------------------------------------------------------------------------------------- vla-deploy


def test_deploy_cli_writes_json_and_histogram(tiny_checkpoint, tmp_path, capsys):
    """In process (test_smoke runs vla-deploy as its own process)."""
    out = tmp_path / "deploy.json"
    argv = ["--checkpoint", str(tiny_checkpoint), "--task", "reach", "--hz", "20", "--budget-ms", "50",
            "--seconds", "1.0", "--json", str(out), "--inject-latency-ms", "2:1", "--seed", "3"]  # fmt: skip
    assert deploy.main(argv) == 0
    stdout = capsys.readouterr().out
    report = json.loads(out.read_text())
    for key in ("p50", "p95", "p99", "max"):
        assert report["latency_ms"][key] > 0
    assert report["latency_ms"]["p50"] <= report["latency_ms"]["p99"] <= report["latency_ms"]["max"]
    assert 1 <= report["steps"] <= 20 and report["steps"] == len(report["ticks"]["latency_ms"])
    assert report["end_reason"] == ("success" if report["success"] is True else "time")
    assert report["hz"] == 20 and report["budget_ms"] == 50 and report["task"] == "tabletop/Reach-v0"
    assert not report["safe_stop"] and report["fallbacks"] == sum(report["fallback_kinds"].values())
    assert report["deadline_misses"] == report["fallbacks"]  # without a safe stop every miss acts on a fallback
    assert report["ticks"]["source"].count("policy") == report["steps"] - report["deadline_misses"]
    assert set(report["guard"]) == {"nonfinite", "clamped", "rate_limited"} and report["instruction"]
    assert report["inference_ms"]["p50"] >= 1.0  # the injected 2 ± 1 ms
    assert 0.5 < report["sim_time_s"] < 1.5
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "latency" in stdout and "p99" in stdout


def test_deploy_safe_stop_exits_nonzero(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "stop.json"
    rc = deploy.main(["--checkpoint", str(tiny_checkpoint), "--task", "tabletop/Push-v0", "--seconds", "3",
                      "--strategy", "chunk", "--execute", "1",
                      "--json", str(out), "--inject-latency-ms", "80", "--max-consecutive-misses", "3"])  # fmt: skip
    assert rc == 3  # a safe stop (vla/cli/common.py's table)
    report = json.loads(out.read_text())
    assert report["safe_stop"] and report["end_reason"] == "safe_stop"
    # It stops on the third miss in a row. A loaded machine can add an isolated miss before those three (a
    # slow first tick), so the total is at least 3, and the longest run is exactly the stopping one.
    assert report["max_consecutive_misses_seen"] == 3 and report["deadline_misses"] >= 3
    assert report["async"] and report["elapsed_s"] < 1.0
    assert "safe stop True" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--checkpoint", "/nonexistent/ckpt", "--task", "reach"], "not a checkpoint directory"),
        (["--task", "fly"], "unknown task"),
        (["--task", "reach", "--hz", "0"], "hz must be positive"),
        (["--task", "reach", "--budget-ms", "-5"], "budget_ms must be positive"),
        (["--task", "reach", "--seconds", "0"], "seconds must be positive"),
        (["--task", "reach", "--max-delta", "-1"], "max-delta"),
        (["--task", "reach", "--strategy", "fly"], "--strategy 'fly' is not one of blocking"),
        (["--task", "reach", "--strategy", "delay_aware"], "no committed action slots"),
    ],
)
def test_deploy_bad_input_is_one_line_and_exit_2(tiny_checkpoint, tmp_path, capsys, args, message):
    if "--checkpoint" not in args:
        args = ["--checkpoint", str(tiny_checkpoint), *args]
    rc = deploy.main([*args, "--json", str(tmp_path / "x.json")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "x.json").exists()


def test_deploy_bad_latency_spec_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        deploy.main(["--checkpoint", "x", "--task", "reach", "--json", "x.json", "--inject-latency-ms", "fast"])
    assert e.value.code == 2 and "X:JITTER" in capsys.readouterr().err
    assert deploy.parse_latency("30") == (30.0, 0.0) and deploy.parse_latency("30:5.5") == (30.0, 5.5)
