"""Training windows: K consecutive control steps of a demo, tokenized for the model.

A sample is the window that ends at step t of a demo: steps max(0, t-K+1) .. t, left-padded to K at
the start of an episode (padding steps are masked, exactly as the policy's cache is only partly
full in an episode's first K steps). Every step of the window carries its targets: the actions
t' .. t'+chunk-1; targets past the end of the demo are marked in `action_is_pad` and carry no
loss (as ACT does), instead of teaching the policy to repeat the last action.

Demos come from an episode source (`vla.data.sources`: our HDF5, robomimic, LIBERO or a LeRobot directory),
opened lazily, once per DataLoader worker (h5py handles do not survive fork). With `preload=True` the
frames are decoded once into memory instead; on a small CPU dataset that keeps the two cores for
training rather than for gzip or video decoding.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import torch
from torch.utils.data import Dataset

from vla.data import moved_object
from vla.data.hdf5_format import DatasetError, ObsKeys
from vla.data.sources import EpisodeSource, open_source
from vla.data.waypoints import N_WAYPOINTS, gripper_closed, still_held, waypoint_targets
from vla.tokenizers import ActionTokenizer, ProprioNormalizer, TextTokenizer, Tokenizers
from vla.tokenizers.encoder import EncoderTokenizer


def _source(path: str | os.PathLike | EpisodeSource, keys: ObsKeys | None) -> EpisodeSource:
    return path if isinstance(path, EpisodeSource) else open_source(path, keys)  # keys None: the layout's


def fit_tokenizers(
    path: str | os.PathLike | EpisodeSource,
    split: str,
    keys: ObsKeys | None,
    action_bins: int,
    action_mode: str,
    paraphrase_vocabulary: bool = False,
    text_encoder: str | None = None,
) -> Tokenizers:
    """Fit the text vocabulary, action bins and proprio statistics on one split (no images read).

    `paraphrase_vocabulary`: when the split holds tabletop tasks, the training grammar's words
    (`envs.language`) join the vocabulary, so every synonym that instruction augmentation uses has an id.
    `text_encoder` (a local model folder): the instructions use that encoder's tokenizer instead."""
    instructions, actions, proprio = [], [], []
    src = _source(path, keys)
    path = src.path
    names = src.names(split)
    if not names:
        raise DatasetError(f"{path}: split '{split}' is empty; nothing to train on")
    tasks = set()
    for name in names:
        demo = src.read(name, images=False)
        instructions.append(demo.instruction)
        actions.append(demo.actions)
        proprio.append(demo.proprio)
        tasks.add(src.meta(name)["task"])
    if paraphrase_vocabulary:
        import envs

        if any(envs.tabletop_task_name(t) for t in tasks):
            instructions += sorted(envs.TRAIN_VOCABULARY)  # one "text" per word: each gets an id
    acts = np.concatenate(actions)
    if not np.all(np.isfinite(acts)) or not np.all(np.isfinite(np.concatenate(proprio))):
        raise DatasetError(f"{path}: non-finite actions or proprio in split '{split}'; run vla-data validate")
    return Tokenizers(
        text=EncoderTokenizer.open(text_encoder) if text_encoder else TextTokenizer.fit(instructions),
        action=ActionTokenizer(bins=action_bins, mode=action_mode).fit(acts),
        proprio=ProprioNormalizer.fit(np.concatenate(proprio)),
    )


def data_fingerprint(path: str | os.PathLike | EpisodeSource, split: str, keys: ObsKeys | None) -> str:
    """A digest of what a run trains on (demo names, actions, proprio, instructions of the split): resume
    compares it, so a run is never silently continued on another dataset."""
    h, src = hashlib.sha256(), _source(path, keys)
    for name in src.names(split):
        demo = src.read(name, images=False)
        h.update(name.encode() + demo.instruction.encode())
        h.update(np.ascontiguousarray(demo.actions, dtype=np.float32).tobytes())
        h.update(np.ascontiguousarray(demo.proprio, dtype=np.float32).tobytes())
    return h.hexdigest()[:16]


_INSTRUCTION_STREAM = 0x1A46  # keeps the augmentation's generators apart from the sampler's ([seed, epoch])
_MOVED_OBJECT_STREAM = 0x5CE7  # ... and the draw of the frames the empty scene is the median of


