"""Moved-object targets: where the thing a demonstration moves is and where it ends, found in its own video.

A user's robot data has no object positions, but a demonstration recorded by a fixed camera shows them: the
thing the hand moves is somewhere in the first frame and gone from there in the last. Per demonstration:

- the scene: each pixel's median over one frame of every demonstration of the split. Objects lie elsewhere
  in each and the arm moves, so what stays is the empty scene;
- where the moved object starts: pixels that differ from the scene in the first frame, differ from the
  first frame in the last, and show the scene again in the last (the object left them; where something
  arrived or the hand stopped, the last frame does not show the scene), and not so in many demonstrations of
  the split or of the demonstration's task (the arm's home pose, which a task may have of its own). Their
  largest 4-connected region, kept when its size is like that of the other demonstrations of its task (much
  smaller or larger is noise or the arm; each task moves a thing of its own size: a puck, a door) and when it lies
  still through the demonstration's first steps (what the hand moves waits for the hand; a region that changes
  at once is the arm leaving a pose of its own);
- where it ends, the goal: in the last frame, pixels of its colour where the first frame showed something else
  that was not the scene either (the bin, the target, the block it is stacked on). Where none are, the hand
  stopped over the goal and hides the thing: then what it covers, of the regions the first frame showed as
  something and the last as something else (the arm may cover other things too) the one nearest where the
  thing was last seen. None where the hand still holds what it grasped at the last step (its gripper command):
  the last frame shows the hand over the thing, and a look-alike elsewhere (an arm of its colour) would be
  taken for it;
- where it is at step t: the start region's centre while most of its pixels still look as in the first frame;
  once it moves, the region of its colour that is not the scene and not as in the first frame (a goal mark of
  its colour is), near where it was last seen and of about its size (NaN while the hand hides it);
- the targets at step t: where it is, and the end's centre.

Training targets only, for the first two keypoints' heat maps on the first camera (`vla.model.losses.keypoint_loss`
skips NaN), as the simulator's `object_px` (the named block, its goal) are for the privileged recipe. The
instruction names the thing a demonstration moves, so the instruction-conditioned keypoints learn to find the named
object and where it goes. The goal's target matters: with the start's alone, the maps the waypoints had put on the
goals followed the object instead (docs/label_free.md, session 9).
"""

from __future__ import annotations

from collections import deque

import numpy as np

CHANGE = 40  # a pixel changed: its largest channel difference exceeds this (of 0..255)
STILL_THERE = 0.8  # share of the start region's pixels that must look as in the first frame
COMMON = 0.2  # a start pixel in more than this share of demonstrations belongs to the scene (the arm's home pose)
TASK_COMMON = 0.6  # ... or in more than this share of its task's (a task's own home pose)
SIZE_RANGE = (1 / 3, 2.0)  # start regions kept, relative to the median start region of their task
NEAR = 0.25  # a moved object is looked for this share of the image around where it was last seen
EARLY = 0.15  # a start region that changes within this share of its demonstration is the arm's, not an object's
MIN_PIXELS = 3  # pixels a start or end region needs (fewer is noise)


def scene(frames: np.ndarray) -> np.ndarray:
    """(E, H, W, 3) uint8, one frame of each demonstration -> (H, W, 3) int16: the per-pixel median."""
    return np.median(frames, axis=0).astype(np.int16)


