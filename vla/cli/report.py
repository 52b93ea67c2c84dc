"""`python -m vla.cli.report RUN`: a run directory's figures in one place (vla/evaluation/report.py).

Exit status: 0 printed, 2 RUN is not a directory; vla/cli/common.py has the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vla.cli import common as cli
from vla.errors import UserError

PROG = "python -m vla.cli.report"


def build_parser() -> cli.Parser:
    parser = cli.Parser(
        prog=PROG,
        description="Summarize a run directory: success table (MT50: the SmolVLA paper's layout), latency, stage "
        "times, curves.",
    )
    parser.add_argument("run", help="run directory, e.g. runs/demo")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(PROG, lambda: _run(Path(args.run)))


def _run(run: Path) -> int:
    from vla.evaluation.report import summary

    if not run.is_dir():
        raise UserError(f"{run} is not a directory")
    print(summary(run))
    return cli.OK


if __name__ == "__main__":
    sys.exit(main())
