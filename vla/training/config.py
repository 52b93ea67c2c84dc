"""The configuration of a training run: typed sections, each filled from YAML presets and overrides.

The defaults are the configuration that works (what `make demo` trains); presets in configs/ hold only
what differs (configs/demo.yaml: data size and steps; configs/ablations/: one experimental knob each).
Sizes the data decides (image side, proprio/action dimensions, vocabulary) are not here: the trainer
reads them from the dataset into a `DataSpec` saved with the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from vla.config import apply_overrides, from_dict, load_yaml
from vla.model import ModelConfig
from vla.policy.config import PolicyConfig


@dataclass
class DataConfig:
    layout: str = "auto"  # dataset layout: auto (detected), ours, robomimic, libero, lerobot (see vla.data.sources)
    image_key: str = ""  # camera: obs/<key> (robomimic: agentview_image) or a LeRobot camera; "" = layout default
    wrist_image_key: str = ""  # a second camera, obs/<key> (ours: wrist_image, vla-collect --wrist-camera); "" = none
    proprio_keys: list[str] = field(default_factory=list)  # obs keys concatenated into proprio; [] = layout default
    instruction: str = ""  # instruction for files whose demos carry none (LIBERO's problem_info is read first)
    image_size: int = 0  # resize frames to image_size x image_size (antialiased) before the model; 0 = as stored
    train_split: str | None = "train"  # mask/<name> to train on ("" = every demo)
    valid_split: str | None = "valid"  # mask/<name> for validation loss ("" = none)
    valid_fraction: float = 0.1  # share of demos in train/valid splits made by hash when the data has no masks
    preload: bool = True  # decode every frame into RAM once (small datasets); else read lazily
    num_workers: int = 0  # DataLoader worker processes
    augment_shift: int = 0  # random-shift augmentation, pixels (pad + random crop); 0 = off
    # Chance that a training window's instruction is replaced by a paraphrase of the same task and colours
    # (envs/language.py's training grammar; tabletop data only); > 0 also drops function words and injects
    # made-up words, and adds the grammar's words to the vocabulary. 0 = off: every demo's own instruction.
    instruction_augment: float = 0.8
    # Privileged targets, used when the file has them (a notice says when it does not): our collector
    # records them; real robot data has none, and the policy then trains without these losses.
    aux_key: str = "object"  # obs/<key>: object positions for an auxiliary localization loss ("" = off)
    keypoint_key: str = "object_px"  # obs/<key>: image positions the first keypoints must find ("" = off)
    # Targets any demonstration holds (vla/data/waypoints.py): where the hand is at the next grasp, the next release
    # and the last step, relative to now, predicted by the auxiliary head from the keypoints.
    waypoint_targets: bool = False
    # Targets any demonstration's video holds (vla/data/moved_object.py): where the thing it moves starts, found by
    # comparing its first and last frames with the empty scene, and where it ends: the first two keypoints' heat-map
    # targets (data.keypoint_key's object_px gives the same two from the simulator).
    moved_object_targets: bool = False
    gripper_dim: int = -1  # the action dimension that commands the gripper (closed above its range's middle)
    waypoint_dims: list[int] = field(default_factory=lambda: [0, 1, 2])  # proprio dims placing the hand; [] = all
    action_key: str = "expert_actions"  # <demo>/<key> to imitate (DART's clean labels); else "actions"
    # removed: bin placement other than uniform (quantile, mu-law) was never used nor measured by a preset
    RETIRED: ClassVar[dict[str, object]] = {"action_mode": "uniform"}

    def __post_init__(self):
        self.train_split, self.valid_split = self.train_split or "", self.valid_split or ""  # `split=` parses as None
        if self.image_size < 0 or not 0 <= self.valid_fraction < 1:
            raise ValueError(
                f"data.image_size={self.image_size} must be >= 0, data.valid_fraction={self.valid_fraction} in [0, 1)"
            )
        if not 0 <= self.instruction_augment <= 1:
            raise ValueError(f"data.instruction_augment={self.instruction_augment} must be a probability in [0, 1]")
        if self.keypoint_key and self.moved_object_targets:
            raise ValueError(
                f"data.keypoint_key={self.keypoint_key!r} and data.moved_object_targets=true both give the first "
                "keypoints' targets; set data.keypoint_key='' (label-free data) or data.moved_object_targets=false"
            )
        if self.moved_object_targets and self.augment_shift:
            raise ValueError(
                "data.moved_object_targets=true needs augment_shift: 0 (a shifted frame moves the objects away "
                "from where the first frame found them)"
            )
        if self.keypoint_key and self.augment_shift:
            raise ValueError(
                f"keypoint_key={self.keypoint_key!r} needs augment_shift: 0 (a shifted frame moves the objects "
                "away from their recorded image positions); set data.keypoint_key='' to shift"
            )


@dataclass
class OptimConfig:
    lr: float = 2e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # final learning rate as a fraction of lr (cosine decay)
    warmup_steps: int = 200  # linear warmup, optimizer steps
    weight_decay: float = 0.05  # AdamW decay, on weight matrices only
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0  # max global gradient norm (0 = off)
    aux_weight: float = 0.5  # weight of the auxiliary loss (when the data has aux targets)
    keypoint_weight: float = 1.0  # weight of the keypoint heat-map loss (when the data has keypoint targets)
    # removed (an old checkpoint's value still loads; see vla.config._retired): a weight average, level on the demo
    RETIRED: ClassVar[dict[str, object]] = {"ema_decay": 0.0}

    def __post_init__(self):
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1 or len(self.betas) != 2:
            raise ValueError(
                f"bad optimizer settings: lr={self.lr}, min_lr_ratio={self.min_lr_ratio}, betas={self.betas}"
            )


@dataclass
class LoopConfig:
    steps: int = 4000  # optimizer steps in the whole run
    batch_size: int = 32  # windows per optimizer step (per rank under DDP)
    seed: int = 0  # seeds weights, data order, augmentation and dropout (each rank adds its rank)
    device: str = "auto"  # auto (CUDA if present), cpu, cuda
    amp: bool = True  # bf16 autocast on CUDA (ignored on CPU)
    threads: int = 0  # torch intra-op threads (0 = torch's default)
    log_every: int = 25  # steps between progress/metrics lines
    checkpoint_every: int = 500  # steps between checkpoints (always at the end too)
    keep_every: int = 0  # also keep every N-th step's checkpoint (a learning curve to evaluate); 0 = latest + best
    delay_aware_max: int = 0  # train with 0..N committed chunk rows (vla/training/delay_prefix.py); 0 = off
    # removed: a non-finite loss always stops the run; tests interrupt a run with a smaller `steps`
    RETIRED: ClassVar[dict[str, object]] = {"skip_nonfinite": False, "stop_at": None}

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(
                f"steps and batch_size must be positive, got steps={self.steps}, batch_size={self.batch_size}"
            )
        if self.delay_aware_max < 0:
            raise ValueError(f"train.delay_aware_max={self.delay_aware_max} must be >= 0")
        if self.log_every < 1 or self.checkpoint_every < 1 or self.keep_every < 0:
            raise ValueError(
                f"log_every={self.log_every} and checkpoint_every={self.checkpoint_every} must be >= 1, "
                f"keep_every={self.keep_every} >= 0"
            )


@dataclass
class EvalConfig:
    every: int = 0  # steps between closed-loop evaluations (0 = only at the end if episodes > 0)
    episodes: int = 0  # episodes per task per evaluation (0 = no closed-loop evaluation)
    seed: int = 100_000  # first evaluation seed
    videos: int = 1  # rollout videos per task per evaluation
    valid_batches: int = 8  # batches of the valid split for the validation loss


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)  # inference settings saved with the checkpoint

    def __post_init__(self):
        if self.train.delay_aware_max and not (
            self.model.committed_actions and self.train.delay_aware_max < self.model.chunk
        ):
            raise ValueError(
                f"train.delay_aware_max={self.train.delay_aware_max} needs model.committed_actions=true (got "
                f"{self.model.committed_actions}) and a delay below model.chunk={self.model.chunk}"
            )
        if self.data.moved_object_targets and self.model.keypoints < 2:
            raise ValueError(
                f"data.moved_object_targets=true needs model.keypoints >= 2 (got {self.model.keypoints}): its two "
                "targets, the moved object and where it ends, are the first two heat maps'"
            )
        if self.data.keypoint_key and not self.model.keypoints:
            raise ValueError(
                f"data.keypoint_key={self.data.keypoint_key!r} needs model.keypoints > 0 (got 0); "
                "set data.keypoint_key='' to train without keypoint targets"
            )
        if (self.data.aux_key or self.data.waypoint_targets) and not self.model.keypoints:
            raise ValueError(
                f"data.aux_key={self.data.aux_key!r} / data.waypoint_targets={self.data.waypoint_targets} need "
                "model.keypoints > 0 (the auxiliary head reads the keypoints); set data.aux_key='' and "
                "data.waypoint_targets=false to train without auxiliary targets"
            )


def load_config(path: str | None, overrides: list[str]) -> TrainConfig:
    """A preset (or the defaults) with `key=value` overrides applied; unknown keys are errors."""
    cfg = from_dict(TrainConfig, load_yaml(path)) if path else TrainConfig()
    return apply_overrides(cfg, overrides)
