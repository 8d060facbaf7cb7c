"""Escalation cascade (beyond the paper): the cheap panel decides, an expensive judge sees only the
items the panel is unsure of.

The rule is the LLM cascade of FrugalGPT (Chen, Zaharia & Zou 2023, "FrugalGPT: How to Use Large Language Models
While Reducing Cost and Improving Performance", arXiv:2305.05176: answer with the cheap model, call the expensive
one when a score of the cheap answer falls below a threshold learned on labelled data) with the confidence of
Cascaded Selective Evaluation (Jung, Brahman & Choi 2024, "Trust or Escalate: LLM Judges with Provable
Guarantees for Human Agreement", arXiv:2407.18370: trust a judge when its confidence reaches a threshold
calibrated on held-out labelled data, else escalate). Here:

* the cheap panel's confidence in an item is ``|p − t|``, the distance of the stacker's (§2) p(hallucinated) from
  its decision threshold t (0.5): the items inside the band ``t ± τ`` escalate;
* per operating point (a target share s of items escalated), τ is chosen on each fold's **training** clusters
  only — the s-quantile of the fold stacker's confidence there — and applied to that fold's held-out clusters
  (:class:`Cascade`; the folds are the ladder's, :func:`src.core.ladder.dataset_folds`). The stacker sees discrete
  votes, so many items share one p: items exactly at τ escalate with the probability that makes the training
  share s exact (a randomised threshold, seeded);
* an escalated item takes the expensive judge's verdict; where that judge abstains it keeps the panel's;
* the expensive judge is the table's frontier column when it has one (the cheap panel is then every member),
  else the roster's most expensive member by the cost model (:mod:`src.studies.suite.cost`: measured seconds per
  verdict from the verdict cache, or the configured throughput), the rest being the cheap panel, whose stacker
  is fitted on the cheap members only;
* κ / bacc / F1 of every operating point with paired cluster-bootstrap 95% intervals on the ladder's own draws
  (:meth:`src.studies.suite.reference.Reference.bootstrap`), the paired Δκ against the expensive judge alone and the
  panel alone, the realised share escalated, and the cost per 1k items (cheap panel on every item + the share
  escalated × the expensive judge);
* the headline: the fewest escalations from which the cascade is **non-inferior** to the expensive judge alone
  (lower bound of the paired Δκ interval > −margin at that share and at every larger one on the grid), and κ at
  fixed budgets (10 %, 20 %). The grid is a curve read on the scored items, so the headline share is a reading
  of it, not a threshold tuned on them: each point's τ was fitted on training folds.
* a reference: escalating the same share of items at random (mean κ over seeded draws).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from sklearn.base import BaseEstimator, clone

from src.core.aggregate import StackedLogit
from src.core.errors import RaimError
from src.core.evaluate import from_counts, interval, paired_delta
from src.core.ladder import LadderSettings, design_matrix
from src.core.names import metric_name
from src.core.verdicts import ABSTAIN, VerdictTable
from src.studies.suite import common
from src.studies.suite.reference import Reference, rng_for
from src.studies.suite.settings import CascadeSettings, settings_of

ROUND = 12  # confidences are rounded to this many decimals, so items of one vote pattern tie exactly


class CascadeError(RaimError, ValueError):
    """A cascade setting the analysis cannot run with (named by its config key)."""


# ------------------------------------------------------------------------------------------------ the rule


def band_thresholds(conf: np.ndarray, shares: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per target share s: (τ, q) such that escalating the items with confidence < τ, and those exactly at τ
    with probability q, escalates exactly s of ``conf`` in expectation. s = 0 → τ = −∞; s = 1 → τ = +∞."""
    c = np.sort(np.asarray(conf, float))
    s = np.asarray(shares, float)
    m = s * len(c)
    tau = c[np.minimum(np.floor(m).astype(int), len(c) - 1)]
    below = np.searchsorted(c, tau, "left")
    at = np.searchsorted(c, tau, "right") - below
    q = np.clip((m - below) / at, 0.0, 1.0)
    tau = np.where(s <= 0, -np.inf, np.where(s >= 1, np.inf, tau))
    return tau, np.where((s <= 0) | (s >= 1), 0.0, q)


