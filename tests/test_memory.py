"""Memory between the datasets of a large table (src/core/memory.py and the ladder's loop over datasets): one
dataset's subset alive at a time, freed heap handed back to the system after each, and nothing kept by a
result beyond its own predictions."""

from __future__ import annotations

import ctypes.util
import sys
import threading

import numpy as np
import pytest
from test_ladder_intervals import _table

from src.core import ladder, ladderbase, memory
from src.core.aggregate import StackedLogit

GLIBC = sys.platform.startswith("linux") and ctypes.util.find_library("c") is not None


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_trim_returns_freed_heap_pages_to_the_system():
    """Blocks under glibc's mmap threshold live on the heap; with every tenth kept, the freed ones between them
    cannot be returned by the heap's own top-trimming, only by malloc_trim."""
    blocks = [bytearray(64 * 1024) for _ in range(3200)]  # ~200 MB of heap, every page touched
    kept = blocks[::10]
    del blocks
    before = _rss_mb()
    assert memory.trim() is True
    after = _rss_mb()
    assert before - after > 100, f"RSS {before:.0f} MB → {after:.0f} MB after trim"
    assert len(kept) == 320


def test_trim_returns_the_freed_pages_of_pyarrows_pool():
    """pandas' string columns live in pyarrow's own pool (mimalloc or jemalloc), which keeps the pages of freed
    columns for reuse; the C heap's malloc_trim does not reach them: building a large verdict table left ~240 MB
    resident before the analysis began."""
    pa = pytest.importorskip("pyarrow")
    pool = pa.default_memory_pool()
    before_build = _rss_mb()
    columns = [pa.array([f"item-{i:09d}-{j}" for i in range(400_000)]) for j in range(16)]  # ~130 MB in the pool
    assert pool.bytes_allocated() > 100 * 2**20
    del columns
    memory.trim()
    assert _rss_mb() - before_build < 60, f"RSS {before_build:.0f} MB before → {_rss_mb():.0f} MB after trim"


def test_the_ladder_trims_first_and_after_each_dataset_and_builds_one_subset_at_a_time(monkeypatch):
    table = _table(datasets=("a", "b", "c"))
    trims: list[int] = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append(1) or True)

    def no_dict(self):  # the ladder iterates the subsets; it does not build them all at once
        raise AssertionError("by_dataset() holds every subset at once")

    monkeypatch.setattr(type(table), "by_dataset", no_dict)
    results = ladder.analyze(table, StackedLogit(), ladderbase.LadderSettings(n_boot=50))
    assert sorted(results) == ["a", "b", "c"] and len(trims) == 4  # what building the table freed, then each


def test_each_dataset_yields_what_by_dataset_holds():
    table = _table(datasets=("a", "b"))
    lazy = table.each_dataset()
    assert not isinstance(lazy, dict)
    for (name, part), (name2, part2) in zip(lazy, table.by_dataset().items(), strict=True):
        assert name == name2 and np.array_equal(part.votes, part2.votes, equal_nan=True)


def test_a_result_keeps_no_view_of_the_whole_vote_matrix():
    table = _table(datasets=("a", "b"))
    results = ladder.analyze(table, StackedLogit(), ladderbase.LadderSettings(n_boot=50))
    for r in results.values():
        for name, pred in r.predictions.items():
            assert pred is None or pred.base is None or pred.base.size == pred.size, name


def test_a_per_array_value_is_computed_once_while_its_array_lives_and_goes_with_it():
    """The refit's fits share their design matrix's zᵀz and distinct rows: computed once per array (an equal copy
    is another array), a freed array's entry dropped first, at most ``keep`` held."""
    calls: list[int] = []
    per = memory.PerArray(lambda X: calls.append(1) or X.sum(), keep=3)
    a, b, c, d, e = np.ones(3), np.ones(3), np.arange(3.0), np.zeros(2), np.ones(1)
    assert (per(a), per(a), per(b), per(c), per(b)) == (3.0, 3.0, 3.0, 3.0, 3.0) and len(calls) == 3
    del b  # its entry goes before any live one
    per(d)
    assert per(a) == 3.0 and per(c) == 3.0 and len(calls) == 4
    assert all(seen() is x for (seen, _), x in zip(per._seen, (a, c, d), strict=True))
    per(e)  # a fourth live array: the oldest (a's) goes
    assert per(a) == 3.0 and len(calls) == 6


def test_a_last_call_is_remembered_per_thread():
    """Two threads handed different arrays each keep theirs: neither evicts the other's (the refit bootstrap's
    chunks on the analysis's threads, src.core.threads)."""
    calls = []
    shared = memory.LastCall(lambda a, b: calls.append(threading.current_thread().name) or a + b)
    mine, theirs = (np.ones(3), np.zeros(3)), (np.full(3, 2.0), np.zeros(3))
    shared(*mine)
    other = threading.Thread(target=shared, args=theirs, name="other")
    other.start()
    other.join()
    assert np.array_equal(shared(*mine), np.ones(3))
    assert calls == [threading.current_thread().name, "other"]  # the main thread's memory survived the other's call
