"""The Policy: what a user calls to drive a robot with a trained checkpoint, whatever runs the network.

    policy = load_policy("runs/demo")     # backend="torch" | "onnxruntime" | "onnxruntime-int8"; PolicyConfig overrides
    policy.reset("put the red block in the bin")
    action = policy.act(obs)            # np.ndarray (A,) inside [-1, 1]
    chunk = policy.act_chunk(obs)       # np.ndarray (chunk, A): this step's action and the next ones

One front end owns the episode (the instruction, the step counter, the plan being executed, temporal
ensembling) and turns a step's logits into actions (the readout); a backend only maps a step to logits:
`TorchBackend` (vla/policy/torch_policy.py) runs the network, `OnnxBackend` (vla/policy/onnx_policy.py) the
graphs vla-export wrote, in numpy and onnxruntime alone. A backend provides:

    spec, cfg, meta, device, tok (vla.tokenizers.Tokenizers), image_keys
    reads_committed                       does `step` condition the chunk on committed bins
    start(ids)                            ids (1, L) int64: a new episode's instruction
    step(image, proprio, t, committed)    (1, C, H, W, 3) uint8, (1, P) float32 normalized, int, (1, chunk*A)
                                          int64 bins or None -> logits (chunk*A, bins) float32
    fork(kv_cache)                        the same weights / sessions with their own episode state
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vla.config import ConfigError, from_dict
from vla.policy.config import PolicyConfig
from vla.policy.ensemble import TemporalEnsembler
from vla.policy.observation import check_instruction, check_observation
from vla.policy.surface import PolicySurface


def expectation(logits: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """(chunk, A, bins) logits -> (chunk, A) the mean of each slot's distribution over its bin centres (A, bins):
    sub-bin resolution, and where the model is torn between neighbouring bins it lands between them."""
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return ((z / z.sum(-1, keepdims=True)) * centres).sum(-1)


class Policy(PolicySurface):
    def __init__(self, backend, config: PolicyConfig | None = None):
        self.backend = backend
        self.config = config or PolicyConfig()
        if self.config.n_action_steps > backend.cfg.chunk:
            raise ConfigError(
                f"policy n_action_steps={self.config.n_action_steps} exceeds the model's chunk={backend.cfg.chunk}"
            )
        self.spec, self.cfg, self.meta, self.tok = backend.spec, backend.cfg, backend.meta, backend.tok
        self.device, self.image_keys = backend.device, backend.image_keys
        self._centres = np.asarray(self.tok.action.centres, dtype=np.float32)  # (A, bins)
        self._ensembler = TemporalEnsembler(self.cfg.chunk, self.config.ensemble_coeff)
        self._plan: np.ndarray | None = None  # (chunk, A) the chunk being executed, with n_action_steps > 1
        self._plan_t: int | None = None  # the step it was planned at
        self._started = False
        self.t = 0  # the step index the next act_chunk is for (a controller may set it)

    def __getattr__(self, name):  # what only one backend has (torch: model, window_batch)
        if name == "backend":
            raise AttributeError(name)
        return getattr(self.backend, name)

    def fork(self, **overrides) -> Policy:
        """A policy on the same weights (or onnxruntime sessions) with its own episode state, and `overrides`
        (PolicyConfig fields) on top of this one's settings: vla-serve makes one per connection."""
        config = from_dict(PolicyConfig, {**dataclasses.asdict(self.config), **overrides}, "policy")
        return Policy(self.backend.fork(config.kv_cache), config)

    @property
    def reads_committed(self) -> bool:
        """Whether committed actions condition the rest of the chunk (a model trained with committed action
        slots, on a backend that feeds them); otherwise `act_chunk` only returns them as the first rows."""
        return bool(getattr(self.cfg, "committed_actions", False)) and self.backend.reads_committed

    def reset(self, instruction: str) -> None:
        """Start an episode with a new instruction (any text: unseen words become <unk>)."""
        ids = self.tok.text.encode_batch([check_instruction(instruction)], self.cfg.instruction_len)  # (1, L)
        self.backend.start(np.asarray(ids, dtype=np.int64))
        self._ensembler.reset()
        self._plan, self._plan_t, self._started, self.t = None, None, True, 0

    def predict_chunk(self, obs: dict, committed: np.ndarray | None = None) -> np.ndarray:
        """The network's whole chunk for this step, (chunk, A) in [-1, 1], executed by nobody here: no plan, no
        ensembling (what an execution strategy schedules itself, vla/policy/strategies.py). `committed` as
        in `act_chunk`."""
        _, values = self._infer(obs, committed)
        return np.clip(values, -1.0, 1.0).astype(np.float32)

    def act_chunk(self, obs: dict, committed: np.ndarray | None = None) -> np.ndarray:
        """This step's action followed by the predicted next ones: (chunk - k, A) in [-1, 1], where k is
        how many actions of the executing chunk were already used (k = 0 with n_action_steps = 1); with
        temporal_ensemble each row is the ensemble of every stored chunk's prediction of it.

        `committed` (n, A): actions already decided for this step and the next n - 1 (they execute while
        this inference runs; vla/policy/strategies.py, delay_aware). The returned chunk's first n rows are
        exactly `committed`; a model with committed action slots (`reads_committed`) decodes the rest of
        the chunk conditioned on them."""
        done = self.config.plan_row(self.t, self._plan_t)  # actions of the current plan already executed
        t, values = self._infer(obs, committed, readout=not done)
        if done:  # the current plan still has this step's row
            return self._plan[done:]
        if self.config.temporal_ensemble:
            self._ensembler.coeff = self.config.ensemble_coeff
            values = self._ensembler.update(t, values)
        self._plan, self._plan_t = np.clip(values, -1.0, 1.0).astype(np.float32), t
        return self._plan

    def _infer(self, obs: dict, committed, readout: bool = True) -> tuple[int, np.ndarray | None]:
        """Run this step through the backend (every step joins the context) -> (its step index, its (chunk, A)
        values with the committed rows in place, or None without `readout`)."""
        if not self._started:
            raise RuntimeError("call policy.reset(instruction) before policy.act(obs)")
        frames, proprio = check_observation(obs, self.image_keys, self.spec.image_size, self.spec.proprio_dim)
        norm = self.tok.proprio.normalize(proprio).astype(np.float32)[None]  # (1, P)
        fixed = None if committed is None else self._checked_committed(committed)
        bins = None if fixed is None else self._committed_bins(fixed)
        t, self.t = self.t, self.t + 1
        logits = self.backend.step(np.ascontiguousarray(frames[None]), norm, t, bins)
        if not readout:
            return t, None
        values = self._readout(logits)
        if fixed is not None:
            values[: len(fixed)] = fixed
        return t, values

    def _readout(self, logits: np.ndarray) -> np.ndarray:
        """One step's logits (chunk*A, bins) -> (chunk, A) action values."""
        logits = logits.reshape(self.cfg.chunk, self.spec.action_dim, -1).astype(np.float32)  # (chunk, A, bins)
        if self.config.readout == "expectation":
            return expectation(logits, self._centres)
        return self.tok.action.decode(logits.argmax(-1))  # the best bin's centre

    def _checked_committed(self, committed) -> np.ndarray:
        fixed = np.asarray(committed, dtype=np.float32)
        if fixed.ndim != 2 or not 1 <= len(fixed) <= self.cfg.chunk or fixed.shape[1] != self.spec.action_dim:
            raise ValueError(
                f"committed actions {fixed.shape} do not fit a chunk of ({self.cfg.chunk}, {self.spec.action_dim})"
            )
        if getattr(self.cfg, "committed_actions", False) and not self.backend.reads_committed:
            raise ConfigError(
                f"this model conditions on committed actions, which the {self.device} backend cannot feed; "
                "use backend torch"
            )
        return fixed

    def _committed_bins(self, committed: np.ndarray) -> np.ndarray:
        """Committed actions (n, A), the first n rows of this step's chunk -> (1, chunk*A) bins, -1 = free."""
        bins = np.full(self.cfg.chunk * self.spec.action_dim, -1, dtype=np.int64)
        bins[: committed.size] = self.tok.action.encode(committed).reshape(-1)  # chunk-major, as the slots
        return bins[None]
