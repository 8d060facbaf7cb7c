"""Admissibility: φ against numpy's Pearson, and the call on panels whose answer is known (§3.3)."""

import numpy as np
import pytest

from src.core import admissibility, ladder, ladderbase, verdicts
from src.core.aggregate import StackedLogit
from src.core.verdicts import ABSTAIN
from src.studies import simulate


def sim(**kw):
    t = verdicts.validate(simulate.panel(**kw))
    return t.gold, t.votes


@pytest.mark.parametrize("seed", range(4))
def test_phi_is_pearson_of_error_indicators(seed):
    gold, votes = sim(n_clusters=200, accuracies=[0.8, 0.7, 0.65, 0.75], rho=0.4, seed=seed)
    err = (votes != gold[:, None]).astype(float)
    ref = np.corrcoef(err.T)
    assert admissibility.phi_matrix(gold, votes) == pytest.approx(ref)
    assert admissibility.phi_bar(gold, votes) == pytest.approx(ref[np.triu_indices(4, 1)].mean())


def test_phi_uses_pairwise_complete_items():
    gold, votes = sim(n_clusters=200, accuracies=[0.8, 0.7, 0.65], rho=0.4, abstain_rate=0.2)
    m = (votes[:, 0] != ABSTAIN) & (votes[:, 1] != ABSTAIN)
    err = votes[m][:, :2] != gold[m][:, None]
    assert admissibility.phi_matrix(gold, votes)[0, 1] == pytest.approx(np.corrcoef(err.T)[0, 1])


def test_agreement_equals_error_indicator_agreement():
    gold, votes = sim(n_clusters=100, accuracies=[0.8, 0.7], rho=0.3)
    err = votes != gold[:, None]
    assert admissibility.agreement_matrix(votes)[0, 1] == pytest.approx(np.mean(err[:, 0] == err[:, 1]))


def test_agreement_matrix_with_abstentions_matches_pairwise_definition():
    gold, votes = sim(n_clusters=150, accuracies=[0.8, 0.7, 0.6, 0.55], rho=0.3, abstain_rate=0.3)
    votes[:, 3] = ABSTAIN  # a member that never voted: no overlap with anyone
    A = admissibility.agreement_matrix(votes)
    for i in range(3):
        for j in range(3):
            m = (votes[:, i] != ABSTAIN) & (votes[:, j] != ABSTAIN)
            assert A[i, j] == pytest.approx(np.mean(votes[m, i] == votes[m, j]))
    assert np.isnan(A[:3, 3]).all() and np.isnan(A[3, :3]).all() and A[3, 3] == 1.0


def test_dominant_member_panel_is_not_admissible():
    gold, votes = sim(n_clusters=400, accuracies=[0.97] + [0.55] * 9, rho=0.1)
    a = admissibility.test(gold, votes)
    assert not a.admissible and a.members_at_kappa0 == 1 and "1/10" in a.reason


def test_correlated_competent_panel_is_not_admissible():
    gold, votes = sim(n_clusters=400, accuracies=[0.8] * 10, rho=0.9)
    a = admissibility.test(gold, votes)
    assert a.members_at_kappa0 == 10 and a.phi_bar > 0.4 and not a.admissible and "φ̄" in a.reason


def test_spread_decorrelated_panel_is_admissible():
    gold, votes = sim(n_clusters=400, accuracies=[0.8] * 6 + [0.6] * 4, rho=0.2)
    a = admissibility.test(gold, votes)
    assert a.admissible and a.phi_bar < 0.4 and a.members_at_kappa0 >= 5
    assert a.as_dict()["kappa0"] == 0.30 and a.as_dict()["c"] == 0.5 and a.as_dict()["phi0"] == 0.40


def test_operating_point_is_respected():
    mk = np.array([0.31, 0.31, 0.1, 0.1])
    assert admissibility.decide(mk, 0.39, 0.30, 0.5, 0.40)[0]
    assert not admissibility.decide(mk, 0.41, 0.30, 0.5, 0.40)[0]
    assert not admissibility.decide(mk, 0.39, 0.32, 0.5, 0.40)[0]
    assert not admissibility.decide(mk, None, 0.30, 0.5, 0.40)[0]


