"""Inference delay in simulated time: the strategies' bookkeeping, equality with today's evaluation at d = 0,
the smoothness metrics, delay-aware training and decoding, the vla-eval flags and the vla-bench delay sweep.

The bookkeeping tests drive `DelayedPolicy` with `StampPolicy`, whose chunk row r for the observation of
tick j is [j, r, 0, g]: every executed action then says which observation and which row it came from.
Everything about what a trained policy does runs a real tiny checkpoint (conftest)."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs  # noqa: F401 - registers the tasks
from vla.cli.bench import main as bench_main
from vla.cli.eval import main as eval_main
from vla.cli.train import main as train_main
from vla.control.delay import DelayedPolicy
from vla.control.smoothness import smoothness
from vla.evaluation.evaluate import evaluate
from vla.policy.load import load_policy
from vla.policy.strategies import STRATEGIES, make_strategy
from vla.training.delay_prefix import commit_random_prefix

GRIP = 0.5


class StampPolicy:
    """Chunk row r decided on tick j's observation is [j, r, 0, GRIP]; records each call's tick and committed."""

    action_dim = 4

    def __init__(self, chunk=6, committed_slots=False, steps_are_ticks=True):
        self.chunk, self.t, self.steps_are_ticks = chunk, 0, steps_are_ticks
        self.calls: list[tuple[int, np.ndarray | None]] = []
        self.steps: list[int] = []  # the step index stamped on each call
        self.cfg = type("Cfg", (), {"committed_actions": committed_slots})()
        self.reads_committed = committed_slots

    def reset(self, instruction):
        self.t = 0

    def act_chunk(self, obs, committed=None):
        tick = obs["tick"]
        if self.steps_are_ticks:
            assert tick == self.t  # the wrapper stamps the tick of the observation it hands over
        self.steps.append(self.t)
        self.calls.append((tick, None if committed is None else np.array(committed)))
        rows = np.array([[tick, r, 0.0, GRIP] for r in range(self.chunk)], np.float32)
        if committed is not None:
            rows[: len(committed)] = committed
        return rows

    predict_chunk = act_chunk  # no plan and no ensembling here: the whole chunk either way


def drive(policy, ticks):
    """Call `policy.act` once per tick with an observation that carries the tick; the actions (ticks, A)."""
    policy.reset("go")
    return np.stack([policy.act({"tick": k}) for k in range(ticks)])


def is_hold(a):
    return np.allclose(a[:3], 0.0)


# ------------------------------------------------------------------------------------- strategies' bookkeeping


def test_blocking_acts_on_the_observation_from_d_ticks_ago_and_holds_meanwhile():
    D = 3
    sent = drive(DelayedPolicy(StampPolicy(), "blocking", delay=D), 13)
    for k, a in enumerate(sent):
        if k and k % D == 0:  # inferences start at 0, 3, 6 ... on that tick's observation, each arrives D later
            np.testing.assert_array_equal(a, [k - D, 0, 0, GRIP])  # row 0 of the D-tick-old observation
        else:
            assert is_hold(a), (k, a)  # zero motion while it thinks
    assert all(a[3] == GRIP for a in sent[D:])  # the gripper stays where the last decision put it


def test_chunk_strategy_skips_the_stale_rows_and_replans_d_ticks_before_the_chunk_runs_out():
    D, S = 2, 3
    stamp = StampPolicy(chunk=6)
    sent = drive(DelayedPolicy(stamp, "chunk", delay=D, execute=S), 14)
    assert [t for t, _ in stamp.calls] == [0, 3, 6, 9, 12]  # every S ticks, D before the last chunk's S run out
    assert all(is_hold(a) for a in sent[:D])  # nothing has arrived yet
    for k in range(D, 14):
        j = k - D - (k - D) % S  # the newest chunk that has arrived: obs tick j, in use from tick j + D
        np.testing.assert_array_equal(sent[k], [j, k - j, 0, GRIP])  # row k - j: indexed by absolute tick
        assert D <= k - j < D + S  # rows 0..D-1 were stale on arrival and are never executed


def test_chunk_execute_is_capped_by_what_can_arrive_in_time():
    s = make_strategy("chunk", chunk=4, execute=4)
    assert [s.execute_for(d) for d in range(6)] == [4, 3, 2, 1, 1, 1]
    assert make_strategy("chunk", chunk=4).execute_for(1) == 3  # 0 = as many as the chunk has left
    sent = drive(DelayedPolicy(StampPolicy(chunk=4), "chunk", delay=4), 12)  # d >= chunk: nothing is ever fresh
    assert all(is_hold(a) for a in sent)  # a hold, never a row of a chunk that has run out


def test_synchronous_holds_still_while_it_thinks_then_executes_rows_from_row_0():
    D, S = 2, 3
    stamp = StampPolicy(chunk=6, steps_are_ticks=False)
    sent = drive(DelayedPolicy(stamp, "synchronous", delay=D, execute=S), 15)
    assert [t for t, _ in stamp.calls] == [0, 5, 10]  # the next inference starts once S rows ran: every S + D ticks
    assert stamp.steps == [0, 3, 6]  # its clock counts the moves, so the policy's steps are those of d = 0
    for k, a in enumerate(sent):
        j = k - (k % (S + D))  # the inference under way or done: started on tick j, arrives at j + D
        if k - j < D:
            assert is_hold(a), (k, a)  # thinking: the hand stays, so obs j still shows the world when it lands
        else:
            np.testing.assert_array_equal(a, [j, k - j - D, 0, GRIP])  # rows 0..S-1, none skipped as stale
    no_delay = drive(DelayedPolicy(StampPolicy(chunk=6, steps_are_ticks=False), "synchronous", delay=0, execute=S), 9)
    np.testing.assert_array_equal(no_delay[:, :2], [[k - k % S, k % S] for k in range(9)])  # at d = 0: no holds
    assert make_strategy("synchronous", chunk=4).execute_for(3) == 4  # 0 = the whole chunk, whatever the delay


def test_ensemble_averages_every_chunks_prediction_for_the_same_absolute_tick():
    D, chunk = 1, 3
    sent = drive(DelayedPolicy(StampPolicy(chunk=chunk), "ensemble", delay=D), 10)
    assert is_hold(sent[0])
    np.testing.assert_array_equal(sent[1], [0, 1, 0, GRIP])  # only tick 0's chunk has arrived
    for k in range(2, 10):  # the chunks of ticks k-1 and k-2 predicted tick k (their rows 1 and 2)
        np.testing.assert_allclose(sent[k], [k - 1.5, 1.5, 0, GRIP])


def test_delay_aware_commits_exactly_the_actions_that_execute_while_it_thinks():
    D, S = 2, 2
    stamp = StampPolicy(chunk=6, committed_slots=True)
    sent = drive(DelayedPolicy(stamp, "delay_aware", delay=D, execute=S), 16)
    assert stamp.calls[0][1] is None  # nothing committed before the first chunk
    for tick, committed in stamp.calls[1:]:
        assert committed.shape == (D, 4)
        np.testing.assert_array_equal(committed, sent[tick : tick + D])  # what ticks tick..tick+D-1 executed
    plain = drive(DelayedPolicy(StampPolicy(chunk=6), "chunk", delay=D, execute=S), 16)
    np.testing.assert_array_equal(sent, plain)  # same schedule as chunk (a stand-in copies committed rows)


def test_strategy_names_and_bad_settings():
    assert list(STRATEGIES) == ["blocking", "chunk", "synchronous", "ensemble", "delay_aware"]
    with pytest.raises(ValueError, match="unknown strategy 'fly'; choose one of blocking"):
        make_strategy("fly", chunk=4)
    with pytest.raises(ValueError, match="--execute 5 must be in 0..4"):
        make_strategy("chunk", chunk=4, execute=5)
    with pytest.raises(ValueError, match="--delay-ticks must be >= 0"):
        DelayedPolicy(StampPolicy(), "chunk", delay=-1)
    with pytest.raises(ValueError, match="committed action slots"):
        DelayedPolicy(StampPolicy(), "delay_aware", delay=1)


# ------------------------------------------------------------------------------------- smoothness


def test_smoothness_on_a_known_action_sequence():
    t = np.arange(6, dtype=np.float64)
    actions = np.stack([0.01 * t**3, np.r_[-1, -1, -1, 1, 1, 1]], axis=1)  # motion dim 0, gripper dim 1
    src = [0, 0, 2, 2, -1, 4]  # a new chunk at tick 2; a hold at tick 4; a chunk again at tick 5
    m = smoothness(actions, src)
    assert m["jerk"] == pytest.approx(0.06)  # third difference of 0.01 t^3 is 0.06; the gripper's switch is ignored
    steps = np.diff(0.01 * t**3)  # [0.01, 0.07, 0.19, 0.37, 0.61]
    assert m["boundaries"] == 3 and m["boundary_jump"] == pytest.approx(np.mean(steps[[1, 3, 4]]))
    assert m["step_change"] == pytest.approx(np.mean(steps[[0, 2]]))
    assert smoothness(actions[:3], src[:3])["jerk"] == 0.0  # too short for a third difference


# ------------------------------------------------------------------------------------- a real tiny policy


def rollout(policy, task="tabletop/Reach-v0", seed=5, steps=25):
    env = gym.make(task, image_size=policy.spec.image_size)
    obs, _ = env.reset(seed=seed)
    policy.reset(obs["instruction"])
    out = []
    for _ in range(steps):
        out.append(np.array(policy.act(obs)))
        obs, *_ = env.step(out[-1])
    env.close()
    return np.stack(out)


def test_at_zero_delay_each_strategy_executes_what_todays_evaluation_does(tiny_checkpoint):
    configured = load_policy(tiny_checkpoint, device="cpu")
    assert configured.config.temporal_ensemble  # the tiny checkpoint's saved default, as the demo's
    raw = load_policy(tiny_checkpoint, device="cpu", temporal_ensemble=False)
    today = rollout(configured)
    np.testing.assert_allclose(rollout(DelayedPolicy(configured, "blocking", delay=0)), today, atol=1e-6)
    for policy in (raw, configured):  # the scheduling strategies take the whole chunks (predict_chunk) of either
        np.testing.assert_allclose(rollout(DelayedPolicy(policy, "ensemble", delay=0)), today, atol=1e-6)
    no_ensemble = rollout(raw)
    for policy in (raw, configured):
        np.testing.assert_allclose(rollout(DelayedPolicy(policy, "chunk", delay=0, execute=1)), no_ensemble, atol=1e-6)
    np.testing.assert_allclose(rollout(DelayedPolicy(configured, "synchronous", delay=0, execute=1)), today, atol=1e-6)
    assert not np.allclose(today, no_ensemble)  # the two references differ, so the equalities say something


def test_a_policy_that_replans_every_n_steps_never_hands_a_skipping_caller_an_old_row(tiny_checkpoint):
    """The controller stamps the tick as the policy's step, so a late tick skips steps. The plan's rows are
    counted from the step it was made at: t % n_action_steps handed step 3 the row meant for step 1."""
    policy = load_policy(tiny_checkpoint, device="cpu", temporal_ensemble=False, n_action_steps=2)
    env = gym.make("tabletop/Reach-v0", image_size=policy.spec.image_size)
    obs, _ = env.reset(seed=1)
    policy.reset(obs["instruction"])
    assert [len(policy.act_chunk(obs)) for _ in range(4)] == [2, 1, 2, 1]  # every step: re-plan every 2
    policy.reset(obs["instruction"])
    plan = policy.act_chunk(obs)
    policy.t = 1
    np.testing.assert_array_equal(policy.act_chunk(obs), plan[1:])  # step 1: the plan's row for step 1
    policy.t = 3  # step 2 skipped
    assert len(policy.act_chunk(obs)) == 2  # a fresh plan for step 3, not the old plan's row for step 1
    env.close()


def test_the_simulation_is_deterministic_given_the_seeds(tiny_checkpoint):
    policy = load_policy(tiny_checkpoint, device="cpu", temporal_ensemble=False)
    delay = {"strategy": "chunk", "delay": 1, "execute": 0}
    runs = [evaluate(policy, ["tabletop/Reach-v0"], 2, seed=3, progress=False, delay=delay) for _ in range(2)]
    assert runs[0]["episodes_detail"] == runs[1]["episodes_detail"] and runs[0]["smoothness"] == runs[1]["smoothness"]
    sm = runs[0]["smoothness"]["tabletop/Reach-v0"]
    assert set(sm) == {"jerk", "boundary_jump", "step_change", "hold_fraction"} and 0 < sm["hold_fraction"] < 0.1
    configured = load_policy(tiny_checkpoint, device="cpu")  # temporal_ensemble=True, as saved
    assert configured.config.temporal_ensemble
    again = evaluate(configured, ["tabletop/Reach-v0"], 2, seed=3, progress=False, delay=delay)
    assert again["episodes_detail"] == runs[0]["episodes_detail"]  # the strategy takes the whole chunks either way


# ------------------------------------------------------------------------------------- delay-aware training


def test_commit_random_prefix_gives_the_first_d_rows_and_takes_them_out_of_the_loss():
    B, T, chunk, A = 64, 2, 4, 3
    actions = torch.randint(0, 32, (B, T, chunk * A))
    pad = torch.zeros(B, T, chunk, dtype=torch.bool)
    pad[0, :, 3] = True  # a target past the demo's end
    batch = commit_random_prefix({"actions": actions, "action_is_pad": pad.clone()}, 2, chunk, torch.Generator())
    committed = batch["committed"].view(B, T, chunk, A)
    given = (committed >= 0).all(-1)  # (B, T, chunk)
    assert torch.equal(given, (committed >= 0).any(-1))  # a row is given whole or not at all
    d = given.sum(-1)
    assert set(d.flatten().tolist()) == {0, 1, 2}  # uniform over 0..max_delay, per (window, step)
    assert torch.equal(given, torch.arange(chunk) < d[..., None])  # a prefix of rows
    assert torch.equal(committed[given], actions.view(B, T, chunk, A)[given])  # the targets themselves
    assert torch.equal(batch["action_is_pad"], given | pad)  # given rows carry no loss; padding stays padding


@pytest.fixture(scope="module")
def delay_aware_checkpoint(tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "delay_aware"
    code = train_main(["--config", "configs/tiny.yaml", "--data", str(tiny_dataset), "--out", str(out),
                       "train.steps=30", "train.log_every=10", "model.committed_actions=true",
                       "train.delay_aware_max=1"])  # fmt: skip
    assert code == 0
    return out


def test_a_delay_aware_model_reads_the_committed_slots(delay_aware_checkpoint):
    env = gym.make("tabletop/Reach-v0", image_size=64)
    obs, _ = env.reset(seed=0)
    outs = {}
    for kv in (True, False):
        policy = load_policy(delay_aware_checkpoint, device="cpu", kv_cache=kv, temporal_ensemble=False)
        assert policy.cfg.committed_actions and policy.chunk == 2
        results = []
        for committed in (None, np.array([[1.0, -1.0, 1.0, 1.0]]), np.array([[-1.0, 1.0, -1.0, -1.0]])):
            policy.reset(obs["instruction"])
            results.append(policy.act_chunk(obs, committed=committed))
        outs[kv] = results
    free, up, down = outs[True]
    np.testing.assert_allclose(up[0], [1.0, -1.0, 1.0, 1.0])  # the committed row is returned exactly
    assert not np.allclose(up[1], down[1]) and not np.allclose(up[1], free[1])  # the rest is conditioned on it
    for a, b in zip(outs[True], outs[False], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)  # streaming equals recompute with committed slots
    env.close()


def test_vla_eval_runs_delay_aware_on_a_delay_aware_checkpoint(
    delay_aware_checkpoint, tiny_checkpoint, tmp_path, capsys
):
    out = tmp_path / "da.json"
    assert eval_main(["--checkpoint", str(delay_aware_checkpoint), "--episodes-per-task", "1", "--tasks", "reach",
                      "--delay-ticks", "1", "--strategy", "delay_aware", "--json", str(out)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    assert result["delay"] == {"delay_ticks": 1, "strategy": "delay_aware", "execute": 0, "execute_effective": 1,
                               "chunk": 2}  # fmt: skip
    assert "jerk" in result["smoothness"]["overall"]
    capsys.readouterr()
    assert eval_main(["--checkpoint", str(tiny_checkpoint), "--episodes-per-task", "1", "--tasks", "reach",
                      "--delay-ticks", "1", "--strategy", "delay_aware"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert "committed action slots" in err and len(err.splitlines()) == 1


# ------------------------------------------------------------------------------------- CLIs


@pytest.mark.parametrize(
    "args, message",
    [
        (["--delay-ticks", "-1"], "--delay-ticks must be >= 0, got -1"),
        (["--strategy", "fly"], "--strategy 'fly' is not one of blocking, chunk, synchronous, ensemble, delay_aware"),
        (["--delay-ticks", "1", "--execute", "-2"], "--execute must be >= 0"),
        (["--delay-ticks", "1", "--strategy", "chunk", "--execute", "9"], "--execute 9 must be in 0..2"),
    ],
)
def test_vla_eval_bad_delay_input_is_one_line_and_exit_2(tiny_checkpoint, tmp_path, capsys, args, message):
    out = tmp_path / "x.json"
    assert eval_main(["--checkpoint", str(tiny_checkpoint), "--tasks", "reach", "--episodes-per-task", "1",
                      "--json", str(out), *args]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_vla_eval_delay_flags_write_the_usual_json_plus_delay_and_smoothness(tiny_checkpoint, tmp_path):
    out = tmp_path / "eval.json"
    assert eval_main(["--checkpoint", str(tiny_checkpoint), "--tasks", "reach", "--episodes-per-task", "2",
                      "--delay-ticks", "1", "--strategy", "ensemble",
                      "--json", str(out)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    assert result["tasks"]["tabletop/Reach-v0"]["episodes"] == 2 and result["overall"]["episodes"] == 2
    assert result["delay"]["strategy"] == "ensemble"
    assert set(result["smoothness"]) == {"tabletop/Reach-v0", "overall"}


def test_sweep_writes_json_and_plot_per_point_and_resumes(tiny_checkpoint, tmp_path, capsys):
    out, docs = tmp_path / "sweep", tmp_path / "docs" / "delay_sweep.png"
    argv = ["delay", "--checkpoint", str(tiny_checkpoint), "--delays", "0,2", "--strategies", "blocking,chunk",
            "--episodes-per-task", "1", "--tasks", "reach", "--out", str(out), "--docs", str(docs),
            "--json", str(tmp_path / "sweep_result.json")]  # fmt: skip
    assert bench_main(argv) == 0
    summary = json.loads((out / "delay_sweep.json").read_text())
    assert [(r["strategy"], r["delay_ticks"]) for r in summary["points"]] == [
        ("blocking", 0), ("blocking", 2), ("chunk", 0), ("chunk", 2)
    ]  # fmt: skip
    for r in summary["points"]:
        assert r["episodes"] == 1 and len(r["ci95"]) == 2 and "boundary_jump" in r
    for png in (out / "delay_sweep.png", docs):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "| chunk | 2 |" in capsys.readouterr().out
    point = out / "points" / "chunk_d2.json"
    saved = json.loads(point.read_text())
    saved["overall"]["success_rate"] = 0.123  # a marker: a resumed sweep reuses the point instead of rerunning it
    point.write_text(json.dumps(saved))
    assert bench_main(argv) == 0
    rows = json.loads((out / "delay_sweep.json").read_text())["points"]
    assert [r["success_rate"] for r in rows if (r["strategy"], r["delay_ticks"]) == ("chunk", 2)] == [0.123]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--delays", "0,-1"], "--delay-ticks must be >= 0, got -1"),
        (["--delays", "0,x"], "--delays: expected a comma-separated list"),
        (["--strategies", "blocking,fly"], "--strategy 'fly' is not one of"),
        (["--strategies", "delay_aware"], "needs a checkpoint trained with model.committed_actions"),
    ],
)
def test_sweep_bad_input_is_one_line_and_exit_2(tiny_checkpoint, tmp_path, capsys, args, message):
    assert bench_main(["delay", "--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path / "s"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