def _left_pad(steps: np.ndarray, K: int) -> torch.Tensor:
    """(n, ...) the window's real steps -> (K, ...), zeros first (an episode's first K - 1 windows)."""
    out = np.zeros((K, *steps.shape[1:]), dtype=steps.dtype)
    out[K - len(steps) :] = steps
    return torch.from_numpy(out)


class WindowDataset(Dataset):
    """Windows of K steps over the demos of one split; item -> dict of tensors (see `__getitem__`)."""

    def __init__(
        self,
        path: str | os.PathLike | EpisodeSource,
        split: str,
        tokenizers: Tokenizers,
        window: int,
        chunk: int,
        instruction_len: int,
        keys: ObsKeys | None = None,
        preload: bool = False,
        aux_key: str = "",
        keypoint_key: str = "",
        instruction_augment: float = 0.0,
        seed: int = 0,
        waypoints: bool = False,
        gripper_dim: int = -1,
        waypoint_dims: list[int] | None = None,
        moved_object: bool = False,
    ):
        self.waypoint_dims = list(waypoint_dims or [])
        self.source = _source(path, keys)
        # Instruction augmentation (`envs.augment_instruction`): the chance of a paraphrase; 0 = the demo's own.
        self.instruction_augment, self.seed = instruction_augment, seed
        self.path, self.split, self.keys = str(self.source.path), split, self.source.keys
        self.tok, self.window, self.chunk, self.instruction_len = tokenizers, window, chunk, instruction_len
        src = self.source
        self.names = src.names(split)
        metas = [src.meta(n) for n in self.names]
        # Actions, proprio and instructions are small: tokenize them all once, up front.
        self.actions, self.action_is_pad, self.proprio, self.instructions, self.instruction_texts = [], [], [], [], []
        self.aux, self.keypoint_targets = [], []
        held = []  # per demo: the hand still holds at the end what it grasped (moved-object targets)
        for name in self.names:
            demo = src.read(name, images=False)
            aux = []  # auxiliary targets (T, D): privileged positions, then the demo's own waypoints
            if aux_key:
                aux.append(self._aux_targets(src, name, aux_key, demo.proprio))
            if waypoints:
                aux.append(self._waypoint_targets(demo.proprio, demo.actions, gripper_dim))
            if aux:
                self.aux.append(np.concatenate(aux, axis=1))
            if keypoint_key:
                self.keypoint_targets.append(self._keypoint_targets(src, name, keypoint_key))
            if moved_object:
                held.append(still_held(self._gripper_closed(demo.actions, gripper_dim)))
            targets, is_pad = self._action_targets(demo.actions)
            self.actions.append(targets)
            self.action_is_pad.append(is_pad)
            self.proprio.append(self.tok.proprio.normalize(demo.proprio).astype(np.float32))
            self.instruction_texts.append(demo.instruction)
            self.instructions.append(self._encode(demo.instruction))
        self.waypoint_spread = None  # (n,) what the waypoint targets were divided by
        if waypoints:  # each waypoint coordinate to unit spread over the split: none dominates the loss
            n = N_WAYPOINTS * (len(self.waypoint_dims) or self.proprio[0].shape[1])
            self.waypoint_spread = np.concatenate([a[:, -n:] for a in self.aux]).std(0) + 1e-3  # (n,)
            for a in self.aux:
                a[:, -n:] /= self.waypoint_spread
        self.images = [self._read_frames(n) for n in self.names] if preload else None
        self.tasks = [m["task"] for m in metas]
        lengths = [m["num_samples"] for m in metas]
        if moved_object:
            self.keypoint_targets = self._moved_object_targets(lengths, held)
        # (demo index, last step of the window) for every step of every demo.
        self.index = np.array([(d, t) for d, n in enumerate(lengths) for t in range(n)], dtype=np.int64)
        if len(self.index) == 0:
            raise DatasetError(f"{path}: split '{split}' has no steps")

    @staticmethod
    def _aux_targets(src: EpisodeSource, name: str, key: str, proprio: np.ndarray) -> np.ndarray:
        """(T, 3n) float32: obs/<key> positions (n xyz triples: for us the named block and its goal)
        relative to the end effector (the first three proprio values), in units of 10 cm.

        Relative, not absolute: in demonstrations the gripper spends most frames next to the named
        block, so an absolute target can be half-explained by finding the gripper (a shortcut the
        keypoints fall into); relative to the gripper, only the object itself explains it."""
        pos = src.obs(name, key)
        if pos is None:
            raise DatasetError(f"{src.path}: {name}/obs has no '{key}' for the auxiliary loss (set data.aux_key='')")
        pos = np.asarray(pos, dtype=np.float32)  # (T, 3n)
        rel = pos.reshape(len(pos), -1, 3) - proprio[:, None, :3]  # (T, n, 3)
        return (10.0 * rel).reshape(len(pos), -1)  # (T, 3n)

    def _gripper_closed(self, actions: np.ndarray, gripper_dim: int) -> np.ndarray:
        """(T,) bool: the gripper command (action dimension `gripper_dim`) closed, per step."""
        act = self.tok.action
        if not -act.action_dim <= gripper_dim < act.action_dim:
            raise DatasetError(f"data.gripper_dim={gripper_dim} is not one of the {act.action_dim} action dimensions")
        return gripper_closed(actions, gripper_dim, float(act.low[gripper_dim]), float(act.high[gripper_dim]))

    def _waypoint_targets(self, proprio: np.ndarray, actions: np.ndarray, gripper_dim: int) -> np.ndarray:
        """(T, 3D) float32: the hand (proprio dims `waypoint_dims`) at the demo's next grasp, next release and
        last step, relative to now (`vla.data.waypoints`)."""
        closed = self._gripper_closed(actions, gripper_dim)
        hand = self.tok.proprio.normalize(proprio).astype(np.float32)
        if self.waypoint_dims:
            if max(self.waypoint_dims) >= hand.shape[1]:
                raise DatasetError(f"data.waypoint_dims={self.waypoint_dims}: proprio has {hand.shape[1]} dimensions")
            hand = hand[:, self.waypoint_dims]
        return waypoint_targets(hand, closed)

    @staticmethod
    def _keypoint_targets(src: EpisodeSource, name: str, key: str) -> np.ndarray:
        """(T, n, 2) float32: obs/<key>, where n points (the named block, its goal) appear in the image
        as (row, column) in -1..1: targets for the first n keypoints' heat maps."""
        px = src.obs(name, key)
        if px is None:
            raise DatasetError(f"{src.path}: {name}/obs has no '{key}' for keypoint targets (set data.keypoint_key='')")
        px = np.asarray(px, dtype=np.float32)  # (T, 2n)
        if px.ndim != 2 or px.shape[1] % 2 or not np.isfinite(px).all():
            raise DatasetError(f"{src.path}: {name}/obs/{key} must be finite (T, 2n) image positions, got {px.shape}")
        return px.reshape(len(px), -1, 2)

    def _moved_object_targets(self, lengths: list[int], held: list[bool]) -> list[np.ndarray]:
        """Per demo (T, 2, 2) float32: where the thing it moves is (NaN where it is not seen) and where it ends
        (`vla.data.moved_object`), from the main camera's frames and, per demo, whether the hand still holds it
        at the end. The empty scene is the median over every demo of the split: measured on Meta-World MT10, one
        scene per task found its pucks less often."""
        rng = np.random.default_rng([self.seed, _MOVED_OBJECT_STREAM])
        one = lambda d, t: self._frames(d, t, t + 1)[0, 0]  # noqa: E731 - (H, W, 3): main camera, step t
        empty = moved_object.scene(np.stack([one(d, int(rng.integers(n))) for d, n in enumerate(lengths)]))
        first = np.stack([one(d, 0) for d in range(len(lengths))])  # (E, H, W, 3)
        last = np.stack([one(d, n - 1) for d, n in enumerate(lengths)])
        starts = moved_object.start_regions(first, last, empty, self.tasks)
        ends = moved_object.end_regions(first, last, empty, self.tasks, starts, held)
        return [
            np.full((n, 2, 2), np.nan, np.float32) if start is None  # nothing found: no target at any step
            else moved_object.moved_object_targets(self._frames(d, 0, n)[:, 0], start, end, empty)
            for d, (n, start, end) in enumerate(zip(lengths, starts, ends, strict=True))
        ]  # fmt: skip

    def _action_targets(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of actions t .. t+chunk-1, chunk-major: (T, chunk * A) int64, and (T, chunk) bool, True
        where t + c is past the demo's end (that slot holds the last action's token, and no loss)."""
        tokens = np.asarray(self.tok.action.encode(actions), dtype=np.int64)  # (T, A)
        T = len(tokens)
        future = np.arange(T)[:, None] + np.arange(self.chunk)[None, :]  # (T, chunk)
        return tokens[np.minimum(future, T - 1)].reshape(T, -1), future >= T  # (T, chunk * A), (T, chunk)

    def __len__(self) -> int:
        return len(self.index)

    def _encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.text.encode_batch([text], self.instruction_len)[0], dtype=np.int64)  # (L,)

    def instruction_text(self, i: int) -> str:
        """The instruction sample `i` carries: the demo's own, or its augmented draw (the same on every call:
        the draw's generator comes from the seed and the sample index, so a resumed run and every DataLoader
        worker see what an uninterrupted single-process run does)."""
        d = int(self.index[i][0])
        if self.instruction_augment <= 0:
            return self.instruction_texts[d]
        import envs

        rng = np.random.default_rng([self.seed, _INSTRUCTION_STREAM, i])
        fits = lambda text: len(self.tok.text.encode(text)) <= self.instruction_len  # noqa: E731 - nothing cut
        return envs.augment_instruction(self.tasks[d], self.instruction_texts[d], rng, self.instruction_augment, fits)

    def _read_frames(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """(n, n_cam, H, W, 3) uint8: the main camera, then the wrist camera when there is one."""
        main = self.source.frames(name, start, stop)  # (n, H, W, 3); reopens its file once per worker
        if not self.keys.wrist_image:
            return main[:, None]
        return np.stack([main, self.source.frames_of(name, self.keys.wrist_image, start, stop)], axis=1)

    def _frames(self, d: int, start: int, stop: int) -> np.ndarray:
        if self.images is not None:
            return self.images[d][start:stop]
        return self._read_frames(self.names[d], start, stop)

    def __getitem__(self, i: int) -> dict:
        d, t = (int(v) for v in self.index[i])
        K = self.window
        start = max(0, t - K + 1)
        pad = K - (t + 1 - start)  # the first `pad` slots are padding (an episode's first K - 1 steps)
        image = _left_pad(self._frames(d, start, t + 1), K)  # (K, n_cam, H, W, 3)
        timestep = np.arange(t - K + 1, t + 1, dtype=np.int64).clip(min=0)  # episode step index
        step_mask = np.arange(K) >= pad
        instruction = self._encode(self.instruction_text(i)) if self.instruction_augment > 0 else self.instructions[d]
        item = {
            "instruction": torch.from_numpy(instruction),
            "image": image,
            "proprio": _left_pad(self.proprio[d][start : t + 1], K),  # (K, P)
            "timestep": torch.from_numpy(timestep),
            "step_mask": torch.from_numpy(step_mask),
            "actions": _left_pad(self.actions[d][start : t + 1], K),  # (K, chunk*A)
            "action_is_pad": _left_pad(self.action_is_pad[d][start : t + 1], K),  # (K, chunk)
            "demo": torch.tensor(d),
        }
        if self.aux:
            item["aux"] = _left_pad(self.aux[d][start : t + 1], K)  # (K, aux_dim)
        if self.keypoint_targets:
            item["keypoint_targets"] = _left_pad(self.keypoint_targets[d][start : t + 1], K)  # (K, n, 2)
        return item


class EpochSampler(torch.utils.data.Sampler):
    """Deterministic shuffled order, sharded across ranks, resumable at any batch.

    The order of epoch e is a permutation drawn from (seed, e); rank r takes every world-th index.
    Resuming at global step s skips the first s * batch_size indices of this rank's stream, so an
    interrupted run sees exactly the batches an uninterrupted one would.
    """

    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world: int = 1, start_step: int = 0):
        self.n, self.batch_size, self.seed, self.rank, self.world = n, batch_size, seed, rank, world
        self.start_step = start_step
        self.per_rank = n // world  # equal shards so DDP ranks stay in lock step

    def _epoch(self, epoch: int) -> np.ndarray:
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return order[self.rank : self.per_rank * self.world : self.world]

    def __iter__(self):
        skip = self.start_step * self.batch_size
        epoch, offset = divmod(skip, self.per_rank)
        while True:  # infinite: the trainer counts steps, not epochs
            yield from (int(i) for i in self._epoch(epoch)[offset:])
            epoch, offset = epoch + 1, 0

    def __len__(self) -> int:  # DataLoader asks; the stream itself never ends
        return self.per_rank
