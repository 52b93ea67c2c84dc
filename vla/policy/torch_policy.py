"""The torch backend of the Policy front end (vla/policy/policy.py): the network maps one step to logits.

With `kv_cache=True` each step appends its observation tokens to the streaming cache and decodes its action
tokens (constant cost per step however long the episode). With `kv_cache=False` it recomputes the whole
window from scratch every step; both give the same actions.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from vla.config import ConfigError
from vla.model import ActionTransformer, DataSpec, ModelConfig
from vla.policy.config import PolicyConfig
from vla.policy.policy import Policy
from vla.tokenizers import Tokenizers


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """CUDA when present, else CPU; an explicit choice wins (and must exist)."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise ConfigError(f"device {device!r} is not a torch device ({e}); use auto, cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was requested but no CUDA device is available")
    return device


class TorchBackend:
    def __init__(self, model: ActionTransformer, tokenizers: Tokenizers, meta: dict, kv_cache: bool = True):
        self.model = model.eval()
        self.tok, self.meta = tokenizers, meta
        self.cfg: ModelConfig = model.cfg
        self.spec: DataSpec = model.spec
        self.device = next(model.parameters()).device
        self.image_keys = ["image", "wrist_image"][: self.spec.n_cameras]
        self.reads_committed = True  # the network's committed slots (when it has them) read the bins
        self._cache = model.new_cache(1, self.device) if kv_cache else None
        self._history: deque = deque(maxlen=self.cfg.window)  # (image, proprio, timestep) per step
        self._instruction: torch.Tensor | None = None

    def fork(self, kv_cache: bool) -> TorchBackend:
        return TorchBackend(self.model, self.tok, self.meta, kv_cache)

    def start(self, ids: np.ndarray) -> None:
        self._instruction = torch.as_tensor(ids, dtype=torch.long, device=self.device)  # (1, L)
        self._history.clear()
        if self._cache is not None:
            self.model.start(self._cache, self._instruction)

    @torch.inference_mode()
    def step(self, image: np.ndarray, proprio: np.ndarray, t: int, committed: np.ndarray | None) -> np.ndarray:
        """Run the network on this step (cached or recomputed); the step joins the window."""
        image_t = torch.from_numpy(image).to(self.device)  # (1, n_cam, H, W, 3)
        proprio_t = torch.from_numpy(proprio).to(self.device)  # (1, P)
        timestep = torch.tensor([t], dtype=torch.long, device=self.device)
        held = None if committed is None else torch.from_numpy(committed).to(self.device)  # (1, chunk*A)
        self._history.append((image_t, proprio_t, timestep))
        if self._cache is not None:
            out = self.model.step(self._cache, image_t, proprio_t, timestep, committed=held)
        else:
            w = self.window_batch()
            out = self.model.recompute(w["instruction"], w["image"], w["proprio"], w["timestep"], committed=held)
        return out.logits[0].float().cpu().numpy()  # (chunk*A, bins)

    def window_batch(self) -> dict:
        """The current window (the last K steps seen) as a model batch of one, oldest step first."""
        images, props, steps = zip(*self._history, strict=True)
        return {
            "instruction": self._instruction,  # (1, L)
            "image": torch.stack(images, dim=1),  # (1, T, n_cam, H, W, 3)
            "proprio": torch.stack(props, dim=1),  # (1, T, P)
            "timestep": torch.stack(steps, dim=1),  # (1, T)
        }


def torch_policy(
    model: ActionTransformer, tokenizers: Tokenizers, meta: dict, config: PolicyConfig | None = None
) -> Policy:
    """The Policy front end over a network in this process (what load_policy builds from a checkpoint)."""
    config = config or PolicyConfig()
    return Policy(TorchBackend(model, tokenizers, meta, config.kv_cache), config)
