"""The surface every policy shows its caller, local (`vla.policy.policy.Policy`) or remote (`RemotePolicy`).

numpy only: the remote client imports it on a robot's computer that has neither torch nor yaml.
"""

from __future__ import annotations

import numpy as np


class PolicySurface:
    """What every policy gives its caller, in process (`Policy`) or over the network (`RemotePolicy`): `spec`,
    `cfg`, `config`, `t`, `reset(instruction)`, `act_chunk(obs, committed=None)`, and from those the rest."""

    spec: object  # DataSpec's fields (action_dim, proprio_dim, image_size, n_cameras)
    cfg: object  # ModelConfig's fields (chunk, window, committed_actions, ...)

    @property
    def action_dim(self) -> int:
        return self.spec.action_dim

    @property
    def chunk(self) -> int:
        return self.cfg.chunk

    def act(self, obs: dict) -> np.ndarray:
        """One action (A,) for this observation."""
        return self.act_chunk(obs)[0]
