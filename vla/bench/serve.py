"""Serving: the in-process step, the same step through vla-serve on loopback, and robots at a fixed rate.

    vla-bench serve --checkpoint runs/demo --backend onnxruntime

One run, all traffic on 127.0.0.1, bounded in steps and seconds. The server is `python -m vla.cli.serve` as its
own process (its own interpreter, as on a GPU box), on the same backend and thread count as the in-process
policy it is compared with.
1. in process: `policy.act_chunk` in this process, `--steps` steps (p50 / p99);
2. round trip: the same steps through the server with our client (`vla.policy.remote.RemotePolicy`) and with
   openpi-client, one client at a time; the overhead is the round trip's p50 minus the in-process p50;
3. robots: for each count in `--clients`, that many clients (threads here, each its own connection and
   episode) step at `--hz` for `--seconds` on one absolute schedule, their ticks aligned (every robot asks
   at the same instant: the worst case for the queue): round trip p50 / p99, replies per second, and
   deadline misses (a reply later than `--budget-ms` after its tick, or a tick skipped because the
   previous reply ran past it);
4. capacity: the largest client count again, unpaced (each client asks as soon as it has its reply);
5. batching (torch backend): B streaming steps of one row against one step of B rows in lockstep, the
   upper bound of what running waiting connections as one batch could give, and how far a batched row's
   logits are from the one-row step's.
Episodes restart every 100 steps, as a robot's would (the reset is not timed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from vla.errors import UserError

EPISODE_STEPS = 100  # steps per episode before a reset, in every part
INSTRUCTION = "push the red block to the green target"


def add_arguments(p) -> None:
    from vla.cli import common as cli

    p.add_argument("--checkpoint", required=True, help="checkpoint directory (vla-train --out; with its export/)")
    cli.add_backend(p)
    p.add_argument("--threads", type=int, default=1, help="threads of the policy step, here and in the server (1)")
    p.add_argument("--steps", type=int, default=200, help="timed steps of the in-process and round-trip parts (200)")
    p.add_argument("--hz", type=float, default=20.0, help="control rate of each robot, Hz (default 20)")
    p.add_argument("--budget-ms", type=float, default=None, help="a reply is due this long after its tick (period)")
    p.add_argument("--clients", default="1,2,4,8", help="robot counts to run, comma-separated (default 1,2,4,8)")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds each robot count runs (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random observations")


def _check(args) -> list[int]:
    if not 1 <= args.steps <= 100_000:
        raise UserError(f"--steps must be in 1..100000, got {args.steps}")
    if not 0 < args.seconds <= 600:
        raise UserError(f"--seconds must be in (0, 600], got {args.seconds}")
    if not args.hz > 0:
        raise UserError(f"--hz must be positive, got {args.hz}")
    if args.threads < 1:
        raise UserError(f"--threads must be at least 1, got {args.threads}")
    try:
        clients = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        clients = []
    if not clients or not all(1 <= c <= 64 for c in clients):
        raise UserError(f"--clients {args.clients!r}: give client counts in 1..64, comma-separated (e.g. 1,2,4,8)")
    return clients


def _stats(seconds: list[float]) -> dict:
    ms = np.asarray(seconds) * 1e3
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "mean": float(ms.mean()),
            "n": len(ms)}  # fmt: skip


def random_observations(spec, seed: int, n: int = 16) -> list[dict]:
    """n observations of the policy's shapes (random pixels and state), the same for the same seed."""
    rng = np.random.default_rng(seed)
    size, cams = spec.image_size, ["image", "wrist_image"][: spec.n_cameras]
    return [
        {**{k: rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for k in cams},
         "proprio": rng.normal(size=spec.proprio_dim).astype(np.float32)}
        for _ in range(n)
    ]  # fmt: skip


def _time_steps(step, reset, obs: list[dict], n: int) -> list[float]:
    """Seconds of each of n calls `step(obs)`, after 3 untimed ones, restarting the episode every EPISODE_STEPS."""
    reset()
    for o in obs[:3]:
        step(o)
    took = []
    for i in range(n):
        if (i + 3) % EPISODE_STEPS == 0:
            reset()
        start = time.perf_counter()
        step(obs[i % len(obs)])
        took.append(time.perf_counter() - start)
    return took


class _Server:
    """`python -m vla.cli.serve` on a free port of 127.0.0.1 for the length of the benchmark."""

    def __init__(self, args):
        cmd = [sys.executable, "-m", "vla.cli.serve", "--checkpoint", str(args.checkpoint), "--backend", args.backend,
               "--threads", str(args.threads), "--host", "127.0.0.1", "--port", "0", "--max-clients", "64",
               "--quiet"]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(300)
        found = re.search(r"ws://[\d.]+:\d+", first[0]) if first else None
        if found is None:
            self.close()
            raise UserError(f"vla-serve did not start: {' '.join(self.proc.stderr.read().split()) or 'no output'}")
        self.url = found.group(0)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(30)


