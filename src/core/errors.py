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


_REDACTORS: list[Callable[[str], str]] = []


def add_redactor(fn: Callable[[str], str]) -> None:
    """A function that every error message goes through before it is shown (the one line of :func:`one_line`,
    the message of an exception re-raised for a traceback): :mod:`src.mlops.redact` adds its secret scrubber."""
    if fn not in _REDACTORS:
        _REDACTORS.append(fn)


def redacted(text: str) -> str:
    """``text`` through every :func:`add_redactor` function."""
    for fn in _REDACTORS:
        text = fn(text)
    return text


def redact_exception(e: BaseException | None) -> BaseException | None:
    """``e`` with its message redacted in place (its ``args`` and text attributes, and those of the exceptions
    it was raised from or during): a traceback printed from it shows no secret."""
    first, seen = e, set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.args = tuple(redacted(a) if isinstance(a, str) else a for a in e.args)
        for attr in ("msg", "message", "strerror", "filename", "filename2", "reason"):
            value = getattr(e, attr, None)
            if isinstance(value, str):
                try:
                    setattr(e, attr, redacted(value))
                except (AttributeError, TypeError):  # a read-only attribute
                    pass
        e = e.__cause__ or e.__context__
    return first


def one_line(fn: F) -> F:
    """Decorate a command's entry: a :class:`RaimError` or an :class:`OSError` becomes ``error: …`` on stderr
    and exit status :data:`EXIT_BAD_INPUT` (a traceback only with ``RAIM_DEBUG=1``); either way its message is
    :func:`redacted` first."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (RaimError, OSError) as e:
            if debug():
                redact_exception(e)
                raise
            print(f"error: {redacted(one_line_message(e))}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_BAD_INPUT) from None

    return wrapper  # type: ignore[return-value]


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the commands' one-line errors: a bad argument prints ``error: <prog>: <what>`` (and where
    to read the usage) on stderr, exit status :data:`EXIT_BAD_INPUT`, instead of the usage block then the error;
    ``<what>``, which quotes the arguments, is :func:`redacted`."""

    def error(self, message: str):
        print(
            f"error: {self.prog}: {redacted(' '.join(message.split()))} (usage: {self.prog} --help)",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(EXIT_BAD_INPUT)


_HYDRA_VALUE_FLAGS = frozenset(
    {
        "--config-path",
        "-cp",
        "--config-name",
        "-cn",
        "--config-dir",
        "-cd",
        "--cfg",
        "-c",
        "--package",
        "-p",
        "--experimental-rerun",
    }
)


def check_overrides(argv: list[str]) -> None:
    """Parse a Hydra command line's overrides with Hydra's own grammar before Hydra does: a bad one (a path with
    ``=``, a word split off by an unquoted space, an unclosed bracket, or a ``,`` that makes a value a sweep
    without ``--multirun``) prints one line ``error: override '<it>': <why> …`` and exits with
    :data:`EXIT_BAD_INPUT`, instead of Hydra's multi-line grammar error and exit status 1."""
    from hydra.core.override_parser.overrides_parser import OverridesParser  # imported here, not at start-up: hydra
    from hydra.errors import OverrideParseException  # imported here, not at start-up: hydra

    sweep = any(a in ("-m", "--multirun") for a in argv)
    overrides, skip = [], False
    for i, a in enumerate(argv):
        if skip or a.startswith("-"):
            skip = not skip and a in _HYDRA_VALUE_FLAGS
            continue
        if i and argv[i - 1] in ("--info", "-i") and "=" not in a:
            continue
        overrides.append(a)
    parser = OverridesParser.create()
    for a in overrides:
        try:
            (o,) = parser.parse_overrides([a])
            why = (
                None
                if sweep or not o.is_sweep_override()
                else "a ',' makes the value a list of values to sweep (add --multirun to sweep)"
            )
        except OverrideParseException as e:
            why = (
                "not key=value (a word split off by an unquoted space?)"
                if "=" not in a
                else " ".join(str(e).split("See https://")[0].split()) or "not an override"
            )
        if why:
            key = a.split("=", 1)[0] if "=" in a else "key"
            print(
                f"error: override {a!r}: {why}; a value holding ',', '=', spaces or brackets is quoted whole: "
                f"{key}='…' (https://hydra.cc/docs/advanced/override_grammar/basic)",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(EXIT_BAD_INPUT)


def checked_overrides(fn: F) -> F:
    """Decorate a ``@hydra.main`` entry (above it): the command line's overrides are checked first
    (:func:`check_overrides`) when it is called as a command, without arguments."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not args and not kwargs:
            check_overrides(sys.argv[1:])
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class MonitorError(RaimError):
    """A vote store, a stream or a setting the monitor cannot use; one line naming the record and the field."""
