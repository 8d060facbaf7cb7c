"""Work spread over the cores this process may use, its results taken in the order it was handed out.

A table's small datasets (:func:`src.core.ladder.dataset_threads`), the ladder's label-fitted rungs and the refit
bootstrap's parts (chunks of draws, :mod:`src.core.refit`) are independent until their results are combined:
:class:`InOrder` computes them on a few threads while the caller goes on (drawing the next weights, say), and hands
the results back in the order the work came, so every sum is taken in the same order whatever the number of
threads (the same bits with 1 thread or 8). NumPy and BLAS release the interpreter's lock in their loops, so threads,
not processes: no copy of the table, nothing pickled. BLAS itself stays on one thread per worker (the analysis holds
it there): the products are small, and a part is the unit of work.

``RAIM_ANALYSIS_THREADS`` sets the number of threads (1: everything on the calling thread, as before); by default
it is the number of cores this process may use. It changes the time, never a result.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from src.core.errors import RaimError

T = TypeVar("T")
R = TypeVar("R")

THREADS_ENV = "RAIM_ANALYSIS_THREADS"


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on, sorted: its affinity (a container's or ``taskset``'s share, not the
    machine's) where the system has one, else every CPU."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def cores() -> int:
    """The cores this process may use (:func:`allowed_cpus`)."""
    return len(allowed_cpus())


def count() -> int:
    """The analysis's threads: ``RAIM_ANALYSIS_THREADS`` when set (a whole number ≥ 1), else :func:`cores`."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return cores()
    if not raw.isdigit() or int(raw) < 1:
        raise RaimError(f"{THREADS_ENV}={raw!r}: the analysis's threads must be a whole number ≥ 1")
    return int(raw)


class InOrder(Generic[T, R]):
    """``fn`` over the items handed to :meth:`put`, on ``workers`` threads, with at most ``workers`` items in flight;
    the results come back (from :meth:`put` as they are due, the rest from :meth:`drain`) in the items' order.

    With ``first_alone`` the first item is computed on the calling thread before any other starts, so state a
    computation sets up on its first call (a fit's starting point, say) is set by the first item whatever the
    number of threads. With ``workers`` 1 every item is computed on the calling thread, in :meth:`put`. A worker's
    exception is raised in the caller, at the item's turn; the other items in flight are cancelled or finished,
    never left running."""

    def __init__(self, fn: Callable[[T], R], workers: int, first_alone: bool = False):
        self.fn, self.workers = fn, workers
        self._pending: deque[Future] = deque()
        self._pool: ThreadPoolExecutor | None = None
        self._first = first_alone

    def put(self, item: T) -> list[R]:
        """Hand ``item`` over; returns the results now due (in order; none while items are in flight below the
        bound)."""
        if self.workers <= 1 or self._first:
            self._first = False
            return [self.fn(item)]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="raim-analysis")
        self._pending.append(self._pool.submit(self.fn, item))
        due = []
        while len(self._pending) > self.workers:
            due.append(self._result())
        return due

    def drain(self) -> list[R]:
        """Every result still in flight, in order; the threads end."""
        try:
            return [self._result() for _ in range(len(self._pending))]
        finally:
            self.close()

    def close(self) -> None:
        """Cancel what has not started, wait for what has, end the threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending.clear()

    def _result(self) -> R:
        try:
            return self._pending.popleft().result()
        except BaseException:
            self.close()
            raise


def in_order(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """``fn`` over ``items`` on ``workers`` threads (:class:`InOrder`), each result as soon as it is due, in the
    items' order; an item is taken from ``items`` only when at most ``workers`` are in flight (with 1 worker, one at
    a time: a large table's datasets are never held together)."""
    pool: InOrder[T, R] = InOrder(fn, workers)
    for item in items:
        yield from pool.put(item)
    yield from pool.drain()
