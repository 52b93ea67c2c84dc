"""`vla-train`: behaviour cloning from a dataset into a run directory (vla/training/train.py).

    vla-train --config configs/demo.yaml --data data/demo.hdf5 --out runs/demo [KEY=VALUE ...]
    torchrun --nproc-per-node N -m vla.cli.train ...        (DDP; gloo on CPU, nccl on CUDA)

KEY=VALUE words are dotted config keys (train.steps=200 model.n_layer=2; unknown keys are errors).
Exit status: 0 trained, 2 bad input, 4 the loss went non-finite (the run stopped; its last checkpoint is kept),
130 interrupted (rerun with --resume); vla/cli/common.py has the table.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from vla.cli import common as cli

PROG = "vla-train"


def build_parser() -> cli.Parser:
    parser = cli.Parser(
        prog=PROG,
        description="Behaviour cloning: train the action transformer on a demonstration dataset.",
        epilog="Overrides: dotted keys, e.g. train.steps=200 model.n_layer=2 (unknown keys are errors).",
    )
    parser.add_argument("--config", help="YAML preset, e.g. configs/demo.yaml (default: the built-in defaults)")
    parser.add_argument("--data", help="HDF5 dataset (vla-collect --out); with --resume, default: the run's own")
    parser.add_argument("--out", required=True, help="run/checkpoint directory")
    parser.add_argument("--resume", action="store_true", help="continue OUT's run from its last complete checkpoint")
    parser.add_argument(
        "--init", metavar="CHECKPOINT",
        help="start from this checkpoint's weights and tokenizers (its config unless --config; its model "
        "settings unless the config sets others), with a fresh optimizer and schedule: fine-tuning, DAgger",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. train.steps=200")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.resume and not args.data:
        parser.error("--data is required (except with --resume)")
    if args.resume and args.init:
        parser.error("--init starts a run and --resume continues one: give one of them")
    return cli.run(PROG, lambda: _run(args))


def _run(args) -> int:
    from vla.checkpoint import has_checkpoint, load_checkpoint
    from vla.config import ConfigError
    from vla.training.config import load_config
    from vla.training.train import NonFiniteError, saved_config, train, with_model_of

    out = Path(args.out)
    resume = None
    if args.resume:
        if not has_checkpoint(out):
            raise ConfigError(f"{out}: nothing to resume (no complete checkpoint); drop --resume to start a run")
        resume = load_checkpoint(out)
        cfg = saved_config(resume, args.overrides)
        data_path = args.data or resume.meta["data"]
    else:
        if has_checkpoint(out):
            raise ConfigError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
        cfg = load_config(args.config, args.overrides)
        data_path = args.data
    init = None
    if args.init:
        init = load_checkpoint(args.init)
        if not args.config:
            cfg = saved_config(init, args.overrides)
        cfg = with_model_of(cfg, init)
    try:
        summary = train(cfg, data_path, out, resume, init)
    except NonFiniteError as e:  # the run's own check on its loss: it stopped rather than train on garbage
        return cli.failed_check(PROG, f"error: {e}")
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: summary[k] for k in ("step", "final_loss", "world_size")}))
    return cli.OK


if __name__ == "__main__":
    sys.exit(main())
