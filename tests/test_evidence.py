"""The evidence beside each call (docs/intervals.md, "Sparse evidence"; §2 calls): no interval narrower than its
discordant items allow, the CV-best single compared as it would be deployed (every item answered), and the counts
recorded in results.json, the decision, the summary line."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from src.core import decide, ladder, ladderbase, verdicts
from src.core.aggregate import StackedLogit
from src.core.evaluate import ABSTAIN, ClusterBootstrap, deployed, from_counts, indicators, kappa
from src.core.intervals import unseen_discordance
from src.core.ladder import refit_delta
from src.core.refit import RefitBootstrap, gradients
from src.present.summary import summary_lines
from src.studies import simulate

Z = norm.ppf(0.975)
STRONG_WEAK = [0.95, 0.625, 0.60, 0.60, 0.575]  # κ 0.90 among four of κ 0.15–0.25, strongly correlated below


def _analyse(df: pd.DataFrame, n_boot: int = 200) -> dict:
    t = verdicts.validate(df)
    (r,) = ladder.analyze(
        t, StackedLogit(), ladderbase.LadderSettings(n_boot=n_boot, abstention_contrast=False)
    ).values()
    doc = ladder.to_json({"d": r}, ladderbase.LadderSettings(n_boot=n_boot))
    return {"table": t, "result": r, "summary": doc["datasets"]["d"], "doc": doc}


@pytest.fixture(scope="module")
def agreeing():
    """The strong member never abstains here: the stacker follows it on every item, and the CV-best single is it in
    every fold and every draw — the arms never differ on the sample, though the population's Δκ is not 0."""
    return _analyse(simulate.panel(50, 2, STRONG_WEAK, 0.6, abstain_rate=[0.0] + [0.02] * 4, dataset="d", seed=0))


@pytest.fixture(scope="module")
def abstaining():
    """The strong member abstains on 10 % of the items, which the panel must answer."""
    return _analyse(simulate.panel(100, 2, STRONG_WEAK, 0.6, abstain_rate=[0.10] + [0.02] * 4, dataset="d", seed=2))


def test_no_zero_width_interval_where_the_arms_never_differ_on_the_sample(agreeing):
    """Every draw sees the same Δκ, 0, whatever is refitted: the bootstrap's variance is 0 and its interval would be
    [0, 0]. The floor keeps z² unseen discordant items (Wilson's upper bound for a count of 0) of the largest
    one-item shift h: a half-width of z·√(z²)·h = z²·h."""
    s, y = agreeing["summary"], agreeing["table"].gold
    pred = agreeing["result"].predictions
    h = max(np.ptp(gradients(indicators(y, pred[k]).sum(0))["kappa"].reshape(2, 3), axis=1).max() for k in pred)
    for c in ("best_cv", "best_cv_deployed"):
        d = s["deltas"][c]["kappa"]
        assert d["discordant"] == 0 and d["estimate"] == 0.0 and d["floored"] is True
        assert d["ci"][1] - d["ci"][0] == pytest.approx(2 * Z * Z * h, rel=1e-6)
        assert d["call"] == "tie" and d["p_one_sided"] == pytest.approx(0.5)
        # the paper's fixed-prediction interval is kept as published: it is the point [0, 0] (no call reads it)
        assert s["deltas_fixed"][c]["kappa"]["ci"] == [0.0, 0.0]


