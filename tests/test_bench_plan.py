"""`vla-bench plan` on a 2-candidate grid of tiny models: the table, the JSON, and fits == p99 * margin <= budget."""

import json
from argparse import Namespace
from dataclasses import replace

import pytest
import torch

from vla.bench.latency import TABLETOP
from vla.bench.plan import candidates
from vla.cli.bench import main
from vla.model.card import model_card

GRID = ["--window", "2", "--chunk", "1", "--width", "32,64", "--depth", "1", "--steps", "3", "--image-size", "32",
        "--peak-seconds", "0.05"]  # fmt: skip


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def plan(tmp_path, *argv):
    out = tmp_path / "plan.json"
    assert main(["plan", "--json", str(out), "--threads", "1", *GRID, *argv]) == 0
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


def test_plan_two_candidates(tmp_path):
    r, md = plan(tmp_path, "--hz", "20", "--budget-ms", "10", "--backend", "torch,onnxruntime")
    assert r["period_ms"] == 50 and r["budget_ms"] == 10 and r["margin"] == 1.5 and r["threads"] == 1
    rows = r["candidates"]
    assert [row["config"]["d_model"] for row in rows] == [32, 64] and rows[1]["config"]["n_head"] == 2
    for row in rows:
        assert set(row["latency_ms"]) == {"torch", "onnxruntime"}
        for backend, stats in row["latency_ms"].items():
            assert 0 < stats["p50"] <= stats["p99"]
            assert row["fits"][backend] == (stats["p99"] * 1.5 <= 10)
        assert row["fits_any"] == any(row["fits"].values())
    cfgs = candidates(Namespace(window="2", chunk="1", width="32,64", depth="1"))
    spec = replace(TABLETOP, image_size=32)
    assert [row["flops_per_step"] for row in rows] == [
        model_card(c, spec)["flops"]["per_control_step_streaming"] for c in cfgs
    ]
    assert rows[1]["flops_per_step"] > rows[0]["flops_per_step"]
    assert "| window | chunk | d_model |" in md and md.count("\n| 2 | 1 |") == 2


def test_plan_budget_decides_what_fits(tmp_path):
    """The same grid: everything fits a whole second; nothing fits a microsecond."""
    r, _ = plan(tmp_path, "--hz", "1", "--budget-ms", "1000", "--backend", "torch")
    assert all(row["fits"]["torch"] for row in r["candidates"])
    r, md = plan(tmp_path, "--hz", "20", "--budget-ms", "0.001", "--backend", "torch", "--margin", "2")
    assert not any(row["fits_any"] for row in r["candidates"]) and md.count("| none |") == 2


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--hz", "20", "--budget-ms", "60"], "--budget-ms 60 must be in (0, 50]"),
        (["--hz", "0"], "--hz must be > 0"),
        (["--hz", "20", "--width", "48"], "--width 48"),
        (["--hz", "20", "--window", "two"], "--window 'two'"),
        (["--hz", "20", "--backend", "tpu"], "--backend 'tpu'"),
        (["--hz", "20", "--image-size", "40"], "--image-size 40"),
        (["--hz", "20", "--device", "tpu"], "--device tpu"),
        (["--hz", "20", "--peak-seconds", "0"], "--peak-seconds must be > 0"),
    ],
)
def test_plan_bad_input_is_one_line(argv, says, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


def test_plan_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "--budget-ms" in out and "--margin" in out and "--backend" in out
