"""The refit paired cluster bootstrap (§2's paired cluster bootstrap, with every label-fitted step redone per draw).

§2 reads each comparison off a paired cluster bootstrap of the out-of-fold predictions: clusters are resampled
and the predictions scored again, the predictions themselves kept. That leaves out the variance of what was
fitted to the labels — the stacker's β, the CV-best single judge's selection, the weighted votes' weights — and
its intervals cover less than they claim at a few hundred items (docs/intervals.md). Here, within every draw,
what was fitted is fitted again on the draw's clusters:

* each cluster keeps the fold it has in the data (§2's 5-fold cluster folds), and a draw's copies of a cluster
  count with their multiplicity: a fold's training part is the draw's clusters outside the fold, weighted by
  how often the draw took them (as duplicated rows would be), its held-out part the draw's clusters inside it;
* the stacker — scikit-learn's ``LogisticRegression(C)`` objective, C·Σ wᵢ·logloss + ½‖β‖² with a free
  intercept — is refitted per draw and fold by :func:`fit_logit` (batched Newton, all draws at once) and
  predicts the held-out clusters;
* the CV-best single judge is chosen again per draw and fold (κ on the training part, among the members that
  answer ``min_coverage`` of it) and scored on the held-out part;
* the accuracy- and log-odds-weighted votes take their weights from the training part's accuracies.

Everything is a sum of per-cluster counts weighted by the draw's multiplicities, so each step is a matrix
product over (draws × clusters); the draws are those of :class:`src.core.evaluate.ClusterBootstrap` (same seed, same
B), so the refit and the fixed-prediction intervals come from the same resampled clusters.

The refit draws' variance overstates the estimate's: a cluster's outcomes enter a draw through its multiplicity and
again through the refitted predictions that score it. :class:`RefitDraws` reads the comparators' per-cluster counts
side by side and takes the second term out; :func:`corrected_interval` turns the corrected variance into the
interval the ladder's calls read (docs/intervals.md has the derivation and the measured coverage).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.stats import norm
from sklearn.base import clone

from src.core.aggregate import WeightedVote, member_accuracy
from src.core.evaluate import MAX_WEIGHT_BYTES, ClusterBootstrap, from_counts, indicators

# a training part holding one gold class only is fitted as scikit-learn cannot: β = 0, intercept ±this
SINGLE_CLASS_LOGIT = 30.0


def _log1pexp_sigmoid(eta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log(1 + eᶯ) and σ(η), stable for any η."""
    e = np.exp(-np.abs(eta))
    return np.maximum(eta, 0.0) + np.log1p(e), np.where(eta >= 0, 1.0, e) / (1.0 + e)


