"""`vla-export`: write a checkpoint's policy as ONNX graphs (vla/export/graphs.py) and check their parity.

    vla-export --checkpoint runs/demo [--out DIR] [--int8] [--parity-steps N]

Exit status: 0 written and within tolerance, 2 bad input or a model export cannot reproduce, 4 parity out of
tolerance (vla/cli/common.py has the whole table).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vla.cli import common as cli
from vla.errors import UserError

PROG = "vla-export"


def build_parser() -> cli.Parser:
    parser = cli.Parser(prog=PROG, description="Export a checkpoint's policy as ONNX graphs runnable without torch.")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (vla-train --out)")
    parser.add_argument("--out", help="output directory (default CHECKPOINT/export)")
    parser.add_argument(
        "--int8", action="store_true", help="also write an int8 step graph (dynamic quantization), parity reported"
    )
    parser.add_argument(
        "--parity-steps", type=int, default=30, metavar="N",
        help="rollout steps per task for the parity check (default 30; 0 = skip)",
    )  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli.run(PROG, lambda: _run(args))


def _run(args) -> int:
    if args.parity_steps < 0:
        raise UserError(f"--parity-steps must be >= 0 (0 = skip the check), got {args.parity_steps}")
    import torch

    import envs
    from vla.export.graphs import PARITY_TOL, ExportError, export_policy, parity
    from vla.policy.load import load_policy

    torch.set_num_threads(1)
    policy = load_policy(args.checkpoint, device="cpu")
    out = Path(args.out) if args.out else Path(args.checkpoint) / "export"
    try:
        manifest = export_policy(policy, out, int8=args.int8)
    except ExportError as e:  # a model the graphs cannot reproduce: the user's choice of checkpoint
        raise UserError(f"{args.checkpoint}: {e}") from None
    files = ", ".join(g["file"] for g in manifest["graphs"].values())
    print(f"wrote {out}/ ({files}, manifest.json) in {manifest['export_seconds']} s")
    if not args.parity_steps:
        return cli.OK
    manifest["parity"] = {"steps": args.parity_steps, "tolerance": PARITY_TOL}
    for name, int8 in (("fp32", False), ("int8", True))[: 1 + args.int8]:
        exported = load_policy(out, backend="onnxruntime-int8" if int8 else "onnxruntime", threads=1)
        diffs = parity(policy, exported, envs.TASKS, args.parity_steps)
        for task, d in diffs.items():
            print(f"parity {name} {task}: max |action difference| {d:.2e} (rollout of <= {args.parity_steps} steps)")
        manifest["parity"]["max_abs_diff" if name == "fp32" else "int8_max_abs_diff"] = diffs
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    worst = max(manifest["parity"]["max_abs_diff"].values())
    if worst > PARITY_TOL:
        return cli.failed_check(PROG, f"parity failed: max |action difference| {worst:.2e} > {PARITY_TOL:g} (fp32)")
    return cli.OK


if __name__ == "__main__":
    sys.exit(main())
