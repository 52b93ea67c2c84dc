"""The Policy: what a user calls to drive a robot with a trained checkpoint.

    policy = load_policy("runs/demo", device="cpu")         # PolicyConfig fields override, e.g. readout="argmax"
    policy.reset("put the red block in the bin")
    action = policy.act(obs)            # np.ndarray (A,) inside [-1, 1]
    chunk = policy.act_chunk(obs)       # np.ndarray (chunk, A): this step's action and the next ones

With `kv_cache=True` each call appends one step's observation tokens to the streaming cache and
decodes its action tokens (constant cost per step however long the episode). With `kv_cache=False`
it recomputes the whole window from scratch every step; both give the same actions.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from pathlib import Path

import numpy as np
import torch

from vla.checkpoint import CheckpointError, load_checkpoint
from vla.config import ConfigError, from_dict
from vla.data.windows import Tokenizers
from vla.model import ActionTransformer, DataSpec, ModelConfig
from vla.model.text_encoder import relocated as text_relocated
from vla.model.vision_encoder import relocated as vision_relocated
from vla.policy.config import BACKENDS, PolicyConfig
from vla.policy.ensemble import TemporalEnsembler
from vla.policy.observation import check_instruction, check_observation


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """CUDA when present, else CPU; an explicit choice wins (and must exist)."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise ConfigError(f"device {device!r} is not a torch device ({e}); use auto, cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was requested but no CUDA device is available")
    return device


