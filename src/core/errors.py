"""User-facing errors: one clear line, a non-zero exit, no traceback (unless asked for).

Every error that a user's input or action can cause (a bad verdict table, a missing file, a refused promotion,
verdicts that are not computed yet) is a :class:`RaimError` whose message names the file, the row and the field
where there is one. The command-line entries wrap their body in :func:`one_line`: such an error prints
``error: <message>`` on stderr and exits with :data:`EXIT_BAD_INPUT`. ``RAIM_DEBUG=1`` (or Hydra's own
``HYDRA_FULL_ERROR=1``) re-raises it with the full traceback instead.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import TypeVar

EXIT_BAD_INPUT = 2
DEBUG_ENV = ("RAIM_DEBUG", "HYDRA_FULL_ERROR")

F = TypeVar("F", bound=Callable)


class RaimError(Exception):
    """Bad input or a refused action; ``str(e)`` is the one line the user reads."""


def debug() -> bool:
    """Whether the user asked for tracebacks (``RAIM_DEBUG=1`` or ``HYDRA_FULL_ERROR=1``)."""
    return any(os.environ.get(k, "").strip().lower() not in ("", "0", "false", "no") for k in DEBUG_ENV)


def one_line_message(e: BaseException) -> str:
    """The error as one line: a RaimError's message, or ``<file>: <reason>`` for an operating-system error."""
    if isinstance(e, OSError) and e.filename is not None:
        msg = f"{e.filename}: {e.strerror or e}"
    else:
        msg = str(e) or type(e).__name__
    return " ".join(msg.split())


def one_line(fn: F) -> F:
    """Decorate a command's entry: a :class:`RaimError` or an :class:`OSError` becomes ``error: …`` on stderr
    and exit status :data:`EXIT_BAD_INPUT` (a traceback only with ``RAIM_DEBUG=1``)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (RaimError, OSError) as e:
            if debug():
                raise
            print(f"error: {one_line_message(e)}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_BAD_INPUT) from None

    return wrapper  # type: ignore[return-value]


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the commands' one-line errors: a bad argument prints ``error: <prog>: <what>`` (and where
    to read the usage) on stderr, exit status :data:`EXIT_BAD_INPUT`, instead of the usage block then the error."""

    def error(self, message: str):
        print(f"error: {self.prog}: {' '.join(message.split())} (usage: {self.prog} --help)", file=sys.stderr,
              flush=True)
        raise SystemExit(EXIT_BAD_INPUT)


class MonitorError(RaimError):
    """A vote store, a stream or a setting the monitor cannot use; one line naming the record and the field."""
