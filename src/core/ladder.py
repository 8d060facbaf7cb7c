"""The comparator ladder of Table 1, per dataset, with paired cluster-bootstrap deltas (§2, §3.1).

Ladder rungs, ordered by the labelled information they consume: ``avg_member``, ``majority``,
``dawid_skene`` (label-free); ``acc_weighted``, ``logodds_weighted`` (Appendix I); ``best_avg`` (one member
chosen by its mean κ over all datasets of the table, deployed everywhere), ``best_cv`` (chosen on each fold's
training clusters, scored out of fold), ``oracle`` (argmax on the scored set, re-taken on every bootstrap
draw); ``stacked`` (the RAIM panel); ``frontier`` when the table carries one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from sklearn.base import clone
from threadpoolctl import threadpool_limits

from src.core import admissibility
from src.core.aggregate import (
    BestSingle,
    DawidSkene,
    MajorityVote,
    StackedLogit,
    WeightedVote,
    cluster_folds,
    crossfit,
    eligible,
)
from src.core.decide import check_floor, decide
from src.core.errors import RaimError
from src.core.evaluate import (
    METRICS,
    ClusterBootstrap,
    Delta,
    best_single_call,
    coverage,
    from_counts,
    holm,
    indicators,
    interval,
    paired_delta,
)
from src.core.verdicts import ABSTAIN, VerdictTable

COMPARATORS = ("avg_member", "majority", "dawid_skene", "acc_weighted", "logodds_weighted",
               "best_avg", "best_cv", "oracle", "stacked", "frontier")
DELTA_METRICS = ("kappa", "bacc")


class AnalysisError(RaimError, ValueError):
    """A dataset the ladder cannot analyse (one gold class, too few clusters, no eligible single judge)."""


@dataclass
class LadderSettings:
    """Analysis settings (conf/analysis): folds, bootstrap and the admissibility operating point."""

    n_splits: int = 5
    seed: int = 0
    n_boot: int = 2000
    level: float = 0.95
    kappa0: float = 0.30
    c: float = 0.5
    phi0: float = 0.40
    core: list[str] = field(default_factory=list)
    features: list[str] = field(default_factory=list)  # continuous extras per member, e.g. ["logodds"]
    abstention_contrast: bool = True  # Table 23: categorical vs scalar abstention encoding
    min_coverage: float = 0.5  # a single-judge comparator (best_avg, best_cv, oracle) must answer this share
    kappa_floor: float = 0.40  # the κ a deployed panel or single judge must reach (src.decide); not κ₀


def _in(value, lo: float, hi: float, lo_open: bool, hi_open: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (lo < value if lo_open else lo <= value) and (value < hi if hi_open else value <= hi)


def check_settings(s: LadderSettings, stacker: StackedLogit) -> None:
    """Refuse settings the analysis cannot run with, in one line naming the config key."""
    inf = float("inf")
    rules = [("analysis.n_splits", s.n_splits, 2, inf, False, False), ("analysis.n_boot", s.n_boot, 1, inf, False, False),
             ("analysis.level", s.level, 0, 1, True, True), ("analysis.kappa0", s.kappa0, -1, 1, False, False),
             ("analysis.c", s.c, 0, 1, True, False), ("analysis.phi0", s.phi0, -1, 1, False, False),
             ("analysis.min_coverage", s.min_coverage, 0, 1, False, False),
             ("stacker.C", stacker.C, 0, inf, True, True), ("stacker.threshold", stacker.threshold, 0, 1, True, True)]
    for key, value, lo, hi, lo_open, hi_open in rules:
        whole = key in ("analysis.n_splits", "analysis.n_boot")
        if not _in(value, lo, hi, lo_open, hi_open) or (whole and not isinstance(value, int)):
            want = f"an integer ≥ {lo}" if whole else f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
            raise AnalysisError(f"{key}={value!r}: must be {want}")
    check_floor(s.kappa_floor)  # the deployment floor's own rule (src.decide), before any work
    if stacker.abstention not in ("scalar", "category"):
        raise AnalysisError(f"stacker.abstention={stacker.abstention!r}: must be 'scalar' or 'category'")


@dataclass
class DatasetResult:
    """Everything computed for one dataset: the JSON-able summary and the fitted objects."""

    summary: dict
    stacker: StackedLogit  # refitted on all items of the dataset (the deployable meta-learner)
    oof_proba: np.ndarray
    predictions: dict[str, np.ndarray]
    feature_names: list[str]
    members: list[str]  # the stacker's vote columns, in order: the members that voted on this dataset


def design_matrix(table: VerdictTable, features: list[str]) -> tuple[np.ndarray, list[str]]:
    """Votes, then the requested continuous extras of each member (missing ones are an error)."""
    extras, names = [], []
    for feat in features:
        for m in table.members:
            key = f"{m}@{feat}"
            if key not in table.features:
                raise KeyError(f"{table.source}: stacker feature '{key}' requested but the table has no such column")
            extras.append(table.features[key])
            names.append(key)
    X = np.column_stack([table.votes] + extras) if extras else table.votes
    return X, names


def best_on_average(table: VerdictTable, min_coverage: float = 0.5) -> tuple[str | None, dict[str, str]]:
    """The member with the highest mean κ across the table's datasets (Table 15 'best-on-average': one judge
    deployed everywhere), among the members that answer at least ``min_coverage`` of the items of *every*
    dataset. Returns (its name or None when no member qualifies, {ineligible member: why})."""
    parts = table.by_dataset()
    kappas = np.array([admissibility.member_kappas(t.gold, t.votes) for t in parts.values()])
    covs = np.array([coverage(t.votes) for t in parts.values()])
    ok = np.all([eligible(t.votes, min_coverage) for t in parts.values()], axis=0)
    why = {}
    for j in np.flatnonzero(~ok):
        d = int(np.argmin(covs[:, j]))
        why[table.members[j]] = f"coverage {covs[d, j]:.3f} < {min_coverage:g} on {list(parts)[d]}"
    if not ok.any():
        return None, why
    return table.members[int(np.argmax(np.where(ok, kappas.mean(axis=0), -np.inf)))], why


def active_members(table: VerdictTable) -> tuple[VerdictTable, list[str]]:
    """Drop members with no verdict at all on this dataset (never run, or unable to judge it, e.g. an evidence
    judge on an ungrounded set): they carry no information, and the admissibility share counts judges that
    judged. Returns the reduced table and the excluded names."""
    voted = coverage(table.votes) > 0
    excluded = [m for m, v in zip(table.members, voted) if not v]
    if voted.all():
        return table, []
    if not voted.any():
        raise AnalysisError("no member returned a single verdict on this dataset")
    return table.subset(np.ones(len(table.gold), bool), [m for m, v in zip(table.members, voted) if v]), excluded


def single_judge_eligibility(table: VerdictTable, min_coverage: float) -> tuple[np.ndarray, dict[str, str]]:
    """Which members may be a single-judge comparator on this dataset (best_cv, oracle), and why not."""
    ok = eligible(table.votes, min_coverage)
    cov = coverage(table.votes)
    why = {m: f"coverage {c:.3f} < {min_coverage:g}" for m, c, e in zip(table.members, cov, ok) if not e}
    if not ok.any():
        raise AnalysisError(f"no member answers at least {min_coverage:g} of the items (coverage: "
                            + ", ".join(f"{m} {c:.2f}" for m, c in zip(table.members, cov))
                            + "); no single judge can be compared (analysis.min_coverage sets the share)")
    return ok, why


def checked_folds(y: np.ndarray, clusters: np.ndarray, s: LadderSettings) -> list[tuple]:
    """The cluster folds (§2), refusing a split whose training part misses a gold class."""
    try:
        folds = cluster_folds(y, clusters, s.n_splits, s.seed)
    except ValueError as e:
        raise AnalysisError(str(e)) from None
    for k, (tr, _) in enumerate(folds):
        if len(np.unique(y[tr])) < 2:
            per = {c: len(np.unique(clusters[y == c])) for c in (0, 1)}
            raise AnalysisError(f"fold {k}'s training clusters hold a single gold class; {s.n_splits}-fold "
                                f"cross-fitting needs more clusters of each class (supported: {per[0]}, "
                                f"hallucinated: {per[1]})")
    return folds


def analyze_dataset(table: VerdictTable, stacker: StackedLogit, s: LadderSettings,
                    best_avg: str | None, folds: list[tuple] | None = None) -> DatasetResult:
    """The whole ladder on one dataset (members that never voted on it are set aside and listed; members
    below ``s.min_coverage`` are not eligible as a single-judge comparator, and listed with the reason).
    ``folds``: the dataset's cluster folds when already computed (:func:`dataset_folds`)."""
    best_avg_votes = None if best_avg is None else table.votes[:, table.members.index(best_avg)]
    table, excluded = active_members(table)
    y, clusters, votes = table.gold, table.clusters, table.votes
    ok, ineligible = single_judge_eligibility(table, s.min_coverage)
    X, extra_names = design_matrix(table, s.features)
    stacker = clone(stacker).set_params(n_votes=votes.shape[1])
    folds = checked_folds(y, clusters, s) if folds is None else folds
    stk = crossfit(stacker, X, y, folds)
    try:
        cv = crossfit(BestSingle(min_coverage=s.min_coverage), votes, y, folds)
    except ValueError as e:
        raise AnalysisError(f"CV-best single: {e} (analysis.min_coverage)") from None
    preds = {
        "stacked": stk.pred,
        "majority": MajorityVote().fit(votes).predict(votes).astype(float),
        "dawid_skene": DawidSkene().fit(votes).predict(votes).astype(float),
        "acc_weighted": crossfit(WeightedVote("accuracy"), votes, y, folds).pred,
        "logodds_weighted": crossfit(WeightedVote("logodds"), votes, y, folds).pred,
        "best_cv": cv.pred,
    }
    if best_avg_votes is not None:
        preds["best_avg"] = best_avg_votes
    if table.has_frontier:
        preds["frontier"] = table.frontier
    alt = _other_encoding(X, y, folds, stacker) if s.abstention_contrast else None
    named = list(preds)
    K = votes.shape[1]
    P = np.column_stack([preds[k] for k in named] + [votes] + ([] if alt is None else [alt]))
    full = from_counts(np.stack([indicators(y, P[:, p]).sum(0) for p in range(P.shape[1])]))
    draws = ClusterBootstrap(clusters, s.n_boot, s.seed).metrics(y, P)  # one pass over the draws
    full_m = {k: v[len(named):len(named) + K] for k, v in full.items()}
    draw_m = {k: v[:, len(named):len(named) + K] for k, v in draws.items()}
    oracle_full = int(np.argmax(np.where(ok, full_m["kappa"], -np.inf)))
    oracle_draw = np.argmax(np.where(ok[None, :], draw_m["kappa"], -np.inf), axis=1)
    est = {name: {m: full[m][i] for m in METRICS} for i, name in enumerate(named)}
    dist = {name: {m: draws[m][:, i] for m in METRICS} for i, name in enumerate(named)}
    est["avg_member"] = {m: float(full_m[m].mean()) for m in METRICS}
    dist["avg_member"] = {m: draw_m[m].mean(axis=1) for m in METRICS}
    est["oracle"] = {m: float(full_m[m][oracle_full]) for m in METRICS}
    dist["oracle"] = {m: draw_m[m][np.arange(len(oracle_draw)), oracle_draw] for m in METRICS}
    comparators = {
        c: {m: {"estimate": float(est[c][m]), "ci": interval(dist[c][m], s.level)} for m in METRICS}
        for c in COMPARATORS if c in est
    }
    deltas = {
        c: {m: paired_delta(est["stacked"][m] - est[c][m], dist["stacked"][m] - dist[c][m], s.level)
            for m in DELTA_METRICS}
        for c in COMPARATORS if c in est and c != "stacked"
    }
    deltas["best_cv"]["kappa"].call = best_single_call(deltas["best_cv"]["kappa"], deltas["oracle"]["kappa"])
    names = stacker.feature_names(table.members, extra_names)
    betas = [dict(zip(["intercept"] + names, [e.intercept_, *e.coef_])) for e in stk.estimators]
    final = clone(stacker).fit(X, y)
    members = {
        m: {"kappa": float(full_m["kappa"][j]), "bacc": float(full_m["bacc"][j]), "f1": float(full_m["f1"][j]),
            "coverage": float(coverage(votes[:, j:j + 1])[0]), "abstentions": int(np.sum(votes[:, j] == ABSTAIN))}
        for j, m in enumerate(table.members)
    }
    adm = admissibility.test(y, votes, s.kappa0, s.c, s.phi0)
    summary = {
        "n": int(len(y)),
        "n_clusters": int(len(np.unique(clusters))),
        "excluded_members": excluded,
        "balance": {"supported": int(np.sum(y == 0)), "hallucinated": int(np.sum(y == 1))},
        "abstentions": {"count": int(np.sum(votes == ABSTAIN)), "rate": float(np.mean(votes == ABSTAIN))},
        "comparators": comparators,
        "deltas": {c: {m: d.as_dict() for m, d in v.items()} for c, v in deltas.items()},
        "stacker": {
            "features": names,
            "beta_mean": {k: float(np.mean([b[k] for b in betas])) for k in betas[0]},
            "beta_folds": [{k: float(v) for k, v in b.items()} for b in betas],
            "beta_full": dict(zip(["intercept"] + names, map(float, [final.intercept_, *final.coef_]))),
            "params": {k: v for k, v in stacker.get_params().items()},
        },
        "members": members,
        "selected": {
            "best_avg": best_avg,
            "best_cv_per_fold": [table.members[e.best_] for e in cv.estimators],
            "oracle": table.members[oracle_full],
            "min_coverage": s.min_coverage,
            "ineligible": ineligible,
        },
        "admissibility": adm.as_dict(),
    }
    if alt is not None:
        i = named.index("stacked")
        summary["abstention_contrast"] = _abstention_contrast(
            stacker, stk.pred, alt, (full["kappa"][i], full["kappa"][-1]), (draws["kappa"][:, i], draws["kappa"][:, -1]),
            s.level)
    return DatasetResult(summary, final, stk.proba, preds, names, list(table.members))


