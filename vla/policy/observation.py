"""The observation contract a policy checks on every step, in numpy alone (the torch and the
onnxruntime policies share it; the latter must run without torch)."""

from __future__ import annotations

import numpy as np


def check_observation(obs, image_keys: list[str], image_size: int, proprio_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """obs dict -> frames (n_cam, H, W, 3) uint8 and proprio (P,) float32, or one clear error naming the key."""
    if not isinstance(obs, dict):
        raise TypeError(f"obs must be a dict of observations, got {type(obs).__name__}")
    frames = []
    for key in image_keys:
        if key not in obs:
            raise KeyError(f"observation is missing '{key}' (has: {', '.join(sorted(obs))})")
        frame = np.asarray(obs[key])
        if frame.shape != (image_size, image_size, 3) or frame.dtype != np.uint8:
            raise ValueError(
                f"obs['{key}'] must be uint8 ({image_size}, {image_size}, 3), got {frame.dtype} {frame.shape}"
            )
        frames.append(frame)
    if "proprio" not in obs:
        raise KeyError(f"observation is missing 'proprio' (has: {', '.join(sorted(obs))})")
    proprio = np.asarray(obs["proprio"], dtype=np.float32)
    if proprio.shape != (proprio_dim,):
        raise ValueError(f"obs['proprio'] must have shape ({proprio_dim},), got {proprio.shape}")
    if not np.all(np.isfinite(proprio)):
        raise ValueError("obs['proprio'] contains NaN or Inf")
    return np.stack(frames), proprio


def check_instruction(instruction) -> str:
    """What `reset` accepts: a non-empty string (any words: unseen ones become <unk>)."""
    if not isinstance(instruction, str) or not instruction.strip():
        raise ValueError("reset() needs a non-empty instruction string")
    return instruction
