"""The streaming step captured in CUDA graphs replays what the eager step computes (issue 16)."""

import pytest
import torch

from vla.model import ActionTransformer, DataSpec, ModelConfig
from vla.model.cuda_graph import CapturedStep

pytestmark = pytest.mark.gpu

SPEC = DataSpec(image_size=64, proprio_dim=9, action_dim=4, vocab_size=40, n_cameras=1, aux_dim=6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("window", [2, 3])
def test_captured_step_equals_the_eager_step_over_episodes_whose_window_slides(window):
    torch.manual_seed(0)
    model = ActionTransformer(ModelConfig(window=window), SPEC).cuda().eval()
    captured = CapturedStep(model)
    eager = model.new_cache(1, "cuda")
    g = torch.Generator().manual_seed(1)
    for episode in range(2):  # a second episode: start() must reuse the captured buffers
        instruction = torch.zeros(1, model.cfg.instruction_len, dtype=torch.long)
        instruction[0, : 5 + episode] = torch.randint(1, SPEC.vocab_size, (5 + episode,), generator=g)
        instruction = instruction.cuda()
        model.start(eager, instruction)
        captured.start(instruction)
        for t in range(3 * window + 1):
            image = torch.randint(0, 256, (1, 1, 64, 64, 3), dtype=torch.uint8, generator=g).cuda()
            proprio = torch.randn(1, 9, generator=g).cuda()
            timestep = torch.tensor([t], device="cuda")
            want = model.step(eager, image, proprio, timestep)
            got = captured(image, proprio, timestep)
            torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
            assert torch.equal(got.tokens, want.tokens)


def test_capturing_refuses_a_cpu_model_in_one_line():
    model = ActionTransformer(ModelConfig(), SPEC)
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device, not cpu"):
        CapturedStep(model)
