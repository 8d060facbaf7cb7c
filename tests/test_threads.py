"""The analysis on several threads (src/core/threads.py): results in the order the work was handed out, the first
item on the calling thread, a worker's error raised at its turn, and the refit bootstrap giving the same bits on
one thread as on several."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from omegaconf import OmegaConf

from src.core import evaluate, ladder, ladderbase, refit, threads, verdicts
from src.core.aggregate import StackedLogit, cluster_folds
from src.core.errors import RaimError
from src.core.evaluate import ClusterBootstrap
from src.core.refit import DrawReader, RefitBootstrap
from src.core.threads import InOrder
from src.studies import simulate
from src.studies.suite import run_suite


def test_results_come_back_in_the_order_the_items_came_whatever_finishes_first():
    seen: list[str] = []

    def slow_first(i: int) -> int:
        seen.append(threading.current_thread().name)
        time.sleep(0.02 * (5 - i % 5))  # later items finish first
        return i * i

    pool = InOrder(slow_first, 3, first_alone=True)
    got = [r for i in range(12) for r in pool.put(i)] + pool.drain()
    assert got == [i * i for i in range(12)]
    assert seen[0] == threading.current_thread().name  # the first item on the calling thread
    assert any(name.startswith("raim-analysis") for name in seen[1:])  # the others on the workers


def test_no_more_items_are_in_flight_than_workers():
    pool = InOrder(lambda i: i, 2)
    assert pool.put(0) == [] and pool.put(1) == []  # two in flight
    assert pool.put(2) == [0]  # the third waits for the oldest
    assert pool.drain() == [1, 2]


def test_one_worker_computes_every_item_on_the_calling_thread():
    names = []
    pool = InOrder(lambda i: names.append(threading.current_thread().name) or i, 1)
    assert [pool.put(i) for i in range(3)] == [[0], [1], [2]] and pool.drain() == []
    assert set(names) == {threading.current_thread().name}


def test_a_workers_error_is_raised_at_its_turn_and_the_threads_end():
    def fails_on_two(i: int) -> int:
        if i == 2:
            raise ValueError("item 2")
        return i

    pool = InOrder(fails_on_two, 2)
    got = [r for i in range(4) for r in pool.put(i)]  # raises when item 2's turn comes, or in drain
    with pytest.raises(ValueError, match="item 2"):
        got += pool.drain()
    assert got == [0, 1] and pool._pool is None


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5"])
def test_a_bad_thread_count_is_one_line_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(threads.THREADS_ENV, raw)
    with pytest.raises(RaimError, match=f"{threads.THREADS_ENV}={raw!r}"):
        threads.count()


def test_the_thread_count_defaults_to_the_usable_cores(monkeypatch):
    monkeypatch.delenv(threads.THREADS_ENV, raising=False)
    assert threads.count() == threads.cores() >= 1
    monkeypatch.setenv(threads.THREADS_ENV, "3")
    assert threads.count() == 3


def small_parts(monkeypatch):
    """A few draws per chunk, so the refit bootstrap has many chunks to spread."""
    monkeypatch.setattr(refit, "MIN_CHUNK", 1)
    monkeypatch.setattr(refit, "PART_BYTES", 40_000)


def read_draws(gold, votes, clusters, n_boot=60):
    folds = cluster_folds(gold, clusters, 5, 0)
    rb = RefitBootstrap(gold, folds, ClusterBootstrap(clusters, n_boot, 4))
    rungs = {
        "stacked": rb.stacked(votes, 1.0, 0.5),
        "cv": rb.best_cv(votes, 0.5),
        "dep": rb.best_cv(votes, 0.5, as_deployed=True),
        "acc": rb.weighted(votes, "accuracy"),
    }
    full = {r: np.full(6, 20.0) for r in rungs}
    reader = DrawReader(rb, rungs, full)
    for w in rb.boot.chunks():
        reader.add(w)
    return reader, reader.result(), rb.choices(rungs["cv"]), rb.choices(rungs["dep"])


def test_the_refit_draws_are_the_same_bits_on_one_thread_and_on_several(monkeypatch):
    """Counts, the own term and the CV-best choices (kept in draw order, not in the order chunks finish)."""
    small_parts(monkeypatch)
    rng = np.random.default_rng(5)
    gold, votes = simulate.draw(rng, 80, 2, [0.8, 0.72, 0.66, 0.62, 0.6, 0.55], 0.3, 0.05)
    clusters = np.repeat(np.arange(80), 2)
    monkeypatch.setenv(threads.THREADS_ENV, "1")
    _, one, cv1, dep1 = read_draws(gold, votes, clusters)
    monkeypatch.setenv(threads.THREADS_ENV, "3")
    reader, many, cv3, dep3 = read_draws(gold, votes, clusters)
    assert reader.threads.workers == 3
    assert len(one.counts["stacked"]) == 60 and cv1.shape == (60, 5)
    for r in one.counts:
        assert np.array_equal(one.counts[r], many.counts[r])
    assert np.array_equal(one.own, many.own)
    assert np.array_equal(cv1, cv3) and np.array_equal(dep1, dep3) and np.array_equal(cv1, dep1)


def test_the_whole_analysis_writes_the_same_document_on_one_thread_and_on_two(monkeypatch):
    small_parts(monkeypatch)
    table = verdicts.validate(simulate.suite(2, 240, 5), frontier="frontier")
    s = ladderbase.LadderSettings(n_boot=80)
    docs = []
    for n in ("1", "2"):
        monkeypatch.setenv(threads.THREADS_ENV, n)
        docs.append(json.dumps(ladder.to_json(ladder.analyze(table, StackedLogit(), s), s)))
    assert docs[0] == docs[1]


def test_in_order_takes_an_item_only_when_a_thread_can_start_it():
    taken = []

    def items():
        for i in range(6):
            taken.append(i)
            yield i

    def first_is_slow(i: int) -> int:
        time.sleep(0.1 if i == 0 else 0)
        return i

    got = threads.in_order(first_is_slow, items(), 2)
    assert next(got) == 0
    assert taken == [0, 1, 2]  # two in flight and the one that waited for a thread
    assert list(got) == [1, 2, 3, 4, 5]


def record_datasets(monkeypatch):
    """Wrap the per-dataset analysis: how many run at once, and with how many refit threads."""
    seen = {"now": 0, "most": 0, "workers": set()}
    lock = threading.Lock()
    real = ladder.analyze_dataset

    def counted(*args):
        with lock:
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
            seen["workers"].add(args[-1])
        time.sleep(0.05)  # long enough for a second dataset to start beside it
        try:
            return real(*args)
        finally:
            with lock:
                seen["now"] -= 1

    monkeypatch.setattr(ladder, "analyze_dataset", counted)
    return seen


def test_small_datasets_are_analysed_side_by_side_each_refit_on_one_thread(monkeypatch):
    monkeypatch.setenv(threads.THREADS_ENV, "2")
    table = verdicts.validate(simulate.suite(3, 120, 4), frontier="frontier")
    assert ladder.side_by_side(table, 40)
    seen = record_datasets(monkeypatch)
    results = ladder.analyze(table, StackedLogit(), ladderbase.LadderSettings(n_boot=40))
    assert list(results) == table.datasets  # in the table's order, whatever finished first
    assert seen["most"] == 2 and seen["workers"] == {1}
    assert ladder.dataset_threads(table, 40) == (2, 1)


def test_a_large_tables_datasets_go_one_at_a_time_their_refits_on_the_threads(monkeypatch):
    """Where a dataset's bootstrap weights would not be kept whole, two datasets at once would double the memory."""
    monkeypatch.setenv(threads.THREADS_ENV, "2")
    monkeypatch.setattr(evaluate, "MAX_WEIGHT_BYTES", 40 * 8 * 40 - 1)  # B × clusters × 8 bytes, just over
    table = verdicts.validate(simulate.suite(2, 80, 4), frontier="frontier")
    assert not ladder.side_by_side(table, 40)
    seen = record_datasets(monkeypatch)
    ladder.analyze(table, StackedLogit(), ladderbase.LadderSettings(n_boot=40))
    assert seen["most"] == 1 and seen["workers"] == {None}  # None: the refit's chunks on every thread


