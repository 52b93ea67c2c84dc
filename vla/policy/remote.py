"""`RemotePolicy`: a policy that `vla-serve` runs on another machine, with the API of `load_policy`'s.

    from vla.policy.remote import RemotePolicy
    policy = RemotePolicy("ws://gpu-box:8000", token="SECRET")     # PolicyConfig overrides as keywords
    policy.reset("put the red block in the bin")
    action = policy.act(obs)            # obs as the robot gives it ("image", "proprio"); np.ndarray (A,)
    chunk = policy.act_chunk(obs)       # (rows, A), as Policy.act_chunk

It imports numpy, msgpack and websockets and nothing of torch: it is what the robot's computer installs.
The connection is the robot's episode on the server (its KV cache, ensembling and step counter live there),
so the actions equal the in-process policy's on the same observations. `t` is sent with every step, so a
controller that stamps its ticks on `policy.t` (vla/control/controller.py) drives it as it drives a local policy.

When the server cannot answer (unreachable, the connection lost, no reply within `timeout` seconds) a call
raises `vla.errors.PolicyUnavailable`: the controller counts a deadline miss and, after too many in a row,
makes its safe stop. The episode's state went with the connection, so every later step of that episode
raises the same; `reset()` reconnects (to a restarted server, say) and starts the next episode. When the
server refuses (a wrong token, an observation it cannot use) a call raises `RemoteError` with its reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from types import SimpleNamespace

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI, WebSocketException
from websockets.sync.client import ClientConnection, connect

from vla.errors import PolicyUnavailable, UserError
from vla.policy.config import PolicyConfig
from vla.policy.observation import check_instruction
from vla.policy.surface import PolicySurface
from vla.serve import wire
from vla.serve.protocol import PROTOCOL_VERSION


class RemoteError(UserError):
    """The policy server refused: a wrong token, a request it cannot act on, not a vla-serve server."""


@dataclasses.dataclass(frozen=True)
class RemoteDevice:
    type: str  # "remote" (what callers test against "cpu" / "cuda")
    url: str
    server_device: str  # where the server runs the policy, e.g. "cuda:0" or "onnxruntime-cpu"

    def __str__(self) -> str:
        return f"remote {self.url} ({self.server_device})"


class RemotePolicy(PolicySurface):
    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0, **overrides):
        """`url`: ws://HOST:PORT of a vla-serve; `token`: its --token; `timeout`: seconds to wait for the
        connection and for each reply; `overrides`: PolicyConfig fields the server runs this client's
        episodes with (e.g. temporal_ensemble=False), checked here and again there."""
        self.url, self.token, self.timeout = url, token, timeout
        self._ws: ClientConnection | None = None
        self._open = contextlib.ExitStack()  # holds the connection open across calls; closing it closes the socket
        self._lost = f"not connected to {url}"  # why there is no connection (while _ws is None)
        info = self._connect()
        self.metadata = info
        self.meta = {"tasks": info["tasks"], "model": info["model"], "data_spec": info["data_spec"]}
        self.spec = SimpleNamespace(**info["data_spec"])
        self.cfg = SimpleNamespace(**info["model"])
        self.image_keys: list[str] = list(info["image_keys"])
        self.device = RemoteDevice("remote", url, info["device"])
        self.overrides = dict(overrides)
        try:
            self.config = _policy_config({**info["policy"], **self.overrides})
        except UserError:
            self.close()
            raise
        self._episode = False
        self.t = 0  # the step index the next act_chunk is for (a controller may set it)

    @property
    def reads_committed(self) -> bool:
        """Whether committed actions condition the rest of the chunk (the served model has committed slots; a
        server whose backend cannot feed them refuses such a step)."""
        return bool(getattr(self.cfg, "committed_actions", False))

    def reset(self, instruction: str) -> None:
        """Start an episode on the server (reconnecting first if the connection is gone)."""
        message = {"reset": True, "instruction": check_instruction(instruction), "policy": self.overrides}
        if self._ws is None:
            self._connect()
        try:
            reply = self._call(message)
        except PolicyUnavailable:  # the server went away between episodes (restarted?): one fresh attempt
            self._connect()
            reply = self._call(message)
        self.config = _policy_config(reply["policy"])
        self._episode, self.t = True, 0

    def act_chunk(self, obs: dict, committed: np.ndarray | None = None) -> np.ndarray:
        """This step's action followed by the predicted next ones, (rows, A) float32: Policy.act_chunk's."""
        return self._step(obs, committed, raw=False)

    def predict_chunk(self, obs: dict, committed: np.ndarray | None = None) -> np.ndarray:
        """The network's whole chunk for this step, (chunk, A) float32: Policy.predict_chunk's."""
        return self._step(obs, committed, raw=True)

    def _step(self, obs: dict, committed: np.ndarray | None, raw: bool) -> np.ndarray:
        if not self._episode:
            raise RuntimeError("call policy.reset(instruction) before policy.act(obs)")
        if not isinstance(obs, dict):
            raise TypeError(f"obs must be a dict of observations, got {type(obs).__name__}")
        message = {"step": self.t, **({"raw": True} if raw else {})}
        for key in (*self.image_keys, "proprio"):
            if key not in obs:
                raise KeyError(f"observation is missing '{key}' (has: {', '.join(sorted(obs))})")
            message[key] = np.asarray(obs[key])
        if committed is not None:
            message["committed"] = np.asarray(committed, dtype=np.float32)
        reply = self._call(message)
        self.t = reply["step"] + 1
        return reply["actions"]

    def close(self) -> None:
        if self._ws is not None:
            self._open.close()
            self._ws, self._lost = None, f"closed the connection to {self.url}"
        self._episode = False

    def __enter__(self) -> RemotePolicy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------- the connection

    def _connect(self) -> dict:
        """Open a connection; returns the server's metadata."""
        self.close()
        headers = {"Authorization": f"Api-Key {self.token}"} if self.token else None
        try:
            ws = self._open.enter_context(
                connect(self.url, additional_headers=headers, compression=None, open_timeout=self.timeout,
                        close_timeout=1.0)
            )  # fmt: skip
        except InvalidURI:
            raise RemoteError(f"{self.url!r} is not a websocket address (ws://HOST:PORT)") from None
        except InvalidStatus as e:
            status, text = e.response.status_code, e.response.body.decode(errors="replace").strip()
            error = PolicyUnavailable if status == 503 else RemoteError  # 503: full now, maybe not later
            raise error(f"the policy server at {self.url} refused the connection (HTTP {status}): {text}") from None
        except (OSError, TimeoutError, WebSocketException) as e:
            raise PolicyUnavailable(f"cannot reach the policy server at {self.url}: {_reason(e)}") from None
        self._ws = ws
        info = self._receive()
        if not isinstance(info, dict) or info.get("server") != "vla-serve":
            self.close()
            raise RemoteError(f"{self.url} is not a vla-serve policy server")
        if info.get("protocol") != PROTOCOL_VERSION:
            self.close()
            raise RemoteError(f"{self.url} speaks protocol {info.get('protocol')}, this client {PROTOCOL_VERSION}")
        return info

    def _call(self, message: dict):
        """Send one message and return the server's reply (its one reply, in order)."""
        if self._ws is None:
            raise PolicyUnavailable(self._lost)
        try:
            self._ws.send(wire.pack(message))
        except (ConnectionClosed, OSError) as e:
            self._drop(f"the connection to the policy server at {self.url} is lost ({_reason(e)})")
        return self._receive()

    def _receive(self):
        try:
            data = self._ws.recv(timeout=self.timeout)
        except TimeoutError:
            self._drop(f"no reply from the policy server at {self.url} within {self.timeout:g} s")
        except (ConnectionClosed, OSError) as e:
            self._drop(f"the connection to the policy server at {self.url} is lost ({_reason(e)})")
        if isinstance(data, str):  # the server's error frame; it closes the connection after it
            self._drop(None)
            raise RemoteError(f"the policy server at {self.url} refused: {data}")
        try:
            return wire.unpack(data)
        except wire.WireError as e:
            self._drop(None)
            raise RemoteError(f"the policy server at {self.url} sent a malformed reply: {e}") from None

    def _drop(self, why: str | None) -> None:
        """Forget the connection (without waiting on a server that may be gone); raise PolicyUnavailable(why)."""
        if self._ws is not None:
            self._ws.close_socket()
            self._open.pop_all()  # nothing left to close politely
        self._ws = None  # the episode stays begun: its next steps raise PolicyUnavailable, not "call reset"
        if why is not None:
            self._lost = f"{why}; its episode state went with it: reset() reconnects for the next episode"
            raise PolicyUnavailable(self._lost)
        self._lost = f"the policy server at {self.url} closed the connection"


def _policy_config(fields: dict) -> PolicyConfig:
    """A PolicyConfig from the server's settings and our overrides; a typo names the nearest field."""
    valid = [f.name for f in dataclasses.fields(PolicyConfig)]
    for key in fields:
        if key not in valid:
            near = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean '{near[0]}'?" if near else f"; valid: {', '.join(valid)}"
            raise UserError(f"unknown policy setting '{key}'{hint}")
    try:
        return PolicyConfig(**fields)
    except ValueError as e:
        raise UserError(f"policy settings {fields}: {e}") from None


def _reason(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