def _robots(url: str, n: int, obs: list[dict], args, paced: bool) -> dict:
    """n clients, each its own connection and episode, stepping on one schedule (or back to back) for
    --seconds: round trips, tick latencies, misses and replies per second."""
    from vla.policy.remote import RemotePolicy

    period = 1.0 / args.hz
    budget = (args.budget_ms or 1e3 / args.hz) / 1e3
    ticks = max(1, round(args.seconds * args.hz))
    clients = [RemotePolicy(url) for _ in range(n)]
    for c in clients:
        c.reset(INSTRUCTION)
        c.act_chunk(obs[0])  # the connection's first step (its fork's first call) is not the steady state
    trips: list[list[float]] = [[] for _ in range(n)]
    late: list[list[float]] = [[] for _ in range(n)]
    misses, skipped = [0] * n, [0] * n
    start = time.perf_counter() + 0.05

    def robot(i: int) -> None:
        c, k = clients[i], 0
        while True:
            tick = start + k * period
            if paced:
                if tick - start >= ticks * period - 1e-9:
                    return
                time.sleep(max(0.0, tick - time.perf_counter()))
            elif time.perf_counter() - start >= args.seconds:
                return
            if (k + 1) % EPISODE_STEPS == 0:
                c.reset(INSTRUCTION)
            sent = time.perf_counter()
            c.act_chunk(obs[(k + i) % len(obs)])
            done = time.perf_counter()
            trips[i].append(done - sent)
            if paced:
                late[i].append(done - tick)
                misses[i] += done - tick > budget
                behind = int((done - start) // period) + 1  # the next boundary not yet past
                skipped[i] += max(0, behind - (k + 1))
                k = max(k + 1, behind)
            else:
                k += 1

    threads = [threading.Thread(target=robot, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    for c in clients:
        c.close()
    every = [x for trip in trips for x in trip]
    row = {"clients": n, "paced": paced, "replies": len(every), "replies_per_s": len(every) / wall,
           "round_trip_ms": _stats(every)}  # fmt: skip
    if paced:
        row["tick_latency_ms"] = _stats([x for lat in late for x in lat])
        row["deadline_misses"] = sum(misses) + sum(skipped)
        row["skipped_ticks"] = sum(skipped)
        row["ticks_scheduled"] = n * ticks
    return row


def _batching(policy, sizes: list[int], reps: int) -> list[dict]:
    """B one-row streaming steps against one B-row step (rows in lockstep): what batching waiting connections
    could give at most on this machine, and the logit difference it would bring."""
    import torch

    model, spec = policy.model, policy.spec
    ids = torch.as_tensor(np.asarray(policy.tok.text.encode_batch([INSTRUCTION], policy.cfg.instruction_len)))
    gen = torch.Generator().manual_seed(0)
    rows = []
    for B in sizes:
        ones, many = [model.new_cache(1) for _ in range(B)], model.new_cache(B)
        for c in ones:
            model.start(c, ids)
        model.start(many, ids.repeat(B, 1))
        separate, batched, diff = [], [], 0.0
        for t in range(reps):
            image = torch.randint(0, 256, (1, spec.n_cameras, spec.image_size, spec.image_size, 3), generator=gen,
                                  dtype=torch.uint8).to(policy.device)  # fmt: skip
            proprio = torch.randn(1, spec.proprio_dim, generator=gen).to(policy.device)
            step = torch.tensor([t % EPISODE_STEPS], device=policy.device)
            start = time.perf_counter()
            one = [model.step(c, image, proprio, step).logits for c in ones]
            _sync(policy.device)
            mid = time.perf_counter()
            out = model.step(many, image.repeat(B, 1, 1, 1, 1), proprio.repeat(B, 1), step.repeat(B)).logits
            _sync(policy.device)
            end = time.perf_counter()
            if t >= 3:  # the first calls allocate
                separate.append(mid - start)
                batched.append(end - mid)
            diff = max(diff, float((out[0] - one[0][0]).abs().max()))
        s, b = float(np.median(separate)) * 1e3, float(np.median(batched)) * 1e3
        rows.append({"batch": B, "separate_ms": s, "batched_ms": b, "gain": s / b, "max_abs_logit_diff": diff})
    return rows


def _sync(device) -> None:
    import torch

    if getattr(device, "type", "") == "cuda":
        torch.cuda.synchronize(device)


def run(args) -> dict:
    clients = _check(args)
    import torch

    from vla.policy.load import load_policy
    from vla.policy.onnx_policy import PolicyLoadError
    from vla.policy.remote import RemotePolicy

    torch.set_num_threads(args.threads)
    try:
        policy = load_policy(args.checkpoint, device="cpu", backend=args.backend)
    except PolicyLoadError as e:
        raise UserError(str(e)) from None
    load = os.getloadavg()[0]
    obs = random_observations(policy.spec, args.seed)
    local = policy.fork()
    result = {"checkpoint": str(args.checkpoint), "backend": args.backend, "threads": args.threads, "hz": args.hz,
              "budget_ms": args.budget_ms or 1e3 / args.hz, "steps": args.steps, "seconds": args.seconds,
              "model": {k: policy.meta["model"][k] for k in ("d_model", "n_layer", "n_head", "window", "chunk")},
              "cpu_count": os.cpu_count(), "loadavg_1min_at_start": load, "torch": torch.__version__}  # fmt: skip
    result["in_process_ms"] = _stats(_time_steps(local.act_chunk, lambda: local.reset(INSTRUCTION), obs, args.steps))
    server = _Server(args)
    try:
        with RemotePolicy(server.url) as remote:
            trips = _time_steps(remote.act_chunk, lambda: remote.reset(INSTRUCTION), obs, args.steps)
        result["round_trip_ms"] = {"vla": _stats(trips), "openpi": _openpi_round_trips(server.url, obs, args.steps)}
        result["overhead_p50_ms"] = {
            name: None if r is None else r["p50"] - result["in_process_ms"]["p50"]
            for name, r in result["round_trip_ms"].items()
        }
        result["robots"] = [_robots(server.url, n, obs, args, paced=True) for n in clients]
        result["capacity"] = _robots(server.url, max(clients), obs, args, paced=False)
    finally:
        server.close()
    result["batching"] = _batching(policy, clients, reps=min(args.steps, 60)) if args.backend == "torch" else None
    return result


def _openpi_round_trips(url: str, obs: list[dict], n: int) -> dict | None:
    """The same steps with openpi-client (its keys, the prompt with every step, as its examples send)."""
    import warnings

    try:
        from openpi_client.websocket_client_policy import WebsocketClientPolicy
    except ImportError:
        return None
    with warnings.catch_warnings():  # websockets >= 17.1 warns about how openpi-client 0.1.2 holds its connection
        warnings.simplefilter("ignore", DeprecationWarning)
        client = WebsocketClientPolicy(url)
        client.infer({"prompt": INSTRUCTION, "reset": True})  # the warning comes with the first recv
    episode = [0]

    def step(o: dict) -> None:
        client.infer({"observation/image": o["image"], "observation/state": o["proprio"], "prompt": INSTRUCTION,
                      "reset": episode[0] == 0})  # fmt: skip
        episode[0] += 1

    def reset() -> None:
        episode[0] = 0

    return _stats(_time_steps(step, reset, obs, n))  # openpi-client has no close(): the server's exit ends it


def format_markdown(r: dict) -> str:
    m = r["model"]
    lines = [
        f"### Serving on loopback: {Path(r['checkpoint']).name}, d_model {m['d_model']}, {m['n_layer']} layers, "
        f"window {m['window']}, chunk {m['chunk']}; backend {r['backend']}, {r['threads']} thread(s) in the server "
        f"and in process; {r['cpu_count']} CPUs, load {r['loadavg_1min_at_start']:.2f} at start",
        "",
        "| one step | p50 ms | p99 ms | p50 over in-process, ms |",
        "|---|---:|---:|---:|",
        f"| in process (`policy.act_chunk`) | {r['in_process_ms']['p50']:.2f} | {r['in_process_ms']['p99']:.2f} | |",
    ]
    for name, label in (("vla", "through vla-serve, `RemotePolicy`"), ("openpi", "through vla-serve, openpi-client")):
        trip = r["round_trip_ms"][name]
        if trip is not None:
            lines.append(f"| {label} | {trip['p50']:.2f} | {trip['p99']:.2f} | {r['overhead_p50_ms'][name]:+.2f} |")
    lines += [
        "",
        f"Robots at {r['hz']:g} Hz for {r['seconds']:g} s each, ticks aligned, a reply due {r['budget_ms']:g} ms "
        "after its tick:",
        "",
        "| robots | round trip p50 ms | p99 ms | tick to reply p99 ms | replies/s | deadline misses |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["robots"]:
        trip, tick = row["round_trip_ms"], row["tick_latency_ms"]
        misses = f"{row['deadline_misses']} of {row['ticks_scheduled']}"
        lines.append(f"| {row['clients']} | {trip['p50']:.2f} | {trip['p99']:.2f} | {tick['p99']:.2f} | "
                     f"{row['replies_per_s']:.0f} | {misses} |")  # fmt: skip
    cap, trip = r["capacity"], r["capacity"]["round_trip_ms"]
    lines += ["", f"Capacity: {cap['clients']} clients back to back, {cap['replies_per_s']:.0f} replies/s "
              f"(round trip p50 {trip['p50']:.2f} ms, p99 {trip['p99']:.2f} ms)."]  # fmt: skip
    if r["batching"]:
        lines += ["", "Batching across connections, upper bound (torch, rows in lockstep):", "",
                  "| batch | B one-row steps ms | one B-row step ms | gain | max abs logit diff |",
                  "|---:|---:|---:|---:|---:|"]  # fmt: skip
        for b in r["batching"]:
            lines.append(f"| {b['batch']} | {b['separate_ms']:.2f} | {b['batched_ms']:.2f} | {b['gain']:.2f}x | "
                         f"{b['max_abs_logit_diff']:.1e} |")  # fmt: skip
    return "\n".join(lines) + "\n"
