"""vla-eval: Wilson interval maths, the summary's shape, and the CLI's JSON (DESIGN.md contract)."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest

import envs
from vla.cli.eval import main
from vla.evaluation.evaluate import EVAL_SEED, format_table, summarize, wilson_interval


def wilson_by_roots(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Independent route: the p with (k/n - p)^2 = z^2 p (1 - p) / n, the roots of a quadratic in p."""
    phat = k / n
    a, b, c = 1 + z * z / n, -(2 * phat + z * z / n), phat * phat
    lo, hi = sorted(np.roots([a, b, c]).real)
    return max(0.0, lo), min(1.0, hi)


@pytest.mark.parametrize(
    "k, n, expected",
    [
        (0, 10, (0.0, 0.277540)),  # upper = z^2 / (n + z^2)
        (10, 10, (0.722460, 1.0)),  # lower = n / (n + z^2)
        (5, 10, (0.236590, 0.763410)),
        (1, 1, (0.206543, 1.0)),  # lower = 1 / (1 + z^2)
        (0, 50, (0.0, 0.071350)),  # z^2 / (n + z^2)
    ],
)
def test_wilson_known_values(k, n, expected):
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(expected[0], abs=2e-5) and hi == pytest.approx(expected[1], abs=2e-5)


@pytest.mark.parametrize("n", [1, 3, 10, 37, 200])
def test_wilson_matches_the_score_test_inversion_and_contains_the_estimate(n):
    for k in range(n + 1):
        lo, hi = wilson_interval(k, n)
        assert (lo, hi) == pytest.approx(wilson_by_roots(k, n), abs=1e-9)
        assert 0.0 <= lo <= k / n <= hi <= 1.0
    assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
    # symmetric: k successes mirror n - k failures
    lo, hi = wilson_interval(n // 3, n)
    assert (1 - hi, 1 - lo) == pytest.approx(wilson_interval(n - n // 3, n))


def test_wilson_narrows_with_more_episodes_and_handles_no_data():
    widths = [np.subtract(*wilson_interval(n // 2, n)[::-1]) for n in (10, 40, 160)]
    assert widths[0] > widths[1] > widths[2]
    assert widths[1] == pytest.approx(widths[0] / 2, rel=0.15)  # ~ 1 / sqrt(n)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(5, 10, z=2.576)  # 99%: wider than 95%
    assert hi - lo > np.subtract(*wilson_interval(5, 10)[::-1])


def test_summarize_shape_and_numbers():
    outcomes = {
        "tabletop/Reach-v0": [{"success": True, "length": 10}, {"success": False, "length": 50}],
        "tabletop/Push-v0": [{"success": True, "length": 30}] * 3,
    }
    result = summarize(outcomes)
    assert set(result) == {"tasks", "overall"}
    reach = result["tasks"]["tabletop/Reach-v0"]
    assert set(reach) == {"success_rate", "episodes", "ci95", "mean_length"}
    assert reach["success_rate"] == 0.5 and reach["episodes"] == 2 and reach["mean_length"] == 30.0
    assert reach["ci95"] == pytest.approx(list(wilson_interval(1, 2)))
    assert result["tasks"]["tabletop/Push-v0"]["ci95"][1] == 1.0
    overall = result["overall"]
    assert overall["success_rate"] == pytest.approx(4 / 5) and overall["episodes"] == 5
    assert overall["ci95"] == pytest.approx(list(wilson_interval(4, 5)))
    json.dumps(result)  # plain JSON types
    table = format_table(result, "title")
    assert "tabletop/Reach-v0" in table and "50%" in table and "**80%**" in table
    assert summarize({"tabletop/Reach-v0": []})["tasks"]["tabletop/Reach-v0"]["success_rate"] == 0.0


def check_contract(result: dict, tasks: list[str], episodes: int, seed: int):
    """The summary agrees with the per-episode outcomes it was made from (DESIGN.md's JSON), which are
    listed by seed (the parallel workers finish in any order)."""
    assert set(result["tasks"]) == set(tasks) == set(result["episodes_detail"])
    for task, r in result["tasks"].items():
        eps = result["episodes_detail"][task]
        assert [e["seed"] for e in eps] == list(range(seed, seed + episodes))
        wins = sum(e["success"] for e in eps)
        assert r["episodes"] == len(eps) == episodes and r["success_rate"] == pytest.approx(wins / episodes)
        assert r["ci95"] == pytest.approx(list(wilson_interval(wins, episodes)))
        max_steps = gym.spec(task).max_episode_steps
        assert all(1 <= e["length"] <= max_steps for e in eps)
        assert r["mean_length"] == pytest.approx(np.mean([e["length"] for e in eps]))
    o = result["overall"]
    wins = sum(e["success"] for eps in result["episodes_detail"].values() for e in eps)
    assert o["episodes"] == episodes * len(tasks) and o["success_rate"] == pytest.approx(wins / o["episodes"])
    assert o["ci95"] == pytest.approx(list(wilson_interval(wins, o["episodes"])))


@pytest.mark.slow
def test_vla_eval_cli_writes_the_design_json_and_videos(tiny_checkpoint, tmp_path, capsys):
    """In process (test_smoke runs vla-eval as its own process)."""
    out, videos = tmp_path / "eval.json", tmp_path / "videos"
    assert main(["--checkpoint", str(tiny_checkpoint), "--episodes-per-task", "1", "--json", str(out),
                 "--seed", "7", "--video", str(videos)]) == 0  # fmt: skip
    stdout = capsys.readouterr().out
    result = json.loads(out.read_text())
    trained = json.loads((tiny_checkpoint / "config.json").read_text())["tasks"]
    check_contract(result, trained, 1, seed=7)
    assert sorted(trained) == sorted(envs.TASKS)
    assert len(list(videos.glob("*.mp4"))) == len(trained)
    assert "| task | success |" in stdout and "**overall**" in stdout


@pytest.mark.slow
def test_vla_eval_parallel_workers_run_the_policy_the_flags_asked_for(tiny_checkpoint, tmp_path):
    out = tmp_path / "eval.json"
    assert main(["--checkpoint", str(tiny_checkpoint), "--episodes-per-task", "2", "--json", str(out),
                 "--tasks", "reach", "--workers", "2", "--device", "cpu", "--no-kv-cache",
                 "readout=argmax", "temporal_ensemble=false",
                 "--delay-ticks", "1", "--strategy", "blocking"]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    check_contract(result, ["tabletop/Reach-v0"], 2, seed=EVAL_SEED)  # one episode in each worker
    ran = result["policy"]  # what every worker built (they must agree)
    assert (ran["device"], ran["kv_cache"], ran["readout"], ran["temporal_ensemble"]) == ("cpu", False, "argmax", False)
    assert (result["delay"]["delay_ticks"], result["delay"]["strategy"]) == (1, "blocking")
    assert set(result["smoothness"]) == {"tabletop/Reach-v0", "overall"}  # the workers' episodes carry it
    assert result["smoothness"]["overall"]["hold_fraction"] > 0  # blocking at d = 1 held ticks: delay simulated


def test_vla_eval_threads_sets_the_in_process_evaluation_and_gives_the_caller_its_own_back(tiny_checkpoint, tmp_path):
    import torch

    out, before = tmp_path / "eval.json", torch.get_num_threads()
    torch.set_num_threads(2)  # the caller's; the evaluation asks for 1 (2 threads of OpenMP spin on a busy box)
    try:
        assert main(["--checkpoint", str(tiny_checkpoint), "--episodes-per-task", "1", "--tasks", "reach",
                     "--threads", "1", "--json", str(out)]) == 0  # fmt: skip
        assert json.loads(out.read_text())["torch_threads"] == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_vla_eval_refuses_an_unknown_policy_setting(tiny_checkpoint, capsys):
    assert main(["--checkpoint", str(tiny_checkpoint), "--episodes-per-task", "1", "--tasks", "reach",
                 "readot=argmax"]) == 2  # fmt: skip
    assert "unknown key 'policy.readot'; did you mean 'readout'?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--episodes-per-task", "0"], "at least 1"),
        (["--tasks", "fly"], "unknown task"),
        (["--workers", "0"], "--workers must be at least 1"),
        (["--device", "gpu0"], "--device gpu0"),
        (["--threads", "0"], "--threads must be at least 1"),
        (["--threads", "2", "--workers", "2"], "with --workers each process uses 1"),
        (["--attention", "x", "--attention-steps", "0,ten"], "--attention-steps"),
    ],
)
def test_vla_eval_bad_input_is_one_line_and_exit_2(tiny_checkpoint, capsys, args, message):
    assert main(["--checkpoint", str(tiny_checkpoint), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_vla_eval_missing_checkpoint(tmp_path, capsys):
    assert main(["--checkpoint", str(tmp_path / "none"), "--episodes-per-task", "1"]) == 2
    assert "not a checkpoint directory" in capsys.readouterr().err
    assert math.isfinite(wilson_interval(3, 7)[0])


@pytest.mark.slow
def test_vla_eval_over_a_lost_server_is_a_safe_stop(tiny_checkpoint, tmp_path):
    """vla-serve killed mid-evaluation: exit 3 (a safe stop, vla/cli/common.py's table), one line that says why,
    and no JSON of a half-run evaluation."""
    import threading

    from tests.conftest import run_main
    from tests.serving import ServerProcess, wait_until

    out = tmp_path / "eval.json"
    with ServerProcess(tiny_checkpoint, "--quiet") as server:
        under_way = lambda: server.health()["steps"] >= 10  # noqa: E731
        killer = threading.Thread(target=lambda: wait_until(under_way, 60) and server.kill())
        killer.start()
        r = run_main("vla.cli.eval", "--server", server.url, "--tasks", "push", "--episodes-per-task", 50,
                     "--json", out)  # fmt: skip
        killer.join(60)
    assert r.returncode == 3, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("vla-eval: safe stop: ") and server.url in last, r.stderr
    assert not out.exists()
