"""Escalation cascade (beyond the paper): the cheap panel decides, an expensive judge sees only the
items the panel is unsure of.

The rule is the LLM cascade of FrugalGPT (Chen, Zaharia & Zou 2023, "FrugalGPT: How to Use Large Language Models
While Reducing Cost and Improving Performance", arXiv:2305.05176: answer with the cheap model, call the expensive
one when a score of the cheap answer falls below a threshold learned on labelled data) with the confidence of
Cascaded Selective Evaluation (Jung, Brahman & Choi 2024, "Trust or Escalate: LLM Judges with Provable
Guarantees for Human Agreement", arXiv:2407.18370: trust a judge when its confidence reaches a threshold
calibrated on held-out labelled data, else escalate); the rule itself is :mod:`src.studies.suite.escalation`. Here:

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
  escalated × the expensive judge). The intervals read are the **refit** ones of :mod:`src.core.refit`: in every
  draw the cheap panel's stacker and each share's band (τ and its tie probability) are fitted again on each fold's
  training clusters (:class:`CascadeRefit`), and the variance corrected as the ladder's is
  (:func:`src.core.ladder.refit_ci`, :func:`src.core.ladder.refit_delta`; docs/intervals.md). The fixed-prediction
  percentile intervals (the cross-fitted verdicts held, the paper's §2 bootstrap) stay beside them: ``ci_fixed``,
  ``delta_expensive_fixed``, ``delta_panel_fixed``, ``noninferior_fixed``;
* the headline: the fewest escalations from which the cascade is **non-inferior** to the expensive judge alone
  (lower bound of the refit paired Δκ interval > −margin at that share and at every larger one on the grid), and κ at
  fixed budgets (10 %, 20 %). The grid is a curve read on the scored items, so the headline share is a reading
  of it, not a threshold tuned on them: each point's τ was fitted on training folds.
* a reference: escalating the same share of items at random (mean κ over seeded draws).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

import numpy as np
from scipy import sparse
from sklearn.base import clone

from src.core.aggregate import StackedLogit
from src.core.detector import scan
from src.core.errors import RaimError
from src.core.evaluate import METRICS, ClusterBootstrap, Delta, distinct_rows, from_counts, interval, paired_delta
from src.core.ladder import dataset_threads, refit_ci, refit_delta
from src.core.ladderbase import LadderSettings, design_matrix
from src.core.logitfit import FoldFits, loop_proba
from src.core.names import metric_name
from src.core.refit import DrawReader, RefitBootstrap, RefitDraws, Rung
from src.core.threads import in_order
from src.core.verdicts import ABSTAIN, VerdictTable, at_or_over
from src.io.suite_settings import CascadeSettings, settings_of
from src.studies.suite import common
from src.studies.suite.escalation import Cascade, band_thresholds, confidence_of, escalation_prob, merge
from src.studies.suite.reference import Reference, rng_for


class CascadeError(RaimError, ValueError):
    """A cascade setting the analysis cannot run with (named by its config key)."""


# ------------------------------------------------------------------------------------------- the analysis


def settings(cfg: CascadeSettings | Mapping) -> CascadeSettings:
    """The cascade's settings (``suite.cascade``), checked (:mod:`src.io.suite_settings`)."""
    out = settings_of(CascadeSettings, cfg, "suite.cascade")
    if out.injection_defence not in INJECTION_DEFENCES:
        raise CascadeError(
            f"suite.cascade.injection_defence: {out.injection_defence!r} is not one of {list(INJECTION_DEFENCES)}"
        )
    return out


INJECTION_DEFENCES = ("escalate", "off")
"""What the cascade does with an item flagged as a prompt injection: escalate it at every share, or nothing."""


def item_flags(items: Iterable[Mapping]) -> dict[str, bool]:
    """{item_id: whether its text looks like a prompt injection} (:func:`src.core.detector.scan`)."""
    return {str(it["item_id"]): scan(it).flagged for it in items}


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
    X: np.ndarray,
    y: np.ndarray,
    expensive: np.ndarray,
    folds: list,
    est: Cascade,
    rng: np.random.Generator,
    flagged: np.ndarray | None = None,
) -> dict:
    """Each fold's cascade fitted on its training clusters, applied to its held-out ones: the out-of-fold
    panel verdicts, the S × n escalations (``flagged`` items at every share) and verdicts (:func:`merge`), and
    each fold's band half-widths τ."""
    n, S = len(y), len(est.shares)
    panel, esc = np.empty(n), np.empty((S, n), bool)
    taus = []
    for tr, te in folds:
        f = clone(est).set_params(random_state=int(rng.integers(2**31))).fit(X[tr], y[tr])
        panel[te] = f.stacker_.predict(X[te])
        esc[:, te] = f.escalate(X[te], None if flagged is None else flagged[te])
        taus.append(f.thresholds_)
    return {"panel": panel, "escalated": esc, "verdicts": merge(panel, expensive, esc), "tau": np.array(taus)}


