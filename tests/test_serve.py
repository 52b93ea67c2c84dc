"""vla-serve: openpi's wire protocol, one exact episode per connection, and a server that survives its clients.

Real sockets on 127.0.0.1 and a real (tiny, briefly trained) checkpoint. Most tests run the server in a
thread of this process (`ServerThread`); the ones about the command itself, and openpi-client driving it,
run `python -m vla.cli.serve` as its own process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy as openpi_msgpack
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.conftest import run_main
from tests.serving import ServerProcess, in_process_chunks, observations, stalled_sender, wait_until
from vla.policy.load import load_policy
from vla.policy.remote import RemoteError, RemotePolicy
from vla.serve import wire
from vla.serve.server import PolicyServer, ServerThread

INSTRUCTION = "push the red block to the green target"
# openpi-client 0.1.2 holds its connection without a context manager, which websockets >= 17.1 warns about
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")


@pytest.fixture(scope="module")
def policy(tiny_checkpoint):
    return load_policy(tiny_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def server(policy):
    with ServerThread(PolicyServer(policy, max_clients=64)) as running:  # openpi clients stay until collected
        yield running


def openpi_obs(o: dict, prompt: str) -> dict:
    return {"observation/image": o["image"], "observation/state": o["proprio"], "prompt": prompt}


# ------------------------------------------------------------------------------------------ the wire format


def test_wire_format_is_openpis_both_ways():
    message = {"image": np.arange(12, dtype=np.uint8).reshape(2, 2, 3), "proprio": np.float32([0.5, -1.0]),
               "step": np.int64(7), "prompt": "go", "nested": {"x": np.zeros((0, 3), np.float64)}}  # fmt: skip
    ours = wire.pack(message)
    assert ours == openpi_msgpack.packb(message)  # byte for byte the layout openpi-client sends
    for decoded in (wire.unpack(ours), openpi_msgpack.unpackb(ours)):
        assert decoded["image"].dtype == np.uint8 and np.array_equal(decoded["image"], message["image"])
        assert decoded["proprio"].tolist() == [0.5, -1.0] and decoded["step"] == 7 and decoded["step"].dtype == np.int64
        assert decoded["nested"]["x"].shape == (0, 3) and decoded["prompt"] == "go"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\xc1\x00", "not a msgpack message"),
        (b"\x93\x01", "not a msgpack message"),  # truncated
        (msgpack.packb({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]}), "refused"),
        (msgpack.packb({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<c8", b"shape": [1]}), "refused"),
        (msgpack.packb({b"__ndarray__": True, b"data": b"\0" * 10, b"dtype": "|u1", b"shape": [4, 4]}), "needs 16"),
        (msgpack.packb({b"__ndarray__": True, b"data": b"", b"dtype": "|u1", b"shape": [-1]}), "shape"),
        (msgpack.packb({b"__ndarray__": True, b"data": b"", b"dtype": "nonsense", b"shape": [0]}), "dtype"),
        (msgpack.packb({b"__npgeneric__": True, b"data": "x", b"dtype": "<f4"}), "scalar"),
    ],
)
def test_wire_refuses_what_is_not_plain_numeric_data(data, says):
    with pytest.raises(wire.WireError, match=says):
        wire.unpack(data)
    with pytest.raises(wire.WireError, match="cannot send"):
        wire.pack({"x": np.array(["a"], dtype=object)})


# ------------------------------------------------------------------------------------------ exact episodes


@pytest.mark.slow
def test_openpi_client_drives_vla_serve_and_gets_the_in_process_actions(tiny_checkpoint, policy):
    """The acceptance test: `vla-serve` as its own process, the unmodified openpi-client, openpi's keys, the
    observations of a real closed-loop episode; every chunk equals the in-process policy's."""
    import gymnasium as gym

    import envs  # noqa: F401 - registers the tasks

    with ServerProcess(tiny_checkpoint, "--quiet") as proc:
        assert proc.health()["status"] == "ok"
        client = WebsocketClientPolicy(proc.url)
        meta = client.get_server_metadata()
        assert meta["server"] == "vla-serve" and meta["backend"] == "torch" and meta["image_keys"] == ["image"]
        assert meta["data_spec"]["action_dim"] == policy.action_dim and meta["model"]["chunk"] == policy.chunk
        env = gym.make("tabletop/Push-v0", image_size=policy.spec.image_size)
        obs, _ = env.reset(seed=3)
        local = policy.fork()
        local.reset(obs["instruction"])
        for t in range(25):
            reply = client.infer(openpi_obs(obs, obs["instruction"]))
            expected = local.act_chunk(obs)
            assert reply["step"] == t and reply["actions"].dtype == np.float32
            np.testing.assert_array_equal(reply["actions"], expected)
            assert reply["server_timing"]["infer_ms"] > 0
            obs, *_ = env.step(expected[0])
        env.close()
        assert proc.health()["steps"] == 25
        assert proc.stop() == 0  # SIGTERM: a clean stop