def _one_sided(k: int, n: int = 200) -> tuple:
    """Two arms on n items in clusters of two: a is wrong on 40 items; b is a, but wrong on k more."""
    gold = np.tile([1, 0], n // 2)
    a = gold.astype(float)
    a[np.arange(0, 80, 2)] = 1 - a[np.arange(0, 80, 2)]
    b = a.copy()
    b[np.arange(81, 81 + 2 * k, 2)] = 1 - b[np.arange(81, 81 + 2 * k, 2)]
    boot = ClusterBootstrap(np.arange(n) // 2, 2000, 0)
    draws = boot.metrics(gold, np.column_stack([a, b]))["kappa"]
    held = draws[:, 0] - draws[:, 1]
    estimate = kappa(gold, a) - kappa(gold, b)
    return estimate, held, unseen_discordance(gold, a, b)["kappa"]


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 5, 7, 8])
def test_a_win_needs_as_many_one_sided_discordant_items_as_mcnemars_exact_test(k):
    """k items on which one arm is right and the other wrong, none the other way (nothing fitted): the bootstrap's
    interval alone claims a win from k = 4 (its variance is the k items it saw); with the floor's z² unseen ones
    not at k ≤ 5, and from k = 7 on. McNemar's exact test: two-sided p = 2¹⁻ᵏ < 0.05 from k = 6, the edge, where
    the floored lower bound sits at 0 within a hair (+0.0003 on this layout)."""
    estimate, held, unseen = _one_sided(k)
    floored = refit_delta(estimate, held, held, 0.0, 0.95, unseen)
    assert (floored.ci[0] > 0) is (k >= 7), floored
    assert floored.floored is True and floored.ci[1] - floored.ci[0] > 0
    bare = refit_delta(estimate, held, held, 0.0, 0.95)
    assert (bare.ci[0] > 0) is (k >= 4) and bare.floored is None


def test_evidence_is_recorded_beside_every_delta(abstaining):
    """Each paired Δ (refit and the paper's fixed) carries the items where its two arms' verdicts differ — an
    abstention against a verdict counts — and each arm's abstentions; the average member, a mean over members, has
    no one count."""
    s, votes = abstaining["summary"], abstaining["table"].votes
    pred = {**abstaining["result"].predictions, "oracle": votes[:, list(s["members"]).index(s["selected"]["oracle"])]}
    st = pred["stacked"]
    for key in ("deltas", "deltas_fixed"):
        for c, per in s[key].items():
            for d in per.values():
                if c == "avg_member":
                    assert d["discordant"] is None and d["abstentions"] is None
                    continue
                assert d["discordant"] == int(np.sum(st != pred[c])), (key, c)
                assert d["abstentions"] == {"stacked": 0, c: int(np.sum(pred[c] == ABSTAIN))}
                assert (d["floored"] is None) is (key == "deltas_fixed")
    # the strong member abstains on 10 %: §2's comparison counts those items discordant, the deployed one answers them
    assert s["deltas"]["best_cv"]["kappa"]["abstentions"]["best_cv"] > 10
    assert s["deltas"]["best_cv_deployed"]["kappa"]["abstentions"]["best_cv_deployed"] == 0


def test_the_decision_compares_the_panel_with_the_single_judge_as_deployed(abstaining):
    """Like with like: §2's κ of the CV-best single leaves out the items it abstains on, which the panel answers; the
    deployed single judge answers them "hallucinated" (its ½ cut at 0.5), both arms scored on every item. §2's
    comparison stays in deltas.best_cv, its call beside the decision."""
    s, y = abstaining["summary"], abstaining["table"].gold
    pred = abstaining["result"].predictions
    cv = pred["best_cv"]
    np.testing.assert_array_equal(pred["best_cv_deployed"], np.where(cv == ABSTAIN, 1.0, cv))
    k_st, k_answered, k_deployed = kappa(y, pred["stacked"]), kappa(y, cv), kappa(y, deployed(cv))
    answered = cv != ABSTAIN
    assert k_answered == pytest.approx(kappa(y[answered], cv[answered]))
    assert s["comparators"]["best_cv"]["kappa"]["estimate"] == pytest.approx(k_answered)
    assert s["comparators"]["best_cv_deployed"]["kappa"]["estimate"] == pytest.approx(k_deployed)
    assert s["deltas"]["best_cv_deployed"]["kappa"]["estimate"] == pytest.approx(k_st - k_deployed)
    assert s["deltas"]["best_cv"]["kappa"]["estimate"] == pytest.approx(k_st - k_answered)
    d = s["decision"]
    assert d["comparison"] == "best_cv_deployed"
    assert d["delta_kappa"] == s["deltas"]["best_cv_deployed"]["kappa"]["estimate"]
    assert d["call"] == s["deltas"]["best_cv_deployed"]["kappa"]["call"]
    assert d["call_paper"] == s["deltas"]["best_cv"]["kappa"]["call"]
    assert d["discordant"] == int(np.sum(pred["stacked"] != pred["best_cv_deployed"]))
    assert d["abstentions"] == {"panel": 0, "single": int(np.sum(cv == ABSTAIN))}
    assert d["action"] == "single" and d["kappa"] == pytest.approx(k_deployed)  # the κ it delivers, every item


