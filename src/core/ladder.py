"""The comparator ladder of Table 1, per dataset, with paired cluster-bootstrap deltas (§2, §3.1).

The deltas and intervals that calls and decisions read refit, in every bootstrap draw, what was fitted to the labels
(the stacker, the CV-best choice, the weighted votes), with each cluster's own refit noise taken out of the
variance (:mod:`src.core.refit`, docs/intervals.md); the paper's fixed-prediction ones are kept beside them
(``deltas_fixed``, ``ci_fixed``).

Ladder rungs, ordered by the labelled information they consume: ``avg_member``, ``majority``,
``dawid_skene`` (label-free); ``acc_weighted``, ``logodds_weighted`` (Appendix I); ``best_avg`` (one member
chosen by its mean κ over all datasets of the table, deployed everywhere), ``best_cv`` (chosen on each fold's
training clusters, scored out of fold), ``oracle`` (argmax on the scored set, re-taken on every bootstrap
draw); ``stacked`` (the RAIM panel); ``frontier`` when the table carries one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import clone
from threadpoolctl import threadpool_limits

from src.core import admissibility, evaluate, memory, threads
from src.core.aggregate import (
    BestSingle,
    DawidSkene,
    MajorityVote,
    StackedLogit,
    WeightedVote,
    crossfit,
    reported_beta,
)
from src.core.decide import decide
from src.core.evaluate import (
    METRICS,
    ClusterBootstrap,
    Delta,
    best_single_call,
    call_for,
    coverage,
    deployed,
    evidence,
    from_counts,
    holm,
    indicators,
    interval,
    paired_delta,
)
from src.core.intervals import (
    corrected_interval,
    corrected_variance,
    fisher_interval,
    normal_interval,
    unseen_discordance,
)
from src.core.ladderbase import (
    COMPARATORS,
    DELTA_METRICS,
    AnalysisError,
    DatasetResult,
    LadderSettings,
    active_members,
    best_on_average,
    check_settings,
    checked_folds,
    cluster_numbers,
    design_matrix,
    single_judge_eligibility,
)
from src.core.refit import DrawReader, RefitBootstrap, RefitDraws, Rung
from src.core.threads import in_order
from src.core.verdicts import ABSTAIN, VerdictTable


def analyze_dataset(
    table: VerdictTable,
    stacker: StackedLogit,
    s: LadderSettings,
    best_avg: str | None,
    folds: list[tuple] | None = None,
    workers: int | None = None,
) -> DatasetResult:
    """The whole ladder on one dataset (members that never voted on it are set aside and listed; members
    below ``s.min_coverage`` are not eligible as a single-judge comparator, and listed with the reason).
    ``folds``: the dataset's cluster folds when already computed (:func:`dataset_folds`); ``workers``: the threads
    of its label-fitted rungs' cross-fits and of its refit bootstrap (:class:`src.core.refit.DrawReader`; default
    :func:`src.core.threads.count`)."""
    # a copy, not a view: the result keeps it, and a view would keep the whole vote matrix alive with it
    best_avg_votes = None if best_avg is None else table.votes[:, table.members.index(best_avg)].copy()
    table, excluded = active_members(table)
    y, clusters, votes = table.gold, cluster_numbers(table), table.votes
    ok, ineligible = single_judge_eligibility(table, s.min_coverage)
    X, extra_names = design_matrix(table, s.features)
    stacker = clone(stacker).set_params(n_votes=votes.shape[1])
    folds = checked_folds(y, clusters, s) if folds is None else folds
    alt_stacker = _other_arm(stacker) if s.abstention_contrast else None
    fits = _fitted(
        {
            "stacked": lambda: crossfit(stacker, X, y, folds),
            "best_cv": lambda: _cv_best(votes, y, folds, s.min_coverage),
            "dawid_skene": lambda: DawidSkene().fit(votes).predict(votes).astype(float),
            "acc_weighted": lambda: crossfit(WeightedVote("accuracy"), votes, y, folds).pred,
            "logodds_weighted": lambda: crossfit(WeightedVote("logodds"), votes, y, folds).pred,
            "other_encoding": None if alt_stacker is None else lambda: crossfit(alt_stacker, X, y, folds).pred,
        },
        threads.count() if workers is None else workers,
    )
    stk, cv, alt = fits["stacked"], fits["best_cv"], fits.get("other_encoding")
    preds: dict[str, np.ndarray] = {
        "stacked": stk.pred,
        "majority": MajorityVote().fit(votes).predict(votes).astype(float),
        "dawid_skene": fits["dawid_skene"],
        "acc_weighted": fits["acc_weighted"],
        "logodds_weighted": fits["logodds_weighted"],
        "best_cv": cv.pred,
        "best_cv_deployed": deployed(cv.pred),
    }
    if best_avg_votes is not None:
        preds["best_avg"] = best_avg_votes
    if table.has_frontier and table.frontier is not None:  # has_frontier implies it; said for the type checker
        preds["frontier"] = table.frontier
    named = list(preds)
    K = votes.shape[1]
    P = np.column_stack([preds[k] for k in named] + [votes] + ([] if alt is None else [alt]))
    cells = np.stack([indicators(y, P[:, p]).sum(0) for p in range(P.shape[1])])
    full = from_counts(cells)
    boot = ClusterBootstrap(clusters, s.n_boot, s.seed)
    at = {**{k: cells[i] for i, k in enumerate(named)}, **({} if alt is None else {"other_encoding": cells[-1]})}
    rb = RefitBootstrap(y, folds, boot)
    reader = DrawReader(rb, refit_rungs(rb, stacker, X, votes, s.min_coverage, alt_stacker), at, workers)
    tables = [boot.per_row(y, P), admissibility.cluster_pair_stats(boot, y, votes)]
    del P  # n × (comparators + members) doubles, read only by the tables: not held over the draws
    # one pass over the draws: the fixed predictions' counts, the members' pair statistics, the refits
    raw, pair_draws = boot.sweep(tables, (reader.add,))
    del tables
    draws = from_counts(ClusterBootstrap.unpack(raw))
    rd = reader.result()
    refit = {r: from_counts(c) for r, c in rd.counts.items()}
    full_m = {k: v[len(named) : len(named) + K] for k, v in full.items()}
    draw_m = {k: v[:, len(named) : len(named) + K] for k, v in draws.items()}
    oracle_full = int(np.argmax(np.where(ok, full_m["kappa"], -np.inf)))
    oracle_draw = np.argmax(np.where(ok[None, :], draw_m["kappa"], -np.inf), axis=1)
    est = {name: {m: full[m][i] for m in METRICS} for i, name in enumerate(named)}
    fixed = {name: {m: draws[m][:, i] for m in METRICS} for i, name in enumerate(named)}
    est["avg_member"] = {m: float(full_m[m].mean()) for m in METRICS}
    fixed["avg_member"] = {m: draw_m[m].mean(axis=1) for m in METRICS}
    est["oracle"] = {m: float(full_m[m][oracle_full]) for m in METRICS}
    fixed["oracle"] = {m: draw_m[m][np.arange(len(oracle_draw)), oracle_draw] for m in METRICS}
    comparators = {
        c: {
            m: {
                "estimate": float(est[c][m]),
                "ci": (
                    refit_ci(m, est[c][m], refit[c][m], fixed[c][m], rd.correction({(c, m): 1.0}), s.level, True)
                    if c in refit
                    else interval(fixed[c][m], s.level)
                ),
                "ci_fixed": interval(fixed[c][m], s.level),
            }
            for m in METRICS
        }
        for c in COMPARATORS
        if c in est
    }
    single = {**{k: preds[k] for k in named if k != "stacked"}, "oracle": votes[:, oracle_full]}
    paired = {c: comparison(y, stk.pred, p, c, s.level) for c, p in single.items()}
    deltas = ladder_deltas(est, fixed, s.level, refit, rd, paired)
    deltas_fixed = ladder_deltas(est, fixed, s.level, paired=paired)
    names = stacker.feature_names(table.members, extra_names)
    betas = [dict(zip(["intercept"] + names, [e.intercept_, *e.coef_])) for e in stk.estimators]
    final = clone(stacker).fit(X, y)
    members: dict[str, dict[str, Any]] = {
        m: {
            "kappa": float(full_m["kappa"][j]),
            "kappa_ci": interval(draw_m["kappa"][:, j], s.level),
            "bacc": float(full_m["bacc"][j]),
            "f1": float(full_m["f1"][j]),
            "coverage": float(coverage(votes[:, j : j + 1])[0]),
            "abstentions": int(np.sum(votes[:, j] == ABSTAIN)),
        }
        for j, m in enumerate(table.members)
    }
    adm = admissibility.test(y, votes, s.kappa0, s.c, s.phi0).as_dict()
    adm["admitted_share"] = admissibility.share_admitted(pair_draws, draw_m["kappa"], s.kappa0, s.c, s.phi0)
    adm["members_uncertain"] = [m for m, v in members.items() if v["kappa_ci"][0] < s.kappa0 <= v["kappa_ci"][1]]
    summary = {
        "n": int(len(y)),
        "n_clusters": len(boot.cluster_ids),
        "excluded_members": excluded,
        "balance": {"supported": int(np.sum(y == 0)), "hallucinated": int(np.sum(y == 1))},
        "abstentions": {"count": int(np.sum(votes == ABSTAIN)), "rate": float(np.mean(votes == ABSTAIN))},
        "comparators": comparators,
        "deltas": {c: {m: d.as_dict() for m, d in v.items()} for c, v in deltas.items()},
        "deltas_fixed": {c: {m: d.as_dict() for m, d in v.items()} for c, v in deltas_fixed.items()},
        "bootstrap": {
            "n_boot": s.n_boot,
            "seed": s.seed,
            "interval": "refit_corrected",
            "refitted": sorted(refit),
            "fixed_predictions": sorted(set(fixed) - set(refit)),
        },
        "stacker": {
            "features": names,
            "beta_mean": {k: reported_beta(np.mean([b[k] for b in betas])) for k in betas[0]},
            "beta_folds": [{k: reported_beta(v) for k, v in b.items()} for b in betas],
            "beta_full": dict(zip(["intercept"] + names, map(reported_beta, [final.intercept_, *final.coef_]))),
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
        "admissibility": adm,
    }
    if alt is not None:
        i = named.index("stacked")
        summary["abstention_contrast"] = _abstention_contrast(
            stacker,
            stk.pred,
            alt,
            (full["kappa"][i], full["kappa"][-1]),
            contrast_delta(
                stacker,
                est["stacked"]["kappa"],
                full["kappa"][-1],
                refit,
                rd,
                fixed["stacked"]["kappa"],
                draws["kappa"][:, -1],
                s.level,
            ),
        )
    return DatasetResult(summary, final, stk.proba, preds, names, list(table.members))


def refit_ci(
    metric: str,
    estimate: float,
    draws: np.ndarray,
    fixed: np.ndarray,
    correction: float,
    level: float,
    fisher: bool = False,
) -> list[float]:
    """A metric's corrected refit interval (:func:`src.core.intervals.corrected_interval`: its refit ``draws``, its
    fixed-prediction ``fixed`` ones, the own term ``correction``), cut to the metric's range (κ in [−1, 1], bacc and
    F1 in [0, 1]); with ``fisher``, a κ's is normal on Fisher's atanh scale instead
    (:func:`src.core.intervals.fisher_interval`: the ladder's comparators, docs/intervals.md)."""
    ci, se, _ = corrected_interval(estimate, draws, fixed, correction, level)
    if fisher and metric == "kappa":
        return fisher_interval(estimate, se, level)
    lo = -1.0 if metric == "kappa" else 0.0
    return [float(min(max(ci[0], lo), 1.0)), float(min(max(ci[1], lo), 1.0))]


def refit_delta(
    estimate: float,
    draws: np.ndarray,
    held: np.ndarray,
    correction: float,
    level: float,
    unseen: float | None = None,
) -> Delta:
    """A paired Δ on its refit draws (``held``: the fixed-prediction draws, ``correction``: the own term of
    :meth:`src.core.refit.RefitDraws.correction`): the corrected normal interval, its one-sided p and call. With
    ``unseen`` (:func:`src.core.intervals.unseen_discordance`) its variance is never under the discordance floor,
    the fixed-prediction draws' variance plus ``unseen`` (``floored`` says whether the floor set it)."""
    var = corrected_variance(draws, held, correction)
    floor = None if unseen is None else float(np.var(held)) + unseen
    ci, se, p = normal_interval(estimate, var if floor is None else max(var, floor), level)
    return Delta(float(estimate), ci, p, call_for(ci), se=se, floored=None if floor is None else bool(floor > var))


def comparison(gold: np.ndarray, stacked: np.ndarray, other: np.ndarray, name: str, level: float) -> dict:
    """What a paired Δ (stacked − ``name``) rests on, from the two arms' verdicts: its evidence
    (:func:`src.core.evaluate.evidence`: the discordant items, each arm's abstentions) and, per metric, the
    variance of the discordance a sample of its size cannot rule out (:func:`src.core.intervals.unseen_discordance`)."""
    return {**evidence(stacked, other, ("stacked", name)), "unseen": unseen_discordance(gold, stacked, other, level)}


def ladder_deltas(
    est: dict,
    fixed: dict,
    level: float,
    refit: dict | None = None,
    rd: RefitDraws | None = None,
    paired: dict[str, dict] | None = None,
) -> dict[str, dict[str, Delta]]:
    """Every rung's paired Δ (stacked − rung) on κ and bacc (§2), and the call against the CV-best single (win /
    clean win against the oracle) and against it as deployed (``best_cv_deployed``, the same calls). Without ``refit``: the paper's paired cluster bootstrap of the fixed
    out-of-fold predictions (``fixed`` draws, percentile interval). With ``refit`` (the refitted rungs' metric
    draws) and ``rd`` (:class:`src.core.refit.RefitDraws`): each refitted rung's draws in place of its fixed ones,
    and the corrected normal interval of :func:`src.core.intervals.corrected_interval` (its standard error ``se``),
    never narrower than the discordance floor (:func:`refit_delta`) of ``paired`` (:func:`comparison`, per rung
    compared item by item; its evidence is recorded beside every Δ, refit or fixed)."""
    deltas: dict[str, dict[str, Delta]] = {}
    for c in COMPARATORS:
        if c not in est or c == "stacked":
            continue
        deltas[c] = {}
        ev = (paired or {}).get(c, {})
        for m in DELTA_METRICS:
            estimate = est["stacked"][m] - est[c][m]
            held = fixed["stacked"][m] - fixed[c][m]
            if refit is None:
                d = paired_delta(estimate, held, level)
            else:
                assert rd is not None, "refitted draws come with their RefitDraws"
                draws = refit["stacked"][m] - (refit[c][m] if c in refit else fixed[c][m])
                correction = rd.correction({("stacked", m): 1.0, (c, m): -1.0})
                d = refit_delta(estimate, draws, held, correction, level, ev["unseen"][m] if ev else None)
            d.discordant, d.abstentions = ev.get("discordant"), ev.get("abstentions")
            deltas[c][m] = d
    deltas["best_cv"]["kappa"].call = best_single_call(deltas["best_cv"]["kappa"], deltas["oracle"]["kappa"])
    if "best_cv_deployed" in deltas:
        deployed = deltas["best_cv_deployed"]["kappa"]
        deltas["best_cv_deployed"]["kappa"].call = best_single_call(deployed, deltas["oracle"]["kappa"])
    return deltas


def refit_rungs(
    refit: RefitBootstrap,
    stacker: StackedLogit,
    X: np.ndarray,
    votes: np.ndarray,
    min_coverage: float,
    other: StackedLogit | None = None,
) -> dict[str, Rung]:
    """The rungs fitted to the labels, as the refit bootstrap refits them on every draw (:mod:`src.core.refit`):
    the stacker (the plain one by the batched Newton fit, any other by its own fit), the CV-best single's choice,
    the two weighted votes, and ``other_encoding`` (Table 23's other arm) when ``other`` is given."""
    rungs = {
        "stacked": stacked_rung(refit, stacker, X),
        "best_cv": refit.best_cv(votes, min_coverage),
        "best_cv_deployed": refit.best_cv(votes, min_coverage, as_deployed=True),
        "acc_weighted": refit.weighted(votes, "accuracy"),
        "logodds_weighted": refit.weighted(votes, "logodds"),
    }
    if other is not None:
        rungs["other_encoding"] = stacked_rung(refit, other, X)
    return rungs


def stacked_rung(refit: RefitBootstrap, stacker: StackedLogit, X: np.ndarray) -> Rung:
    """The stacker as the refit bootstrap refits it on every draw: the plain one by the batched Newton fit, any
    other by its own fit."""
    if type(stacker) is StackedLogit:
        return refit.stacked(stacker.features(X), stacker.C, stacker.threshold)
    return refit.stacked_loop(stacker, X)


def refit_draws(
    refit: RefitBootstrap,
    stacker: StackedLogit,
    X: np.ndarray,
    votes: np.ndarray,
    min_coverage: float,
    full: dict[str, np.ndarray],
    other: StackedLogit | None = None,
) -> RefitDraws:
    """The bootstrap draws of :func:`refit_rungs`, each fitted again on the draw; ``full``: each rung's full-sample
    confusion counts (where its draws are linearised)."""
    return RefitDraws.collect(refit, refit_rungs(refit, stacker, X, votes, min_coverage, other), full)


def contrast_delta(
    stacker: StackedLogit,
    k_reported: float,
    k_other: float,
    refit: dict,
    rd: RefitDraws,
    fixed_reported: np.ndarray,
    fixed_other: np.ndarray,
    level: float,
) -> dict:
    """Table 23's Δκ (category − scalar) with both arms refitted in every draw (corrected interval)."""
    sign = 1.0 if stacker.abstention == "scalar" else -1.0  # category − scalar = sign · (other − reported)
    estimate = sign * (k_other - k_reported)
    draws = sign * (refit["other_encoding"]["kappa"] - refit["stacked"]["kappa"])
    held = sign * (fixed_other - fixed_reported)
    ci, se, p = corrected_interval(
        estimate, draws, held, rd.correction({("other_encoding", "kappa"): sign, ("stacked", "kappa"): -sign}), level
    )
    return {"estimate": float(estimate), "ci": ci, "p_one_sided": p, "call": call_for(ci), "se": se}


def _other_arm(stacker: StackedLogit) -> StackedLogit:
    """Table 23's other arm: the same stacker with the other abstention encoding (same folds and items)."""
    return clone(stacker).set_params(abstention="category" if stacker.abstention == "scalar" else "scalar")


def _abstention_contrast(stacker, reported, alt, full: tuple, delta: dict) -> dict:
    """Table 23: abstention as a category against 0.5 (same folds and draws); ``full`` holds κ of the reported arm
    and of the other one, in that order; ``delta`` is :func:`contrast_delta`."""
    k_cat, k_sca = (full[1], full[0]) if stacker.abstention == "scalar" else full
    return {
        "kappa_scalar": float(k_sca),
        "kappa_category": float(k_cat),
        "delta_category_minus_scalar": {**delta, "p_holm": None},
        "moved": int(np.sum(reported != alt)),
    }


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


def analyze(
    table: VerdictTable, stacker: StackedLogit, s: LadderSettings, folds: dict[str, list[tuple]] | None = None
) -> dict[str, DatasetResult]:
    """Every dataset of the table, then Holm over the configured core datasets for each comparator.

    ``folds``: :func:`dataset_folds` of the table when the caller has them (else each dataset's are computed
    as it is analysed). BLAS runs on one thread here: the products are small, and threads contending for
    shared cores multiply the time. The analysis's threads (:func:`src.core.threads.count`) take several datasets
    side by side when each is small (:func:`side_by_side`), else one dataset at a time, its refit bootstrap's
    chunks on the threads: the same results either way, each dataset's subset built as it starts."""

    check_settings(s, stacker)
    outer, inner = dataset_threads(table, s.n_boot)
    with threadpool_limits(1):
        memory.trim()  # what building the table freed (pandas' columns, pyarrow's pool) is handed back first
        best_avg, avg_ineligible = best_on_average(table, s.min_coverage)

        def one(job: tuple[str, VerdictTable]) -> tuple[str, DatasetResult]:
            name, t = job
            if len(np.unique(t.gold)) < 2:
                raise AnalysisError(f"{table.source}: dataset {name!r} has a single gold class; the ladder needs both")
            try:
                fold = None if folds is None else folds[name]
                return name, analyze_dataset(t, stacker, s, best_avg, fold, inner)
            except AnalysisError as e:
                raise AnalysisError(f"{table.source}: dataset {name!r}: {e}") from e

        results = {}
        for name, results[name] in in_order(one, table.each_dataset(), outer):
            results[name].summary["selected"]["best_avg_ineligible"] = avg_ineligible
            memory.trim()  # the next dataset's peak starts from what is live, not from this one's high-water mark
    _apply_holm(results, s.core, s.holm)
    return results


def _fitted(jobs: dict[str, Any], workers: int) -> dict[str, Any]:
    """Each job's result (a job is a function of nothing; None: left out), the jobs on ``workers`` threads
    (:func:`src.core.threads.in_order`): the ladder's label-fitted rungs are fitted independently of each other."""
    todo = [(name, job) for name, job in jobs.items() if job is not None]
    return dict(in_order(lambda named: (named[0], named[1]()), todo, workers))


def _cv_best(votes: np.ndarray, y: np.ndarray, folds: list[tuple], min_coverage: float):
    """The CV-best single judge cross-fitted (:class:`src.core.aggregate.BestSingle`); no eligible member is the
    analysis's error, naming its setting."""
    try:
        return crossfit(BestSingle(min_coverage=min_coverage), votes, y, folds)
    except ValueError as e:
        raise AnalysisError(f"CV-best single: {e} (analysis.min_coverage)") from None


def dataset_threads(table: VerdictTable, n_boot: int) -> tuple[int, int | None]:
    """(threads for the datasets, each dataset's refit threads) of an analysis of ``table`` on the analysis's
    threads (:func:`src.core.threads.count`): (that count, 1) when its datasets go side by side
    (:func:`side_by_side`), else (1, None: one dataset at a time, its refit bootstrap's chunks on every thread)."""
    n = threads.count()
    return (n, 1) if n > 1 and side_by_side(table, n_boot) else (1, None)


def side_by_side(table: VerdictTable, n_boot: int) -> bool:
    """Whether the datasets are analysed side by side on the analysis's threads: when there are several and each
    one's bootstrap weights would be kept whole in doubles (B × its clusters × 8 bytes within
    :data:`src.core.evaluate.MAX_WEIGHT_BYTES`), so that two datasets at once hold no more than a few such
    matrices; a larger table's datasets go one at a time (its memory bounded by one dataset's)."""
    if len(table.datasets) < 2:
        return False
    ds = table.items["dataset"].to_numpy()
    largest = max(len(np.unique(table.clusters[ds == name])) for name in table.datasets)
    return n_boot * largest * 8 <= evaluate.MAX_WEIGHT_BYTES


def holm_families(datasets: list[str], core: list[str], mode: str = "core") -> list[list[str]]:
    """The families Holm adjusts (``analysis.holm``, :data:`HOLM_FAMILIES`); a dataset in none is not adjusted."""
    if mode == "all":
        return [list(datasets)]
    first = [d for d in datasets if d in core]
    if not first:
        return [list(datasets)]
    rest = [d for d in datasets if d not in core]
    return [first] + ([rest] if mode == "separate" and rest else [])


def _apply_holm(results: dict[str, DatasetResult], core: list[str], mode: str = "core") -> None:
    """Holm's adjusted one-sided p per comparator and metric within each family; each summary records its family
    (``holm_family``, null where the dataset is in none and its ``p_holm`` stays null)."""
    comps = {c for r in results.values() for c in r.summary["deltas"]}
    for r in results.values():
        r.summary["holm_family"] = None
    for family in holm_families(list(results), core, mode):
        for key in ("deltas", "deltas_fixed"):
            for c in comps:
                for m in DELTA_METRICS:
                    fam = [d for d in family if c in results[d].summary[key]]
                    adj = holm([results[d].summary[key][c][m]["p_one_sided"] for d in fam])
                    for d, p in zip(fam, adj):
                        results[d].summary[key][c][m]["p_holm"] = p
        for d in family:
            results[d].summary["holm_family"] = family


def to_json(results: dict[str, DatasetResult], s: LadderSettings, meta: dict | None = None) -> dict:
    """The machine-readable results.json document; each dataset opens with its decision (:mod:`src.core.decide`)."""
    return {
        "settings": dict(s.__dict__),
        "meta": meta or {},
        "datasets": {
            name: {"decision": decide(r.summary, s.kappa_floor, s.floor_rule).as_dict(), **r.summary}
            for name, r in results.items()
        },
    }


__all__ = ["LadderSettings", "DatasetResult", "analyze", "analyze_dataset", "to_json", "Delta", "COMPARATORS"]
