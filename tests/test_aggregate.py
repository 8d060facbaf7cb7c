"""Aggregators: sklearn composition, cluster folds, known answers on simulated panels."""

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold, cross_val_predict

from src.core import verdicts
from src.core.aggregate import (
    BestSingle,
    DawidSkene,
    MajorityVote,
    StackedLogit,
    WeightedVote,
    _long_format,
    cluster_folds,
    crossfit,
)
from src.core.evaluate import kappa
from src.core.verdicts import ABSTAIN
from src.studies import simulate


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


FOLD_SHAPES = [  # (clusters, largest cluster, classes, n_splits, seed, paired gold)
    (12, 1, 2, 5, 0, False),
    (40, 3, 2, 5, 1, False),
    (300, 2, 2, 5, 0, True),
    (1000, 2, 2, 5, 3, True),
    (250, 4, 2, 3, 11, False),
    (120, 5, 3, 7, 2, False),
    (80, 1, 2, 10, 5, False),
    (500, 3, 2, 2, 42, False),
]


@pytest.mark.parametrize("n_clusters,largest,classes,n_splits,seed,paired", FOLD_SHAPES)
def test_folds_equal_sklearn_stratified_group_kfold(n_clusters, largest, classes, n_splits, seed, paired):
    rng = np.random.default_rng(n_clusters + seed)
    groups = np.repeat(rng.permutation(n_clusters) * 3 + 1, rng.integers(1, largest + 1, n_clusters))
    y = np.resize([0, 1], len(groups)) if paired else rng.integers(0, classes, len(groups))
    cv = StratifiedGroupKFold(n_splits, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # sklearn: a class smaller than n_splits
        ref = list(cv.split(np.zeros(len(y)), y, groups))
    got = cluster_folds(y, groups, n_splits, seed)
    assert len(got) == len(ref)
    for (tr, te), (rtr, rte) in zip(got, ref):
        assert np.array_equal(tr, rtr) and np.array_equal(te, rte)


def test_folds_refuse_classes_smaller_than_the_splits_as_sklearn_does():
    y, groups = np.array([0, 1, 0, 1, 0, 1]), np.arange(6)
    with pytest.raises(ValueError, match="n_splits=5 cannot be greater than the number of members in each class"):
        list(StratifiedGroupKFold(5, shuffle=True, random_state=0).split(y, y, groups))
    with pytest.raises(ValueError, match="n_splits=5 cannot be greater than the number of members in each class"):
        cluster_folds(y, groups, 5, 0)


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


# ---------------------------------------------------------------------------------------------- Dawid–Skene


def crowdkit_ds(X, n_iter, tol):
    """crowd-kit's Dawid–Skene on a vote matrix: posteriors (n × 2, NaN rows for unvoted items), priors,
    confusion [j, t, o] of the members that voted, and the fitted crowd-kit model."""
    from crowdkit.aggregation import DawidSkene as CrowdKitDS

    ck = CrowdKitDS(n_iter=n_iter, tol=tol).fit(_long_format(X))
    members = sorted(ck.errors_.index.get_level_values("worker").unique())
    conf = np.array(
        [
            [[ck.errors_.loc[(j, o), t] if (j, o) in ck.errors_.index else 0.0 for o in (0, 1)] for t in (0, 1)]
            for j in members
        ]
    )
    return ck.probas_.reindex(range(len(X)))[[0, 1]].to_numpy(), ck.priors_[[0, 1]].to_numpy(), conf, ck


def reference_em_step(X, q):
    """One Dawid–Skene M-step from posteriors q, then the E-step, written out member by member."""
    voted = (X != ABSTAIN).any(axis=1)
    priors = q[voted].mean(axis=0)
    conf = np.empty((X.shape[1], 2, 2))
    for j in range(X.shape[1]):
        for o in (0, 1):
            conf[j, :, o] = np.maximum(q[X[:, j] == o].sum(axis=0), 1e-10)
    conf /= conf.sum(axis=2, keepdims=True)
    logp = np.tile(np.log(priors), (len(X), 1))
    for i, j in zip(*np.nonzero(X != ABSTAIN)):
        logp[i] += np.log(conf[j, :, int(X[i, j])])
    p = np.exp(logp - logp.max(axis=1, keepdims=True))
    return priors, conf, p / p.sum(axis=1, keepdims=True)


def known_confusion_panel(n, prevalence, confusion, abstain_rate=0.0, seed=0):
    """Independent members with known confusion[j, t, o] = P(j says o | t); abstentions missing at random."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < prevalence).astype(int)
    X = (rng.random((n, len(confusion))) < confusion[:, y, 1].T).astype(float)
    X[rng.random(X.shape) < abstain_rate] = ABSTAIN
    return X, y


KNOWN_CONFUSION = np.array(
    [
        [[0.95, 0.05], [0.10, 0.90]],  # one good member, four weak and lopsided ones
        [[0.70, 0.30], [0.40, 0.60]],
        [[0.60, 0.40], [0.30, 0.70]],
        [[0.75, 0.25], [0.45, 0.55]],
        [[0.65, 0.35], [0.35, 0.65]],
    ]
)


def test_dawid_skene_is_a_sklearn_estimator_and_beats_chance(table):
    ds = DawidSkene().fit(table.votes)
    assert ds.converged_ and 0 < ds.n_iter_ < ds.n_iter
    assert ds.probas_.shape == (len(table.votes), 2) and ds.confusion_.shape == (6, 2, 2)
    assert clone(ds).get_params() == ds.get_params() and not hasattr(clone(ds), "probas_")
    assert kappa(table.gold, ds.predict(table.votes)) > 0.5


@pytest.mark.parametrize("n_iter", [1, 2, 5, 30])
def test_dawid_skene_iterations_are_crowdkits(table, n_iter):
    """Same start, same E- and M-steps: after n iterations (crowd-kit forced on, no early stop) both agree."""
    with pytest.warns(ConvergenceWarning):
        ds = DawidSkene(n_iter=n_iter, tol=0.0, accelerate=False).fit(table.votes)
    probas, priors, conf, _ = crowdkit_ds(table.votes, n_iter, -np.inf)
    assert ds.n_iter_ == n_iter and not ds.converged_
    np.testing.assert_allclose(ds.probas_, probas, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ds.priors_, priors, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ds.confusion_, conf, rtol=0, atol=1e-8)


@pytest.mark.parametrize("seed, rho, abstain_rate", [(1, 0.0, 0.0), (1, 0.0, 0.1), (3, 0.2, 0.05)])
def test_dawid_skene_equals_crowdkit_where_crowdkit_converges(seed, rho, abstain_rate):
    X = sim(
        n_clusters=200, accuracies=[0.9, 0.8, 0.75, 0.7, 0.65, 0.6], rho=rho, abstain_rate=abstain_rate, seed=seed
    ).votes
    probas, priors, conf, ck = crowdkit_ds(X, 10_000, 1e-15)
    # the comparison means something only where crowd-kit's own stopping rule says "converged": its ELBO rose
    # at every iteration and it stopped on tol, well before the cap
    assert (np.diff(ck.loss_history_) > 0).all() and 20 < len(ck.loss_history_) < 10_000
    ds = DawidSkene().fit(X)
    assert ds.converged_
    np.testing.assert_allclose(ds.probas_, probas, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ds.priors_, priors, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ds.confusion_, conf, rtol=0, atol=1e-8)


@pytest.mark.parametrize("panel", ["fixture", "crowdkit_stops_early"])
def test_dawid_skene_ends_at_an_em_fixed_point(table, panel):
    """One more EM step changes nothing: crowd-kit (and the crowd-kit-based version) stopped 2-4 iterations in
    on its non-monotone ELBO check, half an EM step apart, and not at a fixed point."""
    X = (
        table.votes
        if panel == "fixture"
        else sim(n_clusters=200, accuracies=[0.9, 0.8, 0.75, 0.7, 0.65, 0.6], rho=0.0, seed=0).votes
    )
    ds = DawidSkene().fit(X)
    probas = np.asarray(ds.probas_, dtype=float)
    priors, conf, again = reference_em_step(X, probas)
    np.testing.assert_allclose(again, probas, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ds.priors_, priors, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ds.confusion_, conf, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ds.predict_proba(X), probas, rtol=0, atol=1e-8)


SLOW_EM = [
    dict(n_clusters=57, accuracies=[0.54, 0.35, 0.72], rho=0.14, abstain_rate=0.21, seed=15),  # 21,161 steps
    dict(n_clusters=100, accuracies=[0.72, 0.41, 0.84], rho=0.34, abstain_rate=0.28, seed=100),
    dict(n_clusters=100, accuracies=[0.6, 0.55, 0.5], rho=0.1, abstain_rate=0.1, seed=1),
    dict(n_clusters=300, accuracies=[0.85, 0.8, 0.75, 0.7, 0.65, 0.6], rho=0.2, abstain_rate=0.05),
]


@pytest.mark.parametrize("panel", SLOW_EM)
def test_accelerated_dawid_skene_ends_at_plain_ems_fixed_point_in_fewer_steps(panel):
    """SQUAREM reaches the fixed point plain EM creeps towards: same verdicts, posteriors within plain EM's own
    stopping error, an EM step from it changes nothing, and far fewer EM steps on slowly converging panels."""
    X = sim(**panel).votes
    plain, fast = DawidSkene(accelerate=False).fit(X), DawidSkene().fit(X)
    assert plain.converged_ and fast.converged_
    assert np.array_equal(fast.predict(X), plain.predict(X))
    np.testing.assert_allclose(fast.probas_, plain.probas_, rtol=0, atol=1e-6)
    _, _, again = reference_em_step(X, np.asarray(fast.probas_, dtype=float))
    np.testing.assert_allclose(again, fast.probas_, rtol=0, atol=1e-8)
    if plain.n_iter_ > 3000:
        assert fast.n_iter_ < plain.n_iter_ / 5


def test_dawid_skene_recovers_known_confusion_matrices_and_beats_majority():
    X, y = known_confusion_panel(20_000, 0.3, KNOWN_CONFUSION)
    ds = DawidSkene().fit(X)
    assert ds.priors_ == pytest.approx([0.7, 0.3], abs=0.02)
    np.testing.assert_allclose(ds.confusion_, KNOWN_CONFUSION, atol=0.03)
    acc_ds = np.mean(ds.predict(X) == y)
    acc_mv = np.mean(MajorityVote().fit(X).predict(X) == y)
    assert acc_ds > acc_mv + 0.05 and acc_ds > 0.92
    assert np.mean(ds.probas_.argmax(axis=1) == y) == pytest.approx(acc_ds, abs=0.002)


def test_dawid_skene_abstentions_are_missing_votes():
    """Votes missing at random bias nothing; a silent member, a constant voter, an item nobody voted on and exact
    zero counts give finite posteriors, without a numpy warning."""
    X, y = known_confusion_panel(20_000, 0.3, KNOWN_CONFUSION, abstain_rate=0.3, seed=1)
    extra = np.column_stack([np.full(len(X), ABSTAIN), np.ones(len(X))])  # silent, always "hallucinated"
    X[:50] = ABSTAIN
    wide = np.column_stack([X, extra])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = DawidSkene().fit(wide)
        lone = DawidSkene().fit(X)
        tiny = DawidSkene().fit(np.array([[1, 1, ABSTAIN], [0, 0, ABSTAIN], [1, 1, 1], [ABSTAIN] * 3]))
        new = ds.predict_proba(np.array([[ABSTAIN] * 5 + [1, 0], [0] * 7]))  # the constant voter says 0
    assert ds.priors_ == pytest.approx([0.7, 0.3], abs=0.02)
    np.testing.assert_allclose(ds.confusion_[:5], KNOWN_CONFUSION, atol=0.04)
    assert (ds.confusion_[5] == 0.5).all(), "a member that never voted carries no evidence"
    np.testing.assert_allclose(ds.probas_, lone.probas_, atol=1e-6)  # the silent and the constant member
    np.testing.assert_allclose(ds.probas_[:50], np.tile(ds.priors_, (50, 1)), atol=1e-8)
    assert np.mean(ds.predict(wide[50:]) == y[50:]) > np.mean(MajorityVote().fit(X).predict(X[50:]) == y[50:])
    assert np.isfinite(tiny.probas_).all() and np.isfinite(tiny.confusion_).all() and np.isfinite(new).all()
    assert tiny.predict(np.array([[1, 1, ABSTAIN], [0, 0, ABSTAIN]])).tolist() == [1, 0]
    empty = DawidSkene().fit(np.full((3, 2), ABSTAIN))
    assert (empty.probas_ == 0.5).all() and empty.converged_


def test_dawid_skene_agrees_with_crowdkit_step_by_step_with_silent_and_constant_members(table):
    X = np.column_stack([table.votes, np.full(len(table.votes), ABSTAIN), np.ones(len(table.votes))])
    X[:3] = ABSTAIN
    with pytest.warns(ConvergenceWarning):
        ds = DawidSkene(n_iter=10, tol=0.0, accelerate=False).fit(X)
    probas, priors, conf, _ = crowdkit_ds(X, 10, -np.inf)
    np.testing.assert_allclose(ds.probas_[3:], probas[3:], rtol=0, atol=1e-8)
    np.testing.assert_allclose(ds.priors_, priors, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ds.confusion_[[0, 1, 2, 3, 4, 5, 7]], conf, rtol=0, atol=1e-8)


def test_dawid_skene_long_format_drops_abstentions():
    long = _long_format(np.array([[1, ABSTAIN], [0, 1]]))
    assert isinstance(long, pd.DataFrame) and len(long) == 3
