"""Prevalence (prior) shift of the stacker's posteriors (beyond the paper).

The stacker is fitted on balanced sets (train prevalence 0.5), while deployment traffic is hallucinated at
5–30 %. Under a pure prior shift (p(votes | class) unchanged), the posterior under a new prior follows from
Bayes' rule (Saerens, Latinne & Decaestecker 2002, "Adjusting the outputs of a classifier to new a priori
probabilities: a simple procedure", Neural Computation 14(1):21–41, eq. 2.4), and the new prior itself can be
estimated without labels by EM on the posteriors (their §2.2; "EMQ" in the quantification literature, e.g.
mlquantify's ``EMQ``, R's ``mclust::classPriorProbs``).

* :func:`adjust`, :func:`estimate` — the correction and the label-free estimate (the served models use them
  through :func:`served`: ``params={"prevalence": "0.1"}`` or ``"estimate"``);
* :func:`study` — on the real sets resampled to deployment prevalences and on simulated panels: calibration
  (Brier, ECE), F1, balanced accuracy and accuracy at the served decision (corrected p ≥ the stacker's
  threshold), uncorrected / corrected with the true prevalence / corrected with the EM estimate, with intervals;
* ``python -m src.prevalence`` — the study on the configured verdicts → ``prevalence.output`` (JSON),
  ``prevalence.figure`` (PNG), an MLflow run of kind ``prevalence``.

Resampling (:func:`windows`). A deployment window of ``window`` items at prevalence π holds round(π·window)
hallucinated and the rest supported items, each drawn with replacement within its gold class: under prior shift
the class-conditional distribution of the votes is what carries over, and drawing within each class is exactly
that. Whole clusters cannot shift the prevalence (on MedHallu and TruthfulQA each cluster pairs one positive and
one negative), so the clusters enter one level up: each of ``n_boot`` replicates first draws the calibration
set's clusters with replacement (:class:`src.core.evaluate.ClusterBootstrap`, as the ladder does), and its windows
draw items in proportion to their cluster's multiplicity. The posteriors are cross-fitted on the ladder's cluster
folds (:func:`src.core.ladder.dataset_folds`), each corrected from its own fold's training prevalence.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from src.core.aggregate import crossfit
from src.core.evaluate import ClusterBootstrap, call_for, from_counts, indicators, interval, scores
from src.core.ladder import dataset_folds
from src.core.ladderbase import active_members, design_matrix
from src.core.names import metric_name
from src.core.priorshift import PrevalenceError, _ml_rows, _shift, check_prevalence, train_prevalence
from src.core.verdicts import at_or_over
from src.io.settings import Settings
from src.judges import tables
from src.studies import simulate
from src.studies.checked import configured

log = logging.getLogger("raim.prevalence")

CONDITIONS = ("uncorrected", "true", "estimated")  # the posteriors as served, corrected with π, with EM's π̂
METRICS = ("brier", "ece", "f1", "bacc", "accuracy")
LOWER_IS_BETTER = ("brier", "ece")
STUDY_KEYS = ("prevalences", "window", "n_boot", "n_draws", "seed", "level", "ece_bins", "tol", "max_iter")


# ---------------------------------------------------------------------------------------------- the API


# ---------------------------------------------------------------------------------------------- serving


# ---------------------------------------------------------------------------------------------- metrics


def brier(P: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Brier score of each row of ``P`` against ``y`` (Brier 1950; scikit-learn's ``brier_score_loss``)."""
    return np.mean((P - y) ** 2, axis=-1)


def ece(P: np.ndarray, y: np.ndarray, bins: int = 10) -> np.ndarray:
    """Expected calibration error of each row: Σ_b (n_b / n)·|mean y − mean p| over ``bins`` equal-width bins of
    [0, 1] (Naeini, Cooper & Hauskrecht 2015, AAAI; Guo et al. 2017, ICML), p = 1 in the last bin."""
    P = np.atleast_2d(P)
    rows, n = P.shape
    b = np.minimum((P * bins).astype(int), bins - 1)
    idx = (np.arange(rows)[:, None] * bins + b).ravel()
    sums = np.bincount(idx, weights=(np.broadcast_to(y, P.shape) - P).ravel(), minlength=rows * bins)
    return np.abs(sums.reshape(rows, bins)).sum(axis=1) / n