def test_a_new_instruction_or_a_reset_starts_a_new_episode(server, policy):
    obs = observations(policy.spec, seed=1, n=6)
    client = WebsocketClientPolicy(server.url)
    first = [client.infer(openpi_obs(o, "reach the red target")) for o in obs[:3]]
    assert [r["step"] for r in first] == [0, 1, 2]
    second = [client.infer(openpi_obs(o, INSTRUCTION)) for o in obs[3:]]  # a new prompt: a new episode
    assert [r["step"] for r in second] == [0, 1, 2]
    for got, want in zip(second, in_process_chunks(policy, INSTRUCTION, obs[3:]), strict=True):
        np.testing.assert_array_equal(got["actions"], want)
    again = client.infer({**openpi_obs(obs[3], INSTRUCTION), "reset": True})  # the same prompt, explicitly anew
    assert again["step"] == 0
    np.testing.assert_array_equal(again["actions"], in_process_chunks(policy, INSTRUCTION, obs[3:4])[0])


def test_two_concurrent_clients_interleaving_steps_are_each_exact(server, policy):
    """Our client and openpi's, two robots in two threads, each step of one between steps of the other."""
    n = 12
    streams = {"ours": observations(policy.spec, seed=2, n=n), "openpi": observations(policy.spec, seed=3, n=n)}
    ours = RemotePolicy(server.url, temporal_ensemble=False)
    theirs = WebsocketClientPolicy(server.url)
    got: dict[str, list] = {"ours": [], "openpi": []}
    turns = {name: threading.Event() for name in streams}

    def run(name: str, other: str, step) -> None:
        for o in streams[name]:
            assert turns[name].wait(30)
            turns[name].clear()
            got[name].append(step(o))
            turns[other].set()  # strictly alternating: every step lands between two of the other robot's

    ours.reset(INSTRUCTION)
    threads = [
        threading.Thread(target=run, args=("ours", "openpi", ours.act_chunk)),
        threading.Thread(target=run, args=("openpi", "ours", lambda o: client_chunk(theirs, o))),
    ]
    for thread in threads:
        thread.start()
    turns["ours"].set()
    for thread in threads:
        thread.join(60)
    want_ours = in_process_chunks(policy, INSTRUCTION, streams["ours"], temporal_ensemble=False)
    want_theirs = in_process_chunks(policy, "reach the blue target", streams["openpi"])
    assert len(got["ours"]) == len(got["openpi"]) == n
    for got_chunk, want in zip(got["ours"] + got["openpi"], want_ours + want_theirs, strict=True):
        np.testing.assert_array_equal(got_chunk, want)
    ours.close()


def client_chunk(client: WebsocketClientPolicy, o: dict) -> np.ndarray:
    return client.infer(openpi_obs(o, "reach the blue target"))["actions"]


def test_committed_actions_travel_to_the_policy(server, policy):
    """delay_aware's committed rows reach Policy.act_chunk: the chunk starts with them, as in process."""
    obs = observations(policy.spec, seed=4, n=3)
    local = policy.fork(temporal_ensemble=False)
    local.reset(INSTRUCTION)
    committed = np.full((1, policy.action_dim), 0.25, np.float32)
    with RemotePolicy(server.url, temporal_ensemble=False) as remote:
        remote.reset(INSTRUCTION)
        for o in obs:
            got, want = remote.act_chunk(o, committed=committed), local.act_chunk(o, committed=committed)
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(got[:1], committed)


def test_raw_chunks_travel_as_predict_chunk(server, policy):
    """A client that schedules chunks itself asks for the network's whole chunk: predict_chunk's, as in process,
    from a server episode that ensembles its act_chunk (the saved default)."""
    obs = observations(policy.spec, seed=7, n=4)
    local = policy.fork()
    local.reset(INSTRUCTION)
    assert local.config.temporal_ensemble
    with RemotePolicy(server.url) as remote:
        remote.reset(INSTRUCTION)
        for o in obs:
            np.testing.assert_array_equal(remote.predict_chunk(o), local.predict_chunk(o))


