"""The real-time loop: action guard, deadlines under injected latency, safe stop, SimRobot, vla-deploy."""

import json
import time

import gymnasium as gym
import numpy as np
import pytest

import envs  # noqa: F401 - registers the tasks
from tests.conftest import run_cli
from vla import deploy
from vla.controller import ActionGuard, Controller, ControllerConfig
from vla.robot import Robot, SimRobot

# ------------------------------------------------------------------------------------- fakes


class FakeRobot:
    """Records what the loop sends; observation content does not matter to the fake policy."""

    action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    gripper_dims = (3,)

    def __init__(self):
        self.events: list[tuple[str, np.ndarray | None]] = []
        self.observed_at: list[float] = []

    def start(self):
        self.events.append(("start", None))

    def observe(self):
        self.observed_at.append(time.perf_counter())
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
        out = [a if kind == "apply" else kind for kind, a in self.events if kind != "start"]
        return out


class FakePolicy:
    """Chunk row r decided at tick t is [t / 100, r / 10, 0, 0.5]; chosen ticks are slow or NaN."""

    def __init__(self, chunk=3, slow_ticks=(), slow_s=0.07, nan_ticks=(), fail_tick=None):
        self.chunk, self.slow_ticks, self.slow_s, self.nan_ticks = chunk, set(slow_ticks), slow_s, set(nan_ticks)
        self.fail_tick = fail_tick
        self.t = 0  # the controller stamps the tick here before each call

    def reset(self, instruction):
        self.t = 0

    def act_chunk(self, obs):
        t = self.t
        if t == self.fail_tick:
            raise RuntimeError("policy failed")
        if t in self.slow_ticks:
            time.sleep(self.slow_s)
        rows = np.array([[t / 100, r / 10, 0.0, 0.5] for r in range(self.chunk)], np.float32)
        if t in self.nan_ticks:
            rows[:] = np.nan
        self.t += 1
        return rows


def action(t, r):
    return np.array([t / 100, r / 10, 0.0, 0.5], np.float32)


def run(policy, robot=None, **cfg):
    robot = robot or FakeRobot()
    config = ControllerConfig(**{"hz": 20, "budget_ms": 40, "seconds": 0.5, "warmup": 0, **cfg})
    guard = ActionGuard.from_robot(robot, max_delta=None)  # pass actions through unchanged
    return Controller(policy, robot, config, guard).run(), robot


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


def test_guard_limits_the_rate_of_motion_dims_but_not_the_gripper():
    robot = FakeRobot()
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


def test_late_inference_falls_back_to_the_next_chunk_action_then_recovers():
    result, robot = run(FakePolicy(chunk=3, slow_ticks={2}), max_consecutive_misses=0)
    sent = robot.sent()
    np.testing.assert_allclose(sent[0], action(0, 0))
    np.testing.assert_allclose(sent[1], action(1, 0))
    np.testing.assert_allclose(sent[2], action(1, 1))  # tick 2 was late: tick 1's chunk, one step on
    assert result.sources[:4] == ["policy", "policy", "chunk", "policy"]
    assert result.deadline_misses == 1 and result.late_inferences == 1
    assert result.fallbacks == 1 and result.fallback_kinds == {"chunk": 1, "hold": 0}
    assert result.skipped_ticks >= 1  # the 70 ms tick overran the 50 ms period
    assert not result.safe_stop and result.end_reason == "time"
    assert max(result.latency_ms) > 40 and result.latency_ms[0] < 40


def test_consecutive_misses_hold_then_safe_stop():
    result, robot = run(FakePolicy(chunk=2, slow_ticks=range(1, 100)), max_consecutive_misses=3)
    sent = robot.sent()
    np.testing.assert_allclose(sent[0], action(0, 0))
    np.testing.assert_allclose(sent[1], action(0, 1))  # miss 1: the chunk's next action
    np.testing.assert_allclose(sent[2], action(0, 1))  # miss 2: chunk used up, hold the last safe action
    assert sent[3:] == ["hold", "hold"]  # miss 3: safe stop (and the loop's final hold)
    assert result.safe_stop and result.end_reason == "safe_stop"
    assert result.deadline_misses == 3 and result.max_consecutive_misses_seen == 3
    assert result.fallback_kinds == {"chunk": 1, "hold": 1} and result.fallbacks == 2
    assert result.sources == ["policy", "chunk", "hold", "safe_stop"]


def test_injected_latency_makes_every_decision_late():
    result, robot = run(FakePolicy(), inject_latency_ms=60, inject_jitter_ms=5, max_consecutive_misses=2)
    assert robot.sent() == ["hold", "hold", "hold"]  # nothing safe was ever decided: hold in place
    assert result.safe_stop and result.deadline_misses == 2 and result.steps == 2
    assert all(55 <= ms < 200 for ms in result.inference_ms), result.inference_ms


def test_nonfinite_policy_output_is_rejected_and_the_last_safe_action_held():
    result, robot = run(FakePolicy(nan_ticks={2}), seconds=0.2)
    sent = robot.sent()
    np.testing.assert_allclose(sent[2], sent[1])
    np.testing.assert_allclose(sent[3], action(3, 0))
    assert result.guard["nonfinite"] == 1 and result.deadline_misses == 0


