"""Optional pretrained vision encoder: a local Hugging Face image model folder whose last feature map gives the
patch tokens, in place of the conv stem.

    model:
      vision_encoder: /models/resnet-18    # a directory on disk (config.json, weights, preprocessor_config.json)
      vision_encoder_trainable: false       # frozen (the default), or fine-tuned with the policy

Each camera image, in [0, 1], is normalized as the folder's preprocessor_config.json says (its mean and std;
ImageNet's without one), resized to the model's `image_size` when its config fixes one (a ViT's position
embeddings are for one size; a convolutional net sees the data's own frames), and run through `AutoModel`.
Its last feature map (N, C_enc, h, w) -- for a ViT, the patch tokens laid out on their grid -- is pooled to
the policy's patch grid and projected to d_model by a trained linear map (`PatchEmbed`, vla/model/vision.py).
The token layout is the conv stem's, so streaming, the KV cache and recompute are unchanged.

- Never a download, and fingerprinted (vla/hf_folder.py, shared with vla/model/text_encoder.py): a checkpoint
  records the folder's absolute path (`model.vision_encoder`) and fingerprint (`data_spec.vision_fingerprint`),
  and loading refuses a folder that is missing or whose fingerprint differs (one line, exit 2).
- Frozen (default): the weights are never trained and never saved with ours. They are held outside the
  network's module tree, so `state_dict()`, `parameters()` and the optimizer never see them; loading re-reads
  them from the folder.
- Fine-tuned (`vision_encoder_trainable`): the weights are a submodule, trained and saved in model.safetensors.
  Loading builds the architecture from the folder and then puts the trained weights in; the folder must still
  be the one the run started from (the same fingerprint), since its config and preprocessing decide what those
  weights compute. Weights the feature map never reads (a classification pooler) are frozen, so neither the
  optimizer nor DDP waits for their gradients.
- Either way BatchNorm statistics and dropout stay in eval mode: a batch of a few windows is too small for
  batch statistics (DETR freezes its backbone's BatchNorm for the same reason), and training then computes
  the same function as inference.

`transformers` is imported only when a vision encoder is used: `pip install -e ".[vision]"`.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

from vla.errors import UserError
from vla.hf_folder import ModelFolder

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class VisionEncoderError(UserError):
    """The vision encoder folder is not there, not an image model, or not the one a checkpoint was trained on."""


FOLDER = ModelFolder("vision encoder", "model.vision_encoder", "vision", VisionEncoderError)
fingerprint = FOLDER.fingerprint  # the vision encoder folder's (vla/hf_folder.py)


def relocated(meta: dict, path: str | os.PathLike) -> dict:
    """A checkpoint's config.json with its vision encoder folder at `path` (the same encoder, moved: the
    recorded fingerprint still decides whether it loads)."""
    if not meta.get("model", {}).get("vision_encoder"):
        raise VisionEncoderError(f"vision_encoder={str(path)!r} given, but this checkpoint has no vision encoder")
    return {**meta, "model": {**meta["model"], "vision_encoder": str(Path(path).expanduser().resolve())}}


def normalization(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift), each (3, 1, 1): pixels in [0, 1] -> the encoder's inputs, x * scale + shift, as the
    folder's preprocessor_config.json rescales and normalizes (ImageNet's mean and std without one)."""
    path, proc = folder / "preprocessor_config.json", {}
    if path.is_file():
        try:
            proc = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise VisionEncoderError(f"vision encoder {path}: not valid JSON ({e})") from None
    mean, std = proc.get("image_mean", IMAGENET_MEAN), proc.get("image_std", IMAGENET_STD)
    if not proc.get("do_normalize", True):
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    # a processor that does not rescale feeds 0..255; one that does multiplies by rescale_factor (1/255)
    rescale = proc.get("rescale_factor", 1 / 255) if proc.get("do_rescale", True) else 1.0
    try:
        mean, std = (torch.tensor(v, dtype=torch.float32).reshape(3, 1, 1) for v in (mean, std))  # (3, 1, 1)
    except (TypeError, ValueError, RuntimeError):
        raise VisionEncoderError(
            f"vision encoder {path}: image_mean / image_std must be three numbers each, got {mean!r} / {std!r}"
        ) from None
    if not bool((std > 0).all()):
        raise VisionEncoderError(f"vision encoder {path}: image_std {std.flatten().tolist()} must be > 0")
    return 255.0 * rescale / std, -mean / std


def _pair(value) -> tuple[int, int] | None:
    """A config's `image_size` / `patch_size` (an int or a pair) as (height, width); None when absent."""
    if value is None:
        return None
    return (int(value), int(value)) if isinstance(value, int | float) else (int(value[0]), int(value[1]))