def _other_encoding(X, y, folds, stacker) -> np.ndarray:
    """Table 23's other arm: the same stacker, folds and items with the other abstention encoding."""
    other = "category" if stacker.abstention == "scalar" else "scalar"
    return crossfit(clone(stacker).set_params(abstention=other), X, y, folds).pred


def _abstention_contrast(stacker, reported, alt, full: tuple, draws: tuple, level: float) -> dict:
    """Table 23: abstention as a category against 0.5 (same folds and draws); ``full`` / ``draws`` hold κ of the
    reported arm and of the other one, in that order."""
    cat_first = stacker.abstention == "scalar"  # the reported arm is the scalar one
    (k_cat, k_sca), (d_cat, d_sca) = ((full[1], full[0]), (draws[1], draws[0])) if cat_first else (full, draws)
    d = paired_delta(float(k_cat - k_sca), d_cat - d_sca, level)
    return {"kappa_scalar": float(k_sca), "kappa_category": float(k_cat),
            "delta_category_minus_scalar": d.as_dict(), "moved": int(np.sum(reported != alt))}


def dataset_folds(table: VerdictTable, s: LadderSettings) -> dict[str, list[tuple]]:
    """Each dataset's cluster folds (§2), computed once, for callers that run the ladder and the analysis suite
    on the same table (both take them)."""
    out = {}
    for name, t in table.by_dataset().items():
        try:
            out[name] = checked_folds(t.gold, t.clusters, s)
        except AnalysisError as e:
            raise AnalysisError(f"{table.source}: dataset {name!r}: {e}") from e
    return out


