"""`vla-eval`: closed-loop success rates of a checkpoint (or of a policy a vla-serve runs) on its tasks.

    vla-eval --checkpoint runs/demo --episodes-per-task 50 --workers 2 --json runs/demo/eval.json [KEY=VALUE ...]

What runs and what the JSON holds: vla/evaluation/evaluate.py. KEY=VALUE words override the policy settings
saved with the checkpoint (readout=argmax n_action_steps=4; vla/policy/config.py).
Exit status: 0 evaluated, 2 bad input, 3 a safe stop (the --server was lost); vla/cli/common.py has the table.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from vla.cli import common as cli
from vla.errors import PolicyUnavailable, UserError
from vla.evaluation import evaluate as ev

PROG = "vla-eval"


def build_parser() -> cli.Parser:
    parser = cli.Parser(prog=PROG, description="Closed-loop evaluation: success rate per task with 95% intervals.")
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (vla-train --out)")
    cli.add_server(parser)
    parser.add_argument("--episodes-per-task", type=int, default=50, help="episodes per task (default 50)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--seed", type=int, default=ev.EVAL_SEED, help=f"first seed (default {ev.EVAL_SEED})")
    parser.add_argument("--tasks", default="trained", help="'trained' (the checkpoint's tasks), 'all', or ids")
    parser.add_argument("--video", help="write a few episodes per task as mp4 into this directory")
    parser.add_argument("--workers", type=int, default=1, help="parallel worker processes (default 1)")
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda if available)")
    parser.add_argument(
        "--threads", type=int, default=None, metavar="N",
        help="torch threads of the in-process evaluation (default: load_policy's; set 1 beside a training "
        "run); --workers processes use 1 each",
    )  # fmt: skip
    parser.add_argument("--no-kv-cache", action="store_true", help="recompute the window every step")
    cli.add_backend(parser)
    parser.add_argument(
        "--instructions", choices=["own", "swap_colour", "other_task", "paraphrase"], default="own",
        help="grounding probe: give each episode a wrong instruction (swap_colour, other_task) or a held-out "
        "rephrasing of its own (paraphrase); default: its own",
    )  # fmt: skip
    parser.add_argument(
        "--delay-ticks", type=int, default=None, metavar="D",
        help="simulate D control ticks of inference delay (simulated time; see vla/control/delay.py)",
    )  # fmt: skip
    parser.add_argument(
        "--strategy", default=None, metavar="NAME",
        help="execution strategy under delay: blocking (default), chunk, synchronous, ensemble, delay_aware "
        "(vla/policy/strategies.py)",
    )  # fmt: skip
    parser.add_argument(
        "--execute", type=int, default=0, metavar="S",
        help="actions executed per chunk by chunk / delay_aware (default 0: as many as chunk - D)",
    )  # fmt: skip
    parser.add_argument(
        "--attention", metavar="DIR",
        help="save attention figures (first action token over image patches and words) for one episode per task",
    )  # fmt: skip
    parser.add_argument("--attention-steps", default="0,10,20", help="rollout steps to draw (default 0,10,20)")
    parser.add_argument(
        "--experts", metavar="FILE",
        help="`python -m envs --json` output for the same first seed: the expert's rate beside each task",
    )  # fmt: skip
    cli.add_policy_overrides(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(PROG, lambda: _run(args))


def _run(args) -> int:
    check_args(args)
    delay = ev.delay_options(args.delay_ticks, args.strategy, args.execute)
    experts = read_experts(args.experts, args.seed) if args.experts else None
    policy_kwargs = _policy_kwargs(args, delay)
    import torch

    caller_threads = torch.get_num_threads()  # load_policy sets the step's; the in-process evaluation gives it back
    policy = ev.open_policy(args.checkpoint, **policy_kwargs)
    tasks = _tasks(args.tasks, policy.meta.get("tasks"))
    if args.attention:
        _attention(policy, tasks, args)
        if not args.json:
            return cli.OK  # figures only; pass --json to evaluate as well
    start = time.perf_counter()
    try:
        if args.workers > 1:
            result = ev.evaluate_parallel(
                args.checkpoint, tasks, args.episodes_per_task, args.seed, args.instructions,
                args.video, args.workers, policy_kwargs, delay,
            )  # fmt: skip
            result["torch_threads"] = ev.WORKER_THREADS
        else:
            result = _evaluate_in_process(policy, tasks, args, delay, caller_threads)
    except PolicyUnavailable as e:  # the server went away mid-evaluation: nothing was run on a half answer
        print(f"{PROG}: safe stop: {cli.one_line(e)}", file=sys.stderr)
        return cli.SAFE_STOP
    if experts is not None:
        ev.add_expert_rates(result, experts, args.seed, args.experts)
    _describe(result, args, policy, delay, time.perf_counter() - start)
    print(ev.format_table(result, _title(result, args, delay)))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return cli.OK


def check_args(args) -> None:
    """The flags' own constraints, before anything loads (UserError: one line, exit 2)."""
    local = {"--backend": args.backend != "torch", "--device": args.device is not None,
             "--threads": args.threads is not None, "--attention": args.attention is not None}  # fmt: skip
    cli.check_policy_source(args, local)
    for flag, value in (("--episodes-per-task", args.episodes_per_task), ("--workers", args.workers),
                        ("--threads", args.threads)):  # fmt: skip
        if value is not None and value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    if args.threads is not None and args.workers > 1:
        raise UserError("--threads sets the in-process evaluation's threads; with --workers each process uses 1")
    if args.backend != "torch" and args.attention:
        raise UserError(f"--backend {args.backend} has no attention figures (they read torch's attention maps)")


