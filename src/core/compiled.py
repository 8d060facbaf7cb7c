"""Loops compiled by numba where it is installed (the fold assignment of :mod:`src.core.greedy`, the bootstrap's
picks of :func:`src.core.evaluate.multiplicities`): each is written as plain Python over arrays, so without numba,
or for inputs too small to pay for the compile, the caller runs its numpy equivalent, with the same results."""

from __future__ import annotations

from collections.abc import Callable

_COMPILED: dict[Callable, Callable | None] = {}


def njit(fn: Callable) -> Callable | None:
    """``fn`` compiled by numba, once per process (and cached on disk beside its module); None without numba."""
    if fn not in _COMPILED:
        try:
            import numba  # imported here, not at start-up: numba ~0.4 s, only for large tables
        except ImportError:
            _COMPILED[fn] = None
        else:
            _COMPILED[fn] = numba.njit(cache=True, nogil=True)(fn)
    return _COMPILED[fn]
