"""The data side of a training run: open any layout, turn off the privileged targets it lacks, fit (or read
back) the tokenizers, cut training and validation windows, and stream deterministic rank-sharded batches."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import numpy as np
import torch

from vla.checkpoint import Checkpoint
from vla.config import ConfigError
from vla.data.hdf5_format import DatasetError
from vla.data.sources import open_source
from vla.data.windows import EpochSampler, Tokenizers, WindowDataset, data_fingerprint, fit_tokenizers
from vla.model import DataSpec
from vla.model.vision_encoder import FOLDER as VISION_FOLDER
from vla.training.config import DataConfig, TrainConfig


def open_data(data: DataConfig, path: str):
    """Any layout (ours, robomimic, LIBERO, LeRobot) through one key mapping, frames resized on read."""
    return open_source(
        path, layout=data.layout, image=data.image_key, proprio=data.proprio_keys, instruction=data.instruction,
        actions=data.action_key, image_size=data.image_size, valid_fraction=data.valid_fraction,
        wrist_image=data.wrist_image_key,
    )  # fmt: skip


def resolve_optional_keys(data: DataConfig, path: str) -> DataConfig:
    """Turn off the privileged targets the data does not have (one notice each): our collector records
    them, real robot data has none, and the same default config must train on both."""
    source = open_data(dataclasses.replace(data, action_key="actions"), path)
    names = source.names(data.train_split)
    if not names:
        raise DatasetError(f"{path}: split '{data.train_split}' is empty; nothing to train on")
    changes = {}
    if data.action_key == "expert_actions":
        try:
            open_data(data, path).read(names[0], images=False)
        except DatasetError:
            changes["action_key"] = "actions"
    why = {}
    for field_name, per_object in (("aux_key", 3), ("keypoint_key", 2)):
        key = getattr(data, field_name)
        values = source.obs(names[0], key) if key else None
        if key and values is None:
            changes[field_name], why[field_name] = "", f"has no '{key}'"
        elif key and np.asarray(values).reshape(len(values), -1).shape[1] % per_object:
            # another layout's obs/<key> (robomimic's obs/object is its own object state), not our targets
            changes[field_name], why[field_name] = "", f"'{key}' is not object positions ({per_object} values each)"
    for field_name, value in changes.items():
        reason = why.get(field_name, f"has no '{getattr(data, field_name)}'")
        print(f"vla-train: {path} {reason}: data.{field_name}={value!r}", file=sys.stderr)
    return dataclasses.replace(data, **changes)


def registered_tasks() -> set[str]:
    """The gymnasium ids closed-loop evaluation can run (robomimic, LIBERO, LeRobot data name others)."""
    import envs

    return set(envs.TASKS)


@dataclass
class TrainData:
    tokenizers: Tokenizers
    spec: DataSpec
    train_set: WindowDataset
    valid_set: WindowDataset | None
    env_args: dict
    tasks: list[str]
    fingerprint: str


def load_data(cfg: TrainConfig, path: str, tokenizers: Tokenizers | None) -> TrainData:
    """Windows of the training (and validation) split, tokenized, and the sizes the data decides."""
    source = open_data(cfg.data, path)
    keys = source.keys
    if tokenizers is None:
        tokenizers = fit_tokenizers(
            source, cfg.data.train_split, keys, cfg.model.action_bins, "uniform",
            paraphrase_vocabulary=cfg.data.instruction_augment > 0, text_encoder=cfg.model.text_encoder,
        )  # fmt: skip

    def windows(split: str, instruction_augment: float = 0.0) -> WindowDataset:
        return WindowDataset(
            source, split, tokenizers, cfg.model.window, cfg.model.chunk, cfg.model.instruction_len, keys,
            preload=cfg.data.preload, aux_key=cfg.data.aux_key, keypoint_key=cfg.data.keypoint_key,
            instruction_augment=instruction_augment, seed=cfg.train.seed, waypoints=cfg.data.waypoint_targets,
            gripper_dim=cfg.data.gripper_dim, waypoint_dims=cfg.data.waypoint_dims,
            moved_object=cfg.data.moved_object_targets,
        )  # fmt: skip

    train_set = windows(cfg.data.train_split, cfg.data.instruction_augment)  # validation: the demos' own
    valid_set = None
    if cfg.data.valid_split and cfg.eval.valid_batches > 0:
        try:
            valid_set = windows(cfg.data.valid_split)
        except DatasetError as e:  # no or an empty valid split: train without a validation loss
            print(f"vla-train: no validation loss ({e})", file=sys.stderr)
    if cfg.data.moved_object_targets:  # a moving camera finds nothing to label: say so, the loss is then silent
        found = sum(bool(np.isfinite(t[:, 0, 0]).any()) for t in train_set.keypoint_targets)
        goals = sum(bool(np.isfinite(t[:, 1, 0]).any()) for t in train_set.keypoint_targets)
        print(
            f"vla-train: moved-object targets in {found} of {len(train_set.names)} training demos, "
            f"where they end in {goals}",
            file=sys.stderr,
        )
    sample = train_set[0]
    side = sample["image"].shape[-2]
    if side % cfg.model.patch_size:
        raise ConfigError(
            f"{path}: frames are {side}x{side}, not a multiple of model.patch_size={cfg.model.patch_size}; "
            f"resize them with data.image_size={max(1, round(side / cfg.model.patch_size)) * cfg.model.patch_size}"
        )
    spec = DataSpec(
        image_size=side,
        n_cameras=sample["image"].shape[1],
        proprio_dim=sample["proprio"].shape[-1],
        action_dim=tokenizers.action.action_dim,
        vocab_size=tokenizers.text.vocab_size,
        aux_dim=sample["aux"].shape[-1] if "aux" in sample else 0,
        # recorded positions only: moved-object targets (data.moved_object_targets) keep the label-free net
        keypoint_targets=bool(cfg.data.keypoint_key),
        text_fingerprint=tokenizers.text_fingerprint,
    )
    fingerprint = data_fingerprint(source, cfg.data.train_split, keys)
    return TrainData(
        tokenizers, spec, train_set, valid_set, source.env_args(), sorted(set(train_set.tasks)), fingerprint
    )


def batches(dataset, batch_size: int, seed: int, rank: int, world: int, start_step: int, workers: int, pin: bool):
    """An endless, deterministic, rank-sharded stream of batches that resumes at `start_step`."""
    sampler = EpochSampler(len(dataset), batch_size, seed, rank, world, start_step)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
        persistent_workers=workers > 0, pin_memory=pin, drop_last=True,
    )  # fmt: skip
    return iter(loader)


def prepare_data(cfg: TrainConfig, data_path: str, resume: Checkpoint | None, state: dict | None):
    """The data (with a resumed or initializing run's tokenizers) and the config completed by what the data
    decides; a resume on another dataset is refused."""
    vision_fingerprint = ""
    if cfg.model.vision_encoder:  # checked before the data is read; a resumed or initializing run's must match
        recorded = resume.meta["data_spec"].get("vision_fingerprint") if resume else None
        folder, vision_fingerprint = VISION_FOLDER.checked(cfg.model.vision_encoder, recorded)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vision_encoder=str(folder)))  # absolute
    if not state:
        cfg = dataclasses.replace(cfg, data=resolve_optional_keys(cfg.data, data_path))
    data = load_data(cfg, data_path, Tokenizers.from_dict(resume.meta["tokenizers"]) if resume else None)
    data = dataclasses.replace(data, spec=dataclasses.replace(data.spec, vision_fingerprint=vision_fingerprint))
    if cfg.model.text_encoder:  # recorded as an absolute path, so the checkpoint loads from any directory
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, text_encoder=data.tokenizers.text.path))
    if cfg.eval.episodes > 0 and not set(data.tasks) <= registered_tasks():
        print(f"vla-train: no closed-loop evaluation: tasks {data.tasks[:3]} are not registered envs", file=sys.stderr)
        cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, episodes=0))
    if state and state["data_fingerprint"] != data.fingerprint:
        raise ConfigError(
            f"--data {data_path} is not the dataset this run started on ({resume.meta['data']}; "
            f"fingerprint {data.fingerprint} != {state['data_fingerprint']}); resume with that dataset"
        )
    return cfg, data
