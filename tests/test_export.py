"""ONNX export of the streaming policy: the graphs compute what start/step compute, the exported policy's
actions equal PyTorch's over full rollouts of every task, and it runs without torch."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import envs
from tests.conftest import run_cli, run_main
from vla.export.graphs import MaskGraph, PrefixGraph, StepGraph, export_policy, parity
from vla.model import ActionTransformer, DataSpec, ModelConfig
from vla.policy.config import PolicyConfig
from vla.policy.load import load_policy
from vla.policy.policy import Policy
from vla.policy.torch_policy import torch_policy

TOL = 1e-4


def demo_like(tiny_checkpoint, keypoint_targets: bool = True, **overrides) -> Policy:
    """The demo architecture (conv stem + FiLM + keypoints + aux feed, relative time) at test size, on the
    tiny checkpoint's tokenizers and data sizes (untrained: parity is about the arithmetic, not skill).
    keypoint_targets=False: the label-free keypoint net and auxiliary head (configs/real.yaml)."""
    base = load_policy(tiny_checkpoint, device="cpu")
    spec = DataSpec(**{**vars(base.spec), "aux_dim": 6, "keypoint_targets": keypoint_targets})
    cfg = ModelConfig(d_model=32, n_layer=2, n_head=2, d_ff=64, window=3, chunk=2, conv_channels=4,
                      keypoints=4, keypoint_channels=8, action_bins=base.cfg.action_bins, instruction_len=12,
                      **overrides)  # fmt: skip
    torch.manual_seed(0)
    model = ActionTransformer(cfg, spec)
    with torch.no_grad():  # the ALiBi init makes the relative biases small; make them matter
        for p in (model.rel_bias, model.instr_bias):
            if p is not None:
                p.normal_(0, 1.0)
    return torch_policy(model, base.tok, base.meta)


@pytest.mark.parametrize("keypoint_targets", [True, False], ids=["demo", "label-free"])
def test_graphs_compute_what_start_and_step_compute(tiny_checkpoint, keypoint_targets):
    """The export wrappers, run in torch with the runtime's ring bookkeeping (OnnxStreamer's), give
    model.step's logits and KV cache over an episode longer than the window (eviction included)."""
    model = demo_like(tiny_checkpoint, keypoint_targets).model
    spec, rng = model.spec, np.random.default_rng(0)
    L, K, S = model.cfg.instruction_len, model.cfg.window, model.layout.tokens_per_step
    ids = torch.tensor([[1, 258, 259, 260, 2, 0, 0, 0, 0, 0, 0, 0]])  # <bos>, words, a byte, padding
    cache = model.new_cache(1)
    model.start(cache, ids)
    with torch.no_grad():
        kv, instr_valid, film = PrefixGraph(model)(ids)
    torch.testing.assert_close(kv[:, :, :, :, :12], cache.kv[:, :, :, :, :12], atol=1e-6, rtol=0)
    torch.testing.assert_close(film, cache.film_ctx.flat(), atol=1e-6, rtol=0)
    layers = kv[:, :, 0].flatten(0, 1)  # (n_layer*2, H, N, hd): k0, v0, k1, ... as the runtime feeds them
    slot_timestep, slot_valid = torch.zeros(1, K, dtype=torch.long), torch.zeros(1, K, dtype=torch.bool)
    for t in range(2 * K + 1):
        image = torch.from_numpy(rng.integers(0, 256, (1, 1, spec.image_size, spec.image_size, 3), dtype=np.uint8))
        proprio = torch.randn(1, spec.proprio_dim)
        timestep = torch.tensor([t * 3])  # gaps, as when a controller skips ticks
        want = model.step(cache, image, proprio, timestep)
        slot = t % K
        slot_timestep[:, slot], slot_valid[:, slot] = timestep, True
        with torch.no_grad():
            mask = MaskGraph(model)(instr_valid, slot_timestep, slot_valid, timestep, torch.tensor([slot]))[0]
            logits, *new_kv = StepGraph(model)(image, proprio, timestep, mask, film, *layers.unbind(0))
        layers[:, :, L + slot * S : L + (slot + 1) * S] = torch.stack(new_kv)  # (n_layer*2, H, S, hd)
        torch.testing.assert_close(logits, want.logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(kv, cache.kv, atol=1e-5, rtol=0)  # `layers` is a view of kv
        assert torch.equal(slot_timestep, cache.slot_timestep) and torch.equal(slot_valid, cache.slot_valid)


def full_rollout_parity(policy, out) -> dict:
    export_policy(policy, out)
    return parity(policy, load_policy(out, backend="onnxruntime", threads=1), envs.TASKS, steps=None)


# The tests that read `cli_export` run on one worker, which exports once (pytest-xdist --dist loadgroup).
uses_cli_export = pytest.mark.xdist_group("cli_export")


@pytest.fixture(scope="module")
def cli_export(tiny_checkpoint, tmp_path_factory):
    """vla-export of the tiny checkpoint, run as its own process (the one real run of that console script);
    the tests that use it only read it."""
    out = tmp_path_factory.mktemp("export") / "export"
    result = run_cli("vla.cli.export", "--checkpoint", tiny_checkpoint, "--out", out, "--parity-steps", "5", "--int8")
    return result, out


@pytest.mark.slow
@uses_cli_export
def test_cli_export_and_full_rollout_parity(tiny_checkpoint, cli_export):
    """vla-export writes the graphs (fp32 and int8) and manifest, checks parity itself (every task's first
    steps); full rollouts agree."""
    result, out = cli_export
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("parity fp32 tabletop/") == result.stdout.count("parity int8 tabletop/") == 4
    manifest = json.loads((out / "manifest.json").read_text())
    assert max(manifest["parity"]["max_abs_diff"].values()) <= TOL
    int8 = manifest["parity"]["int8_max_abs_diff"].values()  # approximate by design: finite, and not nonsense
    assert all(0 <= d < 1 for d in int8) and max(int8) > 0
    assert (out / "step.int8.onnx").stat().st_size < (out / "step.onnx").stat().st_size
    step_inputs = {io["name"]: io["shape"] for io in manifest["graphs"]["step"]["inputs"]}
    assert step_inputs["image"] == [1, 1, 64, 64, 3] and "mask" in step_inputs
    N = 12 + 2 * manifest["tokens_per_step"]  # configs/tiny.yaml: instruction 12, window 2, 2 heads of 16
    assert {name: step_inputs[name] for name in ("k0", "v0", "k1", "v1")} == dict.fromkeys(
        ("k0", "v0", "k1", "v1"), [2, N, 16]
    )
    assert not {"k2", "kv"} & set(step_inputs)  # one K and one V per layer, nothing else
    mask_inputs = {io["name"] for io in manifest["graphs"]["mask"]["inputs"]}
    assert mask_inputs == {"instr_valid", "slot_timestep", "slot_valid", "timestep", "slot"}
    assert {"text", "action", "proprio"} <= set(manifest["tokenizers"])
    policy = load_policy(tiny_checkpoint, device="cpu")
    # two tasks' full rollouts here; the default architecture's test below runs every task's
    diffs = parity(policy, load_policy(out, backend="onnxruntime"), envs.TASKS[:2], steps=None)
    assert max(diffs.values()) <= TOL, diffs


@pytest.mark.slow
def test_demo_architecture_full_rollout_parity(tiny_checkpoint, tmp_path):
    """Conv stem + FiLM + keypoints (the default architecture): full rollouts of every task agree."""
    diffs = full_rollout_parity(demo_like(tiny_checkpoint), tmp_path / "export")
    assert max(diffs.values()) <= TOL, diffs


def test_argmax_readout_and_action_chunks_agree(tiny_checkpoint, tmp_path):
    """The readout and plan-execution options take the same path as vla.policy.torch_policy.Policy."""
    policy = demo_like(tiny_checkpoint)
    export_policy(policy, tmp_path)
    for options in ({"readout": "argmax"}, {"temporal_ensemble": False, "n_action_steps": 2}):
        policy.config = PolicyConfig(**options)
        onnx = load_policy(tmp_path, backend="onnxruntime", threads=1, **options)
        diffs = parity(policy, onnx, envs.TASKS[:2], steps=20)
        assert max(diffs.values()) <= TOL, (options, diffs)


@uses_cli_export
def test_onnx_policy_runs_without_torch(cli_export):
    """The onnxruntime backend imports neither torch nor anything that needs it."""
    export = cli_export[1]
    spec = json.loads((export / "manifest.json").read_text())["data_spec"]
    script = f"""
import sys
sys.modules["torch"] = None  # any import of torch now fails
import numpy as np
from vla import load_policy
policy = load_policy({str(export)!r}, backend="onnxruntime")
assert "torch" not in [m.split(".")[0] for m, v in sys.modules.items() if v is not None]
policy.reset("reach the red target")
obs = {{"image": np.zeros((64, 64, 3), np.uint8), "proprio": np.zeros({spec["proprio_dim"]}, np.float32)}}
a = policy.act(obs)
assert a.shape == ({spec["action_dim"]},) and np.all(np.abs(a) <= 1), a
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_missing_export_is_one_clear_error(tiny_checkpoint):
    with pytest.raises(ValueError, match="no ONNX export"):
        load_policy(tiny_checkpoint / "checkpoints", backend="onnxruntime")


@pytest.mark.slow
@uses_cli_export
def test_eval_and_deploy_run_the_onnxruntime_backend(tiny_checkpoint, cli_export, tmp_path):
    """vla-eval gives the same episodes on both backends, in one process and in worker processes (every task's
    actions are compared in test_cli_export_and_full_rollout_parity); vla-deploy runs the exported graphs on
    the clock."""
    export = cli_export[1]
    details = {}
    for backend, checkpoint, workers in (("torch", tiny_checkpoint, 1), ("onnxruntime", export, 1),
                                         ("onnxruntime", export, 2), ("onnxruntime-int8", export, 1)):  # fmt: skip
        out = tmp_path / f"eval_{backend}_{workers}.json"
        r = run_main("vla.cli.eval",
                     "--checkpoint", checkpoint, "--episodes-per-task", 2, "--tasks", "reach",
                     "--workers", workers, "--json", out, "--backend", backend)  # fmt: skip
        assert r.returncode == 0, r.stderr
        result = json.loads(out.read_text())
        assert result["backend"] == backend
        details[backend, workers] = sorted(result["episodes_detail"]["tabletop/Reach-v0"], key=json.dumps)
        if backend != "torch":
            assert result["policy"]["device"] == "onnxruntime-cpu"
    assert details["onnxruntime", 1] == details["torch", 1]
    assert details["onnxruntime", 2] == details["onnxruntime", 1]
    assert len(details["onnxruntime-int8", 1]) == 2
    report = tmp_path / "deploy.json"
    r = run_main("vla.cli.deploy", "--checkpoint", export, "--task", "reach", "--seconds", 1, "--json", report,
                 "--backend", "onnxruntime", "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr
    summary = json.loads(report.read_text())
    assert summary["backend"] == "onnxruntime" and summary["device"] == "onnxruntime-cpu"
