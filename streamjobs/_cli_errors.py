"""The command line's errors and exit codes: every mistake a user can make is one line
on stderr and an exit code, never a traceback (docs/operations.md#exit-codes).

:class:`CliError` is the worker's and the connection's one-line error,
:class:`UsageError` the operator commands' (``_cli_ops``); :func:`exit_code` prints
either, or one of the library's own, and says how the process exits.
"""

from __future__ import annotations

import os
import signal
import sys

from .exceptions import ConfigurationError, InvalidStreamName, StreamJobsError


class CliError(Exception):
    """A one-line error for the user (no traceback)."""


class UsageError(Exception):
    """Bad input on the command line (exit 2)."""


def unwrap(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def exit_code(exc: BaseException) -> int | None:
    """Print ``exc`` as one line and return the exit code; None for a bug (traceback)."""
    if isinstance(exc, BrokenPipeError):
        # The reader went away (``streamjobs status | head -3``): nothing to say, and
        # the interpreter's final flush must not fail on the closed pipe either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    if isinstance(exc, CliError | UsageError):
        print(f"streamjobs: error: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, InvalidStreamName):
        print(f"streamjobs: error: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, ConfigurationError):
        print(f"streamjobs: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, StreamJobsError):
        print(f"streamjobs: error: {exc}", file=sys.stderr)
        return 1
    return None
