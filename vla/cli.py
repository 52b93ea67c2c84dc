"""What every console script shares: user-facing errors become one line on stderr and exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Callable


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input or environment (not a bug): reported in one line."""
    from envs.rendering import RenderingUnavailable
    from vla.checkpoint import CheckpointError
    from vla.config import ConfigError
    from vla.hdf5_format import DatasetError

    return (ConfigError, DatasetError, CheckpointError, RenderingUnavailable, ValueError, KeyError, OSError)


def run(prog: str, body: Callable[[], int | None]) -> int:
    """Run a CLI body; a user error prints `prog: error: ...` and returns 2, a bug still shows a traceback."""
    try:
        return int(body() or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except user_errors() as e:
        message = str(e).strip().strip("'\"") or type(e).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
