"""`vla-bench`: figures side by side with a peer. One subcommand per module `vla/bench/<name>.py`.

A subcommand module exposes `add_arguments(parser)` and `run(args) -> dict`, and optionally
`format_markdown(result) -> str`. `main` adds `--json FILE` to every subcommand, writes the result
there and the markdown beside it (FILE with suffix .md), and prints the markdown (or the JSON).
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from vla.cli import common as cli

SUBCOMMANDS = ("latency", "plan", "train", "data", "collect", "delay", "serve")


def main(argv: list[str] | None = None) -> int:
    modules = {name: importlib.import_module(f"vla.bench.{name}") for name in SUBCOMMANDS}
    parser = argparse.ArgumentParser(prog="vla-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(modules) + "}")
    for name, module in modules.items():
        doc = (module.__doc__ or name).strip().splitlines()[0]
        p = sub.add_parser(name, help=doc, description=doc)
        p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the result here (+ FILE.md)")
        module.add_arguments(p)
    args = parser.parse_args(argv)
    return cli.run(f"vla-bench {args.command}", lambda: _run(modules[args.command], args))


def _run(module, args: argparse.Namespace) -> int:
    result = module.run(args)
    markdown = module.format_markdown(result) if hasattr(module, "format_markdown") else None
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        if markdown is not None:
            args.json.with_suffix(".md").write_text(markdown)
    print(markdown if markdown is not None else json.dumps(result, indent=2))
    return 0


__all__ = ["main", "SUBCOMMANDS"]
