"""`vla-bench`: figures side by side with a peer, one subcommand per module `vla/bench/<name>.py`.

    vla-bench latency --json runs/bench/latency.json

`--json FILE` (every subcommand) writes the result there and the markdown beside it (FILE with suffix .md);
the markdown (or the JSON) is printed. Exit codes: vla/cli/common.py.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from vla.bench import SUBCOMMANDS
from vla.cli import common as cli

PROG = "vla-bench"


def build_parser(modules: dict) -> cli.Parser:
    parser = cli.Parser(prog=PROG, description="Figures side by side with a peer: latency, train, data, collect, ...")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(modules) + "}")
    for name, module in modules.items():
        doc = (module.__doc__ or name).strip().splitlines()[0]
        p = sub.add_parser(name, help=doc, description=doc)
        p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the result here (+ FILE.md)")
        module.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    modules = {name: importlib.import_module(f"vla.bench.{name}") for name in SUBCOMMANDS}
    args = build_parser(modules).parse_args(argv)
    return cli.run(f"{PROG} {args.command}", lambda: _run(modules[args.command], args))


def _run(module, args: argparse.Namespace) -> int:
    result = module.run(args)
    markdown = module.format_markdown(result) if hasattr(module, "format_markdown") else None
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        if markdown is not None:
            args.json.with_suffix(".md").write_text(markdown)
    print(markdown if markdown is not None else json.dumps(result, indent=2))
    return cli.OK


if __name__ == "__main__":
    sys.exit(main())
