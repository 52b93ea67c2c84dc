"""The Policy: what a user calls to drive a robot with a trained checkpoint.

    policy = load_policy("runs/demo", device="cpu", kv_cache=True)
    policy.reset("put the red block in the bin")
    action = policy.act(obs)            # np.ndarray (A,) inside [-1, 1]
    chunk = policy.act_chunk(obs)       # np.ndarray (chunk, A): this step's action and the next ones

With `kv_cache=True` each call appends one step's observation tokens to the streaming cache and
decodes its action tokens (constant cost per step however long the episode). With `kv_cache=False`
it recomputes the whole window from scratch every step; both give the same actions.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
import torch

from vla.checkpoint import CheckpointError, load_meta, load_weights
from vla.config import from_dict
from vla.dataset import Tokenizers
from vla.model import ActionTransformer, ModelConfig


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """CUDA when present, else CPU; an explicit choice wins (and must exist)."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but no CUDA device is available")
    return device


class Policy:
    def __init__(self, model: ActionTransformer, tokenizers: Tokenizers, meta: dict, kv_cache: bool = True):
        self.model = model.eval()
        self.tok = tokenizers
        self.meta = meta
        self.cfg: ModelConfig = model.cfg
        self.kv_cache = kv_cache
        self.device = next(model.parameters()).device
        self.image_keys = ["image", "wrist_image"][: self.cfg.n_cameras]
        self._cache = model.new_cache(1, self.device) if kv_cache else None
        self._history: deque = deque(maxlen=self.cfg.window)  # (image, proprio, timestep, tokens) per step
        self._chunks: deque = deque(maxlen=self.cfg.chunk)  # (step it was predicted at, (chunk, A)), newest first
        self._instruction: torch.Tensor | None = None
        self._centres = torch.as_tensor(tokenizers.action.centres, dtype=torch.float32, device=self.device)  # (A, bins)
        self.t = 0

    @property
    def action_dim(self) -> int:
        return self.cfg.action_dim

    @property
    def chunk(self) -> int:
        return self.cfg.chunk

    def reset(self, instruction: str) -> None:
        """Start an episode with a new instruction (any text: unseen words fall back to bytes)."""
        if not isinstance(instruction, str) or not instruction.strip():
            raise ValueError("reset() needs a non-empty instruction string")
        ids = self.tok.text.encode_batch([instruction], self.cfg.instruction_len)  # (1, L)
        self._instruction = torch.as_tensor(np.asarray(ids), dtype=torch.long, device=self.device)
        self._history.clear()
        self._chunks.clear()
        self.t = 0
        if self._cache is not None:
            self.model.start(self._cache, self._instruction)

    def _inputs(self, obs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """obs -> image (1, n_cam, H, W, 3) uint8 and normalized proprio (1, P), with clear errors."""
        if not isinstance(obs, dict):
            raise TypeError(f"obs must be a dict of observations, got {type(obs).__name__}")
        size = self.cfg.image_size
        frames = []
        for key in self.image_keys:
            if key not in obs:
                raise KeyError(f"observation is missing '{key}' (has: {', '.join(sorted(obs))})")
            frame = np.asarray(obs[key])
            if frame.shape != (size, size, 3) or frame.dtype != np.uint8:
                raise ValueError(f"obs['{key}'] must be uint8 ({size}, {size}, 3), got {frame.dtype} {frame.shape}")
            frames.append(frame)
        if "proprio" not in obs:
            raise KeyError(f"observation is missing 'proprio' (has: {', '.join(sorted(obs))})")
        proprio = np.asarray(obs["proprio"], dtype=np.float32)
        if proprio.shape != (self.cfg.proprio_dim,):
            raise ValueError(f"obs['proprio'] must have shape ({self.cfg.proprio_dim},), got {proprio.shape}")
        if not np.all(np.isfinite(proprio)):
            raise ValueError("obs['proprio'] contains NaN or Inf")
        image = torch.from_numpy(np.stack(frames)[None]).to(self.device)  # (1, n_cam, H, W, 3)
        norm = self.tok.proprio.normalize(proprio).astype(np.float32)
        return image, torch.from_numpy(norm[None]).to(self.device)  # (1, P)

    @torch.inference_mode()
    def act_chunk(self, obs: dict) -> np.ndarray:
        """This step's action followed by the chunk-1 predicted next ones: (chunk, A) in [-1, 1]."""
        if self._instruction is None:
            raise RuntimeError("call policy.reset(instruction) before policy.act(obs)")
        image, proprio = self._inputs(obs)
        timestep = torch.tensor([self.t], dtype=torch.long, device=self.device)
        self._history.append([image, proprio, timestep, None])
        if self._cache is not None:
            out = self.model.step(self._cache, image, proprio, timestep)
        else:
            window = self.window_batch()
            out = self.model.recompute(window["instruction"], window["image"], window["proprio"], window["timestep"])
        self._history[-1][3] = out.tokens
        t, self.t = self.t, self.t + 1
        if self.cfg.action_readout == "expectation":
            # The mean of each slot's distribution over bin centres: sub-bin resolution, and where the
            # model is torn between neighbouring bins it lands between them instead of on either.
            probs = out.logits[0].float().softmax(-1).view(self.cfg.chunk, self.cfg.action_dim, -1)  # (chunk, A, bins)
            values = (probs * self._centres).sum(-1).cpu().numpy()  # (chunk, A)
        else:
            tokens = out.tokens[0].view(self.cfg.chunk, self.cfg.action_dim).cpu().numpy()  # (chunk, A)
            values = self.tok.action.decode(tokens)
        if self.cfg.temporal_ensemble:
            values = self._ensemble(t, values)
        return np.clip(values, -1.0, 1.0).astype(np.float32)

    def _ensemble(self, t: int, chunk: np.ndarray) -> np.ndarray:
        """ACT's temporal ensembling, uniform weights: row j (step t + j) becomes the mean of every stored
        chunk's prediction for step t + j, this one included. One chunk's guess flips between modes from
        step to step (up / down at a phase boundary); the mean of the last `chunk` guesses does not."""
        self._chunks.appendleft((t, chunk))
        out = np.empty_like(chunk)
        for j in range(len(chunk)):
            guesses = [c[t + j - s] for s, c in self._chunks if t + j - s < len(c)]  # (n, A) for step t + j
            out[j] = np.mean(guesses, axis=0)
        return out

    def window_batch(self) -> dict:
        """The current window (the last K steps seen) as a model batch of one, oldest step first."""
        images, props, steps, tokens = zip(*self._history, strict=True)
        batch = {
            "instruction": self._instruction,  # (1, L)
            "image": torch.stack(images, dim=1),  # (1, T, n_cam, H, W, 3)
            "proprio": torch.stack(props, dim=1),  # (1, T, P)
            "timestep": torch.stack(steps, dim=1),  # (1, T)
        }
        if all(t is not None for t in tokens):
            batch["actions"] = torch.stack(tokens, dim=1)  # (1, T, chunk*A)
        return batch

    def act(self, obs: dict) -> np.ndarray:
        """One action (A,) for this observation."""
        return self.act_chunk(obs)[0]


def load_policy(checkpoint_dir: str | Path, device=None, kv_cache: bool = True) -> Policy:
    """Build a Policy from DIR/config.json + DIR/model.safetensors (never unpickles)."""
    meta = load_meta(checkpoint_dir)
    device = pick_device(device)
    try:
        cfg = from_dict(ModelConfig, meta["model"], "model")
        tokenizers = Tokenizers.from_dict(meta["tokenizers"])
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{checkpoint_dir}/config.json: incomplete or invalid ({e})") from None
    model = ActionTransformer(cfg)
    missing, unexpected = model.load_state_dict(load_weights(checkpoint_dir), strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{checkpoint_dir}: weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return Policy(model.to(device), tokenizers, meta, kv_cache=kv_cache)