def test_the_refit_draws_deploy_the_same_choice(abstaining):
    """The deployed rung refits the CV-best choice draw by draw, exactly as best_cv, and answers its abstentions."""
    t = abstaining["table"]
    y, clusters = t.gold, t.clusters
    rb = RefitBootstrap(
        y, ladderbase.checked_folds(y, clusters, ladderbase.LadderSettings()), ClusterBootstrap(clusters, 50, 0)
    )
    rungs = {"best_cv": rb.best_cv(t.votes, 0.5), "best_cv_deployed": rb.best_cv(t.votes, 0.5, as_deployed=True)}
    assert rungs["best_cv"].abstains and not rungs["best_cv_deployed"].abstains
    for chunk in rb.draws(rungs):
        answered, dep = chunk["best_cv"][1], chunk["best_cv_deployed"][1]
        np.testing.assert_array_equal(dep, np.where(answered == ABSTAIN, 1.0, answered))
    np.testing.assert_array_equal(rb.choices(rungs["best_cv"]), rb.choices(rungs["best_cv_deployed"]))
    c = from_counts(rb.counts(rungs["best_cv_deployed"]))
    assert np.all(np.isfinite(c["kappa"]))


def _summary(paper_call: str, deployed_call: str, k: int = 2, own: int = 2) -> dict:
    """A ladder summary with both comparisons: §2's (best_cv) and the deployed one (best_cv_deployed)."""

    def delta(call, est):
        return {"estimate": est, "ci": [est - 0.02, est + 0.03], "call": call, "discordant": k}

    return {
        "comparators": {
            "stacked": {"kappa": {"estimate": 0.86, "ci": [0.8, 0.92]}},
            "best_cv": {"kappa": {"estimate": 0.85, "ci": [0.79, 0.91]}},
            "best_cv_deployed": {"kappa": {"estimate": 0.84, "ci": [0.78, 0.90]}},
        },
        "deltas": {
            "best_cv": {"kappa": {**delta(paper_call, 0.01), "abstentions": {"stacked": 0, "best_cv": own}}},
            "best_cv_deployed": {
                "kappa": {**delta(deployed_call, 0.02), "abstentions": {"stacked": 0, "best_cv_deployed": 0}}
            },
        },
        "admissibility": {
            "admissible": True,
            "reason": "",
            "members_at_kappa0": 4,
            "n_members": 5,
            "phi_bar": 0.1,
            "kappa0": 0.3,
            "c": 0.5,
            "phi0": 0.4,
        },
        "members": {"a": {"kappa": 0.85}},
        "selected": {"oracle": "a"},
    }


@pytest.mark.parametrize(("paper", "as_deployed", "action"), [("win", "tie", "single"), ("tie", "win", "panel")])
def test_the_deployed_call_decides_and_the_papers_is_said_beside_it(paper, as_deployed, action):
    s = _summary(paper, as_deployed)
    d = decide.decide(s)
    assert d.action == action and d.call == as_deployed and d.call_paper == paper
    assert d.discordant == 2 and d.abstentions == {"panel": 0, "single": 2}
    assert f"§2's call on the items it answers: {paper}" in d.reason
    assert "2 discordant items; abstentions: panel 0, single 2 answered 'hallucinated'" in d.reason


def test_the_summary_line_says_the_evidence():
    s = _summary("win", "tie")
    s["decision"] = decide.decide(s).as_dict()
    (line,) = summary_lines({"datasets": {"d": s}})
    assert line.startswith("d: stacked κ 0.860 vs CV-best single 0.840, Δκ +0.020 [+0.000, +0.050]: tie (")
    assert (
        "tie (2 discordant items; abstentions: panel 0, single 2 answered 'hallucinated'; "
        "§2 on its answered items: win); admissible → deploy the single judge a"
    ) in line
    s = _summary("tie", "tie", k=1, own=0)
    s["decision"] = decide.decide(s).as_dict()
    assert (
        ": tie (1 discordant item; abstentions: panel 0, single 0); admissible"
        in summary_lines({"datasets": {"d": s}})[0]
    )
