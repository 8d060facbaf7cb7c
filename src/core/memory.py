"""Memory of a large table's analysis: freed pages handed back to the operating system between its datasets, and
values derived from an array kept only while that array lives.

An analysis frees most of what it allocates for one dataset before the next, but the C allocator (glibc's) keeps
the freed pages of its heap for reuse, so the resident size stays at the high-water mark of the datasets before
and the next dataset's peak lands on top of it. So does pyarrow's own memory pool (mimalloc or jemalloc), which holds
the freed pages of pandas' pyarrow-backed columns: building a 1M-row verdict table leaves ~240 MB of them.
:func:`trim` asks both to return those pages (``malloc_trim(0)``, and the pool's ``release_unused`` when pyarrow is
loaded); where there is no glibc the first does nothing. :class:`PerArray` computes a value of an array
once while the array lives (the refit bootstrap's fits share their design matrix's rows, :mod:`src.core.refit`), and
:class:`LastCall` a function of two arrays once while the same arrays come back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library, or none found)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def trim() -> bool:
    """Return the free pages of pyarrow's memory pool (when pyarrow is loaded: it is never imported here) and of the C
    heap to the operating system; True when the C allocator could be asked."""
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


class PerArray(Generic[T]):
    """``f(X)`` computed once per array while the array lives: entries are keyed by the array itself through a weak
    reference (never by ``id``, which a freed array's successor may reuse), an entry whose array was freed is
    dropped, and at most ``keep`` entries are held."""

    def __init__(self, f: Callable[[np.ndarray], T], keep: int = 4):
        self.f, self.keep = f, keep
        self._seen: list[tuple[weakref.ref, T]] = []

    def __call__(self, X: np.ndarray) -> T:
        for seen, value in self._seen:
            if seen() is X:
                return value
        value = self.f(X)
        live = [(seen, v) for seen, v in self._seen if seen() is not None]
        self._seen = live[max(0, len(live) - self.keep + 1) :] + [(weakref.ref(X), value)]
        return value


class LastCall:
    """``f(a, b)`` remembered for its last arguments (the same array objects, held while remembered), one memory per
    thread: two callers on a thread handed the same arrays in turn compute what they share once (the refit
    bootstrap's rungs, a fold's training weights: :mod:`src.core.refit`), and callers on other threads (the
    bootstrap's other chunks, :mod:`src.core.threads`) neither read nor evict it."""

    def __init__(self, f: Callable[[np.ndarray, np.ndarray], np.ndarray]):
        self.f = f
        self._local = threading.local()

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        last = getattr(self._local, "last", None)
        if last is None or last[0] is not a or last[1] is not b:
            last = self._local.last = (a, b, self.f(a, b))
        return last[2]