def test_admits_is_decide_for_every_panel():
    """The vectorised rule (budget draws, sub-panels) calls exactly what :func:`decide` calls, panel by panel."""
    rng = np.random.default_rng(3)
    mk = rng.uniform(-0.1, 0.7, size=(400, 6))
    pb = rng.uniform(0.0, 0.8, size=400)
    pb[::17] = np.nan
    got = admissibility.admits(mk, pb, 0.30, 0.5, 0.40)
    want = [admissibility.decide(m, None if np.isnan(p) else float(p), 0.30, 0.5, 0.40)[0] for m, p in zip(mk, pb)]
    assert got.tolist() == want and 0 < got.sum() < 400


def test_exact_threshold_counts_although_floating_point_lands_just_under():
    """Stop-9 defect: κ = 0.30 exactly, computed as 0.2999999999999999, was not counted (84 of 812 tables)."""
    from fractions import Fraction

    from src.core.evaluate import kappa

    # gold 1: 6 right, 11 wrong; gold 0: 11 right: κ = 3/10 exactly in rational arithmetic
    gold = np.array([1] * 17 + [0] * 11)
    pred = np.array([1] * 6 + [0] * 11 + [0] * 11, dtype=float)
    po, pe = Fraction(17, 28), Fraction(6 * 17 + 22 * 11, 28 * 28)
    assert (po - pe) / (1 - pe) == Fraction(3, 10) and kappa(gold, pred) < 0.3
    votes = np.column_stack([pred, pred, gold.astype(float)])  # two members at κ = 0.30, one perfect
    t = admissibility.test(gold, votes, kappa0=0.30, c=0.5, phi0=1.0)
    assert t.members_at_kappa0 == 3
    four = np.array([0.2999999999999999, 0.31, 0.1, 0.1])  # two of four at κ₀: the share, and two members
    assert admissibility.admits(four, np.array(0.4 + 1e-16), 0.3, 0.5, 0.4)
    assert admissibility.decide(four, 0.4000000000000001, 0.3, 0.5, 0.4)[0]
    assert not admissibility.admits(np.array([0.2999, 0.31, 0.1, 0.1]), np.array(0.3), 0.3, 0.5, 0.4)
    assert not admissibility.admits(np.array([0.3, 0.31, 0.1, 0.1]), np.array(0.4001), 0.3, 0.5, 0.4)


@pytest.mark.parametrize(
    ("member_k", "admitted"),
    [
        ([0.60, 0.10], False),  # one good judge of two: the share is met, but one judge is no aggregate
        ([0.60, 0.35], True),  # two competent members
        ([0.60, 0.10, 0.05], False),  # one of three: under the share too
        ([0.60, 0.35, 0.10], True),
        ([0.60, 0.35, 0.10, 0.05], True),  # from four members at c = ½ the share asks for two anyway
        ([0.6] * 5 + [0.1] * 5, True),  # the paper's ten: five at κ₀, the share
        ([0.6] * 4 + [0.1] * 6, False),
    ],
)
def test_a_tiny_panel_needs_two_competent_members(member_k, admitted):
    """§3.3's share on a panel of two would admit one good judge beside one that is not — the regime where one
    member dominates and the stacker at best recovers it. The rule asks for at least two members at κ₀ besides the
    share; the ten-member rule is unchanged."""
    k = np.array(member_k)
    assert bool(admissibility.admits(k, np.array(0.1), 0.3, 0.5, 0.4)) is admitted
    ok, why = admissibility.decide(k, 0.1, 0.3, 0.5, 0.4)
    assert ok is admitted
    if not admitted and len(k) == 2:
        assert why == "only 1/2 members at κ≥0.3 (a 0.5 share, but fewer than 2)"


def test_a_two_member_roster_with_one_good_judge_is_not_admissible_on_the_ladder():
    """The same through the ladder on a simulated two-member roster: one good judge and one weak, decorrelated."""
    t = verdicts.validate(simulate.panel(100, 2, [0.85, 0.55], 0.0, dataset="two", seed=1))
    r = ladder.analyze(t, StackedLogit(), ladderbase.LadderSettings(n_boot=50, abstention_contrast=False))["two"]
    a = r.summary["admissibility"]
    assert a["members_at_kappa0"] == 1 and a["n_members"] == 2 and a["phi_bar"] < 0.4
    assert not a["admissible"] and "fewer than 2" in a["reason"]
