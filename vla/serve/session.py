"""One connection's episode state: the robot at the other end of a websocket.

A session owns a policy of its own (`fork()` of the served one: the weights, or the onnxruntime sessions,
are shared; the streaming KV cache, temporal ensembling and step counter are not), the instruction of its
episode and how many episodes it has run. Nothing in it is shared with another connection, so a robot's
actions through the server are exactly the in-process policy's on the same observations, whoever else is
connected. The server calls `handle` on its inference thread only; the session is dropped with its
connection.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from vla.serve.protocol import BadRequest, Request


class Session:
    def __init__(self, served_policy):
        self.served = served_policy  # the server's loaded policy: what each episode's policy is forked from
        self.policy = None  # this connection's policy, made when its first episode starts
        self.overrides: dict = {}  # the PolicyConfig overrides it was made with
        self.instruction: str | None = None
        self.episodes = 0

    def handle(self, request: Request) -> dict:
        """Act on one checked message: start an episode if it asks for one, then step if it carries an observation."""
        if request.starts_episode(self.instruction):
            self._start_episode(request)
        elif request.policy is not None and request.policy != self.overrides:
            raise BadRequest("'policy' settings apply from a new episode on: send them with an instruction or reset")
        if request.observation is None:
            config = dataclasses.asdict(self.policy.config) if self.policy is not None else None
            return {"episode": self.episodes, "instruction": self.instruction, "policy": config}
        if self.policy is None:
            raise BadRequest("no episode yet: the first message needs an 'instruction' (or 'prompt')")
        if request.step is not None:
            self.policy.t = request.step
        step = self.policy.t
        start = time.perf_counter()
        infer = self.policy.predict_chunk if request.raw else self.policy.act_chunk
        actions = infer(request.observation, committed=request.committed)
        infer_ms = (time.perf_counter() - start) * 1e3
        return {"actions": np.asarray(actions, np.float32), "step": step, "server_timing": {"infer_ms": infer_ms}}

    def _start_episode(self, request: Request) -> None:
        instruction = request.instruction or self.instruction
        if instruction is None:
            raise BadRequest("'reset' needs an 'instruction' (or 'prompt') for the first episode")
        overrides = self.overrides if request.policy is None else request.policy
        if self.policy is None or overrides != self.overrides:
            try:
                self.policy = self.served.fork(**overrides)
            except (TypeError, ValueError) as e:  # ConfigError (an unknown field, names the nearest) is a ValueError
                raise BadRequest(f"policy settings {overrides}: {e}") from None
            self.overrides = overrides
        self.policy.reset(instruction)
        self.instruction = instruction
        self.episodes += 1
