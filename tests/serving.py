"""What the serving tests share: vla-serve as a real process, observation streams, clients that misbehave."""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

from vla.bench.serve import random_observations

observations = random_observations  # the bench's observations: one generator for both


def in_process_chunks(policy, instruction: str, obs: list[dict], **overrides) -> list[np.ndarray]:
    """What a fresh episode of the policy (its own fork) returns for these observations, one chunk each."""
    twin = policy.fork(**overrides)
    twin.reset(instruction)
    return [twin.act_chunk(o) for o in obs]


class ServerProcess:
    """`python -m vla.cli.serve` as its own process (what a GPU box runs): `url`, `kill()` (SIGKILL), `stop()`."""

    def __init__(self, checkpoint, *args, port: int = 0, timeout: float = 180.0):
        cmd = [sys.executable, "-m", "vla.cli.serve", "--checkpoint", str(checkpoint), "--port", str(port), *args]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        found = re.search(r"ws://[\d.]+:\d+", first[0]) if first else None
        if found is None:
            self.kill()
            raise RuntimeError(f"vla-serve did not start: {first} {self.proc.stderr.read()}")
        self.url = found.group(0)
        self.port = int(self.url.rsplit(":", 1)[1])

    def health(self) -> dict:
        import json

        with urllib.request.urlopen(self.url.replace("ws://", "http://") + "/healthz", timeout=5) as r:
            return json.loads(r.read())

    def kill(self) -> None:
        """As a crash or a pulled plug would: no close frames, no goodbye."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def wait_until(condition, timeout: float = 10.0, every: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every)
    return condition()


def stalled_sender(url: str, announced: int = 1 << 16) -> socket.socket:
    """A client that opens the websocket, announces a frame of `announced` bytes, sends 100 of them and stops:
    a robot on a link that has died mid-message (its socket stays open)."""
    host, port = url.removeprefix("ws://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(4096)
    assert response.startswith(b"HTTP/1.1 101"), response
    header = bytes([0x82, 0x80 | 127]) + announced.to_bytes(8, "big") + os.urandom(4)  # binary, masked, 64-bit size
    sock.sendall(header + bytes(100))
    return sock
