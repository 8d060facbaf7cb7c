"""Labelling budget (Appendix C; Tables 6 and 7, Fig. 6b).

* :func:`regime_recovery` (Table 6): per budget, R calibration samples of that many labelled records drawn as
  whole clusters; on each, both admissibility coordinates (members at κ ≥ κ₀, φ̄) are re-estimated and the
  call compared with the full-sample call. Also reported: how often each coordinate alone matches and how
  often the sample names the full-sample best member (the paper: 69% from 100 records).
* :func:`learning_curve` (Table 7, Fig. 6b): the stacker fitted on a budget of labelled records drawn within
  each of the reported stacker's folds' training clusters, out-of-fold predictions pooled over the folds
  before κ is taken, R draws per budget; against the label-free majority on the same folds.

A "labelled record" is a cluster (§2: the clustering unit; one source record on the paired sets). All draws
are vectorised: κ and φ of every draw come from one matrix product of the draw-selection matrix with
per-cluster counts, and the R × budgets stacker fits of a fold run as one batched Newton solve (identical draws,
e.g. those of a budget that takes every training cluster, fitted once).
"""

from __future__ import annotations

import numpy as np

from src.core import admissibility
from src.core.evaluate import from_counts, kappa
from src.studies.suite import common
from src.studies.suite.reference import Reference


def regime_recovery(
    ref: Reference, budgets: list[int], n_draws: int, rng: np.random.Generator, kappa0: float, c: float, phi0: float
) -> dict:
    """Table 6 for one dataset: Pr(call matches the full sample's) per budget (None when budget ≥ clusters)."""
    t = ref.table
    ids, per_cluster_k = common.cluster_sums(t.clusters, common.member_counts(t.gold, t.votes))
    _, per_cluster_p = common.cluster_sums(t.clusters, admissibility.pair_stats(t.gold, t.votes))
    nc, K = len(ids), t.votes.shape[1]
    full = ref.admissibility
    full_best = int(np.argmax(ref.member_kappa))
    competent_full = bool(admissibility.competent(full.members_at_kappa0, c, K))
    decorrelated_full = full.phi_bar is not None and bool(admissibility.within(full.phi_bar, phi0))
    rows = {}
    for b in budgets:
        if b >= nc:
            rows[str(b)] = None
            continue
        sel = common.draw_clusters(nc, b, n_draws, rng)
        mk = from_counts(np.tensordot(sel, per_cluster_k, axes=1))["kappa"]  # R × K
        pb = admissibility.phi_bar_from(admissibility.phi_from_stats(np.tensordot(sel, per_cluster_p, axes=1)))
        calls = admissibility.admits(mk, pb, kappa0, c, phi0, K)
        n_ok = admissibility.reaches(mk, kappa0).sum(axis=1)
        rows[str(b)] = {
            "p_match": float(np.mean(calls == full.admissible)),
            "p_competence_match": float(np.mean(admissibility.competent(n_ok, c, K) == competent_full)),
            "p_correlation_match": float(np.mean(admissibility.within(pb, phi0) == decorrelated_full)),
            "p_best_member": float(np.mean(np.argmax(mk, axis=1) == full_best)),
            "phi_bar_iqr": [float(v) for v in np.nanpercentile(pb, [25, 75])] if np.isfinite(pb).any() else None,
        }
    return {
        "n": int(len(t.gold)),
        "n_clusters": int(nc),
        "phi_bar": full.phi_bar,
        "spread": int(full.members_at_kappa0),
        "n_members": int(K),
        "admissible": bool(full.admissible),
        "best_member": t.members[full_best],
        "budgets": rows,
    }


def learning_curve(ref: Reference, budgets: list[int], n_draws: int, rng: np.random.Generator) -> dict:
    """Table 7 / Fig. 6b for one dataset: mean (and IQR) κ of the pooled out-of-fold stacker per budget."""
    d = ref.design
    ids, inv = common.cluster_index(d.clusters)
    nc = len(ids)
    train_clusters = [np.unique(inv[tr]) for tr, _ in d.folds]
    n_train = min(len(tc) for tc in train_clusters)
    feasible = [b for b in budgets if b <= n_train]
    full = common.oof_many(d)[0]
    majority = kappa(d.y, ref.majority)
    best_cv = kappa(d.y, ref.best_cv)
    rows = {str(b): None for b in budgets}
    if feasible:
        draws = []
        for tc in train_clusters:
            sel = np.concatenate([common.draw_clusters(nc, b, n_draws, rng, pool=tc) for b in feasible])
            draws.append(sel[:, inv])  # (budgets·R) × n item weights
        k = common.kappas(d.y, common.oof_many(d, draws=draws)).reshape(len(feasible), n_draws)
        for b, kb in zip(feasible, k):
            m = float(kb.mean())
            rows[str(b)] = {
                "mean": m,
                "sd": float(kb.std()),
                "iqr": [float(v) for v in np.percentile(kb, [25, 75])],
                "beats_majority": bool(m > majority),
                "beats_best_cv": bool(m > best_cv),
            }
    return {
        "train_records": int(n_train),
        "majority": float(majority),
        "best_cv": float(best_cv),
        "full": float(kappa(d.y, full)),
        "budgets": rows,
    }


def summarise_regime(per_dataset: dict[str, dict], budgets: list[int]) -> dict:
    """Mean Pr(call matches) per budget over the datasets where the budget is feasible (the paper's
    85.5% at 50 records, 91.9% at 100)."""
    out = {}
    for b in budgets:
        vals = [r["budgets"][str(b)] for r in per_dataset.values() if r["budgets"].get(str(b))]
        out[str(b)] = (
            None
            if not vals
            else {
                "p_match": float(np.mean([v["p_match"] for v in vals])),
                "p_best_member": float(np.mean([v["p_best_member"] for v in vals])),
                "datasets": len(vals),
            }
        )
    return out
