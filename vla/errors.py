"""`UserError`: bad input the user can fix (a flag, a path, a file's contents), as opposed to a bug.

The console scripts (`vla.cli.common.run`) print a user error as one line and exit 2; anything else keeps
its traceback. Raise a subclass of it (or one of the types `vla.cli.common.user_errors` lists) at the
point where user input is found wrong, with a message that says what and where.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input or environment the user can fix; the CLIs print it as one line and exit 2."""


class PolicyUnavailable(UserError):
    """The policy cannot answer now: a remote policy server is unreachable, gone, or did not reply in time.

    The controller counts a step that meets it as a deadline miss (too many in a row make its safe stop);
    anywhere else it is one line and exit 2, like any user error."""
