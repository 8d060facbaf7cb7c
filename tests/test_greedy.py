"""The compiled fold assignment (src/core/greedy.py): the same folds as scikit-learn's StratifiedGroupKFold and as
the Python replay, on random tables and on the benchmarks' simulated load, and it is what many clusters run."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.model_selection import StratifiedGroupKFold
from test_aggregate import FOLD_SHAPES

from src.core import aggregate, greedy
from src.core.aggregate import cluster_folds
from src.studies import simulate

pytest.importorskip("numba")


def sklearn_folds(y, groups, n_splits, seed):
    cv = StratifiedGroupKFold(n_splits, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # sklearn: a class smaller than n_splits
        return list(cv.split(np.zeros(len(y)), y, groups))


def assert_same(got, ref):
    assert len(got) == len(ref)
    for (tr, te), (rtr, rte) in zip(got, ref):
        assert np.array_equal(tr, rtr) and np.array_equal(te, rte)


@pytest.mark.parametrize("n_clusters,largest,classes,n_splits,seed,paired", FOLD_SHAPES)
def test_compiled_folds_equal_sklearn_on_random_tables(
    monkeypatch, n_clusters, largest, classes, n_splits, seed, paired
):
    monkeypatch.setattr(greedy, "COMPILE_FROM", 0)  # the compiled loop even for small tables
    rng = np.random.default_rng(n_clusters + seed)
    groups = np.repeat(rng.permutation(n_clusters) * 3 + 1, rng.integers(1, largest + 1, n_clusters))
    y = np.resize([0, 1], len(groups)) if paired else rng.integers(0, classes, len(groups))
    assert_same(cluster_folds(y, groups, n_splits, seed), sklearn_folds(y, groups, n_splits, seed))


@pytest.mark.parametrize("n_items,seed", [(42_000, 3)])
@pytest.mark.slow
def test_compiled_folds_equal_sklearn_on_the_benchmark_load(n_items, seed):
    """A dataset of bench/bench_memory.py's table (items in pairs of clusters: 21,000 clusters, above
    COMPILE_FROM: the compiled path), and the same clusters with gold redrawn (groups of every class mix)."""
    t = simulate.table("bench", n_clusters=n_items // 2, per_cluster=2, seed=seed)
    assert len(np.unique(t.clusters)) >= greedy.COMPILE_FROM
    assert_same(cluster_folds(t.gold, t.clusters, 5, seed), sklearn_folds(t.gold, t.clusters, 5, seed))
    y = np.random.default_rng(seed).integers(0, 2, len(t.gold))
    assert_same(cluster_folds(y, t.clusters, 5, seed), sklearn_folds(y, t.clusters, 5, seed))


def test_many_clusters_run_the_compiled_loop_not_the_python_replay(monkeypatch):
    def replay(*a):
        raise AssertionError("the Python replay ran on a table of many clusters")

    monkeypatch.setattr(aggregate, "_stratified_group_assignment", replay)
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(greedy.COMPILE_FROM), 2)
    y = rng.integers(0, 2, len(groups))
    folds = cluster_folds(y, groups, 5, 0)
    assert sorted(np.concatenate([te for _, te in folds]).tolist()) == list(range(len(y)))


def test_compiled_and_python_replay_agree_with_three_classes():
    rng = np.random.default_rng(7)
    per_group = rng.integers(0, 4, (greedy.COMPILE_FROM, 3)).astype(float)
    per_group[per_group.sum(1) == 0, 0] = 1
    y_cnt = per_group.sum(0).astype(int)
    assert np.array_equal(
        greedy.assign(per_group, y_cnt, 5), aggregate._stratified_group_assignment(per_group, y_cnt, 5)
    )
