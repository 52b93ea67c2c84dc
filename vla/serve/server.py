"""The websocket server: many robots, one policy, each connection its own episode.

asyncio serves the connections (websockets); one inference thread runs the policy steps, first come first
served. A connection waits for its own reply before its next message is read, so a slow robot (or one that
stops reading) only ever holds up itself, and every connection gets its turn on the inference thread.

Besides the protocol (vla/serve/protocol.py) the HTTP handshake answers three things, as openpi's server
does or where openpi-client looks: `GET /healthz` is 200 with a JSON line (no token needed); with a token
set, a handshake without the header `Authorization: Api-Key TOKEN` (what openpi-client sends for its
`api_key`, and `vla.policy.remote.RemotePolicy` too) is refused with HTTP 401 and one line saying why; past
`max_clients` connections, HTTP 503. A bad message gets one text frame saying what is wrong, then the
connection is closed with code 1008; a failure of the server itself, the same with code 1011 (and the
traceback in the server's log). Either way the other connections carry on.

Why no batching across connections: `vla-bench serve` measures what it could give (docs/benchmarks.md,
"Serving on loopback"), and it is not taken: a batched row's logits differ from the one-row step's in the
last float bits, so a robot's actions would no longer equal the in-process policy's; connections sit at
different ring slots of their KV caches, which one batched step cannot write; and the onnxruntime backend, the
one to serve from a CPU, already carries more robots unbatched than batching gives torch.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from vla.serve import wire
from vla.serve.protocol import BadRequest, ServedPolicy, metadata, parse_request
from vla.serve.session import Session

log = logging.getLogger("vla.serve")


class PolicyServer:
    def __init__(self, policy, backend: str = "torch", checkpoint: str | None = None, token: str | None = None,
                 max_clients: int = 16):  # fmt: skip
        """`policy`: a loaded policy with `fork()` (vla.policy.policy.Policy, on any backend)."""
        self.policy = policy
        self.served = ServedPolicy.of(policy)
        self.backend = backend
        self.token = token
        self.max_clients = max_clients
        self.metadata = metadata(policy, self.served, backend, checkpoint)
        self.sessions: set[Session] = set()  # the open connections' episode states
        self.steps = 0  # policy steps served since the start
        self._inference = ThreadPoolExecutor(1, thread_name_prefix="vla-serve-inference")

    async def serve(self, host: str, port: int, ready=None, stop: asyncio.Event | None = None) -> None:
        """Serve until `stop` is set (forever without one); `ready(url)` once listening (port 0: a free one)."""
        async with serve(
            self._connection, host, port, compression=None, max_size=self.served.max_message_bytes(),
            process_request=self._handshake,
        ) as server:  # fmt: skip
            bound_host, bound_port = server.sockets[0].getsockname()[:2]
            if ready is not None:
                ready(f"ws://{bound_host}:{bound_port}")
            if stop is None:
                await server.serve_forever()
            else:
                await stop.wait()
        self._inference.shutdown(wait=False)

    def health(self) -> dict:
        return {"status": "ok", "clients": len(self.sessions), "steps": self.steps, "backend": self.backend}

    def _handshake(self, connection: ServerConnection, request):
        """The HTTP side: /healthz, the token, the connection limit (None: go on with the websocket)."""
        if request.path.split("?")[0] == "/healthz":
            return connection.respond(HTTPStatus.OK, json.dumps(self.health()) + "\n")
        if self.token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Api-Key {self.token}".encode()):
                why = "wrong token" if given else "no token"
                log.info("refused %s: %s", connection.remote_address, why)
                return connection.respond(
                    HTTPStatus.UNAUTHORIZED, f"{why}: this server needs the header 'Authorization: Api-Key TOKEN' "
                    "(openpi-client: api_key=TOKEN; vla.policy.remote.RemotePolicy: token=TOKEN)\n",
                )  # fmt: skip
        if len(self.sessions) >= self.max_clients:
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, f"{self.max_clients} clients already\n")
        return None

    async def _connection(self, ws: ServerConnection) -> None:
        session = Session(self.policy)
        self.sessions.add(session)
        log.info("client %s connected (%d open)", ws.remote_address, len(self.sessions))
        loop = asyncio.get_running_loop()
        try:
            await ws.send(wire.pack(self.metadata))
            async for message in ws:
                try:
                    if isinstance(message, str):
                        raise BadRequest("a text frame: send msgpack in a binary frame")
                    request = parse_request(wire.unpack(message), self.served)
                    reply = await loop.run_in_executor(self._inference, session.handle, request)
                except (BadRequest, wire.WireError) as e:
                    log.info("client %s: bad request: %s", ws.remote_address, e)
                    await _refuse(ws, f"bad request: {e}", CloseCode.POLICY_VIOLATION, "bad request")
                    return
                self.steps += "actions" in reply
                await ws.send(wire.pack(reply))
        except ConnectionClosed:
            pass  # the client went away (or sent more than max_size: websockets closed it with code 1009)
        except Exception as e:  # a bug of ours: this connection ends with the reason, the others carry on
            log.exception("client %s: server error", ws.remote_address)
            await _refuse(ws, f"server error: {type(e).__name__}: {e}", CloseCode.INTERNAL_ERROR, "server error")
        finally:
            self.sessions.discard(session)  # its policy, cache and all, goes with it
            log.info("client %s disconnected (%d open)", ws.remote_address, len(self.sessions))


async def _refuse(ws: ServerConnection, text: str, code: CloseCode, reason: str) -> None:
    """The error frame (one line of text), then close."""
    try:
        await ws.send(" ".join(text.split()))
        await ws.close(code, reason)
    except ConnectionClosed:
        pass


class ServerThread:
    """A PolicyServer on its own event loop in a background thread, for tests and benchmarks (`url` once
    listening, `stop()`; a context manager)."""

    def __init__(self, server: PolicyServer, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0):
        self.server, self.url = server, None
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(host, port), name="vla-serve", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the server did not start listening within {timeout} s")
        if self._failed is not None:
            raise self._failed

    def _run(self, host: str, port: int) -> None:
        def listening(url: str) -> None:
            self.url = url
            self._ready.set()

        try:
            self._loop.run_until_complete(self.server.serve(host, port, ready=listening, stop=self._stop))
        except BaseException as e:  # noqa: BLE001 - handed to the thread that started it
            self._failed = e
            self._ready.set()
        finally:
            self._loop.close()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
