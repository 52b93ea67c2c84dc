"""Image augmentation applied to training batches."""

from __future__ import annotations

import torch


def random_shift(image: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """DrQ-style augmentation: pad by replicating the edges, crop back at a random offset.

    image (B, K, C, H, W, 3) uint8; one offset per window (the same for every step and camera, so
    motion between steps stays real). Stays in uint8: this runs on every training batch."""
    if pad <= 0:
        return image
    B, K, C, H, W, _ = image.shape
    top, bottom = image[:, :, :, :1], image[:, :, :, -1:]
    x = torch.cat([top.expand(-1, -1, -1, pad, -1, -1), image, bottom.expand(-1, -1, -1, pad, -1, -1)], dim=3)
    left, right = x[:, :, :, :, :1], x[:, :, :, :, -1:]
    x = torch.cat([left.expand(-1, -1, -1, -1, pad, -1), x, right.expand(-1, -1, -1, -1, pad, -1)], dim=4)
    # x: (B, K, C, H+2p, W+2p, 3)
    dy, dx = torch.randint(0, 2 * pad + 1, (2, B), generator=generator).tolist()
    return torch.stack([x[b, :, :, dy[b] : dy[b] + H, dx[b] : dx[b] + W] for b in range(B)])  # (B, K, C, H, W, 3)
