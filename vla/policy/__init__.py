"""The policy front end: observation in, action out, over a torch, onnxruntime or remote backend.

- `load.py`: `load_policy(DIR, backend=...)`, the one way in (no torch imported for onnxruntime).
- `policy.py`: `Policy`, the front end (reset, act, act_chunk, predict_chunk, readout, planning, ensembling).
- `torch_policy.py` / `onnx_policy.py`: the backends, each mapping one step to logits.
- `remote.py`: `RemotePolicy`, the same surface (`surface.py`) served by vla-serve over a websocket.
- `config.py`: PolicyConfig; `ensemble.py`: temporal ensembling; `strategies.py`: chunk execution under delay;
  `observation.py`: the observation contract.
"""
