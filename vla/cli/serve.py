"""`vla-serve`: serve a policy to robots over a websocket, in openpi's wire protocol.

    vla-serve --checkpoint runs/demo --backend onnxruntime --host 0.0.0.0 --port 8000 --token SECRET [KEY=VALUE ...]

The policy runs on this machine (the GPU box); each robot's control loop connects with
`vla.policy.remote.RemotePolicy(url, token=...)` (numpy, msgpack and websockets only: no torch on the robot), or
with openpi's `openpi_client.websocket_client_policy.WebsocketClientPolicy(host, port, api_key=...)`
unmodified. Every connection is one robot with its own episode (vla/serve/session.py); the messages and
the observation keys are in vla/serve/protocol.py, the bytes in vla/serve/wire.py, the server in
vla/serve/server.py. Logs go to stderr; the first line on stdout says where it listens.

Exit status: 0 after SIGTERM (a clean stop), 2 bad input, 130 after Ctrl-C; vla/cli/common.py has the table.
"""

from __future__ import annotations

import sys

from vla.cli import common as cli
from vla.errors import UserError

PROG = "vla-serve"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(PROG, lambda: _run(args), interrupted="stopped")


def build_parser() -> cli.Parser:
    parser = cli.Parser(prog=PROG, description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1])
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (vla-train --out)")
    cli.add_backend(parser)
    parser.add_argument(
        "--host", default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for robots on the network, with "
        "--token)",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free port)")
    parser.add_argument(
        "--token", default=None,
        help="clients must send the header 'Authorization: Api-Key TOKEN' (openpi-client's api_key, RemotePolicy's "
        "token); default: no token",
    )  # fmt: skip
    parser.add_argument("--max-clients", type=int, default=16, metavar="N", help="connections at once (default 16)")
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda if available; torch backend)")
    parser.add_argument(
        "--threads", type=int, default=1, metavar="N",
        help="threads of the policy step (default 1: a small model's step gains little from more on a CPU)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="log only errors (default: every connection too)")
    cli.add_policy_overrides(parser)
    return parser


def _run(args) -> int:
    import asyncio
    import logging
    import signal

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be in 0..65535, got {args.port}")
    if args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    if args.max_clients < 1:
        raise UserError(f"--max-clients must be at least 1, got {args.max_clients}")
    if args.token is not None and not args.token.strip():
        raise UserError("--token must not be empty")
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="vla-serve: %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)  # a refused handshake is ours to report
    policy = _load(args)
    from vla.serve.server import PolicyServer

    server = PolicyServer(policy, args.backend, str(args.checkpoint), args.token, args.max_clients)

    def listening(url: str) -> None:
        where = f"serving {args.checkpoint} ({args.backend}, {policy.device}) on {url}"
        print(f"{PROG}: {where}, health {url.replace('ws://', 'http://')}/healthz, "
              f"{'token required' if args.token else 'no token'}", flush=True)  # fmt: skip

    async def serve() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        try:
            await server.serve(args.host, args.port, ready=listening, stop=stop)
        except OSError as e:  # the address is taken or not this machine's
            raise UserError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None

    asyncio.run(serve())
    return 0


def _load(args):
    """The checkpoint's policy on this machine (its threads set before an onnxruntime session is made)."""
    from vla.policy.load import load_policy

    overrides = cli.policy_overrides(args.overrides)
    device = cli.device(args.device)
    return load_policy(args.checkpoint, device=device, backend=args.backend, threads=args.threads, **overrides)


if __name__ == "__main__":
    sys.exit(main())