def test_the_onnxruntime_backend_serves_each_connection_its_own_episode(tiny_checkpoint, tmp_path):
    """Forked onnxruntime policies share the sessions, not the streaming state; committed actions come back as
    the chunk's first rows, as on torch (this model has no committed slots to condition on)."""
    from vla.export.graphs import export_policy

    export_policy(load_policy(tiny_checkpoint, device="cpu"), tmp_path / "export")
    onnx = load_policy(tmp_path / "export", backend="onnxruntime", threads=1)
    obs_a, obs_b = observations(onnx.spec, seed=5, n=6), observations(onnx.spec, seed=6, n=6)
    with ServerThread(PolicyServer(onnx, backend="onnxruntime")) as running:
        a, b = RemotePolicy(running.url), RemotePolicy(running.url)
        assert a.metadata["backend"] == "onnxruntime" and str(a.device).endswith("(onnxruntime-cpu)")
        a.reset(INSTRUCTION)
        b.reset("stack the red block on the blue block")
        got_a, got_b = [], []
        for oa, ob in zip(obs_a, obs_b, strict=True):
            got_a.append(a.act_chunk(oa))
            got_b.append(b.act_chunk(ob))
        raw, committed = RemotePolicy(running.url, temporal_ensemble=False), np.full((1, onnx.action_dim), 0.25)
        raw.reset(INSTRUCTION)
        np.testing.assert_array_equal(raw.act_chunk(obs_a[0], committed=committed)[:1], committed)
    for got, want in zip(got_a, in_process_chunks(onnx, INSTRUCTION, obs_a), strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(got_b, in_process_chunks(onnx, "stack the red block on the blue block", obs_b), strict=True):
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------------------ faults


class SlowOnCue:
    """The served policy, except that a step whose proprio[0] is 99 takes `seconds` (and says when it began)."""

    def __init__(self, policy, seconds: float, began: threading.Event):
        self.policy, self.seconds, self.began = policy, seconds, began

    def __getattr__(self, name):
        return getattr(self.policy, name)

    @property
    def t(self):
        return self.policy.t

    @t.setter
    def t(self, value):
        self.policy.t = value

    def fork(self, **overrides):
        return SlowOnCue(self.policy.fork(**overrides), self.seconds, self.began)

    def act_chunk(self, obs, committed=None):
        if obs["proprio"][0] == 99:
            self.began.set()
            time.sleep(self.seconds)
        return self.policy.act_chunk(obs, committed=committed)


def cue(o: dict) -> dict:
    return {**o, "proprio": np.concatenate([[99.0], o["proprio"][1:]]).astype(np.float32)}


def test_a_client_that_leaves_mid_step_frees_its_state_and_others_are_served(policy):
    began = threading.Event()
    obs = observations(policy.spec, seed=7, n=4)
    with ServerThread(PolicyServer(SlowOnCue(policy, 0.5, began))) as running:
        other = RemotePolicy(running.url)
        other.reset(INSTRUCTION)
        got = [other.act_chunk(obs[0])]
        with connect(running.url) as leaver:
            leaver.recv(timeout=10)  # the metadata
            leaver.send(wire.pack({"instruction": INSTRUCTION, **cue(obs[1])}))
            assert began.wait(10)  # its step is running on the server when it goes
        assert len(running.server.sessions) >= 1
        got += [other.act_chunk(o) for o in obs[1:]]
        assert wait_until(lambda: len(running.server.sessions) == 1)  # only `other`'s state is left
    for chunk, want in zip(got, in_process_chunks(policy, INSTRUCTION, obs), strict=True):
        np.testing.assert_array_equal(chunk, want)


def test_a_silent_server_is_unavailable_after_the_timeout_and_reset_reconnects(policy):
    from vla.errors import PolicyUnavailable

    obs = observations(policy.spec, seed=8, n=2)
    with ServerThread(PolicyServer(SlowOnCue(policy, 1.0, threading.Event()))) as running:
        remote = RemotePolicy(running.url, timeout=0.2)
        remote.reset(INSTRUCTION)
        start = time.perf_counter()
        with pytest.raises(PolicyUnavailable, match="no reply .* within 0.2 s"):
            remote.act_chunk(cue(obs[0]))
        with pytest.raises(PolicyUnavailable, match="reset\\(\\) reconnects"):  # the episode is gone: fail fast
            remote.act_chunk(obs[1])
        assert time.perf_counter() - start < 0.9  # neither call waited for the slow step
        time.sleep(1.0)
        remote.reset(INSTRUCTION)
        np.testing.assert_array_equal(remote.act_chunk(obs[1]), in_process_chunks(policy, INSTRUCTION, obs[1:])[0])


def test_a_slow_client_never_blocks_another(server, policy):
    """Two clients stalled mid-message and one flooding requests without reading its replies: a robot's steps
    still each take about one step's time (at most the flooder's one step ahead of it) and stay exact."""
    stalled = [stalled_sender(server.url) for _ in range(2)]
    obs = observations(policy.spec, seed=9, n=20)
    flood = [wire.pack({"instruction": "reach the red target", **obs[0]})] + [wire.pack(o) for o in obs[1:]] * 10
    took, got = [], []
    with connect(server.url, max_queue=4) as flooder, RemotePolicy(server.url) as remote:
        flooder.recv(timeout=10)  # its reader stops after 4 unread replies: a robot that stopped listening
        for message in flood:
            flooder.send(message)
        remote.reset(INSTRUCTION)
        for o in obs:
            start = time.perf_counter()
            got.append(remote.act_chunk(o))
            took.append(time.perf_counter() - start)
        flooder.close_socket()
    assert max(took) < 1.0, took  # a step is milliseconds; a blocked one would wait here for its whole timeout
    for chunk, want in zip(got, in_process_chunks(policy, INSTRUCTION, obs), strict=True):
        np.testing.assert_array_equal(chunk, want)
    for sock in stalled:
        sock.close()


# ------------------------------------------------------------------------------------------ bad input


BAD_MESSAGES = ("malformed msgpack", "a text frame", "not a map", "an object array", "bytes that do not fill the shape",
                "a wrong image shape", "a float image", "a wrong proprio shape", "a boolean proprio", "no proprio",
                "both spellings", "no episode yet", "bad committed", "a policy typo", "a negative step",
                "a non-boolean raw")  # fmt: skip


def bad_messages(spec) -> dict[str, tuple]:
    """name -> (what the client sends, what the error frame must say)"""
    P, size, A = spec.proprio_dim, spec.image_size, spec.action_dim
    image = np.zeros((size, size, 3), np.uint8)
    good = {"instruction": INSTRUCTION, "image": image, "proprio": np.zeros(P, np.float32)}
    hostile = {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]}
    short = {b"__ndarray__": True, b"data": b"\0" * 10, b"dtype": "|u1", b"shape": [size, size, 3]}

    def raw(**replace) -> bytes:  # packed as openpi-client would, with no check of ours on the way out
        return msgpack.packb({**good, **replace}, default=openpi_msgpack.pack_array)

    return {
        "malformed msgpack": (b"\xc1\xc1\xc1", "not a msgpack message"),
        "a text frame": ("hello", "text frame"),
        "not a map": (wire.pack([1, 2, 3]), "must be a map"),
        "an object array": (raw(image=hostile), "refused"),
        "bytes that do not fill the shape": (raw(image=short), "needs"),
        "a wrong image shape": (wire.pack({**good, "image": np.zeros((32, 32, 3), np.uint8)}), "must be uint8"),
        "a float image": (wire.pack({**good, "image": np.zeros((size, size, 3), np.float32)}), "must be uint8"),
        "a wrong proprio shape": (wire.pack({**good, "proprio": np.zeros(P + 1, np.float32)}), "must have shape"),
        "a boolean proprio": (wire.pack({**good, "proprio": np.zeros(P, bool)}), "numeric array"),
        "no proprio": (wire.pack({k: v for k, v in good.items() if k != "proprio"}), "missing 'proprio'"),
        "both spellings": (wire.pack({**good, "prompt": "other"}), "both 'instruction' and 'prompt'"),
        "no episode yet": (wire.pack({k: v for k, v in good.items() if k != "instruction"}), "no episode yet"),
        "bad committed": (wire.pack({**good, "committed": np.zeros((3, A + 1), np.float32)}), "'committed' must"),
        "a policy typo": (raw(policy={"temporal_ensembel": False}), "did you mean 'temporal_ensemble'"),
        "a negative step": (wire.pack({**good, "step": -1}), "'step' must be"),
        "a non-boolean raw": (wire.pack({**good, "raw": 1}), "'raw' must be"),
    }