class VisionEncoder(nn.Module):
    """Images (N, 3, H, W) in [0, 1] -> the pretrained encoder's last feature map (N, C_enc, h, w).

    Frozen, the Hugging Face model is held outside the module tree (no parameters or buffers of this module
    are its), so it is never saved, trained or counted, and `_apply` carries it along on `.to(device)`.
    Fine-tuned, it is the submodule `hf`. See the module docstring."""

    def __init__(
        self,
        path: str | os.PathLike,
        image_size: int,
        trainable: bool = False,
        expected_fingerprint: str | None = None,
    ):
        super().__init__()
        folder, self.fingerprint = FOLDER.checked(path, expected_fingerprint)
        self.path, self.trainable = str(folder), trainable
        hf = FOLDER.from_pretrained("AutoModel", folder)
        if getattr(hf.config, "num_channels", 3) != 3:
            raise VisionEncoderError(f"vision encoder {folder}: takes {hf.config.num_channels} channels, not RGB")
        if trainable:
            self.hf = hf
        else:
            hf.requires_grad_(False)
            object.__setattr__(self, "hf", hf)  # not a submodule: see the class docstring
        hf.eval()
        self.input_size = _pair(getattr(hf.config, "image_size", None))  # fixed by position embeddings, or None
        self.patch = _pair(getattr(hf.config, "patch_size", None))  # a ViT's patch side: lays its tokens out
        scale, shift = normalization(folder)
        self.register_buffer("scale", scale, persistent=False)  # (3, 1, 1)
        self.register_buffer("shift", shift, persistent=False)  # (3, 1, 1)
        self.channels = self._probe(image_size)

    def _probe(self, image_size: int) -> int:
        """C_enc, from one blank frame of the data's size; a model that gives no feature map is refused here, in
        one line. Fine-tuned, the weights the feature map does not depend on are frozen (module docstring)."""
        with torch.inference_mode(False), torch.set_grad_enabled(self.trainable):  # a model built in inference mode
            try:
                features = self(torch.zeros(1, 3, image_size, image_size))  # (1, C_enc, h, w)
            except (TypeError, ValueError, AttributeError, RuntimeError) as e:
                detail = " ".join(str(e).split())[:200]
                raise VisionEncoderError(
                    f"vision encoder {self.path}: {type(self.hf).__name__} gives no image feature map "
                    f"({type(e).__name__}: {detail})"
                ) from None
            if self.trainable:
                params = [p for p in self.hf.parameters() if p.requires_grad]
                grads = torch.autograd.grad(features.sum(), params, allow_unused=True)
                for p, g in zip(params, grads, strict=True):
                    if g is None:
                        p.requires_grad_(False)
        return features.shape[1]

    def _apply(self, fn, recurse=True):
        if not self.trainable:  # outside the tree: carried along by hand
            self.hf._apply(fn)
        return super()._apply(fn, recurse)

    def train(self, mode: bool = True) -> VisionEncoder:
        super().train(mode)
        self.hf.eval()  # BatchNorm statistics and dropout frozen: see the module docstring
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) in [0, 1] -> (N, C_enc, h, w)."""
        x = images * self.scale.to(images.dtype) + self.shift.to(images.dtype)  # (N, 3, H, W) the encoder's inputs
        if self.input_size is not None and tuple(x.shape[-2:]) != self.input_size:
            x = F.interpolate(x, size=self.input_size, mode="bilinear", align_corners=False, antialias=True)
        with contextlib.nullcontext() if self.trainable else torch.no_grad():
            hidden = self.hf(pixel_values=x).last_hidden_state  # (N, C_enc, h, w), or a ViT's (N, n, C_enc)
        if hidden.dim() == 4:
            return hidden
        if hidden.dim() != 3 or self.patch is None:
            raise ValueError(f"an output of shape {tuple(hidden.shape)} is not a feature map or patch tokens")
        h, w = x.shape[-2] // self.patch[0], x.shape[-1] // self.patch[1]
        if hidden.shape[1] < h * w:
            raise ValueError(f"{hidden.shape[1]} tokens do not cover a {h}x{w} grid of patches")
        tokens = hidden[:, hidden.shape[1] - h * w :]  # (N, h*w, C_enc): the class / register tokens come first
        return rearrange(tokens, "n (h w) e -> n e h w", h=h)  # (N, C_enc, h, w)

    def extra_repr(self) -> str:
        mode = "fine-tuned" if self.trainable else "frozen"
        return f"{self.path}, fingerprint={self.fingerprint}, channels={self.channels}, {mode}"
