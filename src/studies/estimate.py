"""How much of my traffic hallucinates? The rate per segment of a scored pool (:mod:`src.studies.pool`) by every
method of :mod:`src.core.rates`, and the label-free EM prevalence of :func:`src.core.priorshift.estimate` (its
interval from the observed information, :func:`src.studies.monitor.prevalence_se`: valid only under a pure prior
shift with a calibrated stacker, so flagged); :func:`plan_labels`: how many labels a target half-width needs on
this pool — from the labels in hand when there are enough, else from the stacker's posteriors under a prior shift
(:func:`src.core.priorshift.adjust`); a frontier judge as the labeller: its verdicts are read as gold, and the rate
then estimates *what that judge would say*, not gold (:func:`estimate`'s ``labeller``).
"""

from __future__ import annotations

import numpy as np

from src.core import drift, priorshift, rates
from src.core.rates import RateError
from src.studies.pool import IMPUTED_P, Pool
from src.studies.proposal import Proposal, check_against

FEW_POSITIVES = 5  # fewer labelled items of a class than this: the normal intervals may undercover (the study)


ESTIMAND = (
    "θ = the share of hallucinated items in the traffic the pool was drawn from (the pool's own share "
    "lies inside the interval at least as often)"
)


NO_CLUSTERS = (
    "the pool has no cluster_id: every item is taken as its own cluster; items that share a conversation or a "
    "document make the intervals too narrow then (carry cluster_id in the pool: src.predict copies an items "
    "file's cluster_id to its output)"
)


def em_rates(f: np.ndarray, train_prevalence, level: float, tol: float = 1e-6, max_iter: int = 1000) -> rates.Rates:
    """The label-free EM prevalence (:func:`src.core.priorshift.estimate_rows`) per row, with the interval of the
    mixture likelihood's observed information (:func:`src.studies.monitor.prevalence_se`); ``valid=False``: it holds only
    under a pure prior shift with a calibrated stacker."""
    f = np.atleast_2d(f)
    t = np.broadcast_to(np.asarray(train_prevalence, dtype=float), f.shape)
    est = priorshift.estimate_rows(f, t, tol, max_iter)
    edge = np.clip(est, 1e-6, 1 - 1e-6)
    se = np.array([drift.prevalence_se(f[r], t[r], edge[r]) for r in range(len(f))])
    z = rates.z_value(level)
    return rates.Rates(
        "em",
        est,
        se,
        np.clip(est - z * se, 0, 1),
        np.clip(est + z * se, 0, 1),
        np.zeros(len(f), int),
        np.full(len(f), np.nan),
        None,
        False,
        level,
        ["label-free EM prevalence: valid only under a pure prior shift with a calibrated stacker"],
    )


def segment_rates(
    pool: Pool,
    idx: np.ndarray,
    labelled: np.ndarray,
    y: np.ndarray,
    proposal: Proposal | None,
    level: float,
    threshold: float,
) -> dict[str, rates.Rates]:
    """Every method on the items ``idx`` of the pool (labels: a uniform random sample, or the proposal's draw)."""
    f, lab, g = pool.p[idx], labelled[idx], y[idx]
    codes = rates.cluster_codes(None if pool.clusters is None else pool.clusters[idx])
    out = {"naive": rates.naive(f, threshold, codes, level)}
    if pool.train_prevalence is not None:
        out["em"] = em_rates(f, pool.train_prevalence, level)
    if proposal is None:
        out["classical"] = rates.classical(g, lab, codes, level)
        out["ppi"] = rates.ppi(g, f, lab, codes, level)
    else:
        cl = rates.active(g, f, lab, proposal.pi[idx], codes, level, lam=0.0)
        cl.method, cl.lam = "classical", None
        cl.notes = ["labels only, inverse-probability weighted (the proposal's π)"]
        out["classical"] = cl
        out["active"] = rates.active(g, f, lab, proposal.pi[idx], codes, level)
    return out


def estimate(
    pool: Pool,
    labelled: np.ndarray,
    y: np.ndarray,
    proposal: Proposal | None = None,
    level: float = 0.95,
    threshold: float = 0.5,
    min_labels: int = 10,
    labeller: str | None = None,
    labels_source: str = "labels",
) -> dict:
    """The rate of the pool and of each segment by every method (:func:`segment_rates`), as a document."""
    if proposal is not None:
        check_against(proposal, labelled, pool, labels_source)
    segs = [("all", np.arange(len(pool)))]
    if pool.segments is not None:
        segs += [(str(s), np.flatnonzero(pool.segments == s)) for s in sorted(set(pool.segments))]
    out = {}
    for name, idx in segs:
        n = int(labelled[idx].sum())
        if n < min_labels:
            where = "the pool" if name == "all" else f"segment {pool.segment_by}={name!r}"
            raise RateError(
                f"{where}: {n} labelled item(s), fewer than --min-labels {min_labels} for an interval: "
                "label more (python -m src.rate propose / plan), or merge segments"
            )
        methods = segment_rates(pool, idx, labelled, y, proposal, level, threshold)
        pos = int(np.nansum(y[idx][labelled[idx]]))
        notes = []
        if min(pos, n - pos) < FEW_POSITIVES:
            notes.append(
                f"only {min(pos, n - pos)} labelled item(s) of one class: the normal intervals may "
                "undercover (docs/rates.md)"
            )
        out[name] = {
            "items": int(len(idx)),
            "labels": n,
            "labelled_hallucinated": pos,
            "methods": {m: r.row() for m, r in methods.items()},
            "notes": notes,
        }
    who = labeller or "gold labels"
    return {
        "pool": {
            "source": pool.source,
            "items": len(pool),
            "fingerprint": pool.fingerprint(),
            "imputed_p": pool.imputed,
            "clusters": None if pool.clusters is None else int(len(set(pool.clusters))),
            "train_prevalence": pool.train_prevalence,
            "warnings": [] if pool.clusters is not None else [NO_CLUSTERS],
        },
        "estimand": ESTIMAND
        if labeller is None
        else ESTIMAND.replace("hallucinated items", f"items {labeller} calls hallucinated"),
        "labeller": who,
        "design": "active (proposal)" if proposal is not None else "uniform random sample (assumed)",
        "level": level,
        "threshold": threshold,
        "segments": out,
    }