class Cascade(BaseEstimator):
    """The cheap panel's stacker and, per target share, the uncertainty band learnt on the items it is fitted on.

    ``fit(X, y)`` fits ``stacker`` (default :class:`src.core.aggregate.StackedLogit`) on the cheap members' design and
    sets ``thresholds_`` / ``tie_prob_`` (one per share, :func:`band_thresholds` on those items' confidence);
    :meth:`escalate` says which items of new X escalate at each share (:func:`merge` then takes the expensive
    judge's verdicts there). Nothing of the items it is applied to is seen by ``fit``.
    """

    def __init__(self, stacker: StackedLogit | None = None, shares: tuple[float, ...] = (0.1,), random_state: int = 0):
        self.stacker = stacker
        self.shares = shares
        self.random_state = random_state

    def fit(self, X: np.ndarray, y: np.ndarray) -> Cascade:
        self.stacker_ = clone(self.stacker if self.stacker is not None else StackedLogit()).fit(X, y)
        self.thresholds_, self.tie_prob_ = band_thresholds(self.confidence(X), np.asarray(self.shares, float))
        return self

    def p_hallucinated(self, X: np.ndarray) -> np.ndarray:
        return self.stacker_.predict_proba(X)[:, 1]

    def confidence(self, X: np.ndarray) -> np.ndarray:
        """|p − threshold|: 0 = the panel cannot tell, 0.5 = certain."""
        return np.round(np.abs(self.p_hallucinated(X) - self.stacker_.threshold), ROUND)

    def escalate(self, X: np.ndarray) -> np.ndarray:
        """S × n: item i escalates at share s (ties at τ broken by a seeded uniform draw per item)."""
        conf = self.confidence(X)[None, :]
        u = np.random.default_rng(self.random_state).random(conf.shape[1])[None, :]
        tau, q = self.thresholds_[:, None], self.tie_prob_[:, None]
        return (conf < tau) | ((conf == tau) & (u < q))


def merge(panel: np.ndarray, expensive: np.ndarray, escalated: np.ndarray) -> np.ndarray:
    """Cascade verdicts (… × n): the expensive judge's on escalated items it answered, the panel's elsewhere."""
    expensive = np.asarray(expensive, float)
    return np.where(escalated & (expensive != ABSTAIN), expensive, panel)


# ------------------------------------------------------------------------------------------- the analysis


def settings(cfg: CascadeSettings | Mapping) -> CascadeSettings:
    """The cascade's settings (``suite.cascade``), checked (:mod:`src.studies.suite.settings`)."""
    return settings_of(CascadeSettings, cfg, "suite.cascade")


def grid(cfg: CascadeSettings | Mapping) -> np.ndarray:
    """The target shares: 0, the grid of ``grid_step``, the operating points, the budgets, and 1."""
    cfg = settings(cfg)
    step = float(cfg.grid_step)
    named = [float(v) for v in (*cfg.operating_points, *cfg.budgets)]
    if not 0 < step <= 1:
        raise CascadeError(f"suite.cascade.grid_step: {step} is not in (0, 1]")
    for k in ("operating_points", "budgets"):
        bad = [v for v in getattr(cfg, k) if not 0 <= float(v) <= 1]
        if bad:
            raise CascadeError(f"suite.cascade.{k}: {bad} are not shares in [0, 1]")
    pts = np.r_[np.arange(0.0, 1.0, step), 1.0, named]
    return np.unique(np.round(pts, 6))


def choose_expensive(table: VerdictTable, costs: Mapping, wanted: str | None = None) -> tuple[str, str]:
    """(expensive judge, how chosen): ``wanted`` when set, else the frontier column when the table has one, else
    the member with the highest cost per 1k items in the cost block (``costs['members']``; ties: roster order)."""
    names = list(table.members) + ([table.frontier_name] if table.has_frontier else [])
    if wanted:
        if wanted not in names:
            raise CascadeError(
                f"suite.cascade.expensive: {wanted!r} is neither a member nor the frontier "
                f"column of {table.source} (judges: {', '.join(names)})"
            )
        return wanted, "configured"
    if table.has_frontier:
        return table.frontier_name, "frontier"
    per = costs["members"]
    best = max(table.members, key=lambda m: (per[m]["per_1k"], -table.members.index(m)))
    return best, f"most expensive member ({per[best]['source']} cost)"


def _split(table: VerdictTable, expensive: str) -> tuple[VerdictTable, np.ndarray]:
    """(the cheap panel's table, the expensive judge's votes)."""
    if expensive == table.frontier_name and table.has_frontier:
        return table, table.frontier
    cheap = [m for m in table.members if m != expensive]
    return table.subset(np.ones(len(table.gold), bool), cheap), table.votes[:, table.members.index(expensive)]


