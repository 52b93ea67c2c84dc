"""Training losses: pure functions of the network's outputs and the batch's targets.

Every loss is a mean over real targets only: `weight` is 1 for a target that exists and 0 for left
padding (an episode's first K - 1 windows) and for chunk targets past the end of a demo
(`action_is_pad`, as ACT masks them), so no padding ever teaches the policy anything.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def action_weights(shape, device, step_mask=None, action_is_pad=None) -> torch.Tensor:
    """(B, T, chunk, A) float: 1 where an action target exists. step_mask (B, T) bool (False = left
    padding), action_is_pad (B, T, chunk) bool (True = past the demo's end); either may be None."""
    w = torch.ones(shape, device=device)  # (B, T, chunk, A)
    if step_mask is not None:
        w = w * step_mask[:, :, None, None]
    if action_is_pad is not None:
        w = w * ~action_is_pad[..., None]
    return w


def action_loss(logits: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Cross-entropy over action bins and per-dimension accuracy.

    logits (B, T, chunk*A, bins), targets (B, T, chunk*A) int64, weight (B, T, chunk, A) ->
    loss (scalar, mean over real targets), accuracy (A,) (argmax == target, over real targets)."""
    B, T, CA, bins = logits.shape
    A = weight.shape[-1]
    ce = F.cross_entropy(logits.flatten(0, 2).float(), targets.flatten(), reduction="none")  # (B*T*CA,)
    w = weight.reshape(B, T, CA).to(ce.dtype)  # (B, T, chunk*A)
    loss = (ce.view(B, T, CA) * w).sum() / w.sum().clamp(min=1.0)
    hit = ((logits.argmax(-1) == targets).float() * w).view(B, T, -1, A)  # (B, T, chunk, A)
    accuracy = hit.sum(dim=(0, 1, 2)) / weight.sum(dim=(0, 1, 2)).to(hit.dtype).clamp(min=1.0)  # (A,)
    return {"loss": loss, "accuracy": accuracy}


def aux_loss(pred: torch.Tensor, target: torch.Tensor, step_weight: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the auxiliary prediction: pred, target (B, T, D), step_weight (B, T)."""
    err = (pred.float() - target.float()) ** 2  # (B, T, D)
    return (err * step_weight[..., None]).sum() / (step_weight.sum().clamp(min=1.0) * pred.shape[-1])


def keypoint_loss(
    heat: torch.Tensor, coords: torch.Tensor, targets: torch.Tensor, step_weight: torch.Tensor, grid: int
) -> torch.Tensor:
    """Cross-entropy of the first n heat maps against a Gaussian of one pixel's width around the n target
    points. heat (B, T, n, h*w) softmax over pixels (first camera), coords (h*w, 2) pixel centres,
    targets (B, T, n, 2) (row, column) in -1..1, NaN where a step has no target (moved-object targets once
    the object has moved: vla/data/moved_object.py), step_weight (B, T) -> scalar.

    A dense signal at every pixel, where a coordinate loss only nudges the map's centre of mass:
    keypoints learn to find the named block in minutes, not hours."""
    sigma = 0.8 * 2 / grid  # 0.8 of a heat-map pixel, in -1..1 units
    known = torch.isfinite(targets).all(-1)  # (B, T, n)
    targets = torch.where(known[..., None], targets, torch.zeros_like(targets))
    d2 = ((coords.to(heat.dtype) - targets[..., None, :].to(heat.dtype)) ** 2).sum(-1)  # (B, T, n, h*w)
    soft = (-d2 / (2 * sigma**2)).softmax(-1)  # (B, T, n, h*w): the target as a distribution
    ce = -(soft * heat.float().clamp_min(1e-9).log()).sum(-1)  # (B, T, n)
    weight = step_weight[..., None] * known  # (B, T, n)
    return (ce * weight).sum() / weight.sum().clamp(min=1.0)
