"""`vla-bench serve` at its smallest: every part runs against a real vla-serve on loopback and reports."""

import json

import pytest
import torch

from tests.conftest import run_main
from vla.cli.bench import main


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_bench_serve_reports_every_part(tiny_checkpoint, tmp_path):
    out = tmp_path / "serve.json"
    argv = ["serve", "--json", str(out), "--checkpoint", str(tiny_checkpoint), "--steps", "8", "--seconds", "0.3",
            "--clients", "1,2"]  # fmt: skip
    assert main(argv) == 0
    r, md = json.loads(out.read_text()), out.with_suffix(".md").read_text()
    assert 0 < r["in_process_ms"]["p50"] <= r["in_process_ms"]["p99"] and r["in_process_ms"]["n"] == 8
    for client in ("vla", "openpi"):
        assert r["round_trip_ms"][client]["n"] == 8 and r["overhead_p50_ms"][client] is not None
    assert [row["clients"] for row in r["robots"]] == [1, 2] and r["capacity"]["clients"] == 2
    for row in r["robots"]:
        assert row["ticks_scheduled"] == row["clients"] * 6 and row["replies"] >= 1
        assert 0 <= row["deadline_misses"] <= row["ticks_scheduled"] + row["skipped_ticks"]
    assert r["capacity"]["replies_per_s"] > 0 and not r["capacity"]["paced"]
    assert [b["batch"] for b in r["batching"]] == [1, 2] and r["batching"][0]["max_abs_logit_diff"] == 0
    assert "through vla-serve, openpi-client" in md and "| 2 |" in md and "Capacity" in md


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--clients", "0"], "--clients '0'"), (["--steps", "0"], "--steps must"), (["--seconds", "0"], "--seconds")],
)
def test_bench_serve_bad_input_is_one_line(tiny_checkpoint, args, says):
    r = run_main("vla.cli.bench", "serve", "--checkpoint", tiny_checkpoint, *args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