class CascadeRefit:
    """The cascade's label-fitted steps refitted in every draw of the refit paired cluster bootstrap
        (:mod:`src.core.refit`), fold by fold on the draw's training clusters: the cheap panel's stacker, then, per
        target share, its band τ and tie probability q (:func:`band_thresholds` on the training items' confidence,
        each item counted with its cluster's multiplicity), exactly as :class:`Cascade` is fitted on those items
        repeated.

        A held-out item's verdict depends on it only through its row — its cheap design row and the expensive judge's
        vote — and its fold: the panel's verdict on the design row, escalated (the expensive judge's verdict, where it
        answered) below τ, with probability q at τ. The seeded tie draw of :meth:`Cascade.escalate` is replaced by its
        expectation, so each share is a fractional :class:`src.core.refit.Rung` (each row's probability of the verdict
        1, :func:`merge` of :func:`escalation_prob`). The stacker is fitted once per draw chunk and fold for all shares
    (:meth:`fold`):
        by :class:`src.core.logitfit.FoldFits` for :class:`StackedLogit`, by its own fit otherwise
        (:func:`src.core.logitfit.loop_proba`)."""

    def __init__(
        self,
        stacker: StackedLogit,
        X: np.ndarray,
        expensive: np.ndarray,
        shares: np.ndarray,
        folds: list,
        flagged: np.ndarray | None = None,
    ):
        flag = np.zeros(len(X)) if flagged is None else np.asarray(flagged, float)
        rows, self.inv = distinct_rows(np.column_stack([X, expensive, flag]))
        self.x_rows, self.x_of = distinct_rows(rows[:, :-2])  # the design rows, and each row's
        self.e, self.flag = rows[:, -2], rows[:, -1]  # the expensive judge's vote; flagged: escalates at every share
        self.to_x = sparse.csr_matrix((np.ones(len(rows)), (np.arange(len(rows)), self.x_of)))
        self.stacker, self.shares = stacker, np.asarray(shares, float)
        self.Z = np.column_stack([np.ones(len(self.x_rows)), stacker.features(self.x_rows)])
        self.fits = FoldFits(self.Z, stacker.C)  # each fold's fits start from one fit, not one per chunk of draws
        self.held = [np.unique(self.inv[te]) for _, te in folds]  # the rows each fold's held-out items hold
        # the last :meth:`fold`, per thread: the bootstrap's chunks may be refitted on several (src.core.threads)
        self._kept = threading.local()

    def _proba(self, t1: np.ndarray, t0: np.ndarray, k: int) -> np.ndarray:
        if type(self.stacker) is StackedLogit:
            return self.fits.proba(t1, t0, k)
        return loop_proba(self.stacker, self.x_rows, t1, t0)

    def fold(self, t1: np.ndarray, t0: np.ndarray, k: int) -> np.ndarray:
        """Fold k's verdicts refitted on training weights t1 / t0 (draws × rows) on the rows its held-out items hold
        (draws × shares + 1 × those rows): each share's (probability of 1), then the panel's alone. Computed once
        for all the shares' rungs: kept while the same weights come back."""
        kept = getattr(self._kept, "last", None)
        if kept is not None and kept[0] == k and _same(kept[1], t1) and _same(kept[2], t0):
            return kept[3]
        x1, x0 = (np.asarray(t @ self.to_x) for t in (t1, t0))
        p = self._proba(x1, x0, k)
        conf = confidence_of(p, self.stacker.threshold)
        tau, q = band_thresholds(conf, self.shares, x1 + x0)
        xr = self.x_of[self.held[k]]
        panel = at_or_over(p[:, xr], self.stacker.threshold).astype(float)
        esc = np.maximum(escalation_prob(conf[:, None, xr], tau[:, :, None], q[:, :, None]), self.flag[self.held[k]])
        verdicts = np.concatenate([merge(panel[:, None, :], self.e[self.held[k]], esc), panel[:, None, :]], axis=1)
        self._kept.last = (k, t1, t0, verdicts)
        return verdicts

    def _rung(self, j: int, fractional: bool) -> Rung:
        """Column j of :meth:`fold` as a rung (the rows no held-out item holds predict 0: they score nothing)."""

        def predict(t1, t0, k):
            out = np.zeros((len(t1), len(self.e)))
            out[:, self.held[k]] = self.fold(t1, t0, k)[:, j]
            return out

        def at_rows(t1, t0, k, rows):  # the rows fold k's held-out items hold, as the refit reads them: no copy
            return self.fold(t1, t0, k)[:, j] if np.array_equal(rows, self.held[k]) else None

        return Rung(self.inv, len(self.e), predict, fractional=fractional, at_rows=at_rows)

    def share(self, i: int) -> Rung:
        """The cascade at the i-th share: each row's probability of the verdict 1."""
        return self._rung(i, True)

    def panel(self) -> Rung:
        """The cheap panel alone (its stacker's verdict)."""
        return self._rung(len(self.shares), False)

    def rungs(self) -> dict:
        """Each share's rung (keyed by its index) and the panel's (``panel``)."""
        return {**{i: self.share(i) for i in range(len(self.shares))}, "panel": self.panel()}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or np.array_equal(a, b)


