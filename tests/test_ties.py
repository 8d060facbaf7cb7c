"""Ties by rule (§2's decision rule, hallucinated iff p ≥ threshold): a probability within
:data:`src.core.verdicts.TIE_TOLERANCE` of the threshold is the threshold, in the fixed and the refit paths alike.

A tie in exact arithmetic — gold balanced on every vote pattern, so the stacker's p is ½ — is computed as ½ plus or
minus a few units in the last place, on one side or the other as the BLAS kernel and the order of the sums fall. A
threshold a hair above ½ plays the machine on which the computed ½ lands below it: the rule must still read it as
the tie it is."""

from __future__ import annotations

import numpy as np
import pytest

from src.core import rates
from src.core.aggregate import MajorityVote, StackedLogit, WeightedVote, cluster_folds
from src.core.evaluate import ClusterBootstrap
from src.core.refit import RefitBootstrap
from src.core.verdicts import TIE_TOLERANCE, at_or_over

NOISE = 1e-13  # far above a computed ½'s rounding error (~1e-16), far below the tolerance
THRESHOLD = 0.5 + NOISE


def test_the_rule_reads_a_p_at_rounding_distance_as_the_threshold():
    p = np.array([0.5, 0.5 - 1e-15, 0.5 + 1e-15, 0.5 - NOISE, 0.5 - 10 * TIE_TOLERANCE, 0.4, 0.6])
    assert at_or_over(p).tolist() == [True, True, True, True, False, False, True]
    assert at_or_over(np.array([0.3]), 0.3 + NOISE).tolist() == [True]  # at any threshold


def _tied() -> tuple[np.ndarray, np.ndarray]:
    """40 items, gold 1, 0, 1, 0, …; two members that always disagree and tell nothing (each vote pattern holds
    as many gold 1 as gold 0): every aggregator's p is ½ in exact arithmetic."""
    gold = np.tile([1, 0], 20)
    v = ((np.arange(40) // 2) % 2).astype(float)
    return gold, np.column_stack([v, 1.0 - v])


def _refit(gold: np.ndarray) -> RefitBootstrap:
    clusters = np.arange(len(gold))
    return RefitBootstrap(gold, cluster_folds(gold, clusters, 5, 0), ClusterBootstrap(clusters, 2, 0))


def _balanced(n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Training weights of one draw with as many gold-1 as gold-0 items on every row (draws × rows)."""
    t = np.ones((2, n_rows))
    return t, t.copy()


@pytest.mark.parametrize(
    "path",
    ["stacked fixed", "stacked refit", "stacked refit loop", "weighted fixed", "weighted refit", "majority", "rate"],
)
def test_a_tie_is_decided_by_the_rule_in_every_path(path):
    gold, votes = _tied()
    if path == "stacked fixed":
        pred = StackedLogit(threshold=THRESHOLD).fit(votes, gold).predict(votes)
    elif path == "weighted fixed":
        pred = WeightedVote(threshold=THRESHOLD).fit(votes, gold).predict(votes)
    elif path == "majority":
        pred = MajorityVote(threshold=THRESHOLD).fit(votes).predict(votes)
    elif path == "rate":  # the panel's flagged share counts a tied p as flagged
        pred = np.array([rates.naive(np.full((1, 40), 0.5), THRESHOLD).estimate[0]])
    else:
        rb = _refit(gold)
        rung = {
            "stacked refit": lambda: rb.stacked(votes, 1.0, THRESHOLD),
            "stacked refit loop": lambda: rb.stacked_loop(StackedLogit(threshold=THRESHOLD), votes),
            "weighted refit": lambda: rb.weighted(votes, "accuracy", THRESHOLD),
        }[path]()
        pred = rung.predict(*_balanced(rung.n_rows), 0)
    assert np.all(pred == 1), pred


def test_a_p_beyond_the_tolerance_is_no_tie():
    """The rule moves only what rounding could have put on either side: a p a millionth under ½ is supported."""
    gold, votes = _tied()
    near = StackedLogit(threshold=0.5 + 1e-6).fit(votes, gold)
    assert np.all(near.predict(votes) == 0)