def _changed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(..., H, W, 3) each -> (..., H, W) bool: the pixels where they differ."""
    return np.abs(a.astype(np.int16) - b.astype(np.int16)).max(-1) > CHANGE


def _components(mask: np.ndarray) -> list[list[tuple[int, int]]]:
    """(H, W) bool -> its 4-connected regions of True pixels, each as its (row, column) pixels, in scan order."""
    seen, found, (H, W) = np.zeros_like(mask), [], mask.shape
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
        found.append(region)
    return found


def _mask(pixels: list[tuple[int, int]], shape: tuple[int, int]) -> np.ndarray:
    out = np.zeros(shape, dtype=bool)
    out[tuple(np.array(pixels).T)] = True
    return out


def regions(mask: np.ndarray) -> list[np.ndarray]:
    """(H, W) bool -> its 4-connected regions of True pixels, each an (H, W) bool mask, in scan order."""
    return [_mask(pixels, mask.shape) for pixels in _components(mask)]


def largest_region(mask: np.ndarray) -> np.ndarray | None:
    """(H, W) bool -> the largest 4-connected region of True pixels as an (H, W) bool mask (the first of equals),
    or None. Only the largest becomes a mask: `track` asks this of every frame."""
    largest = max(_components(mask), key=len, default=None)
    return None if largest is None else _mask(largest, mask.shape)


def _common(masks: np.ndarray, tasks: list[str]) -> np.ndarray:
    """(E, H, W) bool, each demonstration's task -> (E, H, W) bool: pixels set in more than COMMON of the split's
    demonstrations (the scene's), or in more than TASK_COMMON of its task's (where a task starts the arm in a pose
    of its own, that pose is in every demonstration of the task but in few of the split)."""
    out = np.broadcast_to(masks.mean(0) > COMMON, masks.shape).copy()
    names = np.array(tasks)
    for task in set(tasks):
        of_task = names == task
        out[of_task] |= masks[of_task].mean(0) > TASK_COMMON
    return out


def start_regions(first: np.ndarray, last: np.ndarray, empty: np.ndarray, tasks: list[str]) -> list[np.ndarray | None]:
    """first, last (E, H, W, 3) uint8: each demonstration's first and last frame; empty (H, W, 3) from `scene`;
    tasks: each demonstration's task -> per demonstration the (H, W) bool region where the thing it moves starts,
    or None where none is found."""
    left = _changed(first, empty) & _changed(first, last) & ~_changed(last, empty)  # (E, H, W): objects that left
    left &= ~_common(left, tasks)  # the same pixels in many demonstrations of a task: the scene's or the arm's
    found = [largest_region(mask) for mask in left]
    found = [r if r is not None and r.sum() >= MIN_PIXELS else None for r in found]
    sizes: dict[str, list[int]] = {}  # task -> the sizes of its start regions
    for r, task in zip(found, tasks, strict=True):
        if r is not None:
            sizes.setdefault(task, []).append(int(r.sum()))
    typical = {task: np.median(of_task) for task, of_task in sizes.items()}
    low, high = SIZE_RANGE
    return [
        r if r is not None and low <= r.sum() / typical[task] <= high else None
        for r, task in zip(found, tasks, strict=True)
    ]


def end_regions(
    first: np.ndarray,
    last: np.ndarray,
    empty: np.ndarray,
    tasks: list[str],
    starts: list[np.ndarray | None],
    held: list[bool],
) -> list[np.ndarray | None]:
    """first, last, empty, tasks as for `start_regions`, starts its result, held per demonstration
    (`vla.data.waypoints.still_held`)
    -> per demonstration the (H, W) bool region where the moved thing is in the last frame, or None: pixels that
    showed something in the first frame and something else in the last (the bin, the target or the block it now
    lies on, covered by it), of the moved thing's colour (its start region's median in the first frame; so not
    the hand, which stops there too). Where no pixel is of its colour the hand stopped over the goal and covers
    the thing on it: then every such pixel, possibly several regions, of which `moved_object_targets` keeps the
    one nearest where the thing was last seen. None where the hand still holds it: what looks like it there is
    the hand."""
    arrived = _changed(first, empty) & _changed(first, last) & _changed(last, empty)  # (E, H, W)
    arrived &= ~_common(arrived, tasks)
    ends = []
    for e, (start, holding) in enumerate(zip(starts, held, strict=True)):
        if start is None or holding:
            ends.append(None)
            continue
        colour = _colour(first[e], start)
        like = arrived[e] & (np.abs(last[e].astype(np.int16) - colour).max(-1) <= CHANGE)  # (H, W)
        if like.sum() >= MIN_PIXELS:
            ends.append(largest_region(like))
        else:  # none of its colour: the hand covers it, and the arm may cover other things
            left_behind = _grow(start, 2)  # the edges of where it was (its shadow, a pixel of it) are no goal
            covered = [r for r in regions(arrived[e] & ~left_behind) if r.sum() >= MIN_PIXELS]
            ends.append(np.any(covered, axis=0) if covered else None)
    return ends


def _grow(mask: np.ndarray, pixels: int) -> np.ndarray:
    """(H, W) bool -> the mask grown by `pixels` in every direction (each pixel's square of side 2 * pixels + 1)."""
    (H, W), side = mask.shape, 2 * pixels + 1
    padded = np.pad(mask, pixels)
    return np.any([padded[r : r + H, c : c + W] for r in range(side) for c in range(side)], axis=0)


def _colour(frame: np.ndarray, region: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8, (H, W) bool -> (3,) the region's median colour: what the moved object looks like."""
    return np.median(frame[region].astype(np.int16), axis=0)


def _centre(region: np.ndarray) -> np.ndarray:
    """(H, W) bool -> (2,) its centre as (row, column) in -1..1 (pixel centres, as the keypoints' coordinates)."""
    axis = (np.arange(region.shape[0]) + 0.5) / region.shape[0] * 2 - 1
    rows, cols = np.nonzero(region)
    return np.array([axis[rows].mean(), axis[cols].mean()], dtype=np.float32)


def still_there(frames: np.ndarray, start: np.ndarray) -> np.ndarray:
    """frames (T, H, W, 3) uint8 of one demonstration, its start region -> (T,) bool: the region still looks as in
    the first frame (at least STILL_THERE of its pixels)."""
    pixels = frames[:, start]  # (T, n, 3)
    return (~_changed(pixels, pixels[0])).mean(1) >= STILL_THERE


def moves_early(there: np.ndarray) -> bool:
    """there (T,) bool from `still_there` -> whether the start region changes within the first EARLY of the
    demonstration. A thing the hand moves lies still while the hand travels to it; a region that changes at once is
    the arm itself (a task's own start pose that the scene did not explain: Meta-World's reach-v3, window-close-v3,
    drawer-open-v3), so it marks no object."""
    return not there[: max(1, int(EARLY * len(there)))].all()


def track(frames: np.ndarray, start: np.ndarray, empty: np.ndarray, there: np.ndarray) -> np.ndarray:
    """frames (T, H, W, 3) uint8 of one demonstration, its start region, the scene, `still_there` of the region
    -> (T, 2) float32: where the moved object is at each step, (row, column) in -1..1, NaN where it is not seen. At
    its start region while that still looks as in the first frame; after, the largest region of its colour that is
    neither the scene nor as in the first frame (so not a goal mark of its colour), near where it was last seen and
    of about its size (a smaller one: the hand covers it, no target)."""
    T, H, W, _ = frames.shape
    out = np.full((T, 2), np.nan, dtype=np.float32)
    colour = _colour(frames[0], start)
    like = np.abs(frames.astype(np.int16) - colour).max(-1) <= CHANGE  # (T, H, W)
    like &= _changed(frames, empty) & (_changed(frames, frames[:1]) | start)  # moved there: not a mark of its colour
    lo, hi = (start.sum() * bound for bound in SIZE_RANGE)  # the sizes it may have, from its start region's
    reach = round(max(H, W) * NEAR)
    rows, cols = np.nonzero(start)
    last = np.array([rows.mean(), cols.mean()])  # where it was last seen, in pixels
    for t in range(T):
        if there[t]:
            out[t] = _centre(start)
            continue
        r, c = np.round(last).astype(int)
        near = np.zeros((H, W), dtype=bool)
        near[max(r - reach, 0) : r + reach + 1, max(c - reach, 0) : c + reach + 1] = True
        candidates = like[t] & near  # (H, W)
        if candidates.sum() < lo:
            continue  # too few pixels of its colour nearby for the object (the hand covers it): no search
        region = largest_region(candidates)
        if not lo <= region.sum() <= hi:
            continue
        out[t] = _centre(region)
        rows, cols = np.nonzero(region)
        last = np.array([rows.mean(), cols.mean()])
    return out


def moved_object_targets(
    frames: np.ndarray, start: np.ndarray, end: np.ndarray | None, empty: np.ndarray
) -> np.ndarray:
    """frames (T, H, W, 3) uint8 of one demonstration, its regions from `start_regions` and `end_regions`, the
    scene -> (T, 2, 2) float32, (row, column) in -1..1: where the moved object is (`track`; NaN where it is not
    seen), and the end region's centre, the goal, at every step (NaN without one); of an end of several regions
    (what the hand and arm cover), the one nearest where the object was last seen. All NaN where the start region
    `moves_early`: it is the arm's."""
    out = np.full((len(frames), 2, 2), np.nan, dtype=np.float32)
    there = still_there(frames, start)  # (T,)
    if moves_early(there):
        return out
    out[:, 0] = track(frames, start, empty, there)
    if end is not None:
        last_seen = out[np.isfinite(out[:, 0, 0]), 0][-1]  # (2,): seen at step 0 at least, at its start
        out[:, 1] = _centre(min(regions(end), key=lambda region: np.abs(_centre(region) - last_seen).max()))
    return out
