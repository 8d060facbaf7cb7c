"""Freed memory handed back to the operating system between the datasets of a large table.

An analysis frees most of what it allocates for one dataset before the next, but the C allocator (glibc's) keeps
the freed pages of its heap for reuse, so the resident size stays at the high-water mark of the datasets before
and the next dataset's peak lands on top of it. :func:`trim` asks the allocator to return those pages
(``malloc_trim(0)``); where there is no glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library, or none found)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def trim() -> bool:
    """Return the C heap's free pages to the operating system; True when the allocator could be asked."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
