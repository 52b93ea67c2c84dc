"""`vla-bench train | data | collect` smoke runs at tiny size: the JSON's figures agree with each other and
with what was measured (latency has its own file). Each run takes seconds."""

from __future__ import annotations

import json

import pytest
import torch

from vla.bench import SUBCOMMANDS
from vla.cli.bench import main
from vla.data.hdf5_format import demo_meta, demo_names, open_dataset


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def bench(capsys, tmp_path, *argv: str) -> dict:
    out = tmp_path / f"{argv[0]}.json"
    assert main([*argv, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    markdown = out.with_suffix(".md").read_text()
    assert capsys.readouterr().out.strip() == markdown.strip()  # printed what it wrote beside the JSON
    return result, markdown


def test_every_subcommand_is_offered(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "{" + ",".join(SUBCOMMANDS) + "}" in capsys.readouterr().out


def test_train_tiny(tmp_path, capsys):

    from vla.bench.latency import TABLETOP
    from vla.config import from_dict, load_yaml
    from vla.model import TokenLayout
    from vla.model.card import model_card
    from vla.training.config import TrainConfig

    r, md = bench(capsys, tmp_path, "train", "--config", "configs/tiny.yaml", "--steps", "2", "--warmup", "1",
                  "--batch-size", "2", "--threads", "1", "--peak-seconds", "0.05")  # fmt: skip
    cfg = from_dict(TrainConfig, load_yaml("configs/tiny.yaml")).model
    spec = TABLETOP  # configs/tiny.yaml is the shipped architecture: it trains with the auxiliary targets
    n_tokens = TokenLayout(cfg, spec).n_tokens
    assert r["batch_size"] == 2 and r["threads"] == 1 and r["tokens_per_sample"] == n_tokens
    assert r["matmul_peak_flops_per_s"] > 1e8  # any CPU multiplies faster than 0.1 GFLOP/s
    ours, plain = r["ours"], r["plain_transformer"]
    assert ours["parameters"] == model_card(cfg, spec)["parameters"]["total"]
    assert ours["flops_per_sample"] == model_card(cfg, spec)["flops"]["per_training_sample_train"]
    for m in (ours, plain):
        assert m["samples_per_s"] == pytest.approx(2 / m["seconds_per_step"])
        assert m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * n_tokens)
        assert m["flops_per_s"] == pytest.approx(m["samples_per_s"] * m["flops_per_sample"])
        assert m["mfu"] == pytest.approx(m["flops_per_s"] / r["matmul_peak_flops_per_s"]) and 0 < m["mfu"] < 1
    assert r["mfu_ratio_ours_over_plain"] == pytest.approx(ours["mfu"] / plain["mfu"])
    assert "| vla trainer step |" in md and f"Ours / plain MFU: {r['mfu_ratio_ours_over_plain']:.2f}x" in md


def test_data_tiny(tiny_dataset, tmp_path, capsys):
    r, md = bench(capsys, tmp_path, "data", "--data", str(tiny_dataset), "--config", "configs/tiny.yaml",
                  "--batches", "2", "--workers", "1", "--trainer-steps", "1")  # fmt: skip
    with open_dataset(tiny_dataset) as f:
        train_steps = sum(demo_meta(f, n)["num_samples"] for n in demo_names(f, "train"))
    assert r["windows"] == train_steps  # one window ends at every step of the train split
    assert r["data"] == str(tiny_dataset) and r["batch_size"] == 8  # configs/tiny.yaml's
    assert set(r["loaders"]) == {"preloaded", "lazy", "lazy, 1 workers"}
    for row in r["loaders"].values():
        assert row["windows_per_s"] > 0 and row["build_s"] > 0
        assert row["headroom_over_trainer"] == pytest.approx(row["windows_per_s"] / r["trainer_windows_per_s"])
    assert "| preloaded |" in md and "*trainer consumes*" in md


@pytest.mark.slow
def test_collect_tiny(tmp_path, capsys):
    r, md = bench(capsys, tmp_path, "collect", "--tasks", "reach", "--episodes-per-task", "1", "--image-size", "32",
                  "--raw-steps", "10")  # fmt: skip
    assert r["config"]["tasks"] == ["tabletop/Reach-v0"] and r["config"]["image_size"] == 32
    one, two = r["collect_1_worker"], r["collect_2_workers"]
    steps = one["steps"]
    assert one["episodes"] == two["episodes"] == r["expert_only"]["episodes"] == r["expert_and_write"]["episodes"] == 1
    # the same seed, replayed in process: the same expert episode, step for step
    assert two["steps"] == r["expert_only"]["steps"] == r["expert_and_write"]["steps"] == steps > 0
    # the figures themselves are vla-bench's to report; here only that each was measured
    assert r["speedup_2_vs_1"] > 0 and r["steady_speedup_2_vs_1"] > 0 and r["write_ms_per_episode"] > 0
    assert r["raw_physics_render"]["steps"] == 10 and r["raw_physics_render"]["substeps_per_step"] == 25
    assert "vla-collect, 2 workers" in md


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--config", "configs/tiny.yaml", "--steps", "0"], "--steps >= 1"),
        (["data", "--config", "configs/tiny.yaml", "--batches", "0"], "--batches must be at least 1"),
        (["collect", "--episodes-per-task", "0"], "--episodes-per-task must be at least 1"),
        (["latency", "--steps", "0"], "--steps must be at least 1"),
        (["latency", "--steps", "1", "--device", "tpu"], "--device tpu"),
        (["train", "--config", "configs/nope.yaml"], "config file not found"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vla-bench {argv[0]}: error: ") and err.count("\n") == 1 and message in err, err
