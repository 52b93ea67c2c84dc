"""Golden values: the network's outputs on a fixed input with fixed weights must not drift.

tests/golden/ holds a small demo-shaped network's weights, an input batch and the logits, losses and
streaming logits it gave when the file was written. A refactor that changes any number by more than
float noise fails here. Regenerate (only for an intended change of the numerics, and say so in the
commit): `VLA_WRITE_GOLDEN=1 python -m pytest tests/test_golden.py`.
"""

import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vla.model import ActionTransformer, DataSpec, ModelConfig

GOLDEN = Path(__file__).parent / "golden"
CFG = ModelConfig(d_model=32, n_layer=2, n_head=2, d_ff=64, conv_channels=8, keypoints=4, keypoint_channels=8,
                  chunk=2, window=2, action_bins=16, instruction_len=8)  # fmt: skip
SPEC = DataSpec(image_size=32, proprio_dim=5, action_dim=3, vocab_size=30, aux_dim=6)


def _inputs(g: torch.Generator) -> dict:
    B, T = 2, CFG.window
    instruction = torch.randint(2, SPEC.vocab_size, (B, CFG.instruction_len), generator=g)
    instruction[:, -3:] = 0  # padding
    return {
        "instruction": instruction,
        "image": torch.randint(0, 256, (B, T, 1, SPEC.image_size, SPEC.image_size, 3), generator=g).to(torch.uint8),
        "proprio": torch.randn(B, T, SPEC.proprio_dim, generator=g),
        "timestep": torch.tensor([[4, 5], [0, 0]]),
        "step_mask": torch.tensor([[True, True], [False, True]]),
        "actions": torch.randint(0, CFG.action_bins, (B, T, CFG.chunk * SPEC.action_dim), generator=g),
        "action_is_pad": torch.tensor([[[False, False], [False, True]], [[False, False], [False, False]]]),
        "aux": torch.randn(B, T, SPEC.aux_dim, generator=g),
        "keypoint_targets": torch.rand(B, T, 2, 2, generator=g) * 2 - 1,
    }


def _outputs(model: ActionTransformer, batch: dict) -> dict:
    with torch.no_grad():
        out = model(batch)
    result = {k: out[k] for k in ("logits", "loss", "accuracy", "aux_loss", "keypoint_loss")}
    cache = model.new_cache(2)
    model.start(cache, batch["instruction"])
    streamed = [model.step(cache, batch["image"][:, t % 2, :], batch["proprio"][:, t % 2], torch.tensor([t, t])).logits
                for t in range(3)]  # fmt: skip
    result["stream_logits"] = torch.stack(streamed)  # (3, B, chunk*A, bins): the window slid once
    return result


def test_outputs_on_a_fixed_input_match_the_golden_values():
    if os.environ.get("VLA_WRITE_GOLDEN"):
        torch.manual_seed(0)
        model = ActionTransformer(CFG, SPEC).eval()
        batch = _inputs(torch.Generator().manual_seed(1))
        GOLDEN.mkdir(exist_ok=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(GOLDEN / "weights.safetensors"))
        io = {f"in.{k}": v for k, v in batch.items()} | {f"out.{k}": v for k, v in _outputs(model, batch).items()}
        save_file(io, str(GOLDEN / "io.safetensors"))
    model = ActionTransformer(CFG, SPEC).eval()
    model.load_state_dict(load_file(str(GOLDEN / "weights.safetensors")))
    io = load_file(str(GOLDEN / "io.safetensors"))
    batch = {k[3:]: v for k, v in io.items() if k.startswith("in.")}
    got = _outputs(model, batch)
    for name, value in got.items():
        expected = io[f"out.{name}"]
        assert value.shape == expected.shape, name
        assert torch.allclose(value, expected, rtol=1e-5, atol=1e-6), (name, (value - expected).abs().max().item())
