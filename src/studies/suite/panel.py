"""Which and how many members (Appendix B, Appendix E; Fig. 5, Fig. 6a, Fig. 8).

* :func:`size_curve` (Fig. 6a): stacked κ against panel size K, members added in a greedy decorrelating order
  (start from the most competent member, then add the member whose mean error correlation φ with those
  already in is lowest, ties to the more competent), the stacker refitted on the same folds at each K.
* :func:`leave_one_out` (Fig. 5): Δκ = stacked without the member − full stacked, on the same folds, with a
  paired cluster-bootstrap interval; a member whose removal clearly costs the panel is load-bearing.
* :func:`label_free` (Table 17): the label-free rungs (unweighted majority, Dawid–Skene) against the CV-best
  single, as paired deltas on the ladder's own bootstrap draws (same clusters, B and seed as results.json).
* :func:`transfer` (Fig. 8, Appendix E): the stacker fitted on every other dataset of the table and applied
  to the held-out one, against the in-domain cross-fitted stacker, the CV-best single and the average member.

Every refit of a member subset is one problem of a batched fit (:func:`common.oof_many` with feature masks).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import clone

from src.core import admissibility
from src.core.aggregate import DawidSkene, StackedLogit
from src.core.evaluate import kappa, paired_delta
from src.core.ladderbase import LadderSettings, design_matrix
from src.core.verdicts import at_or_over
from src.io.files import jsonable
from src.studies.suite import common
from src.studies.suite.reference import Reference


def greedy_order(member_kappa: np.ndarray, phi: np.ndarray) -> list[int]:
    """Greedy decorrelating order: most competent first, then lowest mean φ to the members already in."""
    K = len(member_kappa)
    order = [int(np.argmax(member_kappa))]
    while len(order) < K:
        rest = [j for j in range(K) if j not in order]
        mean_phi = [np.nanmean(phi[j, order]) if np.isfinite(phi[j, order]).any() else np.inf for j in rest]
        # lowest mean φ; ties → higher κ
        j = min(range(len(rest)), key=lambda i: (mean_phi[i], -member_kappa[rest[i]]))
        order.append(rest[j])
    return order


def size_curve(ref: Reference) -> dict:
    """Fig. 6a for one dataset."""
    t, d = ref.table, ref.design
    K = len(t.members)
    order = greedy_order(ref.member_kappa, ref.phi)
    subsets = np.zeros((K, K), bool)
    for k in range(K):
        subsets[k, order[: k + 1]] = True
    stacked = common.kappas(d.y, common.oof_many(d, mask=common.member_masks(d, subsets)))
    majority = common.kappas(d.y, np.array([at_or_over(t.votes[:, s].mean(axis=1)) for s in subsets], float))
    mean_phi = [None] + [
        jsonable(admissibility.phi_bar_from(ref.phi[np.ix_(order[:k], order[:k])][admissibility.pair_index(k)]))
        for k in range(2, K + 1)
    ]
    return {
        "order": [t.members[j] for j in order],
        "k": list(range(1, K + 1)),
        "stacked": stacked.tolist(),
        "majority": majority.tolist(),
        "phi_bar": mean_phi,
        "full_stacked": float(stacked[-1]),
        "best_single": float(ref.member_kappa.max()),
    }


def leave_one_out(ref: Reference, n_boot: int, seed: int, level: float) -> dict:
    """Fig. 5 for one dataset: Δκ per dropped member with its paired cluster-bootstrap interval."""
    t, d = ref.table, ref.design
    K = len(t.members)
    subsets = np.ones((K + 1, K), bool)
    subsets[np.arange(1, K + 1), np.arange(K)] = False  # row 0: full panel; row j+1: without member j
    preds = common.oof_many(d, mask=common.member_masks(d, subsets))
    full_k = common.kappas(d.y, preds)
    draws = ref.bootstrap(n_boot, seed).metrics(d.y, preds.T)["kappa"]
    out = {}
    for j, m in enumerate(t.members):
        delta = paired_delta(full_k[j + 1] - full_k[0], draws[:, j + 1] - draws[:, 0], level)
        out[m] = {**delta.as_dict(), "load_bearing": bool(delta.ci[1] < 0), "spare": bool(delta.ci[0] > 0)}
    most = min(out, key=lambda m: out[m]["estimate"])
    return {"full_stacked": float(full_k[0]), "members": out, "most_load_bearing": most}


def transfer(
    refs: dict[str, Reference], stacker: StackedLogit, s: LadderSettings, datasets: list[str], n_boot: int, seed: int
) -> dict:
    """Fig. 8: leave-one-dataset-out transfer of the stacker onto each of ``datasets`` (those in the table)."""
    names = list(refs)
    if len(names) < 2:
        return {}
    out = {}
    for target in [n for n in datasets if n in refs]:
        others = [n for n in names if n != target]
        Xs = [design_matrix(refs[n].table, list(s.features))[0] for n in others]
        ys = [refs[n].gold for n in others]
        ytr = np.concatenate(ys)
        if len(np.unique(ytr)) < 2:
            continue
        K = len(refs[target].table.members)
        est = clone(stacker).set_params(n_votes=K).fit(np.vstack(Xs), ytr)
        ref = refs[target]
        X, _ = design_matrix(ref.table, list(s.features))
        lodo = est.predict(X).astype(float)
        y = ref.gold
        draws = ref.bootstrap(n_boot, seed).metrics(y, np.column_stack([lodo, ref.stacked]))
        k_lodo, k_in = kappa(y, lodo), kappa(y, ref.stacked)
        d = paired_delta(k_lodo - k_in, draws["kappa"][:, 0] - draws["kappa"][:, 1])
        out[target] = {
            "in_domain": k_in,
            "lodo": k_lodo,
            "best_cv": kappa(y, ref.best_cv),
            "avg_member": float(ref.member_kappa.mean()),
            "delta_lodo_minus_in": d.as_dict(),
            "trained_on": others,
        }
    return out


def label_free(ref: Reference, n_boot: int, seed: int, level: float) -> dict:
    """Table 17's Δ(unw − best) and Δ(D–S − best), κ, with paired cluster-bootstrap intervals."""
    y, votes = ref.gold, ref.table.votes
    ds = DawidSkene().fit(votes).predict(votes).astype(float)
    P = np.column_stack([ref.majority, ds, ref.best_cv])
    k = ref.bootstrap(n_boot, seed).metrics(y, P)["kappa"]
    full = [kappa(y, P[:, i]) for i in range(3)]
    return {
        "majority_minus_best_cv": paired_delta(full[0] - full[2], k[:, 0] - k[:, 2], level).as_dict(),
        "dawid_skene_minus_best_cv": paired_delta(full[1] - full[2], k[:, 1] - k[:, 2], level).as_dict(),
    }
