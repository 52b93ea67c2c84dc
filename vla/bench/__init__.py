"""Benchmarks: figures side by side with a peer (`vla-bench`, vla/cli/bench.py). One subcommand per module.

A subcommand module `vla/bench/<name>.py` exposes `add_arguments(parser)` and `run(args) -> dict`, and optionally
`format_markdown(result) -> str`.
"""

SUBCOMMANDS = ("latency", "plan", "train", "data", "collect", "delay", "serve")

__all__ = ["SUBCOMMANDS"]