def window_metrics(P: np.ndarray, y: np.ndarray, threshold: float, bins: int) -> dict[str, np.ndarray]:
    """Brier, ECE, and at the served decision (p ≥ ``threshold``) hallucinated-class F1, balanced accuracy
    (:func:`src.core.evaluate.from_counts`, §2 definitions) and accuracy, per row of ``P`` (gold ``y`` shared)."""

    c = indicators(y, at_or_over(P, threshold).astype(float).T).sum(axis=0)  # rows × 6 confusion cells
    m = from_counts(c)
    return {
        "brier": brier(P, y),
        "ece": ece(P, y, bins),
        "f1": m["f1"],
        "bacc": m["bacc"],
        "accuracy": (c[:, 0] + c[:, 4]) / c.sum(axis=1),
    }


# ---------------------------------------------------------------------------------------------- the study


def windows(
    y: np.ndarray, clusters: np.ndarray, prevalence: float, window: int, n_boot: int, n_draws: int, seed: int
) -> np.ndarray:
    """Item indices of deployment windows (n_boot × n_draws × window): the first round(π·window) hallucinated,
    the rest supported, drawn with replacement within their class in proportion to their cluster's multiplicity
    in the replicate's cluster bootstrap (module docstring)."""

    n1 = int(round(prevalence * window))
    if not 0 < n1 < window:
        raise PrevalenceError(
            f"prevalence.window={window}: a window at prevalence {prevalence:g} holds {n1} "
            "hallucinated items; it needs at least one of each class"
        )
    w = ClusterBootstrap(clusters, n_boot, seed).item_weights()
    rng = np.random.default_rng([seed, int(round(prevalence * 1e6))])
    parts = []
    for cls, m in ((1, n1), (0, window - n1)):
        members = np.flatnonzero(np.asarray(y) == cls)
        cdf = np.cumsum(w[:, members], axis=1, dtype=float)
        cdf = np.where(
            cdf[:, -1:] > 0, cdf / np.maximum(cdf[:, -1:], 1e-300), np.arange(1, len(members) + 1) / len(members)
        )  # a class the replicate missed: uniform
        u = rng.random((n_boot, n_draws * m))
        pick = np.stack([np.searchsorted(cdf[b], u[b], side="right") for b in range(n_boot)])
        parts.append(members[np.minimum(pick, len(members) - 1)].reshape(n_boot, n_draws, m))
    return np.concatenate(parts, axis=2)


def summary(values: np.ndarray, level: float) -> dict:
    """Mean over every window; ``ci``: percentile interval over the replicates of their mean (the expected value
    on a calibration set like this one); ``window_ci``: over single windows (what one window shows)."""

    return {
        "estimate": float(values.mean()),
        "ci": interval(values.mean(axis=1), level),
        "window_ci": interval(values.ravel(), level),
    }


def delta_summary(diff: np.ndarray, metric: str, level: float) -> dict:
    """A correction's paired Δ (corrected − uncorrected, same windows) with its call (§2 convention: clear when
    the interval excludes 0; improvement = lower Brier / ECE, higher F1 / bacc / accuracy) and the share of
    windows it improves."""

    s = summary(diff, level)
    sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
    s["call"] = call_for(sorted(sign * c for c in s["ci"]))
    s["share_improved"] = float(np.mean(sign * diff > 0))
    return s


def shift_study(
    p: np.ndarray,
    t: np.ndarray,
    y: np.ndarray,
    clusters: np.ndarray,
    prevalence: float,
    settings: Mapping,
    threshold: float,
) -> dict:
    """One calibration set at one deployment prevalence: metrics per condition, Δ of each correction against
    the uncorrected posteriors, and the EM estimate's error (against the naive mean posterior)."""
    s = settings
    idx = windows(y, clusters, prevalence, int(s["window"]), int(s["n_boot"]), int(s["n_draws"]), int(s["seed"]))
    B, R, n = idx.shape
    P, T = p[idx].reshape(B * R, n), t[idx].reshape(B * R, n)
    gold = (np.arange(n) < int(round(prevalence * n))).astype(int)
    est = _ml_rows(P, T, float(s["tol"]), int(s["max_iter"]))
    posts = {"uncorrected": P, "true": _shift(P, T, prevalence), "estimated": _shift(P, T, est[:, None])}
    vals = {
        c: {k: v.reshape(B, R) for k, v in window_metrics(q, gold, threshold, int(s["ece_bins"])).items()}
        for c, q in posts.items()
    }
    level = float(s["level"])
    pcc = P.mean(axis=1).reshape(B, R)
    est = est.reshape(B, R)
    return {
        "n_hallucinated": int(gold.sum()),
        "window": n,
        "metrics": {m: {c: summary(vals[c][m], level) for c in CONDITIONS} for m in METRICS},
        "deltas": {
            m: {c: delta_summary(vals[c][m] - vals["uncorrected"][m], m, level) for c in CONDITIONS[1:]}
            for m in METRICS
        },
        "prevalence_estimate": {
            **error_summary(est, prevalence, level),
            "mean_posterior": error_summary(pcc, prevalence, level),
        },
    }


