"""Serving a policy to robots over a websocket, in openpi's wire protocol (`vla-serve`, vla/cli/serve.py).

    vla-serve --checkpoint runs/demo --backend onnxruntime --host 0.0.0.0 --port 8000 --token SECRET

The policy runs on this machine (the GPU box); each robot's control loop connects with
`vla.policy.remote.RemotePolicy(url, token=...)` (numpy, msgpack and websockets only: no torch on the robot), or
with openpi's `openpi_client.websocket_client_policy.WebsocketClientPolicy(host, port, api_key=...)`
unmodified. Every connection is one robot with its own episode (vla/serve/session.py); the messages and
the observation keys are in vla/serve/protocol.py, the bytes in vla/serve/wire.py, the server in
vla/serve/server.py. Logs go to stderr; the first line on stdout says where it listens.
"""