def _ci(m: str, est: float, refit: np.ndarray, fixed: np.ndarray, correction: float, level: float) -> dict:
    """A metric's refit interval (the one read) and the fixed-prediction percentile interval beside it."""
    return {
        "estimate": float(est),
        "ci": refit_ci(m, est, refit, fixed, correction, level),
        "ci_fixed": interval(fixed, level),
    }


def _fixed_ci(est: float, fixed: np.ndarray, level: float) -> dict:
    """An interval of a verdict nothing was fitted for (the expensive judge): the same draws either way."""
    ci = interval(fixed, level)
    return {"estimate": float(est), "ci": ci, "ci_fixed": list(ci)}


def bootstrap_draws(
    ref: Reference,
    s: LadderSettings,
    refit: CascadeRefit,
    P: np.ndarray,
    counts: np.ndarray,
    workers: int | None = None,
) -> tuple[dict, dict, RefitDraws]:
    """One pass over the dataset's paired cluster bootstrap (the ladder's draws, :meth:`Reference.bootstrap`): the
    fixed predictions' metric draws (B × rows of P: the shares, the panel, the expensive judge), each refitted
    rung's (:class:`CascadeRefit`, on the ladder's folds) and the own term of the variance correction
    (:class:`src.core.refit.DrawReader` on ``workers`` threads, linearised at the rows' full-sample ``counts``)."""
    boot = ref.bootstrap(s.n_boot, s.seed)
    S = len(refit.shares)
    rungs = refit.rungs()
    full = {r: counts[S if r == "panel" else r] for r in rungs}
    reader = DrawReader(RefitBootstrap(ref.gold, ref.design.folds, boot), rungs, full, workers)
    (raw,) = boot.sweep([boot.per_cluster(ref.gold, P.T)], (reader.add,))
    rd = reader.result()
    return from_counts(ClusterBootstrap.unpack(raw)), {r: from_counts(c) for r, c in rd.counts.items()}, rd


