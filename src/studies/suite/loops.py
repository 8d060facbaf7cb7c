"""Straightforward loop implementations of the suite's heavy analyses (the yardstick of the vectorised ones).

One scikit-learn stacker fit per (draw, budget, fold) or per (sub-)panel and fold, one
:func:`src.core.admissibility.test` per calibration sample, one bootstrap scoring per sub-panel on draws made once:
the obvious code.
Given the same generator they draw exactly what the vectorised functions draw, so tests compare the two
result for result, and ``bench/bench_suite.py`` times them against each other.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import clone

from src.core import admissibility
from src.core.aggregate import BestSingle, StackedLogit, crossfit
from src.core.evaluate import ClusterBootstrap, interval, kappa, paired_delta
from src.core.ladderbase import design_matrix
from src.studies.suite import common
from src.studies.suite.reference import Reference


def _fit_predict(stacker, X, y, tr, te) -> np.ndarray:
    if len(np.unique(y[tr])) < 2:  # one class drawn: predict it (as the batched fit does)
        return np.full(len(te), float(y[tr][0]))
    return clone(stacker).fit(X[tr], y[tr]).predict(X[te]).astype(float)


def regime_recovery(ref: Reference, budgets, n_draws, rng, kappa0, c, phi0) -> dict:
    t = ref.table
    ids, inv = common.cluster_index(t.clusters)
    out = {}
    for b in budgets:
        if b >= len(ids):
            out[str(b)] = None
            continue
        sel = common.draw_clusters(len(ids), b, n_draws, rng)
        match = []
        for r in range(n_draws):
            keep = sel[r][inv] > 0
            a = admissibility.test(t.gold[keep], t.votes[keep], kappa0, c, phi0)
            match.append(a.admissible == ref.admissibility.admissible)
        out[str(b)] = float(np.mean(match))
    return out


def learning_curve(ref: Reference, stacker: StackedLogit, features, budgets, n_draws, rng) -> dict:
    d, t = ref.design, ref.table
    X, _ = design_matrix(t, list(features))
    st = clone(stacker).set_params(n_votes=len(t.members))
    ids, inv = common.cluster_index(d.clusters)
    train_clusters = [np.unique(inv[tr]) for tr, _ in d.folds]
    feasible = [b for b in budgets if b <= min(len(tc) for tc in train_clusters)]
    pred = np.empty((len(feasible), n_draws, len(d.y)))
    for (_tr, te), tc in zip(d.folds, train_clusters):
        for i, b in enumerate(feasible):
            sel = common.draw_clusters(len(ids), b, n_draws, rng, pool=tc)
            for r in range(n_draws):
                pick = np.flatnonzero(sel[r][inv] > 0)
                pred[i, r, te] = _fit_predict(st, X, d.y, pick, te)
    return {str(b): float(np.mean([kappa(d.y, p) for p in pred[i]])) for i, b in enumerate(feasible)}


def stacked_kappa(ref: Reference, stacker: StackedLogit, members: list[int]) -> tuple[float, np.ndarray]:
    """Cross-fitted stacked κ of a member subset (one crossfit, as the ladder does)."""
    sub = ref.table.subset(np.ones(len(ref.gold), bool), [ref.table.members[j] for j in members])
    X, _ = design_matrix(sub, [])
    cf = crossfit(clone(stacker).set_params(n_votes=len(members)), X, ref.gold, ref.design.folds)
    return kappa(ref.gold, cf.pred), cf.pred


def leave_one_out(ref: Reference, stacker: StackedLogit, n_boot: int, seed: int, level: float) -> dict:
    """Δκ (without the member − full panel) per member with its paired interval, draws made once."""
    K = len(ref.table.members)
    boot = ClusterBootstrap(ref.table.clusters, n_boot, seed)
    full, full_pred = stacked_kappa(ref, stacker, list(range(K)))
    out = {}
    for j, m in enumerate(ref.table.members):
        k, pred = stacked_kappa(ref, stacker, [i for i in range(K) if i != j])
        draws = boot.metrics(ref.gold, np.column_stack([pred, full_pred]))["kappa"]
        out[m] = paired_delta(k - full, draws[:, 0] - draws[:, 1], level).as_dict()
    return out


def subpanels(ref: Reference, stacker: StackedLogit, subsets: np.ndarray, n_boot: int, seed: int, level: float) -> dict:
    y, votes = ref.gold, ref.table.votes
    boot = ClusterBootstrap(ref.table.clusters, n_boot, seed)
    ks, kb, lo = [], [], []
    for s in subsets:
        cols = list(np.flatnonzero(s))
        k, pred = stacked_kappa(ref, stacker, cols)
        best = crossfit(BestSingle(), votes[:, cols], y, ref.design.folds).pred
        draws = boot.metrics(y, np.column_stack([pred, best]))
        ks.append(k)
        kb.append(kappa(y, best))
        lo.append(interval(draws["kappa"][:, 0] - draws["kappa"][:, 1], level)[0])
    return {"stacked": np.array(ks), "best_cv": np.array(kb), "delta_lo": np.array(lo)}