def crossfit_cascade(
    X: np.ndarray, y: np.ndarray, expensive: np.ndarray, folds: list, est: Cascade, rng: np.random.Generator
) -> dict:
    """Each fold's cascade fitted on its training clusters, applied to its held-out ones: the out-of-fold
    panel verdicts, the S × n escalations and verdicts (:func:`merge`), and each fold's band half-widths τ."""
    n, S = len(y), len(est.shares)
    panel, esc = np.empty(n), np.empty((S, n), bool)
    taus = []
    for tr, te in folds:
        f = clone(est).set_params(random_state=int(rng.integers(2**31))).fit(X[tr], y[tr])
        panel[te] = f.stacker_.predict(X[te])
        esc[:, te] = f.escalate(X[te])
        taus.append(f.thresholds_)
    return {"panel": panel, "escalated": esc, "verdicts": merge(panel, expensive, esc), "tau": np.array(taus)}


def _ci(est: float, draws: np.ndarray, level: float) -> dict:
    return {"estimate": float(est), "ci": interval(draws, level)}


def dataset(
    ref: Reference,
    stacker: StackedLogit,
    s: LadderSettings,
    expensive: str,
    shares: np.ndarray,
    cfg: CascadeSettings | Mapping,
    cost_1k: tuple[float, float],
    seed: int,
) -> dict:
    """The cascade curve of one dataset (see the module docstring)."""
    cfg = settings(cfg)
    t = ref.table
    cheap_t, e_votes = _split(t, expensive)
    if not np.any(e_votes != ABSTAIN):
        return {"skipped": f"the expensive judge {expensive} answered no item of {ref.name}"}
    y = t.gold
    X, _ = design_matrix(cheap_t, list(s.features))
    est = Cascade(clone(stacker).set_params(n_votes=len(cheap_t.members)), tuple(shares))
    cf = crossfit_cascade(X, y, e_votes, ref.design.folds, est, rng_for(seed, "cascade", ref.name))
    P = np.vstack([cf["verdicts"], cf["panel"], e_votes])  # (S + 2) × n: the curve, panel alone, expensive alone
    full = from_counts(common.counts(y, P))
    draws = ref.bootstrap(s.n_boot, s.seed).metrics(y, P.T)
    S = len(shares)
    margin = float(cfg.margin)
    share = cf["escalated"].mean(axis=1)
    rand = _random_kappa(y, cf["panel"], e_votes, shares, cfg.random_draws, rng_for(seed, "cascade-random", ref.name))
    cheap_1k, exp_1k = cost_1k
    points = []
    for i in range(S):
        d_exp = paired_delta(
            full["kappa"][i] - full["kappa"][S + 1], draws["kappa"][:, i] - draws["kappa"][:, S + 1], s.level
        )
        d_pan = paired_delta(full["kappa"][i] - full["kappa"][S], draws["kappa"][:, i] - draws["kappa"][:, S], s.level)
        tau = cf["tau"][:, i]
        points.append(
            {
                "target": float(shares[i]),
                "share": float(share[i]),
                **{m: _ci(full[m][i], draws[m][:, i], s.level) for m in ("kappa", "bacc", "f1")},
                "delta_expensive": d_exp.as_dict(),
                "delta_panel": d_pan.as_dict(),
                "noninferior": bool(d_exp.ci[0] > -margin),
                "band_halfwidth": float(np.mean(tau)) if np.all(np.isfinite(tau)) else None,
                "random_kappa": float(rand[i]),
                "cost_per_1k": cheap_1k + float(share[i]) * exp_1k,
            }
        )
    alone = {
        k: {m: _ci(full[m][j], draws[m][:, j], s.level) for m in ("kappa", "bacc", "f1")}
        for k, j in (("panel", S), ("expensive", S + 1))
    }
    alone["panel"]["cost_per_1k"], alone["expensive"]["cost_per_1k"] = cheap_1k, exp_1k
    alone["expensive"]["coverage"] = float(np.mean(e_votes != ABSTAIN))
    return {
        "n": int(len(y)),
        "cheap": cheap_t.members,
        "alone": alone,
        "points": points,
        "noninferior": _first_stable(points),
        "budgets": _at_budgets(points, cfg.budgets),
    }


