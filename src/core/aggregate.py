"""Aggregators of member votes (paper §2 "Stacked aggregation", the ladder of Table 1, Appendix I).

Every aggregator is a scikit-learn-style estimator over a vote matrix ``X`` (n × K, 0 / 1 / 0.5 = abstained):
``fit`` returns ``self``, fitted state ends in ``_``, ``__init__`` only stores parameters, so each one composes
with :func:`sklearn.model_selection.cross_val_predict` and with :func:`crossfit` below (which also keeps the
fitted per-fold estimators for the β report). Decision rule everywhere: hallucinated iff p ≥ ``threshold``
(0.5), which also breaks the ties of the unweighted majority (§2); a p within
:data:`src.core.verdicts.TIE_TOLERANCE` of the threshold is a tie, decided the same way on every machine
(:func:`src.core.verdicts.at_or_over`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.linear_model import LogisticRegression

from src.core import greedy
from src.core.evaluate import coverage, kappa
from src.core.verdicts import ABSTAIN, at_or_over

_EPS = 1e-3

BETA_DECIMALS = 10
"""The decimals of a fitted coefficient as RAIM writes it (:func:`reported_beta`)."""


def reported_beta(b: float) -> float:
    """A fitted coefficient as results.json and the β files hold it: rounded to :data:`BETA_DECIMALS` decimals, −0
    written 0. A fit's last bits follow the BLAS kernel and thread count (a β of 0 in exact arithmetic is computed as
    ±1e-16); the written β do not (:func:`src.mlops.registry.stacker_mismatch` reads them within that rounding)."""
    return round(float(b), BETA_DECIMALS) + 0.0


class _VoteClassifier(ClassifierMixin, BaseEstimator):
    """Shared plumbing: classes, the 0.5 decision rule, two-column probabilities."""

    threshold: float = 0.5

    def _set_classes(self, X: np.ndarray, y: np.ndarray | None) -> None:
        self.classes_ = np.array([0, 1])
        self.n_features_in_ = np.asarray(X).shape[1]

    def _p1(self, X: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        p = np.clip(self._p1(np.asarray(X, dtype=float)), 0.0, 1.0)
        return np.column_stack([1.0 - p, p])

    def predict(self, X: np.ndarray) -> np.ndarray:
        return at_or_over(self.predict_proba(X)[:, 1], self.threshold).astype(int)


class StackedLogit(_VoteClassifier):
    """The RAIM meta-learner: P(y=1|v) = σ(β₀ + Σ βᵢ vᵢ), L2 penalty 1/C with C = 1 (§2).

    ``abstention="scalar"`` feeds the votes as they are (abstain = 0.5, the paper's setting);
    ``"category"`` one-hot encodes each member's vote as (voted hallucinated, abstained) against the
    reference "voted supported" (Table 23). Columns past ``n_votes`` are continuous extras (e.g. log-odds)
    passed through unchanged.
    """

    def __init__(
        self,
        C: float = 1.0,
        abstention: str = "scalar",
        threshold: float = 0.5,
        n_votes: int | None = None,
        max_iter: int = 1000,
    ):
        self.C = C
        self.abstention = abstention
        self.threshold = threshold
        self.n_votes = n_votes
        self.max_iter = max_iter

    def features(self, X: np.ndarray) -> np.ndarray:
        """The meta-learner's design matrix for a vote matrix (scalar or categorical abstention, then extras)."""
        X = np.asarray(X, dtype=float)
        k = X.shape[1] if self.n_votes is None else self.n_votes
        votes, extra = X[:, :k], X[:, k:]
        if self.abstention == "scalar":
            F = votes
        elif self.abstention == "category":
            F = np.column_stack([(votes == 1).astype(float), (votes == ABSTAIN).astype(float)])
        else:
            raise ValueError(f"abstention must be 'scalar' or 'category', got {self.abstention!r}")
        return np.column_stack([F, extra]) if extra.size else F

    def logistic_regression(self) -> LogisticRegression:
        """newton-cholesky: the exact L2 optimum, fast for a handful of features (same fit as lbfgs, C=1)."""
        return LogisticRegression(C=self.C, solver="newton-cholesky", max_iter=self.max_iter)

    def fit(self, X: np.ndarray, y: np.ndarray) -> StackedLogit:
        self._set_classes(X, y)
        self.lr_ = self.logistic_regression()
        self.lr_.fit(self.features(X), y)
        self.coef_ = self.lr_.coef_.ravel().copy()
        self.intercept_ = float(self.lr_.intercept_[0])
        self.train_prevalence_ = float(np.mean(y))  # the prior its posteriors assume (src.studies.prevalence.adjust)
        return self

    def _p1(self, X: np.ndarray) -> np.ndarray:
        return self.lr_.predict_proba(self.features(X))[:, 1]

    def state(self) -> dict:
        """The fitted stacker as plain data — its parameters, β and training prevalence — which a RAIM model stores
        instead of a pickle; :meth:`from_state` rebuilds the same predictions, bit for bit."""
        return {
            "params": {k: list(v) if isinstance(v, tuple) else v for k, v in self.get_params().items()},
            "n_features_in": int(self.n_features_in_),
            "intercept": float(self.intercept_),
            "coef": [float(b) for b in self.coef_],
            "train_prevalence": getattr(self, "train_prevalence_", None),
        }

    @classmethod
    def from_state(cls, state: dict) -> StackedLogit:
        """The fitted stacker :meth:`state` describes (its keys and values checked by the caller:
        :func:`src.mlops.artifact.read`)."""
        est = cls(**state["params"])
        est.classes_ = np.array([0, 1])
        est.n_features_in_ = int(state["n_features_in"])
        est.intercept_ = float(state["intercept"])
        est.coef_ = np.asarray(state["coef"], dtype=float)
        est.train_prevalence_ = state["train_prevalence"]
        est.lr_ = est.logistic_regression()
        est.lr_.classes_ = est.classes_.copy()
        est.lr_.coef_ = est.coef_[None, :].copy()
        est.lr_.intercept_ = np.array([est.intercept_])
        est.lr_.n_features_in_ = est.coef_.size
        return est

    def feature_names(self, members: list[str], extras: Sequence[str] = ()) -> list[str]:
        """Names aligned with ``coef_``."""
        if self.abstention == "category":
            base = [f"{m}=1" for m in members] + [f"{m}=abstain" for m in members]
        else:
            base = list(members)
        return base + list(extras)


class MajorityVote(_VoteClassifier):
    """Unweighted majority: mean vote (abstain counts 0.5) ≥ threshold; label-free, ``fit`` learns nothing."""

    def __init__(self, threshold: float = 0.5):
        self.threshold = threshold

    def fit(self, X: np.ndarray, y: np.ndarray | None = None) -> MajorityVote:
        self._set_classes(X, y)
        return self

    def _p1(self, X: np.ndarray) -> np.ndarray:
        return X.mean(axis=1)


def member_accuracy(X: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Each member's accuracy over the items it voted on (abstentions excluded); 0.5 if it never voted.
    ``weights`` (M × n item weights, e.g. bootstrap multiplicities) gives one row of accuracies per weighting."""
    voted = X != ABSTAIN
    correct = (X == y[:, None]) & voted
    n, hits = (voted.sum(axis=0), correct.sum(axis=0)) if weights is None else (weights @ voted, weights @ correct)
    return np.where(n > 0, hits / np.where(n > 0, n, 1), 0.5)


class WeightedVote(_VoteClassifier):
    """Accuracy- or log-odds-weighted vote, weights fitted on labelled data (Appendix I).

    ``accuracy``: p = Σ aᵢ vᵢ / Σ aᵢ. ``logodds``: p = σ(Σ wᵢ (2vᵢ − 1)) with wᵢ = log(aᵢ / (1 − aᵢ)), the
    symmetric-noise naive-Bayes posterior; an abstention (v = 0.5) contributes nothing to either.
    """

    def __init__(self, weighting: str = "accuracy", threshold: float = 0.5):
        self.weighting = weighting
        self.threshold = threshold

    def fit(self, X: np.ndarray, y: np.ndarray) -> WeightedVote:
        self._set_classes(X, y)
        self.weights_ = self.weights_of(member_accuracy(np.asarray(X, float), np.asarray(y)), self.weighting)
        return self

    @staticmethod
    def weights_of(accuracy: np.ndarray, weighting: str) -> np.ndarray:
        """The members' weights from their accuracies (… × K), clipped to [ε, 1 − ε]."""
        acc = np.clip(accuracy, _EPS, 1 - _EPS)
        if weighting == "accuracy":
            return acc
        if weighting == "logodds":
            return np.log(acc / (1 - acc))
        raise ValueError(f"weighting must be 'accuracy' or 'logodds', got {weighting!r}")

    @staticmethod
    def p1_of(X: np.ndarray, weights: np.ndarray, weighting: str) -> np.ndarray:
        """P(hallucinated) of the vote rows X (n × K) under weights (K,) → (n,), or under M weightings (M × K)
        → M × n."""
        W = np.asarray(weights, dtype=float).T  # K, or K × M
        if weighting == "accuracy":
            p = X @ W / W.sum(axis=0)
        else:
            p = 1.0 / (1.0 + np.exp(-((2 * X - 1) @ W)))
        return p.T

    def _p1(self, X: np.ndarray) -> np.ndarray:
        return self.p1_of(X, self.weights_, self.weighting)


def eligible(X: np.ndarray, min_coverage: float) -> np.ndarray:
    """Members that answer at least ``min_coverage`` of the items (a judge that voted on 2 of 193 items must not
    become the best single on its κ over those two); coverage is label-free, so this leaks nothing."""

    cov = coverage(X) if len(X) else np.zeros(np.shape(X)[1])
    return cov >= min_coverage - 1e-12


class BestSingle(_VoteClassifier):
    """One member chosen by its κ on the data it is fitted on (CV-best when cross-fitted, §2), among the
    members that answer at least ``min_coverage`` of those items (:func:`eligible`).

    Predictions are that member's votes, abstentions included (0.5 stays an abstention for the metrics).
    """

    def __init__(self, threshold: float = 0.5, min_coverage: float = 0.5):
        self.threshold = threshold
        self.min_coverage = min_coverage

    def fit(self, X: np.ndarray, y: np.ndarray) -> BestSingle:

        self._set_classes(X, y)
        X = np.asarray(X, dtype=float)
        ok = eligible(X, self.min_coverage)
        if not ok.any():
            raise ValueError(f"no member answers at least {self.min_coverage:g} of the items it is fitted on")
        self.scores_ = np.array([kappa(np.asarray(y), X[:, j]) for j in range(X.shape[1])])
        self.best_ = int(np.argmax(np.where(ok, self.scores_, -np.inf)))
        return self

    def _p1(self, X: np.ndarray) -> np.ndarray:
        return X[:, self.best_]

    def predict(self, X: np.ndarray) -> np.ndarray:
        """The member's own vote: 0, 1 or 0.5 (abstained)."""
        return np.asarray(X, dtype=float)[:, self.best_]


class DawidSkene(_VoteClassifier):
    """Unsupervised two-class Dawid–Skene (label-free rung of the ladder): EM in numpy, run to convergence.

    Abstentions (0.5) are missing labels. The EM starts as crowd-kit 1.4.2 does (majority-vote posteriors, i.e.
    each item's vote shares, then an M-step) and alternates E-step and M-step, each iteration exactly crowd-kit's,
    until no posterior moves by ``tol`` or more in one EM step (``converged_``) or ``n_iter`` EM steps have run
    (``n_iter_``; a :class:`~sklearn.exceptions.ConvergenceWarning` then). Unlike crowd-kit it does not stop on
    its ELBO check, which is not monotone and ends some fits after a few iterations.

    ``accelerate=True`` reaches the fixed point plain EM creeps towards in fewer EM steps (SQUAREM, Varadhan &
    Roland 2008, "Simple and globally convergent methods for accelerating the convergence of any EM algorithm",
    Scand. J. Stat., scheme S3): every cycle takes two EM steps from the parameters, extrapolates along them, and
    takes one EM step from the extrapolated point, kept only when the parameters stay probabilities and the
    likelihood is at least that of the two plain steps (otherwise the two plain steps are kept). It starts once a
    plain step moves no posterior by ``_LOCAL`` (started at once, it can jump to another fixed point), the
    likelihood never falls, and the fit ends on a plain EM step under the same rule (``tol``). The cpu roster's
    MedHallu takes about 1,000 EM steps instead of 13,785; ``accelerate=False`` is crowd-kit's sequence of
    iterates, step for step. Fitted state:

    * ``priors_`` — (P(y=0), P(y=1)), the mean posterior over the items with at least one vote;
    * ``confusion_`` — K × 2 × 2, ``confusion_[j, t, o]`` = P(member j says o | true t); a member that never
      voted gets 0.5 everywhere (its votes carry no evidence);
    * ``probas_`` — n × 2 array of the fitted items' posteriors (P(y=0), P(y=1)) from the last E-step; an item
      nobody voted on gets ``priors_``. A table without a single vote gives 0.5 everywhere.

    The only smoothing is crowd-kit's: expected counts and priors are floored at ``1e-10`` before normalising /
    taking logs (crowd-kit floors only the labels a member gave; flooring every cell moves a confusion entry by
    at most 1e-10 over the member's expected count), so a constant voter, a silent member or an exact zero give
    finite posteriors.
    ``predict_proba`` applies the fitted model's E-step to any vote matrix (at convergence, on the fitted items,
    ``probas_``).
    """

    _FLOOR = 1e-10  # crowd-kit's _EPS
    _LOCAL = 1e-4  # acceleration starts once a plain EM step moves no posterior by this much (in its basin)

    def __init__(self, n_iter: int = 100_000, tol: float = 1e-10, threshold: float = 0.5, accelerate: bool = True):
        self.n_iter = n_iter
        self.tol = tol
        self.threshold = threshold
        self.accelerate = accelerate

    @staticmethod
    def _onehot(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(votes == 0, votes == 1) as floats, n × K each; an abstention is neither."""
        X = np.asarray(X, dtype=float)
        return (X == 0).astype(float), (X == 1).astype(float)

    @classmethod
    def _m(cls, X0: np.ndarray, X1: np.ndarray, q: np.ndarray, weights: np.ndarray) -> tuple:
        """M-step: (priors, confusion) — priors from ``weights`` (1 / #voted items on each voted item, else 0),
        confusion from floored, normalised expected counts."""
        counts = np.maximum(np.stack([X0.T @ q, X1.T @ q], axis=2), cls._FLOOR)  # [j, t, o]
        return weights @ q, counts / counts.sum(axis=2, keepdims=True)

    @classmethod
    def _e(cls, X0: np.ndarray, X1: np.ndarray, priors: np.ndarray, confusion: np.ndarray) -> np.ndarray:
        """E-step: posteriors (P(y=0), P(y=1)), the prior's log-odds plus each vote's log-likelihood ratio, through σ."""
        from scipy.special import expit  # imported here, not at start-up: scipy

        llr = np.diff(np.log(confusion), axis=1)[:, 0, :]  # [j, o]: log P(o | 1) − log P(o | 0)
        z = np.diff(np.log(np.maximum(priors, cls._FLOOR)))[0] + X0 @ llr[:, 0] + X1 @ llr[:, 1]
        return np.column_stack([expit(-z), expit(z)])

    @classmethod
    def _loglik(
        cls, X0: np.ndarray, X1: np.ndarray, voted: np.ndarray, priors: np.ndarray, confusion: np.ndarray
    ) -> float:
        """Marginal log-likelihood of the votes, Σ over voted items of log Σ_t P(t) Π_j P(vote_j | t)."""
        logc = np.log(confusion)
        a = np.log(np.maximum(priors, cls._FLOOR)) + X0 @ logc[:, :, 0] + X1 @ logc[:, :, 1]
        return float(np.logaddexp(a[voted, 0], a[voted, 1]).sum())

    def fit(self, X: np.ndarray, y: np.ndarray | None = None) -> DawidSkene:
        self._set_classes(X, y)
        X0, X1 = self._onehot(X)
        shares = np.column_stack([X0.sum(axis=1), X1.sum(axis=1)])
        voted = shares.sum(axis=1) > 0
        self.n_iter_, self.converged_ = 0, not voted.any()
        if not voted.any():  # nothing to learn from: flat model
            self.priors_, self.confusion_ = np.full(2, 0.5), np.full((X0.shape[1], 2, 2), 0.5)
            self.probas_ = np.full((len(X0), 2), 0.5)
            return self
        # crowd-kit's start: majority-vote posteriors (vote shares); 0.5 where nobody voted
        q = np.where(voted[:, None], shares / np.maximum(shares.sum(axis=1, keepdims=True), 1), 0.5)
        weights = voted / voted.sum()
        theta, step = self._m(X0, X1, q, weights), np.inf
        while self.n_iter_ < self.n_iter and not self.converged_:
            if self.accelerate and step < self._LOCAL and self.n_iter_ + 3 <= self.n_iter:
                q, theta = self._squarem_cycle(X0, X1, voted, weights, q, theta)
            else:
                q_new = self._e(X0, X1, *theta)
                theta = self._m(X0, X1, q_new, weights)
                step = np.abs(q_new - q).max()
                self.converged_ = bool(step < self.tol)
                q, self.n_iter_ = q_new, self.n_iter_ + 1
        self.priors_, self.confusion_ = theta
        self.probas_ = q
        if not self.converged_:
            from sklearn.exceptions import ConvergenceWarning  # imported here, not at start-up: scikit-learn ~1.4 s

            warnings.warn(
                f"Dawid–Skene EM did not converge in {self.n_iter} iterations (tol={self.tol:g})",
                ConvergenceWarning,
                stacklevel=2,
            )
        return self

    def _squarem_cycle(self, X0, X1, voted, weights, q, theta) -> tuple:
        """One SQUAREM (S3) cycle from ``theta`` (``q``: the posteriors it was fitted to): (posteriors, parameters)
        after it; sets ``converged_`` when one of its plain EM steps moved no posterior by ``tol``."""
        q1 = self._e(X0, X1, *theta)
        theta1 = self._m(X0, X1, q1, weights)
        q2 = self._e(X0, X1, *theta1)
        theta2 = self._m(X0, X1, q2, weights)
        self.n_iter_ += 2
        if np.abs(q1 - q).max() < self.tol:  # the first plain step already moved nothing
            self.converged_ = True
            return q1, theta1
        if np.abs(q2 - q1).max() < self.tol:
            self.converged_ = True
            return q2, theta2
        flat = [np.concatenate([p.ravel(), c.ravel()]) for p, c in (theta, theta1, theta2)]
        r, v = flat[1] - flat[0], flat[2] - 2 * flat[1] + flat[0]
        alpha = min(-1.0, -float(np.linalg.norm(r)) / max(float(np.linalg.norm(v)), 1e-300))
        ext = flat[0] - 2 * alpha * r + alpha**2 * v
        if alpha == -1.0 or not ((ext > 0) & (ext < 1)).all():
            return q2, theta2
        p_ext, c_ext = ext[:2], ext[2:].reshape(theta[1].shape)
        c_ext = c_ext / c_ext.sum(axis=2, keepdims=True)
        q3 = self._e(X0, X1, p_ext, c_ext)
        theta3 = self._m(X0, X1, q3, weights)
        self.n_iter_ += 1
        if self._loglik(X0, X1, voted, *theta3) < self._loglik(X0, X1, voted, *theta2):
            return q2, theta2
        return q3, theta3

    def _p1(self, X: np.ndarray) -> np.ndarray:
        return self._e(*self._onehot(X), self.priors_, self.confusion_)[:, 1]


def _long_format(X: np.ndarray) -> pd.DataFrame:
    """crowd-kit's long format of a vote matrix (task, worker, label), abstentions dropped: the tests and
    ``bench/bench_dawid_skene.py`` compare :class:`DawidSkene` with crowd-kit on it."""
    task, worker = np.nonzero(X != ABSTAIN)
    return pd.DataFrame({"task": task, "worker": worker, "label": X[task, worker].astype(int)})


# ---------------------------------------------------------------------------------------------- cross-fitting


def cluster_folds(y: np.ndarray, clusters: np.ndarray, n_splits: int = 5, seed: int = 0) -> list[tuple]:
    """Folds made of whole clusters, stratified on gold (§2: 5-fold cross-fitting, no cluster split).

    The folds of scikit-learn's ``StratifiedGroupKFold(n_splits, shuffle=True, random_state=seed)``, index for
    index (:func:`_stratified_group_assignment` replays its greedy assignment without its per-fold numpy calls;
    :func:`src.core.greedy.assign` runs the same replay compiled, for tables of many clusters).
    """
    n_clusters = len(np.unique(clusters))
    if n_clusters < n_splits:
        raise ValueError(f"cross-fitting needs at least {n_splits} clusters, got {n_clusters}")
    _, y_inv, y_cnt = np.unique(np.asarray(y), return_inverse=True, return_counts=True)
    if np.all(n_splits > y_cnt):
        raise ValueError(f"n_splits={n_splits} cannot be greater than the number of members in each class.")
    _, g_inv = np.unique(np.asarray(clusters), return_inverse=True)
    g_inv = g_inv.ravel()
    per_group = np.zeros((n_clusters, len(y_cnt)))
    np.add.at(per_group, (g_inv, y_inv.ravel()), 1.0)
    perm = np.random.RandomState(seed).permutation(n_clusters)  # StratifiedGroupKFold's shuffle of the groups
    fold_of = np.empty(n_clusters, int)
    shuffled = per_group[perm]
    assigned = greedy.assign(shuffled, y_cnt, n_splits)  # compiled for many clusters, else replayed here
    fold_of[perm] = _stratified_group_assignment(shuffled, y_cnt, n_splits) if assigned is None else assigned
    item_fold = fold_of[g_inv]
    idx = np.arange(len(g_inv))
    return [(idx[item_fold != k], idx[item_fold == k]) for k in range(n_splits)]


def _stratified_group_assignment(per_group: np.ndarray, y_cnt: np.ndarray, n_splits: int) -> np.ndarray:
    """The fold of each group (rows: class counts, in shuffled order), by StratifiedGroupKFold's greedy rule:
    groups by decreasing spread of their class counts (stable), each to the fold whose trial assignment gives the
    lowest mean over classes of the std over folds of (fold class count / class total), ties (``np.isclose``)
    to the fold with fewer items. The arithmetic repeats numpy's order of operations (sequential sums over the
    folds, then over the classes), so every comparison — ties included — comes out as scikit-learn's. Each
    fold's shares are kept between groups (only the chosen fold's change), so a trial computes one new share."""
    totals = [float(c) for c in y_cnt]
    counts = [[0.0] * len(totals) for _ in range(n_splits)]  # [fold][class]
    shares = [[0.0] * n_splits for _ in totals]  # [class][fold]: counts / class total
    sizes = [0.0] * n_splits
    rows = per_group.tolist()
    out = np.empty(len(per_group), int)
    for g in np.argsort(-np.std(per_group, axis=1), kind="stable").tolist():
        add = rows[g]
        best, min_eval, min_size = 0, math.inf, math.inf
        for i in range(n_splits):
            ev = _trial_eval(shares, [(counts[i][c] + a) / t for c, (a, t) in enumerate(zip(add, totals))], i)
            if ev < min_eval or (abs(ev - min_eval) <= 1e-8 + 1e-5 * abs(min_eval) and sizes[i] < min_size):
                best, min_eval, min_size = i, ev, sizes[i]
        counts[best] = [a + b for a, b in zip(counts[best], add)]
        sizes[best] = sum(counts[best])
        for c, t in enumerate(totals):
            shares[c][best] = counts[best][c] / t
        out[g] = best
    return out


def _trial_eval(shares: list[list[float]], trial: list[float], i: int) -> float:
    """``np.mean(np.std(trial_counts / totals, axis=0))`` with fold ``i``'s shares replaced by ``trial``."""
    k, ev = len(shares[0]), 0.0
    for c, row in enumerate(shares):
        v = row.copy()
        v[i] = trial[c]
        m = v[0]
        for x in v[1:]:
            m += x
        m /= k
        ss = 0.0
        for x in v:
            d = x - m
            ss += d * d
        std = math.sqrt(ss / k)
        ev = std if c == 0 else ev + std
    return ev / len(shares)


@dataclass
class CrossFit:
    """Out-of-fold probabilities and predictions, with the estimator fitted on each fold's training part."""

    proba: np.ndarray
    pred: np.ndarray
    estimators: list
    folds: list


def crossfit(estimator, X: np.ndarray, y: np.ndarray, folds: list[tuple]) -> CrossFit:
    """Fit a clone per fold on its training clusters, predict its held-out clusters (out-of-fold)."""
    X = np.asarray(X, dtype=float)
    proba = np.empty(len(y))
    pred = np.empty(len(y))
    fitted = []
    for tr, te in folds:
        est = clone(estimator).fit(X[tr], y[tr])
        proba[te] = est.predict_proba(X[te])[:, 1]
        pred[te] = est.predict(X[te])
        fitted.append(est)
    return CrossFit(proba, pred, fitted, folds)


# ---------------------------------------------------------------------------------------- noisy calibration labels


class NoiseRobustStackedLogit(StackedLogit):
    """The RAIM stacker fitted through noisy calibration labels by forward loss correction (beyond the paper).

    Patrini et al. (2017), "Making deep neural networks robust to label noise: a loss correction approach"
    (CVPR), §3 forward correction, for two classes: with flip rates ρ₀ = P(ỹ=1 | y=0) and ρ₁ = P(ỹ=0 | y=1) the
    noisy label is modelled as q(x) = P(ỹ=1 | x) = ρ₀ + (1 − ρ₀ − ρ₁)·σ(β₀ + βᵀf(x)), and β maximises the
    likelihood of the noisy labels under q with the paper's L2 penalty (the objective of scikit-learn's
    ``LogisticRegression``, C·Σ loss + ½‖β‖², intercept unpenalised). Predictions are σ(β₀ + βᵀf(x)): the
    clean-label posterior (Natarajan et al. 2013, "Learning with noisy labels", NeurIPS, give the same
    class-conditional noise model). With ρ₀ = ρ₁ = 0 it is :class:`StackedLogit`.

    ``flip_rates`` = (ρ₀, ρ₁) when known; ``None`` estimates them on the training items without clean labels:
    Dawid & Skene (1979) on the members' votes with the noisy label as one more annotator, whose fitted
    confusion matrix gives (ρ₀, ρ₁) (conditional independence of the label source and the members given the
    truth; it fails when the labels come from a member, or when flips concentrate where members err). Each rate
    is capped at ``max_flip`` and their sum kept under 1. Fitted: ``flip_rates_``, the β of the parent and
    ``train_prevalence_``, the clean-label prevalence the noise model implies (the prior of its posteriors).
    """

    def __init__(
        self,
        C: float = 1.0,
        abstention: str = "scalar",
        threshold: float = 0.5,
        n_votes: int | None = None,
        max_iter: int = 1000,
        flip_rates: tuple | None = None,
        max_flip: float = 0.45,
    ):
        super().__init__(C=C, abstention=abstention, threshold=threshold, n_votes=n_votes, max_iter=max_iter)
        self.flip_rates = flip_rates
        self.max_flip = max_flip

    def estimate_flip_rates(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """(ρ₀, ρ₁) of the labels ``y`` from Dawid–Skene on [member votes, y] (no clean label used)."""

        from sklearn.exceptions import ConvergenceWarning  # imported here, not at start-up: scikit-learn ~1.4 s

        X = np.asarray(X, dtype=float)
        votes = X[:, : X.shape[1] if self.n_votes is None else self.n_votes]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            ds = DawidSkene(n_iter=500, tol=1e-6).fit(np.column_stack([votes, np.asarray(y, dtype=float)]))
        conf = ds.confusion_[-1]  # [true, given]
        return np.array([conf[0, 1], conf[1, 0]])

    def _rates(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        rates = self.estimate_flip_rates(X, y) if self.flip_rates is None else np.asarray(self.flip_rates, float)
        if rates.shape != (2,) or not np.all(np.isfinite(rates)) or np.any(rates < 0):
            raise ValueError(f"flip_rates must be two rates (ρ₀, ρ₁) ≥ 0, got {self.flip_rates!r}")
        rates = np.minimum(rates, self.max_flip)
        return rates if rates.sum() < 0.99 else rates * 0.99 / rates.sum()

    def fit(self, X: np.ndarray, y: np.ndarray) -> NoiseRobustStackedLogit:
        from scipy.optimize import minimize  # imported here, not at start-up: scipy
        from scipy.special import expit  # imported here, not at start-up: scipy

        super().fit(X, y)  # the plain fit: the starting point (and the answer when the rates are 0)
        self.flip_rates_ = self._rates(X, y)
        r0, r1 = self.flip_rates_
        if r0 == 0 and r1 == 0:
            return self
        F, y = self.features(X), np.asarray(y, dtype=float)
        Z = np.column_stack([np.ones(len(F)), F])
        scale = 1.0 - r0 - r1

        def objective(b: np.ndarray) -> tuple[float, np.ndarray]:
            s = expit(Z @ b)
            q = np.clip(r0 + scale * s, 1e-12, 1 - 1e-12)
            loss = -np.sum(y * np.log(q) + (1 - y) * np.log1p(-q))
            g_eta = (q - y) / (q * (1 - q)) * scale * s * (1 - s)
            pen = np.r_[0.0, b[1:]]
            return self.C * loss + 0.5 * pen @ pen, self.C * (Z.T @ g_eta) + pen

        res = minimize(
            objective,
            np.r_[self.intercept_, self.coef_],
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": self.max_iter},
        )
        self.intercept_, self.coef_ = float(res.x[0]), res.x[1:].copy()
        self.lr_.intercept_, self.lr_.coef_ = np.array([self.intercept_]), self.coef_[None, :].copy()
        # its posteriors are of the clean label: their prior is the clean prevalence the noise model implies
        # (E[ỹ] = ρ₀ + (1 − ρ₀ − ρ₁)·π), not the noisy labels' share (src.studies.prevalence.adjust reads it)
        self.train_prevalence_ = float(np.clip((y.mean() - r0) / scale, 1e-6, 1 - 1e-6))
        return self

    def state(self) -> dict:
        """:meth:`StackedLogit.state` and the flip rates it was fitted through."""
        return {**super().state(), "flip_rates": [float(r) for r in self.flip_rates_]}

    @classmethod
    def from_state(cls, state: dict) -> NoiseRobustStackedLogit:
        est = super().from_state({k: v for k, v in state.items() if k != "flip_rates"})
        est.flip_rates_ = np.asarray(state["flip_rates"], dtype=float)
        return est
