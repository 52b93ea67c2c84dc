"""What a message to `vla-serve` may hold and what comes back: the protocol on top of the wire format.

On connect the server sends its metadata (`metadata()`); after that every message the client sends gets
exactly one reply, in order. A message is a map (keys on the left are ours, on the right openpi's; either
spelling works, both at once is an error):

    image        observation/image        uint8 (H, W, 3): the camera the policy was trained on
    wrist_image  observation/wrist_image  uint8 (H, W, 3): the second camera, for a two-camera policy
    proprio      observation/state        float (P,): the robot state the policy was trained on
    instruction  prompt                   str: a new instruction (or the first) starts a new episode
    reset                                 true: start a new episode even with the same instruction
    policy                                {field: value}: PolicyConfig overrides (vla/policy/config.py) for the
                                          connection, from the episode this message starts on
    step                                  int: the episode step this observation is for (default: one more
                                          than the last); the controller's tick, also across skipped ticks
    committed                             float (n, A): actions already decided for this step and the next
                                          n - 1 (the delay_aware strategy)
    raw                                   true: the network's whole chunk (`Policy.predict_chunk`), for a
                                          client that executes chunks itself (vla/policy/strategies.py)

Other keys are ignored (openpi clients send robot-specific extras). A message with an observation gets
{"actions": float32 (rows, A), "step": int, "server_timing": {"infer_ms": float}}, the rows as
`Policy.act_chunk` returns them; one without (a reset) gets {"episode": int, "instruction": str,
"policy": {...}}. A message that breaks these rules is a `BadRequest`: the server sends its message as one
text frame and closes the connection.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import numpy as np

from vla.policy.observation import check_observation

PROTOCOL_VERSION = 1
# our observation keys -> openpi's spelling of the same thing (what `openpi_client` examples send)
OPENPI_KEYS = {
    "image": "observation/image",
    "wrist_image": "observation/wrist_image",
    "proprio": "observation/state",
    "instruction": "prompt",
}
MAX_INSTRUCTION_CHARS = 2000  # an instruction is a sentence; the tokenizer keeps instruction_len tokens of it
MAX_STEP = 10**9  # an episode step index; far beyond any episode, small enough for every integer type


class BadRequest(ValueError):
    """A message the server cannot act on; its text goes back to the client as the error frame."""


@dataclass(frozen=True)
class ServedPolicy:
    """What the protocol checks a message against: the served policy's inputs and outputs."""

    image_keys: tuple[str, ...]  # the cameras, in our keys ("image", "wrist_image")
    image_size: int  # pixels per side
    proprio_dim: int  # P
    action_dim: int  # A
    chunk: int  # actions per prediction
    takes_committed: bool  # the policy accepts committed actions (torch backend)

    @classmethod
    def of(cls, policy) -> ServedPolicy:
        spec = policy.spec
        return cls(
            image_keys=tuple(policy.image_keys), image_size=spec.image_size, proprio_dim=spec.proprio_dim,
            action_dim=spec.action_dim, chunk=policy.chunk,
            takes_committed="committed" in inspect.signature(policy.act_chunk).parameters,
        )  # fmt: skip

    def max_message_bytes(self) -> int:
        """The largest message the server reads: room for four times a full observation (its images dominate)
        and 1 MiB at least; a longer message is refused unread (websocket close code 1009)."""
        images = len(self.image_keys) * self.image_size**2 * 3
        return max(1 << 20, 4 * (images + 4 * (self.proprio_dim + self.chunk * self.action_dim)))


@dataclass
class Request:
    """One message, checked and in our keys."""

    instruction: str | None = None  # starts a new episode when it differs from the current one
    reset: bool = False  # start a new episode even with the same instruction
    policy: dict | None = None  # PolicyConfig overrides
    observation: dict | None = None  # {"image": ..., "wrist_image": ..., "proprio": ...}, checked
    step: int | None = None  # the episode step this observation is for
    committed: np.ndarray | None = None  # (n, A) float32
    raw: bool = False  # the whole chunk, without the policy's planning or ensembling

    def starts_episode(self, current: str | None) -> bool:
        return self.reset or (self.instruction is not None and self.instruction != current)


def _field(message: dict, key: str):
    """The value under our key or openpi's spelling of it (None when neither is present)."""
    other = OPENPI_KEYS.get(key)
    if other is not None and key in message and other in message:
        raise BadRequest(f"both '{key}' and '{other}' are given; send one of them")
    return message.get(key, message.get(other) if other else None)


