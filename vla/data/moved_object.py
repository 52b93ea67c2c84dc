"""Moved-object targets: where the thing a demonstration moves starts out, found in its own video.

A user's robot data has no object positions, but a demonstration recorded by a fixed camera shows them: the
thing the hand moves is somewhere in the first frame and gone from there in the last. Per demonstration:

- the scene: each pixel's median over one frame of every demonstration of the split. Objects lie elsewhere
  in each and the arm moves, so what stays is the empty scene;
- where the moved object starts: pixels that differ from the scene in the first frame, differ from the
  first frame in the last, and show the scene again in the last (the object left them; where something
  arrived or the hand stopped, the last frame does not show the scene). Their largest 4-connected region,
  kept when its size is like the other demonstrations' (much smaller or larger is noise or the arm);
- the target at step t: that region's centre, while most of its pixels still look as in the first frame
  (the object is there and uncovered); NaN once it is picked up, pushed away or hidden.

Training targets only, for the first keypoint's heat map on the first camera (`vla.model.losses.keypoint_loss`
skips NaN), as the simulator's `object_px` are for the privileged recipe. The instruction names the thing a
demonstration moves, so the instruction-conditioned keypoint learns to find the named object.
"""

from __future__ import annotations

from collections import deque

import numpy as np

CHANGE = 40  # a pixel changed: its largest channel difference exceeds this (of 0..255)
STILL_THERE = 0.8  # share of the start region's pixels that must look as in the first frame
COMMON = 0.2  # a start pixel in more than this share of demonstrations belongs to the scene (the arm's home pose)
SIZE_RANGE = (1 / 3, 2.0)  # start regions kept, relative to the median region's size


def scene(frames: np.ndarray) -> np.ndarray:
    """(E, H, W, 3) uint8, one frame of each demonstration -> (H, W, 3) int16: the per-pixel median."""
    return np.median(frames, axis=0).astype(np.int16)


def _changed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(..., H, W, 3) each -> (..., H, W) bool: the pixels where they differ."""
    return np.abs(a.astype(np.int16) - b.astype(np.int16)).max(-1) > CHANGE


def largest_region(mask: np.ndarray) -> np.ndarray | None:
    """(H, W) bool -> the largest 4-connected region of True pixels as an (H, W) bool mask, or None."""
    seen, best, (H, W) = np.zeros_like(mask), [], mask.shape
    for start in zip(*np.nonzero(mask), strict=True):
        if seen[start]:
            continue
        seen[start], queue, region = True, deque([start]), []
        while queue:
            r, c = queue.popleft()
            region.append((r, c))
            for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                if 0 <= rr < H and 0 <= cc < W and mask[rr, cc] and not seen[rr, cc]:
                    seen[rr, cc] = True
                    queue.append((rr, cc))
        if len(region) > len(best):
            best = region
    if not best:
        return None
    out = np.zeros_like(mask)
    out[tuple(np.array(best).T)] = True
    return out


def start_regions(first: np.ndarray, last: np.ndarray, empty: np.ndarray) -> list[np.ndarray | None]:
    """first, last (E, H, W, 3) uint8: each demonstration's first and last frame; empty (H, W, 3) from `scene`
    -> per demonstration the (H, W) bool region where the thing it moves starts, or None where none is found."""
    left = _changed(first, empty) & _changed(first, last) & ~_changed(last, empty)  # (E, H, W): objects that left
    left &= ~(left.mean(0) > COMMON)  # the same pixels in many demonstrations: the scene's, not an object
    regions = [largest_region(mask) for mask in left]
    sizes = [int(r.sum()) for r in regions if r is not None]
    if not sizes:
        return regions
    lo, hi = (np.median(sizes) * bound for bound in SIZE_RANGE)
    return [r if r is not None and lo <= r.sum() <= hi else None for r in regions]


def moved_object_targets(frames: np.ndarray, region: np.ndarray) -> np.ndarray:
    """frames (T, H, W, 3) uint8 of one demonstration, its region from `start_regions` -> (T, 1, 2) float32: the
    region's centre as (row, column) in -1..1 (pixel centres, as the keypoints' coordinates) at the steps where
    the object is still there, NaN at the others."""
    T, H = frames.shape[:2]
    out = np.full((T, 1, 2), np.nan, dtype=np.float32)
    axis = (np.arange(H) + 0.5) / H * 2 - 1  # pixel centres in -1..1
    rows, cols = np.nonzero(region)
    pixels = frames[:, region].astype(np.int16)  # (T, n, 3)
    there = (np.abs(pixels - pixels[0]).max(-1) <= CHANGE).mean(1) >= STILL_THERE  # (T,)
    out[there, 0] = [axis[rows].mean(), axis[cols].mean()]
    return out
