"""The model card's FLOP counts agree with torch's own counter (FlopCounterMode) on the real passes.

FlopCounterMode counts the matrix products torch runs (mm, addmm, bmm, convolutions, attention). On CPU,
`scaled_dot_product_attention` dispatches to a fused kernel that FlopCounterMode has no formula for (it
would count attention as 0), so the passes are counted under the math backend, where Q·Kᵀ and the
weighted sum of V are plain bmm's: the same products, now visible.
"""

from dataclasses import replace

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from vla.config import from_dict, load_yaml
from vla.model import ActionTransformer, DataSpec, ModelConfig
from vla.model.card import model_card

# The demo's data (vla.bench.latency.TABLETOP) at 32x32 pixels: same structure (conv stem, 16-pixel
# patches, keypoints at half resolution, auxiliary targets fed into the proprio token), 4x fewer pixels.
SPEC = DataSpec(image_size=32, proprio_dim=9, action_dim=4, vocab_size=64, n_cameras=1, aux_dim=6)


def ablation(name: str, **extra) -> ModelConfig:
    """ModelConfig() with a configs/ablations/ preset's model section (and `extra`) applied."""
    cfg = from_dict(ModelConfig, load_yaml(f"configs/ablations/{name}.yaml")["model"], "model")
    return replace(cfg, **extra)


CONFIGS = {
    "demo": lambda: ModelConfig(),
    "demo, keypoint targets": lambda: ModelConfig(),
    "demo K=8": lambda: ModelConfig(window=8),
    "linear_patches": lambda: ablation("linear_patches"),
    "two cameras, chunk 1, no aux": lambda: ModelConfig(chunk=1, aux_feed=False),
}


def counted(fn) -> int:
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def count_passes(cfg: ModelConfig, spec: DataSpec) -> dict:
    """FlopCounterMode's count of one streaming step (window already full), one recompute over the
    window, and one training forward of a window, batch 1."""
    torch.manual_seed(0)
    model = ActionTransformer(cfg, spec).eval()
    K, lay = cfg.window, model.layout
    g = torch.Generator().manual_seed(0)
    instruction = torch.zeros(1, cfg.instruction_len, dtype=torch.long)
    instruction[0, :5] = torch.randint(1, spec.vocab_size, (5,), generator=g)
    size = spec.image_size
    image = torch.randint(0, 256, (1, K + 1, spec.n_cameras, size, size, 3), dtype=torch.uint8, generator=g)
    proprio = torch.randn(1, K + 1, spec.proprio_dim, generator=g)
    timestep = torch.arange(K + 1)[None]  # (1, K+1)
    cache = model.new_cache(1)
    model.start(cache, instruction)
    for t in range(K):  # fill the window; the counted step evicts the oldest
        model.step(cache, image[:, t], proprio[:, t], timestep[:, t])
    last = slice(1, K + 1)  # the window the counted step sees
    batch = {
        "instruction": instruction,
        "image": image[:, last],
        "proprio": proprio[:, last],
        "timestep": timestep[:, last],
        "actions": torch.randint(0, cfg.action_bins, (1, K, lay.n_action_tokens), generator=g),
    }
    with torch.no_grad():
        forward = counted(lambda: model(batch))
    return {
        "per_control_step_streaming": counted(lambda: model.step(cache, image[:, K], proprio[:, K], timestep[:, K])),
        "per_control_step_recompute": counted(
            lambda: model.recompute(instruction, image[:, last], proprio[:, last], timestep[:, last])
        ),
        "per_training_sample_forward": forward,
    }


@pytest.mark.parametrize("name", list(CONFIGS))
def test_card_flops_agree_with_flop_counter(name):
    cfg = CONFIGS[name]()
    spec = replace(SPEC, n_cameras=2, aux_dim=0) if "two cameras" in name else SPEC
    spec = replace(spec, aux_dim=0) if name == "linear_patches" else spec  # no keypoints: no auxiliary head
    spec = replace(spec, keypoint_targets=True) if "keypoint targets" in name else spec  # the other keypoint net
    card = model_card(cfg, spec)["flops"]
    for key, value in count_passes(cfg, spec).items():
        assert value > 0
        assert card[key] == pytest.approx(value, rel=0.05), f"{name}: {key} card {card[key]:,} vs counted {value:,}"


def test_the_counter_sees_attention():
    """Without the math backend FlopCounterMode counts no attention on CPU; with it, exactly 4·n_q·n_k·d."""
    q, k = torch.randn(1, 4, 5, 32), torch.randn(1, 4, 7, 32)  # (B, H, n, hd)
    mask = torch.zeros(1, 1, 5, 7)
    flops = counted(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask))
    assert flops == 4 * 5 * 7 * (4 * 32)


def test_streaming_is_cheaper_than_recompute_by_about_the_window():
    """The card's point: a step costs ~1/K of a recompute in the trunk, and the vision of one frame, not K."""
    for K in (2, 8):
        flops = model_card(ModelConfig(window=K), SPEC)["flops"]
        assert 1.5 < flops["recompute_over_streaming"] <= K + 1