def error_summary(values: np.ndarray, truth: float, level: float) -> dict:
    """An estimate of the prevalence over the windows: :func:`summary`, its bias and mean absolute error."""
    return {
        **summary(values, level),
        "bias": float(np.mean(values - truth)),
        "mae": float(np.mean(np.abs(values - truth))),
    }


def posteriors(table, stacker, settings, folds: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """The stacker's cross-fitted p(hallucinated) on one dataset (the ladder's features and cluster folds) and,
    per item, the training prevalence of the fold that scored it."""
    from sklearn.base import clone  # imported here, not at start-up: scikit-learn ~1.4 s

    table, _ = active_members(table)
    X, _ = design_matrix(table, settings.features)
    cf = crossfit(clone(stacker).set_params(n_votes=table.votes.shape[1]), X, table.gold, folds)
    t = np.empty(len(cf.proba))
    for est, (_, te) in zip(cf.estimators, cf.folds):
        t[te] = train_prevalence(est)
    return cf.proba, t


def simulated(spec: Mapping):
    """A ``prevalence.simulations`` entry as a balanced verdict table (:func:`src.studies.simulate.table`)."""

    return simulate.table(
        f"simulated panel {spec['name']}",
        n_clusters=int(spec["n_clusters"]),
        per_cluster=2,
        accuracies=list(spec["accuracies"]),
        rho=float(spec["rho"]),
        abstain_rate=float(spec.get("abstain_rate", 0.0)),
        dataset=str(spec["name"]),
        seed=int(spec["seed"]),
    )


def check_study(s: Mapping) -> None:
    """Refuse settings the study cannot run with, in one line naming the ``prevalence.*`` key."""
    missing = [k for k in STUDY_KEYS if k not in s]
    if missing:
        raise PrevalenceError(
            f"prevalence: missing setting(s) {missing} (conf/prevalence/default.yaml has them; "
            "a params.yaml older than it: regenerate it with `python -m src.track params`)"
        )
    for p in s["prevalences"]:
        check_prevalence(p, "prevalence.prevalences")
    for key, lo in (("window", 2), ("n_boot", 1), ("n_draws", 1), ("ece_bins", 1), ("max_iter", 1)):
        v = s[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise PrevalenceError(f"prevalence.{key}={v!r}: must be an integer ≥ {lo}")
    check_prevalence(s["level"], "prevalence.level")
    if not (isinstance(s["tol"], (int, float)) and s["tol"] > 0):
        raise PrevalenceError(f"prevalence.tol={s['tol']!r}: must be a positive number")


def study(table, stacker, settings, s: Mapping) -> dict:
    """The prior-shift study on every dataset of ``table`` (kind ``real``; None: none) and on the configured
    simulated panels (kind ``simulated``), at each of ``s['prevalences']``."""
    from tqdm import tqdm  # imported here, not at start-up: tqdm

    check_study(s)
    sets = [] if table is None else [(name, "real", t) for name, t in table.by_dataset().items()]
    sets += [(str(sim["name"]), "simulated", simulated(sim)) for sim in s.get("simulations") or []]
    out: dict[str, dict] = {}
    bar = tqdm(total=len(sets) * len(s["prevalences"]), desc="prevalence", unit="cell", mininterval=2.0)
    for name, kind, t in sets:
        folds = dataset_folds(t, settings)[name]
        p, tp = posteriors(t, stacker, settings, folds)
        y = t.gold
        doc = {
            "kind": kind,
            "n": int(len(y)),
            "n_clusters": int(len(np.unique(t.clusters))),
            "train_prevalence": float(tp.mean()),
            "balanced": {
                "kappa": scores(y, at_or_over(p, stacker.threshold).astype(float))["kappa"],
                "brier": float(brier(p, y)),
                "ece": float(ece(p, y, int(s["ece_bins"]))[0]),
            },
            "prevalences": {},
        }
        for q in s["prevalences"]:
            doc["prevalences"][f"{q:g}"] = shift_study(p, tp, y, t.clusters, float(q), s, stacker.threshold)
            bar.update()
        out[name] = doc
    bar.close()
    return {
        "settings": {k: v for k, v in s.items() if k not in ("output", "figure")},
        "datasets": out,
        "summary": headline(out),
    }


def headline(sets: dict) -> dict:
    """Per kind (real / simulated), condition and metric: the range of the mean Δ over (set, prevalence) cells
    and how many cells each call got; and the EM estimate's mean absolute error range."""
    out: dict[str, dict] = {}
    for kind in ("real", "simulated"):
        cells = [c for d in sets.values() if d["kind"] == kind for c in d["prevalences"].values()]
        if not cells:
            continue
        k = out[kind] = {"cells": len(cells), "deltas": {}}
        for m in METRICS:
            k["deltas"][m] = {}
            for c in CONDITIONS[1:]:
                ds = [cell["deltas"][m][c] for cell in cells]
                calls = [d["call"] for d in ds]
                k["deltas"][m][c] = {
                    "min": min(d["estimate"] for d in ds),
                    "max": max(d["estimate"] for d in ds),
                    "mean": float(np.mean([d["estimate"] for d in ds])),
                    **{call: calls.count(call) for call in ("clear improvement", "clear worsening", "unresolved")},
                }
        maes = [cell["prevalence_estimate"]["mae"] for cell in cells]
        naive = [cell["prevalence_estimate"]["mean_posterior"]["mae"] for cell in cells]
        k["estimate_mae"] = {
            "min": min(maes),
            "max": max(maes),
            "mean_posterior_min": min(naive),
            "mean_posterior_max": max(naive),
        }
    return out


def statements(doc: dict) -> list[str]:
    """The study's plain conclusions, from its numbers (for the log, the report and the README)."""
    lines = []
    names = {"true": "the true prevalence", "estimated": "the EM-estimated prevalence"}
    for kind, k in doc["summary"].items():
        n = k["cells"]
        for c in CONDITIONS[1:]:
            parts = []
            for m in METRICS:
                d = k["deltas"][m][c]
                parts.append(
                    f"{m} Δ {d['min']:+.3f}…{d['max']:+.3f} (better in {d['clear improvement']}, worse in "
                    f"{d['clear worsening']} of {n})"
                )
            lines.append(f"{kind}: corrected with {names[c]}: " + "; ".join(parts))
        e = k["estimate_mae"]
        lines.append(
            f"{kind}: EM estimate of the prevalence, mean absolute error {e['min']:.3f}–{e['max']:.3f} "
            f"(the mean uncorrected posterior: {e['mean_posterior_min']:.3f}–{e['mean_posterior_max']:.3f})"
        )
    return lines


def flat_metrics(doc: dict) -> dict[str, float]:
    """The study's numbers as MLflow metrics: ``<set>/p<π>/<metric>/<condition>``, Δ and the estimate's error."""

    out = {}
    for name, d in doc["datasets"].items():
        for q, cell in d["prevalences"].items():
            for m in METRICS:
                for c in CONDITIONS:
                    out[metric_name(name, f"p{q}", m, c)] = cell["metrics"][m][c]["estimate"]
                for c in CONDITIONS[1:]:
                    out[metric_name(name, f"p{q}", m, f"delta_{c}")] = cell["deltas"][m][c]["estimate"]
            pe = cell["prevalence_estimate"]
            out[metric_name(name, f"p{q}", "estimate_mae")] = pe["mae"]
            out[metric_name(name, f"p{q}", "estimate_bias")] = pe["bias"]
    return out


def compute(cfg: Settings) -> dict:
    """Config in, study document out: the configured verdict table (:func:`src.judges.tables.load_table`), the
    stacker and analysis settings of the ladder, the ``prevalence`` settings."""

    settings, stacker = configured(cfg)
    s = cfg.node("prevalence")
    check_study(s)  # before reading the table
    table = tables.load_table(cfg)
    doc = study(table, stacker, settings, s)
    doc["meta"] = {"verdicts": table.source, "members": table.members, "stacker": cfg.node("stacker")}
    return doc
