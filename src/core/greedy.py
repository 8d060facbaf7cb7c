"""The greedy fold assignment of §2's cross-fitting compiled: :func:`src.core.aggregate.cluster_folds` replays
scikit-learn's ``StratifiedGroupKFold`` rule group by group, a sequential loop (each group's fold depends on every
earlier one) that costs ~2 s per 125,000 clusters in Python. :func:`assign` runs the same loop, operation for
operation in the same order (so every float, every ``np.isclose`` tie and hence every fold is the same), compiled
by numba; without numba, or below :data:`COMPILE_FROM` groups (compiling costs more than it saves), the Python
replay runs."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from src.core.compiled import njit

COMPILE_FROM = 20_000  # groups: from here on the compiled loop (its import and cached compile: ~0.5 s) pays off


def _kernel(rows: np.ndarray, order: np.ndarray, totals: np.ndarray, n_splits: int, out: np.ndarray) -> None:
    """:func:`src.core.aggregate._stratified_group_assignment`'s loop over arrays (written to compile)."""
    n_cls = totals.shape[0]
    counts = np.zeros((n_splits, n_cls))
    shares = np.zeros((n_cls, n_splits))
    sizes = np.zeros(n_splits)
    v = np.empty(n_splits)
    for g in order:
        best, min_eval, min_size = 0, math.inf, math.inf
        for i in range(n_splits):
            ev = 0.0
            for c in range(n_cls):
                v[:] = shares[c]
                v[i] = (counts[i, c] + rows[g, c]) / totals[c]
                m = v[0]
                for f in range(1, n_splits):
                    m += v[f]
                m /= n_splits
                ss = 0.0
                for f in range(n_splits):
                    d = v[f] - m
                    ss += d * d
                std = math.sqrt(ss / n_splits)
                ev = std if c == 0 else ev + std
            ev = ev / n_cls
            if ev < min_eval or (abs(ev - min_eval) <= 1e-8 + 1e-5 * abs(min_eval) and sizes[i] < min_size):
                best, min_eval, min_size = i, ev, sizes[i]
        size = 0.0
        for c in range(n_cls):
            counts[best, c] = counts[best, c] + rows[g, c]
            size += counts[best, c]
            shares[c, best] = counts[best, c] / totals[c]
        sizes[best] = size
        out[g] = best


def compiled() -> Callable | None:
    """The numba-compiled :func:`_kernel` (:func:`src.core.compiled.njit`); None without numba."""
    return njit(_kernel)


def assign(per_group: np.ndarray, y_cnt: np.ndarray, n_splits: int) -> np.ndarray | None:
    """The fold of each group (rows: class counts, in shuffled order) by the compiled loop; None when it is not
    worth compiling (fewer than :data:`COMPILE_FROM` groups) or numba is missing: the caller replays in Python."""
    kernel = compiled() if len(per_group) >= COMPILE_FROM else None
    if kernel is None:
        return None
    rows = np.ascontiguousarray(per_group, dtype=np.float64)
    order = np.argsort(-np.std(rows, axis=1), kind="stable").astype(np.int64)
    out = np.empty(len(rows), np.int64)
    kernel(rows, order, np.asarray(y_cnt, dtype=np.float64), int(n_splits), out)
    return out