def _random_kappa(y, panel, expensive, shares, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """Mean κ over ``n_draws`` cascades that escalate each item with probability s (no use of p)."""
    if n_draws <= 0:
        return np.full(len(shares), np.nan)
    u = rng.random((n_draws, 1, len(y)))
    preds = merge(panel, expensive, u < np.asarray(shares)[None, :, None])  # R × S × n
    return common.kappas(y, preds.reshape(-1, len(y))).reshape(n_draws, len(shares)).mean(axis=0)


def _first_stable(points: list[dict]) -> dict | None:
    """The smallest target share from which every point of the grid is non-inferior, with its numbers."""
    ok = [p["noninferior"] for p in points]
    if not ok[-1]:
        return None
    i = len(ok) - 1
    while i > 0 and ok[i - 1]:
        i -= 1
    p = points[i]
    return {
        "target": p["target"],
        "share": p["share"],
        "calls_saved": 1.0 - p["share"],
        "kappa": p["kappa"],
        "delta_expensive": p["delta_expensive"],
        "cost_per_1k": p["cost_per_1k"],
    }


def _at_budgets(points: list[dict], budgets: list) -> dict:
    by = {round(p["target"], 6): p for p in points}
    return {
        f"{float(b):g}": {k: by[round(float(b), 6)][k] for k in ("share", "kappa", "delta_expensive", "cost_per_1k")}
        for b in budgets
    }


def run(
    refs: Mapping[str, Reference],
    table: VerdictTable,
    stacker: StackedLogit,
    s: LadderSettings,
    cfg: CascadeSettings | Mapping,
    costs: Mapping,
    seed: int,
) -> dict:
    """The ``cascade`` block of suite.json. ``cfg``: the cascade's settings (``suite.cascade``); ``costs``: the
    suite's cost block of this panel (:func:`src.studies.suite.cost.compute`: each member's and the frontier's cost
    per 1k items)."""
    cfg = settings(cfg)
    if not cfg.enabled:
        return {}
    shares = grid(cfg)
    expensive, how = choose_expensive(table, costs, cfg.expensive)
    is_frontier = expensive == table.frontier_name and table.has_frontier
    cheap = list(table.members) if is_frontier else [m for m in table.members if m != expensive]
    if not cheap:
        raise CascadeError(f"suite.cascade.expensive: {expensive!r} is the only member; no cheap panel is left")
    exp_1k = costs["frontier"]["per_1k"] if is_frontier else costs["members"][expensive]["per_1k"]
    cheap_1k = float(sum(costs["members"][m]["per_1k"] for m in cheap))
    per = {n: dataset(r, stacker, s, expensive, shares, cfg, (cheap_1k, exp_1k), seed) for n, r in refs.items()}
    done = {n: d for n, d in per.items() if "skipped" not in d}
    saved = [d["noninferior"]["calls_saved"] if d["noninferior"] else 0.0 for d in done.values()]
    return {
        "expensive": expensive,
        "chosen_as": how,
        "cheap": cheap,
        "margin": float(cfg.margin),
        "operating_points": [float(v) for v in cfg.operating_points],
        "budgets": [float(v) for v in cfg.budgets],
        "cost_per_1k": {"cheap_panel": cheap_1k, "expensive": exp_1k},
        "datasets": per,
        "summary": {
            "datasets": len(done),
            "noninferior": sum(d["noninferior"] is not None for d in done.values()),
            "calls_saved_mean": float(np.mean(saved)) if saved else None,
        },
    }


def flat_metrics(block: Mapping) -> dict[str, float]:
    """The cascade's headline numbers as MLflow metrics: κ at the budgets, the fewest escalations non-inferior
    and the calls saved there (0 where none is) per dataset, and their mean over the datasets."""

    out: dict[str, float] = {}
    for name, d in (block.get("datasets") or {}).items():
        if "skipped" in d:
            continue
        for b, v in d["budgets"].items():
            out[metric_name("cascade", name, f"kappa_at_{b}")] = v["kappa"]["estimate"]
        ni = d["noninferior"]
        out[metric_name("cascade", name, "calls_saved")] = ni["calls_saved"] if ni else 0.0
        if ni:
            out[metric_name("cascade", name, "noninferior_share")] = ni["share"]
    mean = (block.get("summary") or {}).get("calls_saved_mean")
    if mean is not None:
        out["cascade/calls_saved_mean"] = mean
    return out