def test_the_suite_writes_the_same_document_on_one_thread_and_on_two(monkeypatch):
    """Its datasets side by side (the rows, the sub-panels, the cascade): the same document but for the timings."""
    cfg = OmegaConf.to_container(
        OmegaConf.merge(OmegaConf.load("conf/suite/default.yaml"), OmegaConf.load("conf/suite/fast.yaml")), resolve=True
    )
    cfg.pop("defaults", None)
    cfg["budget"].update(draws=10, curve_draws=3, curve_budgets=[10, 25])
    cfg["mechanism"].update(subpanels=6, subpanel_boot=40)
    cfg["panel"]["n_boot"] = 40
    table = verdicts.validate(simulate.suite(3, 160, 5), frontier="frontier")
    s = ladderbase.LadderSettings(n_boot=40, core=table.datasets)
    docs = []
    for n in ("1", "2"):
        monkeypatch.setenv(threads.THREADS_ENV, n)
        doc = run_suite(table, StackedLogit(), s, cfg)
        assert set(doc.pop("timings")) >= {"cascade", "learning_curve", "subpanels"}
        docs.append(json.dumps(doc, sort_keys=True))
    assert ladder.dataset_threads(table, 40) == (2, 1)
    assert docs[0] == docs[1]


def test_a_chunk_in_flight_holds_its_counts_per_cell_not_the_weights():
    """What a thread refits is a chunk's draws × cells counts, computed as it is handed over: the draws × clusters
    weights are let go by the caller, not held by the chunks in flight."""
    rng = np.random.default_rng(6)
    gold, votes = simulate.draw(rng, 60, 2, [0.8, 0.7, 0.65, 0.6], 0.3, 0.05)
    clusters = np.repeat(np.arange(60), 2)
    rb = RefitBootstrap(gold, cluster_folds(gold, clusters, 5, 0), ClusterBootstrap(clusters, 30, 4))
    rungs = {"stacked": rb.stacked(votes, 1.0, 0.5)}
    cells = rb.cells(list(rungs.values()))
    (w,) = rb.boot.chunks()
    jobs = list(rb.parts(w, rungs, cells))
    assert sum(len(N) for N, _, _ in jobs) == len(w)
    assert all(N.shape[1] == len(cells) and not np.shares_memory(N, w) for N, _, _ in jobs)