@pytest.mark.parametrize("case", BAD_MESSAGES)
def test_bad_input_gets_one_error_frame_and_the_connection_closes_others_unaffected(server, policy, case):
    cases = bad_messages(policy.spec)
    assert set(cases) == set(BAD_MESSAGES)
    data, says = cases[case]
    obs = observations(policy.spec, seed=10, n=2)
    with RemotePolicy(server.url) as bystander, connect(server.url) as bad:
        bystander.reset(INSTRUCTION)
        got = [bystander.act_chunk(obs[0])]
        bad.recv(timeout=10)  # the metadata
        bad.send(data)
        error = bad.recv(timeout=10)
        assert isinstance(error, str) and error.startswith("bad request: ") and says in error, error
        assert "\n" not in error
        with pytest.raises(ConnectionClosed):
            bad.recv(timeout=10)
        assert bad.close_code == 1008
        got.append(bystander.act_chunk(obs[1]))
    for chunk, want in zip(got, in_process_chunks(policy, INSTRUCTION, obs), strict=True):
        np.testing.assert_array_equal(chunk, want)


def test_an_oversized_message_is_refused_unread_others_unaffected(server, policy):
    limit = server.server.served.max_message_bytes()
    obs = observations(policy.spec, seed=11, n=1)
    with RemotePolicy(server.url) as bystander, connect(server.url) as big:
        bystander.reset(INSTRUCTION)
        assert wire.unpack(big.recv(timeout=10))["server"] == "vla-serve"
        big.send(b"\0" * (limit + 1))
        with pytest.raises(ConnectionClosed) as closed:
            big.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009  # websocket's "message too big"
        np.testing.assert_array_equal(bystander.act_chunk(obs[0]), in_process_chunks(policy, INSTRUCTION, obs)[0])


