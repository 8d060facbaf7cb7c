"""The deployment decision (src/core/decide.py): known answers on constructed ladder summaries, and its place in
results.json (§2 calls, §3.3 admissibility)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from src.core import decide, ladder, ladderbase, verdicts
from src.core.aggregate import StackedLogit
from src.studies import simulate


def summary(
    stacked: float = 0.60,
    single: float = 0.50,
    call: str = "win",
    admissible: bool = True,
    at_k0: int = 4,
    n: int = 6,
    phi: float | None = 0.10,
    majority: float = 0.45,
    members: dict | None = None,
) -> dict:
    """A ladder summary holding only what the decision reads."""
    delta = stacked - single
    members = members or {"a": 0.52, "b": 0.31, "c": 0.20}
    comp = {
        c: {"kappa": {"estimate": k, "ci": [k - 0.1, k + 0.1]}}
        for c, k in (("stacked", stacked), ("best_cv", single), ("majority", majority))
    }
    return {
        "comparators": comp,
        "deltas": {"best_cv": {"kappa": {"estimate": delta, "ci": [delta - 0.05, delta + 0.05], "call": call}}},
        "admissibility": {
            "admissible": admissible,
            "members_at_kappa0": at_k0,
            "n_members": n,
            "phi_bar": phi,
            "kappa0": 0.30,
            "c": 0.5,
            "phi0": 0.40,
        },
        "members": {m: {"kappa": k} for m, k in members.items()},
        "selected": {"oracle": "a"},
    }


@pytest.mark.parametrize("call", ["win", "clean win"])
def test_admissible_and_a_win_deploys_the_panel(call):
    d = decide.decide(summary(call=call), 0.40)
    assert (d.action, d.member, d.label) == ("panel", None, "deploy the panel")
    assert d.kappa == 0.60 and d.kappa_ci == pytest.approx([0.50, 0.70])
    for text in (
        "stacked κ 0.600 [0.500, 0.700] ≥ floor 0.4",
        f"+0.100 [+0.050, +0.150] ({call})",
        "admissible: 4/6 members at κ≥0.3",
        "φ̄ 0.100",
    ):
        assert text in d.reason, (text, d.reason)
    assert d.share_competent == pytest.approx(4 / 6) and d.phi_bar == 0.10


def test_admissible_but_a_tie_deploys_the_cv_best_single():
    d = decide.decide(summary(stacked=0.52, call="tie"), 0.40)
    assert (d.action, d.member, d.label) == ("single", "a", "deploy the single judge a")
    assert d.kappa == 0.50 and d.kappa_ci == pytest.approx([0.40, 0.60])
    assert "does not pay here (a tie vs the CV-best single)" in d.reason
    assert "CV-best single a κ 0.500 [0.400, 0.600] ≥ floor 0.4" in d.reason


def test_a_win_that_is_not_admissible_deploys_the_single():
    d = decide.decide(summary(admissible=False, at_k0=2), 0.40)
    assert (d.action, d.member) == ("single", "a")
    assert "does not pay here (not admissible)" in d.reason and "not admissible: 2/6 members" in d.reason


def test_floor_exactly_reached_counts_and_a_hair_under_does_not():
    exact = decide.decide(summary(admissible=False, single=0.40), 0.40)
    assert exact.action == "single" and "≥ floor 0.4" in exact.reason
    tolerance = decide.decide(summary(admissible=False, single=0.3999999999999999), 0.40)
    assert tolerance.action == "single"  # 0.40 computed with a rounding error still reaches it
    under = decide.decide(summary(admissible=False, single=0.399, stacked=0.45), 0.40)
    assert under.action == "none"
    panel = decide.decide(summary(stacked=0.40, single=0.30), 0.40)
    assert panel.action == "panel"


def test_nothing_good_enough_names_the_best_reached():
    d = decide.decide(
        summary(
            stacked=0.25,
            single=0.20,
            call="tie",
            admissible=False,
            at_k0=0,
            majority=0.28,
            members={"a": 0.33, "b": 0.10},
        ),
        0.40,
    )
    assert (d.action, d.member, d.label) == ("none", None, "nothing here is good enough")
    assert d.kappa == 0.25  # the better of the panel and the single
    for text in (
        "CV-best single a κ 0.200 [0.100, 0.300] < floor 0.4",
        "stacked κ 0.250 [0.150, 0.350] < floor",
        "best member a κ 0.330",
        "best aggregate majority κ 0.280",
        "0/6 members",
    ):
        assert text in d.reason, (text, d.reason)


def test_a_paying_panel_under_the_floor_is_not_deployed():
    d = decide.decide(summary(stacked=0.35, single=0.25), 0.40)
    assert d.action == "none" and "the panel pays but is under the floor" in d.reason


def test_the_floor_is_a_setting_distinct_from_kappa0():
    s = summary(stacked=0.52, single=0.45, call="tie")
    assert decide.decide(s, 0.40).action == "single" and decide.decide(s, 0.50).action == "none"
    assert ladderbase.LadderSettings().kappa_floor == 0.40 != ladderbase.LadderSettings().kappa0
    with pytest.raises(decide.FloorError, match=r"analysis.kappa_floor=2: must be in \[-1, 1\]"):
        decide.decide(s, 2)
    # checked before any work, by the ladder's settings check, with the same rule
    with pytest.raises(decide.FloorError, match=r"analysis.kappa_floor=2: must be in \[-1, 1\]"):
        ladderbase.check_settings(ladderbase.LadderSettings(kappa_floor=2), StackedLogit())


def test_undefined_phi_and_missing_kappa_are_said_not_crashed():
    d = decide.decide(summary(admissible=False, phi=None, single=0.1, stacked=0.1), 0.40)
    assert d.action == "none" and "φ̄ undefined" in d.reason


def test_results_json_carries_the_decision_per_dataset():
    """Through the real ladder: a competent, decorrelated panel (the stacker wins) and one dominant member."""
    frame = pd.concat(
        [
            simulate.panel(150, 2, [0.75] * 8, rho=0.05, dataset="good", seed=1),
            simulate.panel(150, 2, [0.93] + [0.56] * 7, rho=0.6, dataset="bad", seed=2),
        ],
        ignore_index=True,
    )
    t = verdicts.validate(frame)
    s = ladderbase.LadderSettings(n_boot=200, core=["good", "bad"], abstention_contrast=False)
    doc = json.loads(json.dumps(ladder.to_json(ladder.analyze(t, StackedLogit(), s), s), default=float))
    good, bad = doc["datasets"]["good"]["decision"], doc["datasets"]["bad"]["decision"]
    assert list(doc["datasets"]["good"])[0] == "decision" and doc["settings"]["kappa_floor"] == 0.40
    assert good["action"] == "panel" and good["label"] == "deploy the panel"
    assert bad["action"] == "single" and bad["member"] == "m00" == doc["datasets"]["bad"]["selected"]["oracle"]
    assert bad["kappa"] == doc["datasets"]["bad"]["comparators"]["best_cv"]["kappa"]["estimate"]
    assert decide.decide_all(doc)["bad"].as_dict() == bad


def test_a_clean_win_the_rule_vetoes_is_said_in_the_reason():
    """The paper's rule stands (an inadmissible panel is not deployed), and the decision says what it overrides."""
    s = summary(stacked=0.62, single=0.50, call="clean win", admissible=False, at_k0=1, n=8)
    s["admissibility"].update(
        reason="only 1/8 members at κ≥0.3 (< 0.5 share)", admitted_share=0.043, members_uncertain=["b", "c"]
    )
    d = decide.decide(s, 0.40)
    assert (d.action, d.member) == ("single", "a") and d.vetoed_win and d.admitted_share == 0.043
    for text in (
        "the ladder shows a clean win against the CV-best single (Δκ lower bound +0.070) that the "
        "admissibility rule vetoes (only 1/8 members at κ≥0.3 (< 0.5 share); admissible in 4% of the "
        "bootstrap draws; 2 member(s) with κ intervals across κ₀ 0.3)",
    ):
        assert text in d.reason, d.reason
    assert not decide.decide(summary(call="tie", admissible=False), 0.40).vetoed_win


def test_the_floor_is_read_with_its_interval():
    s = summary(stacked=0.45, single=0.42, call="tie")  # CV-best single κ 0.42 [0.32, 0.52]
    d = decide.decide(s, 0.40)
    assert d.action == "single" and d.floor_clear is False and d.floor_rule == "estimate"
    assert "≥ floor 0.4 (its interval spans the floor: reached on the estimate only)" in d.reason
    strict = decide.decide(s, 0.40, "lower_bound")
    assert strict.action == "none" and "< floor 0.4 (its interval spans the floor: " in strict.reason
    assert decide.decide(summary(), 0.40, "lower_bound").action == "panel"  # 0.60 [0.50, 0.70]: clearly above
    assert decide.decide(summary(), 0.40).floor_clear is True
    with pytest.raises(decide.FloorError, match=r"^analysis.floor_rule='mean': must be one of estimate, lower_bound$"):
        decide.decide(s, 0.40, "mean")