def analyze(table: VerdictTable, stacker: StackedLogit, s: LadderSettings,
            folds: dict[str, list[tuple]] | None = None) -> dict[str, DatasetResult]:
    """Every dataset of the table, then Holm over the configured core datasets for each comparator.

    ``folds``: :func:`dataset_folds` of the table when the caller has them (else each dataset's are computed
    as it is analysed). BLAS runs on one thread here: the products are small, and threads contending for
    shared cores multiply the time."""

    check_settings(s, stacker)
    with threadpool_limits(1):
        best_avg, avg_ineligible = best_on_average(table, s.min_coverage)
        results = {}
        for name, t in table.by_dataset().items():
            if len(np.unique(t.gold)) < 2:
                raise AnalysisError(f"{table.source}: dataset {name!r} has a single gold class; the ladder needs both")
            try:
                results[name] = analyze_dataset(t, stacker, s, best_avg, None if folds is None else folds[name])
            except AnalysisError as e:
                raise AnalysisError(f"{table.source}: dataset {name!r}: {e}") from e
            results[name].summary["selected"]["best_avg_ineligible"] = avg_ineligible
    _apply_holm(results, s.core)
    return results


def _apply_holm(results: dict[str, DatasetResult], core: list[str]) -> None:
    family = [d for d in results if d in core] or list(results)
    comps = {c for r in results.values() for c in r.summary["deltas"]}
    for c in comps:
        for m in DELTA_METRICS:
            fam = [d for d in family if c in results[d].summary["deltas"]]
            adj = holm([results[d].summary["deltas"][c][m]["p_one_sided"] for d in fam])
            for d, p in zip(fam, adj):
                results[d].summary["deltas"][c][m]["p_holm"] = p
    for r in results.values():
        r.summary["holm_family"] = family


def to_json(results: dict[str, DatasetResult], s: LadderSettings, meta: dict | None = None) -> dict:
    """The machine-readable results.json document; each dataset opens with its decision (:mod:`src.core.decide`)."""
    return {
        "settings": dict(s.__dict__),
        "meta": meta or {},
        "datasets": {name: {"decision": decide(r.summary, s.kappa_floor).as_dict(), **r.summary}
                     for name, r in results.items()},
    }


__all__ = ["LadderSettings", "DatasetResult", "analyze", "analyze_dataset", "to_json", "Delta", "COMPARATORS"]
