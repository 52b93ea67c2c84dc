"""Serving a policy to robots over a websocket, in openpi's wire protocol (the `vla-serve` command:
vla/cli/serve.py, which says how robots connect). One connection is one robot with its own episode
(session.py); the messages and observation keys are in protocol.py, the bytes in wire.py, the server in
server.py."""
