"""The escalation rule of the cascade (beyond the paper; the analysis is :mod:`src.studies.suite.cascade`): the
cheap panel's confidence in its verdict (:func:`confidence_of`), the threshold band that escalates a share of the
items to the expensive judge, ties split at random (:func:`band_thresholds`, :func:`escalation_prob`), the
:class:`Cascade` estimator, and the merged verdicts (:func:`merge`).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, clone

from src.core.aggregate import StackedLogit
from src.core.verdicts import ABSTAIN

ROUND = 12  # confidences are rounded to this many decimals, so items of one vote pattern tie exactly


# ------------------------------------------------------------------------------------------------ the rule


def band_thresholds(
    conf: np.ndarray, shares: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per target share s: (τ, q) such that escalating the items with confidence < τ, and those exactly at τ
    with probability q, escalates exactly s of ``conf`` in expectation. s = 0 → τ = −∞; s = 1 → τ = +∞.

    ``conf`` is one item's confidence per entry (n), or rows of them (… × n, each row its own set of items, e.g. a
    bootstrap draw's); ``weights`` (its shape) counts each entry as that many items (whole numbers: a row of distinct
    confidences weighted by its items' multiplicities gives the τ and q of those items listed one by one). τ is the
    confidence of the ⌊s·N⌋-th of the N items in increasing order (0-based, the last when s·N = N); the shape of
    τ and q is conf's with the last axis the shares."""
    conf = np.asarray(conf, float)
    w = np.ones_like(conf) if weights is None else np.broadcast_to(np.asarray(weights, float), conf.shape)
    n = conf.shape[-1]
    c2, w2 = conf.reshape(-1, n), w.reshape(-1, n)
    order = np.argsort(c2, axis=1)  # equal confidences are one group (_tie_groups): their order is immaterial
    c_sorted, w_sorted = np.take_along_axis(c2, order, axis=1), np.take_along_axis(w2, order, axis=1)
    upto = np.cumsum(w_sorted, axis=1)  # items up to each sorted entry (whole numbers: exact)
    below, at = _tie_groups(c_sorted, w_sorted, upto)
    total = upto[:, -1]
    s = np.asarray(shares, float)
    m = s[None, :] * total[:, None]  # rows × shares
    at_item = np.minimum(np.floor(m), total[:, None] - 1)  # the item (0-based) whose confidence τ is
    entry = np.minimum(_count_upto(upto, at_item), n - 1)  # the sorted entry that holds it
    r = np.arange(len(c2))[:, None]
    tau = c_sorted[r, entry]
    b, a = below[r, entry], at[r, entry]
    q = np.clip(np.divide(m - b, a, out=np.zeros_like(m), where=a > 0), 0.0, 1.0)
    tau = np.where(s <= 0, -np.inf, np.where(s >= 1, np.inf, tau))
    q = np.where((s <= 0) | (s >= 1), 0.0, q)
    shape = conf.shape[:-1] + (len(s),)
    return tau.reshape(shape), q.reshape(shape)


def _tie_groups(c_sorted: np.ndarray, w_sorted: np.ndarray, upto: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each sorted entry (rows of sorted confidences, their weights and running sums): the items of a smaller
    confidence, and those of its own."""
    n = c_sorted.shape[1]
    idx = np.arange(n)
    starts = np.ones(c_sorted.shape, bool)
    starts[:, 1:] = c_sorted[:, 1:] != c_sorted[:, :-1]
    ends = np.ones(c_sorted.shape, bool)
    ends[:, :-1] = starts[:, 1:]
    first = np.maximum.accumulate(np.where(starts, idx, 0), axis=1)
    last = np.minimum.accumulate(np.where(ends, idx, n)[:, ::-1], axis=1)[:, ::-1]
    r = np.arange(len(c_sorted))[:, None]
    below = upto[r, first] - w_sorted[r, first]
    return below, upto[r, last] - below


def _count_upto(upto: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per row, how many of its running sums (nondecreasing, ≥ 0) are ≤ each of x's values (rows × queries, ≥ −1):
    one search of all rows laid end to end."""
    span = float(upto[:, -1].max(initial=0.0)) + 2.0
    offset = np.arange(len(upto))[:, None] * span
    found = np.searchsorted((upto + offset).ravel(), (x + offset).ravel(), side="right").reshape(x.shape)
    return found - np.arange(len(upto))[:, None] * upto.shape[1]


def confidence_of(p: np.ndarray, threshold: float) -> np.ndarray:
    """|p − threshold| (rounded to :data:`ROUND` decimals): 0 = the panel cannot tell, 0.5 = certain."""
    return np.round(np.abs(p - threshold), ROUND)


def escalation_prob(conf: np.ndarray, tau: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Each item's probability of escalating under the band (τ, q) of :func:`band_thresholds`: 1 below τ, q at τ,
    0 above (broadcast)."""
    return (conf < tau) + q * (conf == tau)


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
        """|p − threshold| (:func:`confidence_of`)."""
        return confidence_of(self.p_hallucinated(X), self.stacker_.threshold)

    def escalate(self, X: np.ndarray, flagged: np.ndarray | None = None) -> np.ndarray:
        """S × n: item i escalates at share s (ties at τ broken by a seeded uniform draw per item: u < its
        :func:`escalation_prob`); an item ``flagged`` as a prompt injection (:func:`src.core.detector.scan`)
        escalates at every share: the cheap panel, LLM judges its text can address, never decides it."""
        conf = self.confidence(X)[None, :]
        u = np.random.default_rng(self.random_state).random(conf.shape[1])[None, :]
        esc = u < escalation_prob(conf, self.thresholds_[:, None], self.tie_prob_[:, None])
        return esc if flagged is None else esc | np.asarray(flagged, bool)[None, :]


def merge(panel: np.ndarray, expensive: np.ndarray, escalated: np.ndarray) -> np.ndarray:
    """Cascade verdicts (… × n): the expensive judge's on escalated items it answered, the panel's elsewhere.
    ``escalated`` may also be each item's probability of escalating (:func:`escalation_prob`): then each item's
    probability of the verdict 1 (the randomised rule's expected verdict)."""
    expensive = np.asarray(expensive, float)
    return panel + np.where(expensive != ABSTAIN, escalated * (expensive - panel), 0.0)