class Policy:
    def __init__(
        self, model: ActionTransformer, tokenizers: Tokenizers, meta: dict, config: PolicyConfig | None = None
    ):
        self.model = model.eval()
        self.tok = tokenizers
        self.meta = meta
        self.cfg: ModelConfig = model.cfg
        self.spec: DataSpec = model.spec
        self.config = config or PolicyConfig()
        if self.config.n_action_steps > self.cfg.chunk:
            raise ConfigError(
                f"policy n_action_steps={self.config.n_action_steps} exceeds the model's chunk={self.cfg.chunk}"
            )
        self.device = next(model.parameters()).device
        self.image_keys = ["image", "wrist_image"][: self.spec.n_cameras]
        self._cache = model.new_cache(1, self.device) if self.config.kv_cache else None
        self._history: deque = deque(maxlen=self.cfg.window)  # [image, proprio, timestep, tokens] per step
        self._ensembler = TemporalEnsembler(self.cfg.chunk, self.config.ensemble_coeff)
        self._plan: np.ndarray | None = None  # (chunk, A) the chunk being executed, with n_action_steps > 1
        self._plan_t: int | None = None  # the step it was planned at
        self._instruction: torch.Tensor | None = None
        self._centres = torch.as_tensor(tokenizers.action.centres, dtype=torch.float32, device=self.device)  # (A, bins)
        self.t = 0

    def fork(self, **overrides) -> Policy:
        """A policy on the same weights with its own episode state (KV cache, ensembling, step counter), and
        `overrides` (PolicyConfig fields) on top of this one's settings: vla-serve makes one per connection."""
        config = from_dict(PolicyConfig, {**dataclasses.asdict(self.config), **overrides}, "policy")
        return Policy(self.model, self.tok, self.meta, config)

    @property
    def action_dim(self) -> int:
        return self.spec.action_dim

    @property
    def chunk(self) -> int:
        return self.cfg.chunk

    def reset(self, instruction: str) -> None:
        """Start an episode with a new instruction (any text: unseen words fall back to bytes)."""
        ids = self.tok.text.encode_batch([check_instruction(instruction)], self.cfg.instruction_len)  # (1, L)
        self._instruction = torch.as_tensor(np.asarray(ids), dtype=torch.long, device=self.device)
        self._history.clear()
        self._ensembler.reset()
        self._plan, self._plan_t = None, None
        self.t = 0
        if self._cache is not None:
            self.model.start(self._cache, self._instruction)

    def _inputs(self, obs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """obs -> image (1, n_cam, H, W, 3) uint8 and normalized proprio (1, P), with clear errors."""
        frames, proprio = check_observation(obs, self.image_keys, self.spec.image_size, self.spec.proprio_dim)
        image = torch.from_numpy(frames[None]).to(self.device)  # (1, n_cam, H, W, 3)
        norm = self.tok.proprio.normalize(proprio).astype(np.float32)
        return image, torch.from_numpy(norm[None]).to(self.device)  # (1, P)

    def _decode(self, image: torch.Tensor, proprio: torch.Tensor, timestep: torch.Tensor, committed=None):
        """Run the network on this step (cached or recomputed); the step's tokens join the history."""
        temperature = self.config.temperature
        if self._cache is not None:
            out = self.model.step(self._cache, image, proprio, timestep, temperature=temperature, committed=committed)
        else:
            w = self.window_batch()
            out = self.model.recompute(
                w["instruction"], w["image"], w["proprio"], w["timestep"], temperature=temperature, committed=committed,
            )  # fmt: skip
        self._history[-1][3] = out.tokens
        return out

    def _values(self, out) -> np.ndarray:
        """Decoded tokens/logits of one step -> (chunk, A) action values."""
        chunk, A = self.cfg.chunk, self.spec.action_dim
        if self.config.readout == "expectation":
            # The mean of each slot's distribution over bin centres: sub-bin resolution, and where the
            # model is torn between neighbouring bins it lands between them instead of on either.
            probs = out.logits[0].float().softmax(-1).view(chunk, A, -1)  # (chunk, A, bins)
            return (probs * self._centres).sum(-1).cpu().numpy()  # (chunk, A)
        return self.tok.action.decode(out.tokens[0].view(chunk, A).cpu().numpy())  # (chunk, A)

    def _committed_bins(self, committed: np.ndarray) -> torch.Tensor:
        """Committed actions (n, A), the first n rows of this step's chunk -> (1, chunk*A) bins, -1 = free."""
        n, A = committed.shape
        if n > self.cfg.chunk or self.spec.action_dim != A:
            raise ValueError(f"committed actions {committed.shape} do not fit a chunk of ({self.cfg.chunk}, {A})")
        bins = np.full(self.cfg.chunk * A, -1, dtype=np.int64)
        bins[: n * A] = np.asarray(self.tok.action.encode(committed)).reshape(-1)  # chunk-major, as the slots
        return torch.from_numpy(bins[None]).to(self.device)

    @torch.inference_mode()
    def act_chunk(self, obs: dict, committed: np.ndarray | None = None) -> np.ndarray:
        """This step's action followed by the predicted next ones: (chunk - k, A) in [-1, 1], where k is
        how many actions of the executing chunk were already used (k = 0 with n_action_steps = 1).

        `committed` (n, A): actions already decided for this step and the next n - 1 (they execute while
        this inference runs; vla/policy/strategies.py, delay_aware). A model with committed action slots
        (model.committed_actions) decodes the rest of the chunk conditioned on them; the returned
        chunk's first n rows are exactly `committed` either way."""
        if self._instruction is None:
            raise RuntimeError("call policy.reset(instruction) before policy.act(obs)")
        image, proprio = self._inputs(obs)
        timestep = torch.tensor([self.t], dtype=torch.long, device=self.device)
        self._history.append([image, proprio, timestep, None])
        t, self.t = self.t, self.t + 1
        done = self.config.plan_row(t, self._plan_t)  # actions of the current plan already executed
        fixed = None if committed is None else np.asarray(committed, dtype=np.float32)
        held = None if fixed is None else self._committed_bins(fixed)
        out = self._decode(image, proprio, timestep, held)  # every step joins the context, planned or not
        if done and self._plan is not None:
            return self._plan[done:]
        values = self._values(out)
        if fixed is not None:
            values[: len(fixed)] = fixed
        if self.config.temporal_ensemble:
            values = self._ensembler.update(t, values)
        self._plan, self._plan_t = np.clip(values, -1.0, 1.0).astype(np.float32), t
        return self._plan

    def window_batch(self) -> dict:
        """The current window (the last K steps seen) as a model batch of one, oldest step first; the
        steps' decoded tokens as `actions` (-1 for a step not yet decoded)."""
        images, props, steps, tokens = zip(*self._history, strict=True)
        blank = torch.full((1, self.model.layout.n_action_tokens), -1, dtype=torch.long, device=self.device)
        return {
            "instruction": self._instruction,  # (1, L)
            "image": torch.stack(images, dim=1),  # (1, T, n_cam, H, W, 3)
            "proprio": torch.stack(props, dim=1),  # (1, T, P)
            "timestep": torch.stack(steps, dim=1),  # (1, T)
            "actions": torch.stack([blank if t is None else t for t in tokens], dim=1),  # (1, T, chunk*A)
        }

    def act(self, obs: dict) -> np.ndarray:
        """One action (A,) for this observation."""
        return self.act_chunk(obs)[0]


def load_policy(
    checkpoint_dir: str | Path,
    device=None,
    kv_cache: bool | None = None,
    backend: str = "torch",
    text_encoder: str | Path | None = None,
    vision_encoder: str | Path | None = None,
    **overrides,
) -> Policy:
    """Build a Policy from a checkpoint directory (safetensors + JSON; never unpickles).

    `kv_cache` and `overrides` are PolicyConfig fields (readout, temporal_ensemble, n_action_steps, ...)
    that replace the values saved with the checkpoint. backend="onnxruntime": the exported graphs
    (`vla-export`; an `OnnxPolicy` with the same API, see vla/policy/onnx_policy.py). `text_encoder`: where the
    checkpoint's text encoder folder is on this machine, if it moved (its fingerprint must still match);
    `vision_encoder` the same for its vision encoder folder.
    backend="onnxruntime-int8": the same with the dynamically quantized step graph (`vla-export --int8`)."""
    if backend in ("onnxruntime", "onnxruntime-int8"):
        from vla.policy.onnx_policy import load_onnx_policy

        if kv_cache is not None:
            overrides["kv_cache"] = kv_cache
        int8 = backend == "onnxruntime-int8"
        return load_onnx_policy(checkpoint_dir, threads=torch.get_num_threads(), int8=int8, **overrides)
    if backend != "torch":
        raise ConfigError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    ckpt = load_checkpoint(checkpoint_dir)
    meta = ckpt.meta if text_encoder is None else text_relocated(ckpt.meta, text_encoder)
    meta = meta if vision_encoder is None else vision_relocated(meta, vision_encoder)
    if kv_cache is not None:
        overrides["kv_cache"] = kv_cache
    try:
        cfg = from_dict(ModelConfig, meta["model"], "model")
        spec = from_dict(DataSpec, meta["data_spec"], "data_spec")
        saved = meta.get("policy", {})
        from_dict(PolicyConfig, saved, "policy")
        tokenizers = Tokenizers.from_dict(meta["tokenizers"])
    except KeyError as e:
        raise CheckpointError(f"{ckpt.path}/config.json: incomplete (no {e})") from None
    except ConfigError as e:
        raise CheckpointError(f"{ckpt.path}/config.json: invalid ({e})") from None
    config = from_dict(PolicyConfig, {**saved, **overrides}, "policy")  # a bad override: the caller's error
    model = ActionTransformer(cfg, spec)
    ckpt.load_into(model)
    return Policy(model.to(pick_device(device)).for_inference(), tokenizers, meta, config)