def labeller_statement(doc: dict) -> str | None:
    """When the labels are a judge's verdicts: what the rate then means."""
    who = doc.get("labeller")
    if not who or who == "gold labels":
        return None
    return f"the labels are {who}'s verdicts: every rate here estimates what {who} would say on this traffic, not gold"


def text_table(doc: dict) -> str:
    """The estimate document as a plain table (one row per segment × method)."""
    rows = [("segment", "method", "rate", f"{round(100 * doc['level'])}% interval", "labels", "eff. labels", "")]
    for seg, d in doc["segments"].items():
        for m, r in d["methods"].items():
            note = "" if r["valid_interval"] else "no valid interval"
            lo, hi = (_num(v) for v in r["ci"])
            eff = "—" if r["effective_labels"] is None else f"{r['effective_labels']:.0f}"
            rows.append((seg, m, _num(r["estimate"]), f"[{lo}, {hi}]", str(r["labels"]), eff, note))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    extra = [f"note ({seg}): {n}" for seg, d in doc["segments"].items() for n in d["notes"]]
    if doc["pool"]["imputed_p"]:
        extra.append(
            f"note: {doc['pool']['imputed_p']} item(s) without a p (every member abstained) take p = "
            f"{IMPUTED_P} (a fixed predictor value: the estimates stay valid)"
        )
    extra += [f"warning: {w}" for w in doc["pool"].get("warnings", [])]
    st = labeller_statement(doc)
    return "\n".join(lines + extra + ([f"note: {st}"] if st else []) + [f"estimand: {doc['estimand']}"])


def _num(v) -> str:
    return "—" if v is None else f"{v:.4f}"


def plan_labels(
    pool: Pool,
    labelled: np.ndarray,
    y: np.ndarray,
    halfwidth: float,
    level: float = 0.95,
    tau: float = 0.5,
    proposal: Proposal | None = None,
    prevalence_guess: float | None = None,
    min_labels: int = 10,
) -> dict:
    """How many labels ``halfwidth`` needs on this pool per method (:func:`src.core.rates.plan`): from the labels
    in hand when there are at least ``min_labels`` (weighted by 1/π under a proposal); else from the stacker's
    posteriors under a prior shift to ``prevalence_guess`` (default: the EM estimate), which assumes the stacker
    is calibrated on this traffic — a plan, not a guarantee; the interval itself does not rest on it."""
    n = int(labelled.sum())
    if n >= min_labels:
        rows = np.flatnonzero(labelled)
        w = 1.0 / proposal.pi[rows] if proposal is not None else np.ones(len(rows))
        m, basis = y[rows], f"the {n} labels in hand"
    else:
        if pool.train_prevalence is None:
            raise RateError(
                f"plan: {n} labels in hand (fewer than --min-labels {min_labels}) and no training "
                "prevalence to read the posteriors with: pass --train-prevalence (0.5 for a stacker "
                "fitted on a balanced set) or label a first uniform sample"
            )
        guess = (
            priorshift.estimate(pool.p, pool.train_prevalence)
            if prevalence_guess is None
            else priorshift.check_prevalence(prevalence_guess, "--prevalence")
        )
        guess = min(max(guess, 1e-3), 1 - 1e-3)
        rows, w = np.arange(len(pool)), np.ones(len(pool))
        m = priorshift.adjust(pool.p, pool.train_prevalence, guess)
        basis = (
            f"the stacker's posteriors shifted to prevalence {guess:.3f} "
            f"({'given' if prevalence_guess is not None else 'EM estimate'}; assumes a calibrated stacker)"
        )
    p = rates.plan(pool.p, rows, m, halfwidth, level, w, tau)
    return {
        "halfwidth": p.halfwidth,
        "level": p.level,
        "labels": p.labels,
        "expected_halfwidth": p.expected_halfwidth,
        "narrowest_halfwidth": p.narrowest,
        "pool_needed": p.pool_needed,
        "prevalence": p.prevalence,
        "basis": basis,
        "pool": len(pool),
        "note": "for unclustered items; clustered traffic needs more (its design effect)",
    }