def read_experts(path: str, seed: int) -> dict:
    """`--experts FILE`: `python -m envs --json` output measured from the same first seed (UserError if not)."""
    try:
        experts = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"--experts {path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(experts, dict) or not isinstance(experts.get("rows", []), list):
        raise UserError(f"--experts {path}: expected `python -m envs --json` output (an object with 'rows')")
    if experts.get("seed", seed) != seed:
        raise UserError(f"--experts {path} was measured from seed {experts['seed']}, this evaluation starts at {seed}")
    return experts


def _policy_kwargs(args, delay: dict | None) -> dict:
    """What `open_policy` gets: here a device and backend, with --server only PolicyConfig overrides."""
    overrides = cli.policy_overrides(args.overrides)
    kwargs = {"device": cli.device(args.device), "backend": args.backend, **overrides}
    if args.server is not None:  # the server's backend and device; ours are PolicyConfig overrides only
        kwargs = {"server": args.server, "token": args.token, **overrides}
    if args.no_kv_cache:
        kwargs["kv_cache"] = False
    return kwargs


def _tasks(spec: str, trained: list[str] | None) -> list[str]:
    import envs

    if spec == "trained":
        return list(trained or envs.TASKS)
    if spec == "all":
        return list(envs.TASKS)
    return envs.expand_tasks(spec)  # ids, short names or a suite ("metaworld/mt10")


def _attention(policy, tasks: list[str], args) -> None:
    from vla.evaluation.attention import attention_rollout

    try:
        steps = [int(s) for s in args.attention_steps.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--attention-steps: expected comma-separated integers, got {args.attention_steps!r}") from None
    for task in tasks:
        paths = attention_rollout(policy, task, args.seed, steps, args.attention)
        print(f"{task}: {len(paths)} attention figures in {args.attention}")


def _evaluate_in_process(policy, tasks: list[str], args, delay: dict | None, before: int) -> dict:
    """`evaluate` at `--threads` torch threads (default: load_policy's), then the caller's count `before` again
    (tests and notebooks keep their own setting)."""
    import torch

    torch.set_num_threads(args.threads or torch.get_num_threads())
    try:
        result = ev.evaluate(policy, tasks, args.episodes_per_task, args.seed, args.instructions, args.video,
                             delay=delay)  # fmt: skip
        result["torch_threads"] = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    result["policy"] = ev.policy_info(policy)
    return result


def _describe(result: dict, args, policy, delay: dict | None, seconds: float) -> None:
    """What the run was, into the JSON beside its figures."""
    result["seconds"] = seconds
    result["instructions"] = args.instructions
    result["checkpoint"] = str(args.checkpoint if args.server is None else policy.metadata["checkpoint"])
    result["backend"] = args.backend if args.server is None else policy.metadata["backend"]
    result["server"] = args.server
    if delay is not None:
        result["delay"] = ev.delay_report(delay, policy.chunk)


def _title(result: dict, args, delay: dict | None) -> str:
    title = f"checkpoint {result['checkpoint']}, instructions: {args.instructions}"
    if args.server is not None:
        title += f", served by {args.server}"
    if delay is not None:
        d, sm = result["delay"], result["smoothness"]["overall"]
        title += (f", delay {d['delay_ticks']} ticks, strategy {d['strategy']} (execute {d['execute_effective']}); "
                  f"jerk {sm['jerk']:.4f}, boundary jump {sm['boundary_jump']:.4f}")  # fmt: skip
    return title


if __name__ == "__main__":
    sys.exit(main())
