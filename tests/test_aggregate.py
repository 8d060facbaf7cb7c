"""Aggregators: sklearn composition, cluster folds, known answers on simulated panels."""

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold, cross_val_predict

from src import simulate, verdicts
from src.aggregate import (BestSingle, DawidSkene, MajorityVote, StackedLogit, WeightedVote, cluster_folds,
                           crossfit)
from src.evaluate import kappa
from src.verdicts import ABSTAIN


def sim(**kw):
    return verdicts.validate(simulate.panel(**kw))


@pytest.fixture(scope="module")
def table():
    return sim(n_clusters=300, accuracies=[0.85, 0.8, 0.75, 0.7, 0.65, 0.6], rho=0.2, abstain_rate=0.05)


def test_folds_never_split_a_cluster(table):
    folds = cluster_folds(table.gold, table.clusters, 5, seed=0)
    seen = np.zeros(len(table.gold), int)
    for tr, te in folds:
        assert not set(table.clusters[tr]) & set(table.clusters[te])
        seen[te] += 1
    assert (seen == 1).all(), "every item is out of fold exactly once"
    with pytest.raises(ValueError, match="at least 5 clusters"):
        cluster_folds(np.array([0, 1, 0, 1]), np.array(["a", "a", "b", "b"]), 5)


def test_crossfit_equals_cross_val_predict(table):
    X, y, g = table.votes, table.gold, table.clusters
    cv = StratifiedGroupKFold(5, shuffle=True, random_state=0)
    ref = cross_val_predict(StackedLogit(), X, y, groups=g, cv=cv, method="predict_proba")[:, 1]
    got = crossfit(StackedLogit(), X, y, cluster_folds(y, g, 5, 0)).proba
    assert got == pytest.approx(ref)


def test_stacker_is_l2_logistic_regression_with_c1(table):
    est = StackedLogit().fit(table.votes, table.gold)
    ref = LogisticRegression(C=1.0, tol=1e-10, max_iter=10000).fit(table.votes, table.gold)  # lbfgs, tight
    assert est.coef_ == pytest.approx(ref.coef_.ravel(), rel=1e-4, abs=1e-6)
    assert est.intercept_ == pytest.approx(ref.intercept_[0], rel=1e-4, abs=1e-6)
    assert clone(est).get_params() == est.get_params() and not hasattr(clone(est), "coef_")


def test_categorical_abstention_feature_map():
    X = np.array([[1, ABSTAIN], [0, 1], [ABSTAIN, 0]])
    F = StackedLogit(abstention="category").features(X)
    assert F.tolist() == [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 1, 0]]
    assert StackedLogit(abstention="category").feature_names(["a", "b"]) == ["a=1", "b=1", "a=abstain", "b=abstain"]
    with pytest.raises(ValueError, match="abstention"):
        StackedLogit(abstention="bogus").features(X)


def test_shuffled_gold_gives_stacked_kappa_near_zero(table):
    y = np.random.default_rng(1).permutation(table.gold)
    oof = crossfit(StackedLogit(), table.votes, y, cluster_folds(y, table.clusters, 5, 0)).pred
    assert abs(kappa(y, oof)) < 0.1


def test_stacker_recovers_a_dominant_member():
    t = sim(n_clusters=400, accuracies=[0.97] + [0.52] * 9, rho=0.0)
    oof = crossfit(StackedLogit(), t.votes, t.gold, cluster_folds(t.gold, t.clusters, 5, 0)).pred
    lead = kappa(t.gold, t.votes[:, 0])
    assert kappa(t.gold, oof) == pytest.approx(lead, abs=0.03)
    coef = StackedLogit().fit(t.votes, t.gold).coef_
    assert np.argmax(coef) == 0 and coef[0] > 3 * np.abs(coef[1:]).max()


def test_stacker_beats_best_member_on_independent_competent_panel():
    t = sim(n_clusters=500, accuracies=[0.75] * 10, rho=0.0)
    oof = crossfit(StackedLogit(), t.votes, t.gold, cluster_folds(t.gold, t.clusters, 5, 0)).pred
    assert kappa(t.gold, oof) > max(kappa(t.gold, t.votes[:, j]) for j in range(10)) + 0.2


def test_majority_ties_go_to_hallucinated_at_threshold():
    X = np.array([[1, 0], [1, 1], [0, 0], [ABSTAIN, ABSTAIN], [1, ABSTAIN]])
    assert MajorityVote().fit(X).predict(X).tolist() == [1, 1, 0, 1, 1]


def test_weighted_votes_flip_an_adversarial_member():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    good = np.where(rng.random(400) < 0.8, y, 1 - y)
    adversary = np.where(rng.random(400) < 0.95, 1 - y, y)
    X = np.column_stack([good, adversary, adversary]).astype(float)
    lo = WeightedVote("logodds").fit(X, y)
    assert lo.weights_[1] < 0 and kappa(y, lo.predict(X)) > 0.8
    acc = WeightedVote("accuracy").fit(X, y)
    assert acc.weights_ == pytest.approx([np.mean(good == y), np.mean(adversary == y), np.mean(adversary == y)])
    with pytest.raises(ValueError):
        WeightedVote("bogus").fit(X, y)


def test_best_single_picks_the_highest_kappa_and_keeps_abstentions(table):
    b = BestSingle().fit(table.votes, table.gold)
    assert b.best_ == int(np.argmax([kappa(table.gold, table.votes[:, j]) for j in range(6)]))
    assert set(np.unique(b.predict(table.votes))) <= {0.0, 1.0, ABSTAIN}


def test_dawid_skene_reproduces_crowdkit_posteriors(table):
    ds = DawidSkene().fit(table.votes)
    ref = ds.probas_[1].to_numpy()
    # crowd-kit reports posteriors one M-step before its final parameters: equal up to one half EM step
    assert ds.predict_proba(table.votes)[:, 1] == pytest.approx(ref, abs=1e-3)
    assert kappa(table.gold, ds.predict(table.votes)) > 0.5


def test_dawid_skene_long_format_drops_abstentions():
    from src.aggregate import _long_format

    long = _long_format(np.array([[1, ABSTAIN], [0, 1]]))
    assert isinstance(long, pd.DataFrame) and len(long) == 3