def test_a_policy_error_still_leaves_the_robot_holding():
    robot = FakeRobot()
    with pytest.raises(RuntimeError, match="policy failed"):
        run(FakePolicy(fail_tick=2), robot)
    assert robot.sent()[-1] == "hold"


def test_async_acts_on_the_previous_ticks_chunk_while_the_next_is_computed():
    result, robot = run(FakePolicy(chunk=3), async_inference=True, seconds=0.4)
    sent = robot.sent()
    np.testing.assert_allclose(sent[0], action(0, 0))  # the first tick fills the pipeline synchronously
    for k in range(1, result.steps):
        np.testing.assert_allclose(sent[k], action(k - 1, 1))  # decided one tick ago, for this tick
    assert result.deadline_misses == 0 and set(result.sources) == {"policy"}
    assert max(result.latency_ms) < 40  # the loop never waits for inference


def test_async_inference_slower_than_the_budget_ends_in_a_safe_stop():
    result, _ = run(FakePolicy(), async_inference=True, inject_latency_ms=70, max_consecutive_misses=4, seconds=2)
    assert result.safe_stop and result.deadline_misses == 4
    assert result.late_inferences >= 1 and result.fallbacks == 3


def test_schedule_is_absolute_no_drift():
    robot = FakeRobot()
    result, _ = run(FakePolicy(), robot, hz=50, seconds=0.6)
    start = robot.observed_at[1]  # [0] is the observation before the clock starts
    offsets = np.array(robot.observed_at[1:]) - start - np.arange(result.steps) * 0.02
    assert 28 <= result.steps <= 30
    assert abs(offsets[-1]) < 0.015, offsets  # lateness never accumulates


def test_config_rejects_bad_values():
    for bad in ({"hz": 0}, {"budget_ms": -1}, {"seconds": 0}, {"max_consecutive_misses": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ControllerConfig(**bad)


# ------------------------------------------------------------------------------------- SimRobot


def test_sim_robot_time_follows_the_wall_clock():
    robot = SimRobot(gym.make("tabletop/Reach-v0", image_size=64), seed=0)
    assert isinstance(robot, Robot)
    obs = robot.observe()
    assert obs["image"].shape == (64, 64, 3) and obs["proprio"].shape == (9,) and obs["instruction"]
    assert robot.physics_steps == 0  # frozen until start()
    robot.start()
    start_ee = robot.scene.ee_pos
    robot.apply(np.array([1.0, 0.0, 0.0, -1.0], np.float32))
    time.sleep(0.2)
    robot.observe()
    assert 0.2 <= robot.sim_time < 0.3  # physics advanced by the wall time, in whole 2 ms steps
    moved = robot.scene.ee_pos - start_ee
    assert moved[0] > 0.015  # the arm moved under the last command while nobody was deciding
    gripper = robot.scene.data.ctrl[0]
    robot.hold()
    time.sleep(0.1)
    robot.observe()
    np.testing.assert_allclose(robot.scene.data.mocap_pos[0], robot.scene.ee_pos, atol=3e-3)  # holding still
    assert robot.scene.data.ctrl[0] == gripper  # gripper unchanged
    assert robot.success() in (True, False)
    with pytest.raises(ValueError, match="finite"):
        robot.apply(np.array([np.nan, 0, 0, 0]))
    robot.close()


# ------------------------------------------------------------------------------------- vla-deploy


def test_deploy_cli_writes_json_and_histogram(tiny_checkpoint, tmp_path):
    out = tmp_path / "deploy.json"
    r = run_cli("vla.deploy", "--checkpoint", tiny_checkpoint, "--task", "reach", "--hz", 20, "--budget-ms", 50,
                "--seconds", 1.0, "--json", out, "--inject-latency-ms", "2:1", "--seed", 3)  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    for key in ("p50", "p95", "p99", "max"):
        assert report["latency_ms"][key] > 0
    assert report["latency_ms"]["p50"] <= report["latency_ms"]["p99"] <= report["latency_ms"]["max"]
    assert 1 <= report["steps"] <= 20 and report["steps"] == len(report["ticks"]["latency_ms"])
    assert isinstance(report["success"], bool) and report["end_reason"] in ("time", "success")
    assert report["hz"] == 20 and report["budget_ms"] == 50 and report["task"] == "tabletop/Reach-v0"
    assert report["deadline_misses"] >= 0 and report["fallbacks"] >= 0 and not report["safe_stop"]
    assert set(report["guard"]) == {"nonfinite", "clamped", "rate_limited"} and report["instruction"]
    assert report["inference_ms"]["p50"] >= 1.0  # the injected 2 ± 1 ms
    assert 0.5 < report["sim_time_s"] < 1.5
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "latency" in r.stdout and "p99" in r.stdout


def test_deploy_safe_stop_exits_nonzero(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "stop.json"
    rc = deploy.main(["--checkpoint", str(tiny_checkpoint), "--task", "tabletop/Push-v0", "--seconds", "3", "--async",
                      "--json", str(out), "--inject-latency-ms", "80", "--max-consecutive-misses", "3"])  # fmt: skip
    assert rc == deploy.SAFE_STOP_EXIT
    report = json.loads(out.read_text())
    assert report["safe_stop"] and report["end_reason"] == "safe_stop" and report["deadline_misses"] == 3
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