def parse_request(message, served: ServedPolicy) -> Request:
    """A decoded message -> a checked `Request`, or a BadRequest that says what is wrong."""
    if not isinstance(message, dict):
        raise BadRequest(f"a message must be a map of observations, got {type(message).__name__}")
    request = Request()
    instruction = _field(message, "instruction")
    if instruction is not None:
        if not isinstance(instruction, str) or not instruction.strip() or len(instruction) > MAX_INSTRUCTION_CHARS:
            raise BadRequest(f"'instruction' must be a non-empty string of at most {MAX_INSTRUCTION_CHARS} characters")
        request.instruction = instruction
    reset = message.get("reset", False)
    if not isinstance(reset, bool):
        raise BadRequest(f"'reset' must be true or false, got {reset!r}")
    request.reset = reset
    policy = message.get("policy")
    if policy is not None and not (isinstance(policy, dict) and all(isinstance(k, str) for k in policy)):
        raise BadRequest("'policy' must be a map of PolicyConfig fields to values")
    request.policy = policy
    step = message.get("step")
    integer = isinstance(step, int | np.integer) and not isinstance(step, bool)
    if step is not None and not (integer and 0 <= step < MAX_STEP):
        raise BadRequest(f"'step' must be an integer in 0..{MAX_STEP - 1}, got {step!r}")
    request.step = None if step is None else int(step)
    request.observation = _observation(message, served)
    request.committed = _committed(message.get("committed"), served)
    raw = message.get("raw", False)
    if not isinstance(raw, bool):
        raise BadRequest(f"'raw' must be true or false, got {raw!r}")
    request.raw = raw
    if request.observation is None and (request.step is not None or request.committed is not None or raw):
        raise BadRequest("'step', 'committed' and 'raw' come with an observation")
    return request


def _observation(message: dict, served: ServedPolicy) -> dict | None:
    """The observation in our keys, its shapes and dtypes checked; None when the message carries none."""
    keys = (*served.image_keys, "proprio")
    values = {key: _field(message, key) for key in keys}
    if all(v is None for v in values.values()):
        return None
    for key, value in values.items():
        if value is None:
            raise BadRequest(f"the observation is missing '{key}' (or '{OPENPI_KEYS[key]}')")
    proprio = values["proprio"]
    if isinstance(proprio, list | tuple):
        proprio = np.asarray(proprio) if all(isinstance(x, int | float) for x in proprio) else None
    if not isinstance(proprio, np.ndarray) or proprio.dtype.kind not in "iuf":
        raise BadRequest(f"'proprio' must be a numeric array of shape ({served.proprio_dim},)")
    values["proprio"] = proprio
    try:
        check_observation(values, list(served.image_keys), served.image_size, served.proprio_dim)
    except (KeyError, TypeError, ValueError) as e:
        raise BadRequest(e.args[0] if e.args else str(e)) from None
    return values


def _committed(value, served: ServedPolicy) -> np.ndarray | None:
    if value is None:
        return None
    if not served.takes_committed:
        raise BadRequest("'committed' actions need a server running the torch backend (vla-serve --backend torch)")
    A = served.action_dim
    ok = isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.ndim == 2
    if not ok or value.shape[1] != A or not 1 <= value.shape[0] <= served.chunk:
        raise BadRequest(f"'committed' must be a float array (n, {A}) with 1 <= n <= {served.chunk}")
    if not np.all(np.isfinite(value)):
        raise BadRequest("'committed' contains NaN or Inf")
    return value.astype(np.float32)


def metadata(policy, served: ServedPolicy, backend: str, checkpoint: str | None = None) -> dict:
    """What the server sends first on every connection: what it serves, and how to talk to it."""
    from vla import __version__

    return {
        "server": "vla-serve",
        "protocol": PROTOCOL_VERSION,
        "vla_version": __version__,
        "checkpoint": checkpoint,
        "backend": backend,
        "device": str(policy.device),
        "model": dict(policy.meta["model"]),
        "data_spec": dict(policy.meta["data_spec"]),
        "tasks": list(policy.meta.get("tasks") or []),
        "image_keys": list(served.image_keys),
        "policy": dataclasses.asdict(policy.config),  # the defaults a connection starts with
        "takes_committed": served.takes_committed,
        "max_message_bytes": served.max_message_bytes(),
        "keys": dict(OPENPI_KEYS),
    }
