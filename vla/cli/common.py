"""What every console script shares: user errors become one line on stderr and exit 2, bugs keep their traceback.

A user error is an instance of one of `user_errors()`: the project's own types for bad input
(`UserError` and its subclasses, bad configs, datasets, checkpoints, task names, no GL for rendering)
and the OS errors that mean a path the user gave is wrong. A plain ValueError/KeyError/OSError is
not one of them: it is a bug until the code that checks the input says otherwise, so it propagates.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

# OSErrors that point at a path the user gave (missing, a directory, not writable), not at a bug.
PATH_ERRORS: tuple[type[OSError], ...] = (
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input or environment (not a bug): reported in one line."""
    from envs import UnknownTask
    from envs.rendering import RenderingUnavailable
    from vla.checkpoint import CheckpointError
    from vla.config import ConfigError
    from vla.data.hdf5_format import DatasetError
    from vla.errors import UserError

    return (UserError, ConfigError, DatasetError, CheckpointError, RenderingUnavailable, UnknownTask, *PATH_ERRORS)


def one_line(e: BaseException) -> str:
    """The exception's message on one line (HDF5 and OS messages can span several)."""
    return " ".join(str(e).split()) or type(e).__name__


def run(prog: str, body: Callable[[], int | None], interrupted: str = "interrupted") -> int:
    """Run a CLI body; a user error prints `prog: error: ...` and returns 2, a bug still shows a traceback."""
    try:
        return int(body() or 0)
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `prog ... | head`: the reader has gone; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except user_errors() as e:
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return 2


def device(text: str | None):
    """A `--device` flag checked up front: None/"auto" stays None (CUDA when present), else a device that exists."""
    if text is None or text == "auto":
        return None
    from vla.errors import UserError
    from vla.policy.torch_policy import pick_device

    try:
        return pick_device(text)
    except (RuntimeError, ValueError) as e:  # torch: not a device name; pick_device: no CUDA on this machine
        raise UserError(f"--device {text}: {one_line(e)}") from None


def add_policy_overrides(parser) -> None:
    """`--policy KEY=VALUE` (repeatable): PolicyConfig fields that replace the checkpoint's saved ones."""
    parser.add_argument(
        "--policy", action="append", default=[], metavar="KEY=VALUE",
        help="policy setting saved with the checkpoint to override, e.g. readout=argmax, temporal_ensemble=false, "
        "n_action_steps=4 (repeatable; see vla/policy/config.py)",
    )  # fmt: skip


def add_backend(parser) -> None:
    """`--backend`: the checkpoint in torch, or its ONNX export on onnxruntime (vla-eval, vla-deploy)."""
    from vla.policy.config import BACKENDS

    parser.add_argument(
        "--backend", choices=BACKENDS, default="torch",
        help="run the checkpoint in torch, or its vla-export graphs (CHECKPOINT/export/) on onnxruntime, fp32 or "
        "the int8 step graph (vla-export --int8)",
    )  # fmt: skip


def policy_overrides(items: list[str]) -> dict:
    """Parse `--policy KEY=VALUE` items (YAML scalars: 4, false, 0.5); the keys are checked by load_policy."""
    import yaml

    from vla.config import ConfigError

    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--policy {item!r} is not of the form KEY=VALUE (e.g. readout=argmax)")
        out[key.strip()] = yaml.safe_load(text)
    return out


def add_server(parser) -> None:
    """`--server URL` and `--token T`: run against a policy that `vla-serve` runs elsewhere (vla-eval, vla-deploy)."""
    parser.add_argument(
        "--server", default=None, metavar="URL",
        help="use the policy a vla-serve runs at URL (ws://HOST:PORT) instead of a local --checkpoint",
    )  # fmt: skip
    parser.add_argument(
        "--token", default=os.environ.get("VLA_TOKEN"), metavar="T",
        help="the server's --token (default: $VLA_TOKEN, which keeps it out of the process list)",
    )  # fmt: skip


def check_policy_source(args, local_flags: dict[str, bool]) -> None:
    """Exactly one of --checkpoint and --server; with --server, none of the flags that choose how a local policy
    runs (`local_flags`: flag -> whether it was given), since the server has chosen."""
    from vla.errors import UserError

    if (args.checkpoint is None) == (args.server is None):
        raise UserError("give one of --checkpoint DIR (run the policy here) and --server URL (a vla-serve runs it)")
    given = [flag for flag, on in local_flags.items() if on]
    if args.server is not None and given:
        raise UserError(f"{', '.join(given)}: with --server the server runs the policy (that is for a --checkpoint)")


def open_policy(checkpoint=None, server: str | None = None, token: str | None = None, timeout: float = 10.0,
                **kwargs):  # fmt: skip
    """The checkpoint's policy in this process (`load_policy(checkpoint, **kwargs)`), or the one a vla-serve at
    `server` runs, over the network (`RemotePolicy`; kwargs are then PolicyConfig overrides only)."""
    if server is None:
        from vla.policy.load import load_policy

        return load_policy(checkpoint, **kwargs)
    from vla.policy.remote import RemotePolicy

    return RemotePolicy(server, token=token, timeout=timeout, **kwargs)