def test_the_token_is_checked_where_openpi_client_sends_its_api_key(policy):
    obs = observations(policy.spec, seed=12, n=1)
    with ServerThread(PolicyServer(policy, token="s3cret")) as running:
        good = RemotePolicy(running.url, token="s3cret")
        good.reset(INSTRUCTION)
        for token in (None, "wrong"):
            with pytest.raises(RemoteError, match="HTTP 401.*token"):
                RemotePolicy(running.url, token=token)
            with pytest.raises(InvalidStatus, match="HTTP 401"):
                WebsocketClientPolicy(running.url, api_key=token)
        theirs = WebsocketClientPolicy(running.url, api_key="s3cret")
        assert theirs.infer(openpi_obs(obs[0], INSTRUCTION))["step"] == 0
        with urllib.request.urlopen(running.url.replace("ws://", "http://") + "/healthz", timeout=5) as r:
            assert json.loads(r.read())["clients"] == 2  # health needs no token; refused handshakes left nothing
        np.testing.assert_array_equal(good.act_chunk(obs[0]), in_process_chunks(policy, INSTRUCTION, obs)[0])


def test_past_max_clients_the_handshake_is_refused(policy):
    from vla.errors import PolicyUnavailable

    with ServerThread(PolicyServer(policy, max_clients=1)) as running:
        first = RemotePolicy(running.url)
        with pytest.raises(PolicyUnavailable, match="HTTP 503"):
            RemotePolicy(running.url)
        first.close()
        assert wait_until(lambda: not running.server.sessions)
        RemotePolicy(running.url).close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(running.url.replace("ws://", "http://") + "/healthz", timeout=2)  # stopped


# ------------------------------------------------------------------------------------------ the command


def test_vla_serve_help_and_one_line_errors(tiny_checkpoint):
    r = subprocess.run([sys.executable, "-m", "vla.cli.serve", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage: vla-serve" in r.stdout and "--token" in r.stdout and "api_key" in r.stdout
    assert 'vla-serve = "vla.cli.serve:main"' in Path("pyproject.toml").read_text()  # the console script
    for args, says in [
        (["--checkpoint", "/nonexistent/ckpt"], "not a checkpoint directory"),
        (["--checkpoint", tiny_checkpoint, "--port", "70000"], "--port must be in 0..65535"),
        (["--checkpoint", tiny_checkpoint, "--backend", "onnxruntime"], "no ONNX export"),
        (["--checkpoint", tiny_checkpoint, "temporal_ensembel=false"], "temporal_ensemble"),
    ]:
        r = run_main("vla.cli.serve", *args)
        assert r.returncode == 2 and r.stderr.startswith("vla-serve: error: ") and r.stderr.count("\n") == 1, r.stderr
        assert says in r.stderr, r.stderr
    r = run_main("vla.cli.serve", "--port", "8000")  # argparse's own error: one line too
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("vla-serve: error: "), r.stderr
    assert "--checkpoint" in r.stderr and "(see vla-serve --help)" in r.stderr
