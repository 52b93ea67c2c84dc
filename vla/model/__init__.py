"""The policy network, split by role:

- `config.py`: ModelConfig (hyperparameters), DataSpec (sizes the data decides), TokenLayout (counts).
- `vision.py`: frames -> image tokens (conv stem or linear patches, FiLM, spatial-softmax keypoints).
- `transformer.py`: blocks and the one attention rule shared by training, recompute and streaming.
- `network.py`: ActionTransformer, embed -> trunk -> head (the training pass).
- `streaming.py`: decoding a control step: KV cache, start, step, and recompute (the reference).
- `kv_cache.py`: the cache's ring of step slots.
- `losses.py`: the training losses, pure functions of outputs and targets.
"""

from vla.model.config import (
    PAD_ID,
    SEG_ACTION,
    SEG_IMAGE,
    SEG_INSTRUCTION,
    SEG_PROPRIO,
    DataSpec,
    ModelConfig,
    TokenLayout,
)
from vla.model.network import ActionTransformer
from vla.model.streaming import StepOutput

__all__ = [
    "PAD_ID",
    "SEG_ACTION",
    "SEG_IMAGE",
    "SEG_INSTRUCTION",
    "SEG_PROPRIO",
    "ActionTransformer",
    "DataSpec",
    "ModelConfig",
    "StepOutput",
    "TokenLayout",
]
