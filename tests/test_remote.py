"""The robot side of serving: RemotePolicy without torch, the controller against a server that dies, and
vla-eval / vla-deploy --server giving what the in-process policy gives."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from tests.conftest import run_main
from tests.serving import ServerProcess, in_process_chunks, observations, wait_until
from vla.control.controller import Controller, ControllerConfig
from vla.control.guard import ActionGuard
from vla.errors import PolicyUnavailable, UserError
from vla.policy.load import load_policy
from vla.policy.remote import RemoteError, RemotePolicy
from vla.serve.server import PolicyServer, ServerThread

INSTRUCTION = "push the red block to the green target"


@pytest.fixture(scope="module")
def policy(tiny_checkpoint):
    return load_policy(tiny_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def server(policy, tiny_checkpoint):
    with ServerThread(PolicyServer(policy, checkpoint=str(tiny_checkpoint))) as running:
        yield running


def test_remote_policy_imports_no_torch_and_acts_as_the_policy(server, policy, tmp_path):
    """What the robot runs: with torch (and the training side) impossible to import, RemotePolicy connects,
    resets and acts, and its chunks equal the in-process policy's."""
    out = tmp_path / "chunks.npy"
    script = f"""
import sys
for name in ("torch", "yaml", "h5py", "onnxruntime", "mujoco", "gymnasium", "PIL"):
    sys.modules[name] = None  # any import of these now fails
import numpy as np
from tests.serving import observations
from vla.policy.remote import RemotePolicy
policy = RemotePolicy({server.url!r})
assert policy.device.type == "remote" and policy.chunk == {policy.chunk}
policy.reset({INSTRUCTION!r})
chunks = [policy.act_chunk(o) for o in observations(policy.spec, seed=20, n=6)]
assert policy.act(observations(policy.spec, seed=21, n=1)[0]).shape == ({policy.action_dim},)
np.save({str(out)!r}, np.stack(chunks))
loaded = {{m.split(".")[0] for m, v in sys.modules.items() if v is not None}}
assert not loaded & {{"torch", "yaml", "h5py", "onnxruntime", "mujoco", "gymnasium"}}, loaded
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    want = in_process_chunks(policy, INSTRUCTION, observations(policy.spec, seed=20, n=6))
    np.testing.assert_array_equal(np.load(out), np.stack(want))


def test_remote_policy_errors_are_one_clear_line(server):
    with pytest.raises(RemoteError, match="not a websocket address"):
        RemotePolicy("http://127.0.0.1:1")
    with pytest.raises(PolicyUnavailable, match="cannot reach the policy server at ws://127.0.0.1:1"):
        RemotePolicy("ws://127.0.0.1:1", timeout=2)
    with pytest.raises(UserError, match="did you mean 'readout'"):
        RemotePolicy(server.url, readuot="argmax")
    with RemotePolicy(server.url) as remote:
        with pytest.raises(RuntimeError, match="reset"):
            remote.act({})
        remote.reset(INSTRUCTION)
        with pytest.raises(KeyError, match="missing 'proprio'"):
            remote.act({"image": np.zeros((64, 64, 3), np.uint8)})
    assert not server.server.sessions or wait_until(lambda: not server.server.sessions)


class StillRobot:
    """A robot in real time that never moves, with the policy's observation shapes; `on_observe(tick)` runs at
    every observation (here: kill the server at a chosen tick)."""

    def __init__(self, spec, on_observe=lambda tick: None):
        self.spec, self.on_observe, self.ticks = spec, on_observe, 0
        self.action_space = gym.spaces.Box(-1.0, 1.0, (spec.action_dim,), np.float32)
        self.gripper_dims = (spec.action_dim - 1,)
        self.holds = 0

    def start(self):
        self.ticks = 0

    def observe(self):
        self.on_observe(self.ticks)
        self.ticks += 1
        obs = observations(self.spec, seed=self.ticks, n=1)[0]
        return {**obs, "instruction": INSTRUCTION}

    def apply(self, action):
        pass

    def hold(self):
        self.holds += 1

    def success(self):
        return False

    def close(self):
        pass


def run_controller(policy, robot, **config) -> object:
    config = ControllerConfig(**{"hz": 20, "budget_ms": 50, "seconds": 3.0, "max_consecutive_misses": 3, **config})
    return Controller(policy, robot, config, ActionGuard.from_robot(robot, max_delta=None)).run()


@pytest.mark.slow
def test_a_server_killed_mid_episode_ends_in_the_safe_stop_and_a_restarted_one_serves_the_next(
    tiny_checkpoint, policy, tmp_path
):
    """kill -9 of vla-serve mid-episode: the controller misses its deadlines and makes its safe stop within
    the configured misses (no hang, the reason recorded); vla-deploy --server says so in one line; the same
    RemotePolicy reconnects to the restarted server for the next episode, which is exact again."""
    with ServerProcess(tiny_checkpoint, "--quiet") as first:
        remote = RemotePolicy(first.url, timeout=1.0, temporal_ensemble=False)

        def kill_at(tick):
            if tick == 6:
                first.kill()

        start = time.perf_counter()
        result = run_controller(remote, StillRobot(policy.spec, kill_at), warmup=1)
    assert time.perf_counter() - start < 8.0  # 6 ticks at 20 Hz, then 3 misses (0.45 s): no hang on the dead server
    assert result.safe_stop and result.end_reason == "safe_stop" and result.max_consecutive_misses_seen == 3
    assert result.policy_unavailable >= 1 and "is lost" in result.unavailable_reason
    # at most 6 ticks before the kill (a loaded machine can miss one of those too), then the 3rd miss stops
    assert len(result.sources) <= 6 + 3 and result.sources[-1] == "safe_stop"

    # vla-deploy --server, its server killed once the episode is under way (chunk strategy: the worker loop)
    with ServerProcess(tiny_checkpoint, "--quiet", port=first.port) as second:
        started = lambda: second.health()["steps"] >= 8  # noqa: E731 - the warm-up's 3 steps, then 5 ticks
        killer = threading.Thread(target=lambda: wait_until(started, 60) and second.kill())
        killer.start()
        report = tmp_path / "deploy.json"
        r = run_main("vla.cli.deploy",
                     "--server", second.url, "--task", "push", "--seconds", 20, "--strategy", "chunk",
                     "--hz", 5, "--budget-ms", 200,  # slow ticks: a loaded machine misses no 3 before the kill
                     "--max-consecutive-misses", 3, "--json", report, "--quiet")  # fmt: skip
        killer.join(60)
    assert r.returncode == 3, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("vla-deploy: safe stop after 3 deadline misses in a row: ")
    assert f"the connection to the policy server at {second.url} is lost" in r.stderr, r.stderr
    summary = json.loads(report.read_text())
    assert summary["safe_stop"] and summary["policy_unavailable"] >= 1 and summary["elapsed_s"] < 30

    # the next episode, on the first RemotePolicy: reset reconnects to the server now on that port
    with ServerProcess(tiny_checkpoint, "--quiet", port=first.port) as third:
        result = run_controller(remote, StillRobot(policy.spec), seconds=0.5)
        assert not result.safe_stop and result.policy_unavailable == 0 and result.end_reason == "time"
        obs = observations(policy.spec, seed=30, n=4)
        remote.reset(INSTRUCTION)
        got = [remote.act_chunk(o) for o in obs]
        assert third.health()["clients"] == 1
    for chunk, want in zip(got, in_process_chunks(policy, INSTRUCTION, obs, temporal_ensemble=False), strict=True):
        np.testing.assert_array_equal(chunk, want)


def test_vla_eval_over_the_server_gives_the_in_process_episodes(tiny_checkpoint, server, tmp_path):
    results = {}
    for where in ("--checkpoint", "--server"):
        source = tiny_checkpoint if where == "--checkpoint" else server.url
        out = tmp_path / f"{where[2:]}.json"
        r = run_main("vla.cli.eval", where, source, "--episodes-per-task", 2, "--tasks", "reach,push", "--json", out)
        assert r.returncode == 0, r.stderr
        results[where] = json.loads(out.read_text())
    local, remote = results["--checkpoint"], results["--server"]
    assert remote["episodes_detail"] == local["episodes_detail"] and remote["tasks"] == local["tasks"]
    assert remote["server"] == server.url and remote["backend"] == "torch"
    assert remote["checkpoint"] == str(tiny_checkpoint)
    assert remote["policy"]["device"].startswith(f"remote {server.url}")


@pytest.mark.parametrize("strategy", ["blocking", "chunk", "ensemble", "synchronous"])
def test_the_strategies_run_unchanged_against_the_server(tiny_checkpoint, server, tmp_path, strategy):
    """vla-eval --delay-ticks: the strategies (which ask the server for raw chunks, and stamp its step index)
    execute over the network exactly what they execute in process."""
    results = {}
    for where in ("--checkpoint", "--server"):
        source = tiny_checkpoint if where == "--checkpoint" else server.url
        out = tmp_path / f"{where[2:]}.json"
        r = run_main("vla.cli.eval",
                     where, source, "--episodes-per-task", 1, "--tasks", "push", "--json", out,
                     "--delay-ticks", 2, "--strategy", strategy)  # fmt: skip
        assert r.returncode == 0, r.stderr
        results[where] = json.loads(out.read_text())
    local, remote = results["--checkpoint"], results["--server"]
    assert remote["episodes_detail"] == local["episodes_detail"] and remote["smoothness"] == local["smoothness"]


def test_vla_deploy_over_the_server_and_its_flags(tiny_checkpoint, server, tmp_path):
    report = tmp_path / "deploy.json"
    r = run_main("vla.cli.deploy",
                 "--server", server.url, "--task", "reach", "--seconds", 1, "--strategy", "ensemble",
                 "--json", report, "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr
    summary = json.loads(report.read_text())
    assert summary["server"] == server.url and summary["backend"] == "torch" and summary["torch_threads"] is None
    assert summary["device"].startswith("remote ") and summary["steps"] >= 1 and summary["policy_unavailable"] == 0
    for args, says in [
        (["--server", server.url, "--backend", "onnxruntime"], "--backend: with --server the server runs"),
        (["--server", server.url, "--checkpoint", tiny_checkpoint], "give one of --checkpoint"),
        ([], "give one of --checkpoint"),
        (["--server", "ws://127.0.0.1:1"], "cannot reach the policy server"),
    ]:
        r = run_main("vla.cli.deploy", *args, "--task", "reach", "--json", tmp_path / "x.json")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    r = run_main("vla.cli.eval", "--server", server.url, "--attention", tmp_path)
    assert r.returncode == 2 and "--attention: with --server the server runs the policy" in r.stderr, r.stderr