def dataset(
    ref: Reference,
    stacker: StackedLogit,
    s: LadderSettings,
    expensive: str,
    shares: np.ndarray,
    cfg: CascadeSettings | Mapping,
    cost_1k: tuple[float, float],
    seed: int,
    flagged: np.ndarray | None = None,
    workers: int | None = None,
) -> dict:
    """The cascade curve of one dataset (see the module docstring); ``flagged`` items (a prompt injection,
    :func:`src.core.detector.scan`) escalate at every share; ``workers``: its refit bootstrap's threads."""
    cfg = settings(cfg)
    t = ref.table
    cheap_t, e_votes = _split(t, expensive)
    if not np.any(e_votes != ABSTAIN):
        return {"skipped": f"the expensive judge {expensive} answered no item of {ref.name}"}
    y = t.gold
    X, _ = design_matrix(cheap_t, list(s.features))
    st = clone(stacker).set_params(n_votes=len(cheap_t.members))
    cf = crossfit_cascade(
        X, y, e_votes, ref.design.folds, Cascade(st, tuple(shares)), rng_for(seed, "cascade", ref.name), flagged
    )
    P = np.vstack([cf["verdicts"], cf["panel"], e_votes])  # (S + 2) × n: the curve, panel alone, expensive alone
    counts = common.counts(y, P)
    refit_rule = CascadeRefit(st, X, e_votes, shares, ref.design.folds, flagged)
    fixed, refit, rd = bootstrap_draws(ref, s, refit_rule, P, counts, workers)
    reading = _Reading(from_counts(counts), fixed, refit, rd, len(shares), s.level)
    share = cf["escalated"].mean(axis=1)
    rand = _random_kappa(y, cf["panel"], e_votes, shares, cfg.random_draws, rng_for(seed, "cascade-random", ref.name))
    cheap_1k, exp_1k = cost_1k
    points = [
        {
            "target": float(shares[i]),
            "share": float(share[i]),
            **reading.point(i, float(cfg.margin)),
            "band_halfwidth": float(np.mean(cf["tau"][:, i])) if np.all(np.isfinite(cf["tau"][:, i])) else None,
            "random_kappa": float(rand[i]),
            "cost_per_1k": cheap_1k + float(share[i]) * exp_1k,
        }
        for i in range(len(shares))
    ]
    alone = reading.alone()
    alone["panel"]["cost_per_1k"], alone["expensive"]["cost_per_1k"] = cheap_1k, exp_1k
    alone["expensive"]["coverage"] = float(np.mean(e_votes != ABSTAIN))
    return {
        "n": int(len(y)),
        "flagged": int(0 if flagged is None else np.sum(flagged)),
        "cheap": cheap_t.members,
        "alone": alone,
        "points": points,
        "noninferior": _first_stable(points),
        "noninferior_fixed": _first_stable(points, fixed=True),
        "budgets": _at_budgets(points, cfg.budgets),
    }


class _Reading:
    """The intervals of one dataset's cascade from its draws (:func:`bootstrap_draws`): ``full`` / ``fixed`` the
    metrics of the rows of P (the S shares, the panel, the expensive judge) on the sample / the fixed-prediction
    draws, ``refit`` each refitted rung's metric draws (shares by index, ``panel``), ``rd`` their own term."""

    def __init__(self, full: dict, fixed: dict, refit: dict, rd: RefitDraws, n_shares: int, level: float):
        self.full, self.fixed, self.refit, self.rd, self.S, self.level = full, fixed, refit, rd, n_shares, level

    def metrics(self, rung: int | str) -> dict:
        """κ / bacc / F1 of a refitted rung: the refit interval and the fixed-prediction one beside it."""
        j = self.S if rung == "panel" else int(rung)
        return {
            m: _ci(
                m,
                self.full[m][j],
                self.refit[rung][m],
                self.fixed[m][:, j],
                self.rd.correction({(rung, m): 1.0}),
                self.level,
            )
            for m in METRICS
        }

    def delta(self, i: int, other: str) -> tuple[Delta, Delta]:
        """Δκ (share i − ``other``: ``expensive`` or ``panel``), paired: (refit, fixed predictions)."""
        j = self.S + 1 if other == "expensive" else self.S
        k_full, k_fixed = self.full["kappa"], self.fixed["kappa"]
        estimate = k_full[i] - k_full[j]
        held = k_fixed[:, i] - k_fixed[:, j]
        against = k_fixed[:, j] if other == "expensive" else self.refit["panel"]["kappa"]
        coef = {(i, "kappa"): 1.0} if other == "expensive" else {(i, "kappa"): 1.0, ("panel", "kappa"): -1.0}
        refit = refit_delta(estimate, self.refit[i]["kappa"] - against, held, self.rd.correction(coef), self.level)
        return refit, paired_delta(estimate, held, self.level)

    def point(self, i: int, margin: float) -> dict:
        """The i-th share's intervals, its paired Δκ against the expensive judge and the panel, and whether it is
        non-inferior to the expensive judge (lower bound of Δκ > −margin) on each interval."""
        d_exp, d_exp_fixed = self.delta(i, "expensive")
        d_pan, d_pan_fixed = self.delta(i, "panel")
        return {
            **self.metrics(i),
            "delta_expensive": d_exp.as_dict(),
            "delta_expensive_fixed": d_exp_fixed.as_dict(),
            "delta_panel": d_pan.as_dict(),
            "delta_panel_fixed": d_pan_fixed.as_dict(),
            "noninferior": bool(d_exp.ci[0] > -margin),
            "noninferior_fixed": bool(d_exp_fixed.ci[0] > -margin),
        }

    def alone(self) -> dict:
        """The panel alone (refitted) and the expensive judge alone (nothing fitted: fixed draws)."""
        j = self.S + 1
        return {
            "panel": self.metrics("panel"),
            "expensive": {m: _fixed_ci(self.full[m][j], self.fixed[m][:, j], self.level) for m in METRICS},
        }


