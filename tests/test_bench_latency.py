"""`vla-bench latency` smoke runs with a tiny model: JSON fields, markdown beside it, exactness."""

import json
import runpy
import sys

import pytest
import torch

from vla.cli.bench import main

TINY = [
    "d_model=32",
    "n_layer=2",
    "n_head=2",
    "d_ff=64",
    "conv_channels=4",  # the shipped architecture (conv stem, FiLM, keypoints) scaled down
    "keypoints=2",
    "keypoint_channels=4",
    "instruction_len=6",
    "action_bins=16",
]
ARGS = [
    "--steps",
    "4",
    "--warmup",
    "3",
    "--window",
    "3",
    "--equivalence-steps",
    "8",
    "--threads",
    "1",
    "--peak-seconds",
    "0.1",
]


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_latency_json_and_markdown(tmp_path, capsys):
    out = tmp_path / "lat.json"
    assert main(["latency", "--json", str(out), "--backend", "torch", *ARGS, *TINY]) == 0  # backends: below
    r = json.loads(out.read_text())
    for key in ("streaming_ms", "recompute_ms", "hf_gpt2_ms"):
        assert set(r[key]) >= {"p50", "p99"} and 0 < r[key]["p50"] <= r[key]["p99"]
    assert 0 <= r["max_abs_diff"] <= 1e-4
    assert r["decoding"] == "parallel" and set(r["by_decoding"]) == {"parallel"}
    assert all(m["tokens_identical"] for m in r["by_decoding"].values())
    assert r["by_decoding"]["parallel"]["hf_gpt2_one_pass_ms"]["p50"] > 0
    assert r["config"]["d_model"] == 32 and r["config"]["window"] == 3 and r["threads"] == 1
    md = out.with_suffix(".md").read_text()
    assert "| parallel |" in md
    assert "streaming" in capsys.readouterr().out


def test_latency_without_transformers(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    out = tmp_path / "lat.json"
    assert main(["latency", "--json", str(out), "--backend", "torch", *ARGS, *TINY]) == 0
    r = json.loads(out.read_text())
    assert r["hf_gpt2_ms"] is None and "transformers" in r["hf_gpt2_reason"]
    assert r["streaming_ms"]["p50"] > 0 and r["max_abs_diff"] <= 1e-4


def test_bad_input_is_one_clear_error(capsys):
    assert main(["latency", "--steps", "1", "d_modle=8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "d_model" in err[0]


def test_module_entry_point_help(monkeypatch, capsys):
    """`python -m vla.cli.bench latency --help`, its __main__ run in this process (the imports are already paid)."""
    monkeypatch.setattr(sys, "argv", ["vla-bench", "latency", "--help"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("vla.cli.bench", run_name="__main__")
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--json" in out and "--window" in out


def test_the_demo_config_builds_in_both_benchmarks():
    """configs/demo.yaml is the default model; the benchmarks build it with our tasks' data sizes (the
    aux head fed into the proprio token) and train it with the same losses the trainer sums."""
    from argparse import Namespace

    from vla.bench.latency import TABLETOP, build_config
    from vla.bench.train import measure_ours
    from vla.config import from_dict, load_yaml
    from vla.model import ActionTransformer, ModelConfig
    from vla.training.config import TrainConfig

    cfg = build_config(Namespace(config="configs/demo.yaml", window=None, overrides=[]))
    assert cfg == ModelConfig()
    assert ActionTransformer(cfg, TABLETOP).layout.feeds_aux
    train_cfg = from_dict(TrainConfig, load_yaml("configs/demo.yaml"))
    result = measure_ours(train_cfg, batch_size=2, warmup=0, steps=1)
    assert result["seconds_per_step"] > 0 and result["parameters"] > 0


def test_latency_backends_and_flop_limit_columns(tmp_path):
    """Each backend's streaming step next to its FLOP limit (model-card FLOPs / the matmul peak of this run)."""
    from argparse import Namespace

    from vla.bench.latency import TABLETOP, build_config
    from vla.model.card import model_card

    out = tmp_path / "lat.json"
    argv = ["latency", "--json", str(out), *ARGS, *TINY]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert list(r["backends_ms"]) == ["torch", "onnxruntime", "onnxruntime-int8"]
    assert r["backends_ms"]["torch"] == r["streaming_ms"]  # torch eager is the streaming step
    for stats in r["backends_ms"].values():
        assert 0 < stats["p50"] <= stats["p99"]
    m = r["by_decoding"]["parallel"]
    assert m["backend_max_abs_logit_diff"]["onnxruntime"] <= 1e-4  # the exported step computes the same logits
    assert m["backend_max_abs_logit_diff"]["onnxruntime-int8"] > 0  # quantized: close, not equal
    fl, peak = r["flop_limit"], r["matmul_peak_flops_per_s"]
    cfg = build_config(Namespace(config=None, window=3, overrides=TINY))
    assert fl["flops_per_step"] == model_card(cfg, TABLETOP)["flops"]["per_control_step_streaming"]
    assert peak > 1e8 and fl["limit_ms"] == pytest.approx(fl["flops_per_step"] / peak * 1e3)
    for backend, ratio in fl["measured_over_limit"].items():
        assert ratio == pytest.approx(r["backends_ms"][backend]["p50"] / fl["limit_ms"]) and ratio > 1
    assert fl["fastest_backend"] == min(r["backends_ms"], key=lambda b: r["backends_ms"][b]["p50"])
    md = out.with_suffix(".md").read_text()
    assert "FLOP limit ms" in md and "| parallel | onnxruntime-int8 |" in md and "measured / limit" in md


def test_latency_backend_flag(tmp_path, capsys):
    """--backend picks the backends; an unknown one is a one-line error."""
    out = tmp_path / "lat.json"
    argv = ["latency", "--json", str(out), "--backend", "torch,onnxruntime", *ARGS, *TINY]
    assert main(argv) == 0
    m = json.loads(out.read_text())["by_decoding"]["parallel"]
    assert m["backends_ms"]["torch"]["p50"] > 0 and set(m["backends_ms"]) == {"torch", "onnxruntime"}
    assert main(["latency", "--backend", "tensorrt", *ARGS, *TINY]) == 2
    assert "--backend 'tensorrt'" in capsys.readouterr().err
