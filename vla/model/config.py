"""What the policy network is: the user's hyperparameters, the sizes the data decides, and the token layout.

- `ModelConfig`: hyperparameters a user chooses. Its defaults are the configuration that works (the
  one `make demo` trains); experiments live in configs/ablations/.
- `DataSpec`: sizes the data decides (image side, proprio and action dimensions, vocabulary, auxiliary
  targets). Read from the dataset by the trainer and saved with the checkpoint; never set by hand.
- `TokenLayout`: the token counts both imply (tokens per step, stream length, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

SEG_INSTRUCTION, SEG_IMAGE, SEG_PROPRIO, SEG_ACTION = 0, 1, 2, 3
PAD_ID = 0  # instruction padding id (vla.tokenizers.text.PAD_ID)


@dataclass
class ModelConfig:
    # sizes that come from the data (DataSpec); naming one in a config is an error that says so
    DATA_DECIDED: ClassVar[tuple[str, ...]] = (
        "image_size",
        "proprio_dim",
        "action_dim",
        "vocab_size",
        "n_cameras",
        "aux_dim",
        "text_fingerprint",
        "vision_fingerprint",
    )
    # options that are gone, with the one behaviour left: a saved config naming that value still loads
    # (vla.config.from_dict drops it); any other value is an error. The last commit with them: 0c1a0cc.
    RETIRED: ClassVar[dict[str, object]] = {
        "action_decoding": "parallel",  # autoregressive decoding (one pass per action token): export refused it
        "causal_scope": "step",  # "stream": streaming equals recompute only until the window slides
        "time_encoding": "relative",  # absolute (sinusoidal, learned) and no time
        "max_episode_steps": None,  # the learned absolute time table's size; None: any value
        "bias": True,  # Linear and LayerNorm biases are always on
    }
    # vision
    patch_size: int = 16  # ViT patch side, pixels
    patch_embed: Literal["linear", "conv"] = "conv"  # pixels -> d_model: per-patch linear, or stride-conv stem
    conv_channels: int = 16  # channels of the conv stem's first stage, doubling per stage (patch_embed="conv")
    vision_encoder: str | None = (
        None  # local HF image-model folder in place of the conv stem (vla/model/vision_encoder.py)
    )
    vision_encoder_trainable: bool = False  # fine-tune it (saved in model.safetensors); False: frozen, not saved
    film: bool = True  # condition the conv stem and keypoints on the instruction (FiLM, as RT-1 does)
    keypoints: int = 8  # spatial-softmax keypoint tokens per camera and step (0 = patches only)
    keypoint_channels: int = 32  # hidden channels of the keypoint network, at half the image resolution
    aux_feed: bool = True  # when the data has auxiliary targets, their prediction enters the proprio token
    # instruction
    instruction_len: int = 16  # L: instruction tokens (padded / truncated), tokens
    # a local Hugging Face model folder whose frozen features embed the instruction (vla/model/text_encoder.py; never
    # downloaded), or None: a word table fitted on the data's instructions
    text_encoder: str | None = None
    # actions
    action_bins: int = 256  # discretization bins per action dimension (ActionTokenizer.bins)
    chunk: int = 4  # future actions predicted per step (t .. t+chunk-1) -> chunk * A action slots
    committed_actions: bool = False  # action slots can hold already-committed bins (vla/training/delay_prefix.py)
    # context (time enters as a learned relative bias per head and step offset; vla/model/transformer.py)
    window: int = 2  # K: control steps in the context window (and KV-cache step slots)
    # transformer
    d_model: int = 128  # embedding width, features
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads (d_model / n_head features each)
    d_ff: int = 512  # MLP hidden width, features
    dropout: float = 0.0  # dropout probability (embeddings, attention, residual branches), training only

    def __post_init__(self):
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.patch_embed == "conv" and (self.patch_size < 2 or self.patch_size & (self.patch_size - 1)):
            raise ValueError(f"patch_embed='conv' needs patch_size a power of two >= 2, got {self.patch_size}")
        for name in ("patch_size", "instruction_len", "chunk", "window", "d_model"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("n_layer", "n_head", "d_ff", "conv_channels", "keypoint_channels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.keypoints < 0:
            raise ValueError(f"keypoints={self.keypoints} must be >= 0")
        if self.film and self.patch_embed != "conv" and not self.keypoints:
            raise ValueError(f"film=True needs patch_embed='conv' or keypoints, got patch_embed={self.patch_embed!r}")
        if self.vision_encoder is not None and not self.vision_encoder.strip():
            raise ValueError("vision_encoder='' names no folder; use null for the conv stem")
        if self.vision_encoder_trainable and not self.vision_encoder:
            raise ValueError("vision_encoder_trainable=True needs a vision_encoder folder, got vision_encoder=None")
        if self.vision_encoder and self.patch_embed != "conv":
            raise ValueError(
                f"vision_encoder={self.vision_encoder!r} takes the conv stem's place: it needs patch_embed='conv', "
                f"got patch_embed={self.patch_embed!r}"
            )
        if self.vision_encoder and self.film and not self.keypoints:  # the pretrained encoder takes no FiLM
            raise ValueError(
                f"film=True with vision_encoder={self.vision_encoder!r} conditions nothing: it needs keypoints > 0, "
                "got keypoints=0 (or set film=false)"
            )
        if self.aux_feed and not self.keypoints:
            raise ValueError("aux_feed=True needs keypoints > 0 (the auxiliary prediction reads the keypoints)")
        if self.action_bins < 2:
            raise ValueError(f"action_bins={self.action_bins} must be >= 2")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")
        if self.text_encoder is not None and not self.text_encoder.strip():
            raise ValueError("text_encoder='' names no folder; use null for the word table")


@dataclass(frozen=True)
class DataSpec:
    """Sizes the data decides; the trainer reads them from the dataset and saves them with the checkpoint."""

    image_size: int  # camera image height = width, pixels
    proprio_dim: int  # proprioceptive state size P (normalized floats), embedded as one token
    action_dim: int  # A: action dimensions
    vocab_size: int  # instruction vocabulary size (TextTokenizer.vocab_size), tokens
    n_cameras: int = 1  # cameras per step
    aux_dim: int = 0  # auxiliary regression targets per step (privileged positions; 0 = none), training only
    # the keypoint maps train against objects' recorded image positions (data.keypoint_key), which decides the keypoint
    # net (vla/model/vision.py); moved-object targets (data.moved_object_targets) leave it False: the label-free net
    keypoint_targets: bool = False
    text_fingerprint: str = ""  # the text encoder folder the ids come from (text_encoder.fingerprint); "" = words
    vision_fingerprint: str = ""  # the vision encoder folder trained against (vision_encoder.fingerprint); "" = stem

    def __post_init__(self):
        for name in ("image_size", "proprio_dim", "action_dim", "vocab_size", "n_cameras"):
            if getattr(self, name) < 1:
                raise ValueError(f"data spec: {name}={getattr(self, name)} must be >= 1")
        if self.aux_dim < 0:
            raise ValueError(f"data spec: aux_dim={self.aux_dim} must be >= 0")


@dataclass(frozen=True)
class TokenLayout:
    """Token counts of the stream for one (config, data) pair.

    [instruction: L] then per step: [patches + keypoints, per camera] [proprio: 1] [action slots: chunk * A]."""

    cfg: ModelConfig
    spec: DataSpec

    def __post_init__(self):
        if self.spec.image_size % self.cfg.patch_size:
            raise ValueError(
                f"image_size={self.spec.image_size} (from the data) is not a multiple of "
                f"model.patch_size={self.cfg.patch_size}; resize the images or choose another patch size"
            )

    @property
    def grid(self) -> int:
        """Patches per image side."""
        return self.spec.image_size // self.cfg.patch_size

    @property
    def keypoint_grid(self) -> int:
        """Heat-map side of the keypoint network (half the image, rounded up), pixels."""
        return (self.spec.image_size + 1) // 2

    @property
    def n_image_tokens(self) -> int:
        """Image tokens per step, all cameras: patches, then keypoints, per camera."""
        return self.spec.n_cameras * (self.grid**2 + self.cfg.keypoints)

    @property
    def n_obs_tokens(self) -> int:
        """Observation tokens per step: image tokens + 1 proprio."""
        return self.n_image_tokens + 1

    @property
    def n_action_tokens(self) -> int:
        """Action slots per step: chunk * action_dim."""
        return self.cfg.chunk * self.spec.action_dim

    @property
    def tokens_per_step(self) -> int:
        """S."""
        return self.n_obs_tokens + self.n_action_tokens

    @property
    def n_tokens(self) -> int:
        """L + K * S: the stream length of a full window."""
        return self.cfg.instruction_len + self.cfg.window * self.tokens_per_step

    @property
    def feeds_aux(self) -> bool:
        """Does the auxiliary prediction enter the proprio token (aux_feed, and the data has targets)?"""
        return self.cfg.aux_feed and self.spec.aux_dim > 0