def _random_kappa(y, panel, expensive, shares, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """Mean κ over ``n_draws`` cascades that escalate each item with probability s (no use of p)."""
    if n_draws <= 0:
        return np.full(len(shares), np.nan)
    u = rng.random((n_draws, 1, len(y)))
    preds = merge(panel, expensive, u < np.asarray(shares)[None, :, None])  # R × S × n
    return common.kappas(y, preds.reshape(-1, len(y))).reshape(n_draws, len(shares)).mean(axis=0)


def _first_stable(points: list[dict], fixed: bool = False) -> dict | None:
    """The smallest target share from which every point of the grid is non-inferior, with its numbers: on the refit
    interval of Δκ (the headline), or with ``fixed`` on the fixed-prediction one."""
    key = "_fixed" if fixed else ""
    ok = [p["noninferior" + key] for p in points]
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
        "delta_expensive": p["delta_expensive" + key],
        "cost_per_1k": p["cost_per_1k"],
    }


def _at_budgets(points: list[dict], budgets: list) -> dict:
    by = {round(p["target"], 6): p for p in points}
    keys = ("share", "kappa", "delta_expensive", "delta_expensive_fixed", "cost_per_1k")
    return {f"{float(b):g}": {k: by[round(float(b), 6)][k] for k in keys} for b in budgets}


def run(
    refs: Mapping[str, Reference],
    table: VerdictTable,
    stacker: StackedLogit,
    s: LadderSettings,
    cfg: CascadeSettings | Mapping,
    costs: Mapping,
    seed: int,
    flags: Mapping[str, bool] | None = None,
) -> dict:
    """The ``cascade`` block of suite.json. ``cfg``: the cascade's settings (``suite.cascade``); ``costs``: the
    suite's cost block of this panel (:func:`src.studies.suite.cost.compute`: each member's and the frontier's cost
    per 1k items); ``flags``: {item_id: flagged as a prompt injection} (:func:`item_flags`), escalated at every
    share where ``suite.cascade.injection_defence`` is ``escalate`` (an item not in it is not flagged)."""
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
    defended = cfg.injection_defence == "escalate" and flags is not None
    outer, inner = dataset_threads(table, s.n_boot)  # small datasets side by side, as the ladder's

    def one(item: tuple[str, Reference]) -> tuple[str, dict]:
        n, r = item
        flagged = np.array([bool(flags.get(str(i), False)) for i in r.table.items["item_id"]]) if defended else None
        return n, dataset(r, stacker, s, expensive, shares, cfg, (cheap_1k, exp_1k), seed, flagged, inner)

    per = dict(in_order(one, refs.items(), outer))
    done = {n: d for n, d in per.items() if "skipped" not in d}
    saved = {
        key: [d[key]["calls_saved"] if d[key] else 0.0 for d in done.values()]
        for key in ("noninferior", "noninferior_fixed")
    }
    return {
        "expensive": expensive,
        "chosen_as": how,
        "injection_defence": cfg.injection_defence,
        "cheap": cheap,
        "interval": "refit_corrected",
        "margin": float(cfg.margin),
        "operating_points": [float(v) for v in cfg.operating_points],
        "budgets": [float(v) for v in cfg.budgets],
        "cost_per_1k": {"cheap_panel": cheap_1k, "expensive": exp_1k},
        "datasets": per,
        "summary": {
            "datasets": len(done),
            "noninferior": sum(d["noninferior"] is not None for d in done.values()),
            "calls_saved_mean": float(np.mean(saved["noninferior"])) if done else None,
            "noninferior_fixed": sum(d["noninferior_fixed"] is not None for d in done.values()),
            "calls_saved_mean_fixed": float(np.mean(saved["noninferior_fixed"])) if done else None,
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