def fit_logit(
    Z: np.ndarray,
    W1: np.ndarray,
    W0: np.ndarray,
    C: float = 1.0,
    start: np.ndarray | None = None,
    max_iter: int = 100,
    tol: float = 1e-8,
) -> np.ndarray:
    """M weighted L2 logistic regressions on shared rows; returns β (M × p), intercept first.

    ``Z`` (V × p) holds the distinct feature rows with the intercept's column of ones first; ``W1`` and ``W0``
    (M × V) each problem's weight of items with gold 1 and with gold 0 on each row (for unit items, their
    counts). Problem m minimises scikit-learn's ``LogisticRegression(C=C)`` objective on those items with
    ``sample_weight`` their weights: C·Σᵥ [(W1ₘᵥ + W0ₘᵥ)·log(1 + e^{zᵥβ}) − W1ₘᵥ·zᵥβ] + ½‖β₁:‖² (the
    intercept β₀ unpenalised), by Newton's method from ``start`` (p, or M × p; default 0) with step halving
    where the objective would rise, all problems at once, until no coefficient of a problem moves by ``tol``
    (the convergence is quadratic by then: the answer is far closer than ``tol``). The objective is strictly
    convex, so the start changes the number of steps, not the answer. A problem whose items hold one class only
    (or none) gets β₁: = 0 and β₀ = ±:data:`SINGLE_CLASS_LOGIT` (it predicts that class; scikit-learn refuses
    such a fit).
    """
    Z = np.asarray(Z, float)
    W1, W0 = np.atleast_2d(np.asarray(W1, float)), np.atleast_2d(np.asarray(W0, float))
    M, p = len(W1), Z.shape[1]
    pos, neg = W1.sum(axis=1), W0.sum(axis=1)
    single = (pos <= 0) | (neg <= 0)
    B = np.zeros((M, p)) if start is None else np.array(np.broadcast_to(start, (M, p)), dtype=float)
    B[single] = 0.0
    B[single, 0] = np.where(pos[single] > 0, SINGLE_CLASS_LOGIT, -SINGLE_CLASS_LOGIT)
    lam = np.full(p, 1.0 / C)
    lam[0] = 0.0
    outer = (Z[:, :, None] * Z[:, None, :]).reshape(len(Z), p * p)  # V × p²: each row's zᵀz, flat

    def evaluate(w, w1, beta):
        """(η, σ(η), objective) of the problems with weights w (all items) and w1 (gold 1) at coefficients beta."""
        eta = beta @ Z.T
        sp, s = _log1pexp_sigmoid(eta)
        return eta, s, (w * sp - w1 * eta).sum(axis=1) + 0.5 * (beta**2 * lam).sum(axis=1)

    active = np.flatnonzero(~single)
    w1, w, b = W1[active], W1[active] + W0[active], B[active]
    eta, s, f = evaluate(w, w1, b)
    for _ in range(max_iter):
        if not len(active):
            break
        g = (w * s - w1) @ Z + b * lam
        H = ((w * s * (1 - s)) @ outer).reshape(len(active), p, p) + np.diag(lam)
        step = np.linalg.solve(H, g[..., None])[..., 0]
        b_new = b - step
        eta_new, s_new, f_new = evaluate(w, w1, b_new)
        t = np.ones(len(active))
        for _halving in range(40):  # halve the step of the problems whose objective went up
            bad = np.flatnonzero(f_new > f + 1e-13 * np.abs(f))
            if not len(bad):
                break
            t[bad] *= 0.5
            b_new[bad] = b[bad] - t[bad, None] * step[bad]
            eta_new[bad], s_new[bad], f_new[bad] = evaluate(w[bad], w1[bad], b_new[bad])
        b, eta, s, f = b_new, eta_new, s_new, f_new
        B[active] = b
        moving = np.abs(t[:, None] * step).max(axis=1) >= tol
        active, w, w1, b, eta, s, f = (a[moving] for a in (active, w, w1, b, eta, s, f))
    return B


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _rows(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of X and each item's row index."""
    uniq, inv = np.unique(np.asarray(X, float), axis=0, return_inverse=True)
    return uniq, inv.ravel()


class RefitBootstrap:
    """Per-draw refits of the ladder's label-fitted comparators on the draws of a :class:`ClusterBootstrap`.

    Built once per dataset from its gold, its cluster folds and the bootstrap. Each ``*_clusters`` method yields,
    chunk by chunk of draws, the chunk's cluster multiplicities w (chunk × clusters) and each cluster's confusion
    counts under the draw's refitted out-of-fold predictions (chunk × clusters × 6, the cells of
    :func:`src.core.evaluate.indicators`, unweighted); a draw's counts are Σ_c w_c · counts_c. The plain methods
    return those totals, B × 6, ready for :func:`src.core.evaluate.from_counts`.
    """

    def __init__(self, gold: np.ndarray, folds: list[tuple], boot: ClusterBootstrap):
        self.y = np.asarray(gold)
        self.boot = boot
        self.item_cluster = boot.item_cluster
        self.n_clusters = len(boot.cluster_ids)
        n = len(self.y)
        self.fold_of = np.full(n, -1)
        for k, (_, te) in enumerate(folds):
            self.fold_of[te] = k
        if (self.fold_of < 0).any():
            raise ValueError("the folds do not hold every item out once")
        self.n_folds = len(folds)

    # ------------------------------------------------------------------------------------------- plumbing

    def _by_cluster(self, cols: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """Σ over each cluster's items with ``keep`` of ``cols`` (n × q) → n_clusters × q."""
        n = len(self.y)
        agg = sparse.csr_matrix((keep.astype(float), (self.item_cluster, np.arange(n))), shape=(self.n_clusters, n))
        return np.asarray(agg @ cols)

    def _row_counts(self, inv: np.ndarray, n_rows: int, keep: np.ndarray) -> sparse.csc_matrix:
        """n_rows × n_clusters: how many of each cluster's items with ``keep`` have each distinct row."""
        idx = np.flatnonzero(keep)
        return sparse.csc_matrix(
            (np.ones(len(idx)), (inv[idx], self.item_cluster[idx])), shape=(n_rows, self.n_clusters)
        )

    def _draw_chunks(self):
        """The draws' cluster multiplicities (float64), in chunks of draws small enough that a chunk × (items +
        6·clusters) array of doubles stays under 1/8 of :data:`src.core.evaluate.MAX_WEIGHT_BYTES`. Every comparator
        gets the same chunks, so their chunks can be read side by side."""
        width = len(self.y) + 6 * self.n_clusters
        rows = max(1, MAX_WEIGHT_BYTES // (64 * width))
        for w in self.boot.chunks():
            for a in range(0, len(w), rows):
                yield np.asarray(w[a : a + rows], dtype=float)

    @staticmethod
    def totals(chunks) -> np.ndarray:
        """B × 6: each draw's counts, Σ over clusters of multiplicity × the cluster's counts."""
        return np.vstack([np.einsum("bc,bck->bk", w, c) for w, c, *_ in chunks])

    def _rows_clusters(self, predict, X: np.ndarray):
        """Per chunk (w, counts) of 0/1 predictions that depend on an item's row of X only: ``predict(rows, t1, t0)``
        gives a chunk's predictions (chunk × rows) fitted with t1 / t0 (chunk × rows) as each row's weight of
        training items of gold 1 / gold 0 in each draw."""
        rows, inv = _rows(X)
        parts = [
            [
                self._row_counts(inv, len(rows), (self.fold_of != k if train else self.fold_of == k) & (self.y == g))
                for g in (1, 0)
                for train in (True, False)
            ]
            for k in range(self.n_folds)
        ]
        n1 = sum(np.asarray(p[1].sum(axis=0)).ravel() for p in parts)  # each cluster's held-out items of gold 1
        n0 = sum(np.asarray(p[3].sum(axis=0)).ravel() for p in parts)
        for w in self._draw_chunks():
            wt = w.T
            a11, a01 = np.zeros(w.shape), np.zeros(w.shape)
            for tr1, te1, tr0, te0 in parts:
                pred = predict(rows, (tr1 @ wt).T, (tr0 @ wt).T)  # chunk × rows
                a11 += np.asarray(te1.T @ pred.T).T
                a01 += np.asarray(te0.T @ pred.T).T
            zero = np.zeros(w.shape)
            yield w, np.stack([a11, n1 - a11, zero, a01, n0 - a01, zero], axis=-1)

    # ------------------------------------------------------------------------------------------- comparators

    def stacked_clusters(self, F: np.ndarray, C: float, threshold: float):
        """The stacker on its design matrix ``F`` (n × d, :meth:`src.core.aggregate.StackedLogit.features`), refitted
        per draw and fold (:func:`fit_logit`, started from the fit to the chunk's mean weights): hallucinated iff
        P ≥ ``threshold``."""

        def predict(rows, t1, t0):
            Z = np.column_stack([np.ones(len(rows)), rows])
            start = fit_logit(Z, t1.mean(axis=0), t0.mean(axis=0), C)
            return (_sigmoid(fit_logit(Z, t1, t0, C, start) @ Z.T) >= threshold).astype(float)

        return self._rows_clusters(predict, F)

    def stacked(self, F: np.ndarray, C: float, threshold: float) -> np.ndarray:
        """B × 6 totals of :meth:`stacked_clusters`."""
        return self.totals(self.stacked_clusters(F, C, threshold))

    def stacked_loop_clusters(self, stacker, X: np.ndarray):
        """Any other stacker (e.g. :class:`src.core.aggregate.NoiseRobustStackedLogit`), refitted per draw and fold by
        its own ``fit`` on the training part's items repeated by their multiplicity: the same refit as
        :meth:`stacked_clusters`, one fit at a time (B × folds fits). A training part of one gold class predicts
        it."""
        X = np.asarray(X, float)
        for w in self._draw_chunks():
            counts = np.zeros(w.shape + (6,))
            for b, row in enumerate(w):
                iw = row[self.item_cluster].astype(int)
                for k in range(self.n_folds):
                    tr, te = np.flatnonzero(self.fold_of != k), np.flatnonzero(self.fold_of == k)
                    rep = np.repeat(tr, iw[tr])
                    if len(np.unique(self.y[rep])) < 2:
                        pred = np.full(len(te), float(self.y[rep][0]) if len(rep) else 0.0)
                    else:
                        pred = clone(stacker).fit(X[rep], self.y[rep]).predict(X[te]).astype(float)
                    np.add.at(counts[b], self.item_cluster[te], indicators(self.y[te], pred))
            yield w, counts

    def stacked_loop(self, stacker, X: np.ndarray) -> np.ndarray:
        """B × 6 totals of :meth:`stacked_loop_clusters`."""
        return self.totals(self.stacked_loop_clusters(stacker, X))

    def weighted_clusters(self, votes: np.ndarray, weighting: str, threshold: float = 0.5):
        """The accuracy- or log-odds-weighted vote (:class:`src.core.aggregate.WeightedVote`), its member accuracies
        taken per draw and fold on the training part."""

        def predict(rows, t1, t0):
            both = np.vstack([rows, rows])
            acc = member_accuracy(both, np.r_[np.ones(len(rows)), np.zeros(len(rows))], np.hstack([t1, t0]))
            return (WeightedVote.p1_of(rows, WeightedVote.weights_of(acc, weighting), weighting) >= threshold).astype(
                float
            )

        return self._rows_clusters(predict, votes)

    def weighted(self, votes: np.ndarray, weighting: str, threshold: float = 0.5) -> np.ndarray:
        """B × 6 totals of :meth:`weighted_clusters`."""
        return self.totals(self.weighted_clusters(votes, weighting, threshold))

    def best_cv_clusters(self, votes: np.ndarray, min_coverage: float):
        """The CV-best single judge (:class:`src.core.aggregate.BestSingle`), chosen per draw and fold: the member
        with the highest κ on the training part among those answering at least ``min_coverage`` of it (all
        members when none does). Yields (w, counts of its out-of-fold votes, chunk × folds chosen members)."""
        votes = np.asarray(votes, float)
        K = votes.shape[1]
        ind = indicators(self.y, votes).reshape(len(self.y), K * 6)
        tr = [self._by_cluster(ind, self.fold_of != k) for k in range(self.n_folds)]
        te = [
            self._by_cluster(ind, self.fold_of == k).reshape(self.n_clusters, K, 6).transpose(1, 0, 2)
            for k in range(self.n_folds)
        ]  # K × clusters × 6
        for w in self._draw_chunks():
            c = np.zeros(w.shape + (6,))
            sel = np.empty((len(w), self.n_folds), int)
            for k in range(self.n_folds):
                fit = (w @ tr[k]).reshape(len(w), K, 6)
                kap = from_counts(fit)["kappa"]
                total = fit.sum(axis=2)
                cov = np.where(total > 0, (total - fit[..., 2] - fit[..., 5]) / np.where(total > 0, total, 1), 0.0)
                ok = cov >= min_coverage - 1e-12
                ok[~ok.any(axis=1)] = True
                sel[:, k] = np.argmax(np.where(ok, kap, -np.inf), axis=1)
                c += te[k][sel[:, k]]
            yield w, c, sel

    def best_cv(self, votes: np.ndarray, min_coverage: float) -> tuple[np.ndarray, np.ndarray]:
        """(B × 6 totals of :meth:`best_cv_clusters`, B × folds chosen members)."""
        parts = list(self.best_cv_clusters(votes, min_coverage))
        return self.totals(parts), np.vstack([p[2] for p in parts])


# ------------------------------------------------------------------------------------------- the variance


def gradients(counts: np.ndarray, h: float = 1e-4) -> dict[str, np.ndarray]:
    """Each metric's gradient in the six confusion cells at ``counts`` (:func:`src.core.evaluate.from_counts`, central
    differences of step ``h``): the linearisation that gives a cluster's contribution to a metric."""
    c = np.asarray(counts, dtype=float)
    steps = np.eye(6) * h
    up, down = from_counts(c + steps), from_counts(c - steps)
    return {m: (up[m] - down[m]) / (2 * h) for m in up}


OWN_MAX_BYTES = MAX_WEIGHT_BYTES  # :meth:`RefitDraws.collect` keeps per-cluster second moments up to this size


class RefitDraws:
    """The draws of the refitted comparators, read side by side (:meth:`collect`): each comparator's B × 6
    counts, and Σ over clusters of the covariance across draws of each cluster's own linearised contribution
    (``own``, units × units; a unit is a (comparator, metric) pair, its value for cluster c in draw b the
    gradient of the metric at the comparator's full-sample counts times the cluster's counts in that draw).

    Why the second part. In a refit draw a cluster's outcomes count twice: through its multiplicity (the
    sampling variance the bootstrap is for) and through the predictions that score it, which change as the
    comparators are refitted on the draw's other clusters. The variance of that second contribution, taken with
    the cluster's *observed* outcomes, is noise the estimate does not have — where a refit flips a decision on an
    item whose class is a coin flip given its votes, the flip moves the expected κ by nothing and the observed
    one by a whole item — so the refit bootstrap's variance overstates the estimate's. :meth:`variance` takes it
    out: Var*(S) − Σ_c Var*(s_c), with s_c the cluster's own linearised contribution to S (its multiplicity
    aside: w_c is independent of the predictions scoring c, so this keeps the cluster's sampling variance at the
    draws' predictions and every covariance between clusters — how the fit's variation moves many clusters at
    once, and how a cluster's weight moves the fits that score the others)."""

    def __init__(self, counts: dict[str, np.ndarray], units: list[tuple[str, str]], own: np.ndarray):
        self.counts, self.units, self.own = counts, units, own

    @classmethod
    def collect(cls, parts: dict[str, object], full: dict[str, np.ndarray]) -> RefitDraws:
        """Read the comparators' chunk generators (``*_clusters`` of :class:`RefitBootstrap`) side by side;
        ``full`` holds each comparator's full-sample counts (the linearisation point)."""
        names = list(parts)
        grads = {r: gradients(full[r]) for r in names}
        metrics = list(next(iter(grads.values())))
        units = [(r, m) for r in names for m in metrics]
        G = np.stack([np.stack([grads[r][m] for m in metrics], axis=1) for r in names])  # rungs × 6 × metrics
        totals: dict[str, list[np.ndarray]] = {r: [] for r in names}
        s1: np.ndarray | None = None
        s2: np.ndarray | None = None
        per_cluster = True
        n_draws = 0
        for chunk in zip(*parts.values()):
            w = chunk[0][0]
            u = np.concatenate([c[1] @ G[i] for i, c in enumerate(chunk)], axis=-1)  # draws × clusters × units
            for r, c in zip(names, chunk):
                totals[r].append(np.einsum("bc,bck->bk", w, c[1]))
            if s1 is None:  # each cluster's units × units second moments, unless they would not fit in memory
                per_cluster = u.shape[1] * len(units) ** 2 * 8 <= OWN_MAX_BYTES
            s1 = u.sum(axis=0) if s1 is None else s1 + u.sum(axis=0)
            if per_cluster:
                outer = np.einsum("bcu,bcv->cuv", u, u)
            else:  # one matrix product (BLAS) over every draw and cluster of the chunk
                flat = u.reshape(-1, u.shape[-1])
                outer = flat.T @ flat
            s2 = outer if s2 is None else s2 + outer
            n_draws += len(w)
        assert s1 is not None and s2 is not None, "no bootstrap draws"
        mean = s1 / n_draws
        if per_cluster:
            own = (s2 / n_draws - np.einsum("cu,cv->cuv", mean, mean)).sum(axis=0)
        else:  # the same sum over clusters, taken before the moments are combined (equal up to rounding)
            own = s2 / n_draws - mean.T @ mean
        return cls({r: np.vstack(v) for r, v in totals.items()}, units, own)

    def correction(self, coef: dict[tuple[str, str], float]) -> float:
        """Σ_c Var*(s_c) of the statistic Σ coef[unit]·unit (units not refitted count as constants)."""
        a = np.array([coef.get(u, 0.0) for u in self.units])
        return float(a @ self.own @ a)


def corrected_interval(
    estimate: float, draws: np.ndarray, fixed_draws: np.ndarray, correction: float, level: float = 0.95
) -> tuple[list[float], float, float]:
    """(interval, standard error, one-sided p of S ≤ 0) of a statistic from its refit draws: variance
    Var*(S) − ``correction`` (:class:`RefitDraws`), never under the fixed-prediction draws' variance (the
    sampling variance with the fit held, which the fit's variation can only add to); a normal interval around the
    estimate."""
    var = max(float(np.var(draws)) - correction, float(np.var(fixed_draws)))
    se = float(np.sqrt(var))
    z = float(norm.ppf(0.5 + level / 2))
    if se > 0:
        p = float(norm.sf(estimate / se))
    else:
        p = 0.0 if estimate > 0 else 1.0
    return [float(estimate - z * se), float(estimate + z * se)], se, p
