"""`vla-bench`: figures side by side with a peer. One subcommand per module `vla/bench/<name>.py`.

A subcommand module exposes `add_arguments(parser)` and `run(args) -> dict`, and optionally
`format_markdown(result) -> str`. `main` adds `--json FILE` to every subcommand, writes the result
there and the markdown beside it (FILE with suffix .md), and prints the markdown (or the JSON).
A module that does not exist yet is simply not offered.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from vla.config import ConfigError

SUBCOMMANDS = ("latency", "train", "data", "collect")


def _modules() -> dict:
    found = {}
    for name in SUBCOMMANDS:
        try:
            found[name] = importlib.import_module(f"vla.bench.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"vla.bench.{name}":  # the module exists but one of its imports is missing
                raise
    return found


def main(argv: list[str] | None = None) -> int:
    modules = _modules()
    parser = argparse.ArgumentParser(prog="vla-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(modules) + "}")
    for name, module in modules.items():
        doc = (module.__doc__ or name).strip().splitlines()[0]
        p = sub.add_parser(name, help=doc, description=doc)
        p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the result here (+ FILE.md)")
        module.add_arguments(p)
    args = parser.parse_args(argv)
    module = modules[args.command]
    try:
        result = module.run(args)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"vla-bench {args.command}: error: {e}", file=sys.stderr)
        return 2
    markdown = module.format_markdown(result) if hasattr(module, "format_markdown") else None
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        if markdown is not None:
            args.json.with_suffix(".md").write_text(markdown)
    print(markdown if markdown is not None else json.dumps(result, indent=2))
    return 0


__all__ = ["main", "SUBCOMMANDS"]
