"""The escalation cascade (src/studies/suite/cascade.py, escalation.py) on simulated panels whose answer is known, and
on the committed `cpu` verdicts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from sklearn.base import clone

from src.analyses.__main__ import flat_metrics
from src.core import verdicts
from src.core.aggregate import StackedLogit, crossfit
from src.core.ladder import dataset_folds
from src.core.ladderbase import LadderSettings
from src.judges import tables
from src.present import figures, report
from src.studies import simulate
from src.studies.checked import check_config
from src.studies.suite import cascade, cost, escalation
from src.studies.suite.reference import reference, references

CFG = {
    "enabled": True,
    "expensive": None,
    "operating_points": [0.05, 0.1, 0.2, 0.3, 0.5],
    "budgets": [0.1, 0.2],
    "grid_step": 0.05,
    "margin": 0.05,
    "random_draws": 20,
    "injection_defence": "escalate",
}
COST_CFG = {
    "price_per_gpu_hour": 2.0,
    "throughput": {"default": 142.45},
    "use_measured": True,
    "paper_panel_size": 10,
    "frontier": {"price_per_mtok": {"input": 3.0, "output": 15.0}, "tokens_per_item": {"input": 790, "output": 10}},
    "labelling": {"price_per_label": 1.0, "labels_per_record": 2, "records": []},
}


def _ref(acc, rho, frontier, n_clusters=300, seed=0, abstain=0.02, name="sim", n_boot=500):
    df = simulate.panel(
        n_clusters, 2, acc, rho=rho, abstain_rate=abstain, dataset=name, seed=seed, frontier_accuracy=frontier
    )
    t = verdicts.validate(df, frontier="frontier" if frontier is not None else None)
    return reference(name, t, StackedLogit(), LadderSettings(n_boot=n_boot))


def _run(ref, cfg=CFG, measured=None):
    t = ref.table
    costs = cost.compute(COST_CFG, t.members, None, measured, t.frontier_name)
    return cascade.run({ref.name: ref}, t, StackedLogit(), LadderSettings(n_boot=500), cfg, costs, 0)


@pytest.fixture(scope="module")
def informative():
    """An admissible panel (8 members at accuracy 0.75, ρ = 0.2) and a perfect expensive judge."""
    return _ref([0.75] * 8, 0.2, 1.0)


@pytest.fixture(scope="module")
def informative_doc(informative):
    return _run(informative)


# ----------------------------------------------------------------------------------------------- the rule


def test_band_thresholds_escalate_the_target_share_exactly_despite_ties():
    conf = np.array([0.0, 0.0, 0.0, 0.1, 0.1, 0.2, 0.2, 0.2, 0.2, 0.4])
    shares = np.array([0.0, 0.05, 0.25, 0.3, 0.5, 0.77, 1.0])
    tau, q = escalation.band_thresholds(conf, shares)
    expected = (conf[None] < tau[:, None]).mean(1) + q * (conf[None] == tau[:, None]).mean(1)
    np.testing.assert_allclose(expected, shares, atol=1e-12)
    assert tau[0] == -np.inf and tau[-1] == np.inf
    assert tau[2] == 0.0 and q[2] == pytest.approx(2.5 / 3)  # a share inside a tie: part of the tied items


def test_band_thresholds_of_weighted_rows_are_those_of_the_items_repeated():
    """A draw's distinct confidences weighted by their items' multiplicities give the τ and q of the items listed one
    by one; rows of draws at once."""
    rng = np.random.default_rng(3)
    shares = np.array([0.0, 0.05, 0.1, 0.33, 0.5, 0.8, 0.97, 1.0])
    conf = np.round(rng.choice([0.0, 0.05, 0.1, 0.2, 0.3, 0.45], (6, 9)), 2)
    w = rng.integers(0, 4, (6, 9)).astype(float)
    w[:, 0] += 1  # no empty draw
    tau, q = escalation.band_thresholds(conf, shares, w)
    assert tau.shape == q.shape == (6, len(shares))
    for b in range(6):
        t1, q1 = escalation.band_thresholds(np.repeat(conf[b], w[b].astype(int)), shares)
        np.testing.assert_array_equal(tau[b], t1)
        np.testing.assert_array_equal(q[b], q1)


def test_the_tie_draw_escalates_with_its_probability():
    """The seeded tie rule escalates an item at τ with probability q: over many seeds, :func:`escalation_prob`."""
    ref = _ref([0.7] * 5, 0.2, 0.9, n_clusters=60, seed=2, n_boot=10)
    X, y = ref.table.votes, ref.table.gold
    est = escalation.Cascade(StackedLogit(n_votes=X.shape[1]), (0.1, 0.3, 0.5)).fit(X, y)
    prob = escalation.escalation_prob(est.confidence(X)[None], est.thresholds_[:, None], est.tie_prob_[:, None])
    assert ((prob > 0) & (prob < 1)).any()  # some items tie at τ
    seen = np.mean([clone(est).set_params(random_state=r).fit(X, y).escalate(X) for r in range(400)], axis=0)
    assert np.abs(seen - prob).max() < 0.1 and np.all(seen[prob == 0] == 0) and np.all(seen[prob == 1] == 1)


class _OtherStacker(StackedLogit):
    """The same stacker as another class: the refit fits it by its own ``fit``, one draw at a time."""


def _brute_refit(X, y, e, folds, boot, est, n_draws):
    """Per draw and fold, the cascade fitted on the training clusters' items repeated by their multiplicity and applied
    to the held-out ones: each share's expected confusion counts (ties at τ escalated with probability q)."""
    from src.core.refit import _cells

    w = boot.weights
    out = np.zeros((n_draws, len(est.shares), 6))
    for b in range(n_draws):
        iw = w[b][boot.item_cluster]
        for tr, te in folds:
            rep = np.repeat(tr, iw[tr].astype(int))
            f = clone(est).fit(X[rep], y[rep])
            esc = escalation.escalation_prob(f.confidence(X[te])[None], f.thresholds_[:, None], f.tie_prob_[:, None])
            pred = escalation.merge(f.stacker_.predict(X[te]).astype(float), e[te], esc)
            out[b] += np.stack([iw[te] @ _cells(y[te], p, True) for p in pred])
    return out


@pytest.mark.parametrize("stacker", [StackedLogit(), StackedLogit(abstention="category"), _OtherStacker()])
def test_a_refit_draw_is_the_cascade_fitted_on_the_draws_repeated_items(stacker):
    """Every share of :class:`CascadeRefit`: the stacker, τ and q refitted on a draw's training clusters (each item
    counted by its multiplicity) equal :class:`Cascade` fitted on those items repeated, draw by draw."""
    from src.core.aggregate import cluster_folds
    from src.core.evaluate import ClusterBootstrap
    from src.core.refit import RefitBootstrap

    df = simulate.panel(40, 2, [0.8, 0.7, 0.66, 0.6, 0.58], rho=0.2, abstain_rate=0.05, seed=4, frontier_accuracy=0.85)
    t = verdicts.validate(df, frontier="frontier")
    X, y = t.votes, t.gold
    e = t.frontier.copy()
    e[::7] = 0.5  # the expensive judge abstains on some items: they keep the panel's verdict
    folds = cluster_folds(y, t.clusters, 5, 0)
    boot = ClusterBootstrap(t.clusters, 12, 1)
    shares = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
    st = clone(stacker).set_params(n_votes=X.shape[1])
    refit = cascade.CascadeRefit(st, X, e, np.array(shares), folds)
    rb = RefitBootstrap(y, folds, boot)
    n = 5
    brute = _brute_refit(X, y, e, folds, boot, escalation.Cascade(st, shares), n)
    got = {r: rb.counts(rung)[:n] for r, rung in refit.rungs().items()}
    for i in range(len(shares)):
        np.testing.assert_allclose(got[i], brute[:, i], rtol=0, atol=1e-9)
    assert any((got[i] != np.round(got[i])).any() for i in range(len(shares)))  # ties at τ: fractional counts
    np.testing.assert_array_equal(got["panel"], got[0])  # nothing escalated: the panel


def test_a_share_reads_its_held_out_rows_without_the_whole_row_set():
    """The refit reads each fold's predictions on the rows its held-out items hold: a share's rung gives just those
    (the rows of the fold's pairs), the same numbers as its whole-row predictions read there; other rows are read off
    those."""
    from src.core.aggregate import cluster_folds
    from src.core.evaluate import ClusterBootstrap
    from src.core.refit import RefitBootstrap

    df = simulate.panel(40, 2, [0.8, 0.7, 0.66, 0.6, 0.58], rho=0.2, abstain_rate=0.05, seed=4, frontier_accuracy=0.85)
    t = verdicts.validate(df, frontier="frontier")
    folds = cluster_folds(t.gold, t.clusters, 5, 0)
    refit = cascade.CascadeRefit(
        StackedLogit(n_votes=t.votes.shape[1]), t.votes, t.frontier, np.array([0.2, 0.5]), folds
    )
    rb = RefitBootstrap(t.gold, folds, ClusterBootstrap(t.clusters, 6, 1))
    rungs = refit.rungs()
    cells = rb.cells(list(rungs.values()))
    fold, row = np.divmod(cells.pairs[0], rungs[0].n_rows)
    rng = np.random.default_rng(0)
    t1, t0 = (rng.integers(0, 3, (6, rungs[0].n_rows)).astype(float) for _ in range(2))
    for k in range(len(folds)):
        rows = row[fold == k]
        assert np.array_equal(rows, refit.held[k])
        for rung in (rungs[1], rungs["panel"]):
            direct = rung._at_rows(t1, t0, k, rows)
            assert direct is not None and np.array_equal(direct, rung.predict(t1, t0, k)[:, rows])
            assert rung._at_rows(t1, t0, k, rows[1:]) is None  # other rows: read off the whole set
            assert np.array_equal(rung.predict_at(t1, t0, k, rows[1:]), rung.predict(t1, t0, k)[:, rows[1:]])


def test_the_headline_reads_the_refit_interval():
    """The fewest escalations non-inferior: from the refit lower bound of Δκ, the fixed-prediction one kept apart."""
    base = {"target": 0.0, "share": 0.0, "kappa": {}, "cost_per_1k": 1.0}
    d = {"estimate": 0.0, "ci": [0.0, 0.0]}
    points = [
        {**base, "target": t, "share": t, "noninferior": r, "noninferior_fixed": f}
        | {"delta_expensive": {**d, "se": 1.0}, "delta_expensive_fixed": d}
        for t, r, f in ((0.2, False, True), (0.4, False, True), (0.6, True, True), (0.8, True, True))
    ]
    assert cascade._first_stable(points)["share"] == 0.6 and cascade._first_stable(points)["delta_expensive"]["se"]
    assert cascade._first_stable(points, fixed=True)["share"] == 0.2


def test_every_share_reads_refit_intervals_beside_the_fixed_ones(informative_doc):
    d = informative_doc["datasets"]["sim"]
    margin = informative_doc["margin"]
    assert informative_doc["interval"] == "refit_corrected"
    wider = 0
    for p in d["points"]:
        for m in ("kappa", "bacc", "f1"):
            assert set(p[m]) == {"estimate", "ci", "ci_fixed"}
        de, df = p["delta_expensive"], p["delta_expensive_fixed"]
        assert de["se"] is not None and df["se"] is None and de["estimate"] == df["estimate"]
        assert p["noninferior"] == (de["ci"][0] > -margin) and p["noninferior_fixed"] == (df["ci"][0] > -margin)
        assert de["ci"][0] < de["estimate"] < de["ci"][1] or de["se"] == 0
        wider += (de["ci"][1] - de["ci"][0]) > (df["ci"][1] - df["ci"][0])
    assert wider > len(d["points"]) // 2  # the fit's variation widens most intervals
    assert d["noninferior"] == cascade._first_stable(d["points"])
    assert d["noninferior_fixed"] == cascade._first_stable(d["points"], fixed=True)
    assert d["points"][0]["delta_panel"]["ci"] == [0.0, 0.0]  # share 0 is the panel, in every draw
    assert d["alone"]["panel"]["kappa"]["ci"] == d["points"][0]["kappa"]["ci"]
    assert d["alone"]["expensive"]["kappa"]["ci"] == d["alone"]["expensive"]["kappa"]["ci_fixed"]


def test_no_escalation_is_the_panel_and_full_escalation_the_expensive_judge(informative, informative_doc):
    d = informative_doc["datasets"]["sim"]
    first, last = d["points"][0], d["points"][-1]
    assert first["target"] == 0 and first["share"] == 0 and last["target"] == 1 and last["share"] == 1
    assert first["kappa"] == d["alone"]["panel"]["kappa"] and last["kappa"] == d["alone"]["expensive"]["kappa"]
    assert first["cost_per_1k"] == d["alone"]["panel"]["cost_per_1k"]
    assert last["cost_per_1k"] == pytest.approx(
        d["alone"]["panel"]["cost_per_1k"] + d["alone"]["expensive"]["cost_per_1k"]
    )
    # with the frontier as the expensive judge the cheap panel is every member: its verdicts are the ladder's stacker
    t = informative.table
    X = t.votes
    cf = cascade.crossfit_cascade(
        X,
        t.gold,
        t.frontier,
        informative.design.folds,
        escalation.Cascade(StackedLogit(n_votes=X.shape[1]), (0.0, 1.0)),
        np.random.default_rng(0),
    )
    np.testing.assert_array_equal(cf["panel"], informative.stacked)
    np.testing.assert_array_equal(cf["verdicts"][0], informative.stacked)
    np.testing.assert_array_equal(cf["verdicts"][1], t.frontier)


def test_escalating_the_uncertain_beats_random_and_reaches_a_perfect_judge_early(informative_doc):
    d = informative_doc["datasets"]["sim"]
    inner = [p for p in d["points"] if 0.05 <= p["target"] <= 0.5]
    for p in inner:  # the panel's p is informative: its uncertain items are where it errs
        assert p["kappa"]["estimate"] > p["random_kappa"] + 0.03, p
        assert abs(p["share"] - p["target"]) < 0.03  # the band fitted on training folds holds the budget held out
    ni = d["noninferior"]
    assert ni is not None and ni["share"] <= 0.4  # the perfect judge's κ (within 0.05) well before 100%
    assert ni["calls_saved"] == pytest.approx(1 - ni["share"])
    assert d["budgets"]["0.2"]["kappa"]["estimate"] > 0.93 > d["alone"]["panel"]["kappa"]["estimate"]
    assert d["points"][1]["delta_panel"]["ci"][0] > 0  # 5% escalated already clearly improves on the panel


def test_readme_admissible_panel_behind_a_frontier_judge():
    """The README's simulated case: ten members at accuracy 0.72 (ρ = 0.15, admissible) behind a frontier judge at
    accuracy 0.92: the cascade is non-inferior to the frontier from a few percent escalated on, and at 20% it
    clearly beats both the panel and the frontier alone (their errors differ)."""
    ref = _ref([0.72] * 10, 0.15, 0.92, seed=1)
    assert ref.admissibility.admissible
    doc = _run(ref)
    d = doc["datasets"]["sim"]
    assert d["noninferior"]["share"] <= 0.1 and d["noninferior"]["calls_saved"] >= 0.9
    at20 = next(p for p in d["points"] if p["target"] == 0.2)
    assert at20["delta_expensive"]["ci"][0] > 0 and at20["delta_panel"]["ci"][0] > 0
    assert at20["cost_per_1k"] < 0.25 * d["alone"]["expensive"]["cost_per_1k"]
    print(
        "simulated admissible panel:",
        {k: d["alone"][k]["kappa"]["estimate"] for k in ("panel", "expensive")},
        "non-inferior from",
        d["noninferior"]["share"],
        "κ at 10/20%:",
        [d["budgets"][b]["kappa"]["estimate"] for b in ("0.1", "0.2")],
        "cost at 20%:",
        at20["cost_per_1k"],
        "frontier alone:",
        d["alone"]["expensive"]["cost_per_1k"],
    )


def test_an_uninformative_panel_gains_only_what_random_escalation_gains():
    ref = _ref([0.5] * 6, 0.0, 1.0, n_clusters=250, seed=4)  # coin-flip members: p carries nothing
    d = _run(ref)["datasets"]["sim"]
    gap = [p["kappa"]["estimate"] - p["random_kappa"] for p in d["points"]]
    assert max(abs(g) for g in gap) < 0.12
    assert d["noninferior"]["share"] > 0.85  # nothing short of (nearly) everything reaches the perfect judge


def test_thresholds_never_see_held_out_items(informative):
    t, folds = informative.table, informative.design.folds
    X, y, e = t.votes.copy(), t.gold.copy(), t.frontier.copy()
    est = escalation.Cascade(StackedLogit(n_votes=X.shape[1]), tuple(cascade.grid(CFG)))
    base = cascade.crossfit_cascade(X, y, e, folds, est, np.random.default_rng(7))
    tr, te = folds[0]
    np.testing.assert_array_equal(base["tau"][0], clone(est).fit(X[tr], y[tr]).thresholds_)
    # rewrite half of fold 0's held-out items: confident all-hallucinated votes, flipped gold
    changed = te[::2]
    X2, y2 = X.copy(), y.copy()
    X2[changed] = 1.0
    y2[changed] = 1 - y2[changed]
    moved = cascade.crossfit_cascade(X2, y2, e, folds, est, np.random.default_rng(7))
    np.testing.assert_array_equal(moved["tau"][0], base["tau"][0])  # fold 0's bands: training clusters only
    kept = te[1::2]
    np.testing.assert_array_equal(moved["escalated"][:, kept], base["escalated"][:, kept])
    assert not np.array_equal(moved["escalated"][:, changed], base["escalated"][:, changed])
    assert not np.array_equal(moved["tau"][1:], base["tau"][1:])  # the other folds train on those items


def test_the_expensive_judge_is_the_frontier_or_the_costliest_member_and_the_panel_the_rest():
    ref = _ref([0.9, 0.7, 0.65, 0.6, 0.8], 0.3, None, n_clusters=150, seed=5)
    t = ref.table
    measured = {m: {"seconds_per_item": 1.0} for m in t.members} | {"m02": {"seconds_per_item": 9.0}}
    doc = _run(ref, measured=measured)
    assert doc["expensive"] == "m02" and doc["chosen_as"].startswith("most expensive member (measured")
    assert doc["cheap"] == ["m00", "m01", "m03", "m04"]
    # the cheap panel's stacker is fitted on the cheap members only, on the ladder's folds
    keep = [0, 1, 3, 4]
    alone = crossfit(StackedLogit(n_votes=4), t.votes[:, keep], t.gold, ref.design.folds).pred
    d = doc["datasets"]["sim"]
    from src.core.evaluate import kappa

    assert d["alone"]["panel"]["kappa"]["estimate"] == pytest.approx(kappa(t.gold, alone))
    assert d["alone"]["expensive"]["kappa"]["estimate"] == pytest.approx(kappa(t.gold, t.votes[:, 2]))
    per = cost.compute(COST_CFG, t.members, None, measured)["members"]
    assert doc["cost_per_1k"] == pytest.approx(
        {"cheap_panel": sum(per[t.members[j]]["per_1k"] for j in keep), "expensive": per["m02"]["per_1k"]}
    )
    for p in d["points"]:
        assert p["cost_per_1k"] == pytest.approx(doc["cost_per_1k"]["cheap_panel"] + p["share"] * per["m02"]["per_1k"])
    # configured throughput only (all equal): roster order; a frontier column wins; a configured name must exist
    assert _run(ref)["expensive"] == "m00"
    assert cascade.choose_expensive(_ref([0.7] * 4, 0.2, 0.9, 60).table, {"members": {}})[0] == "frontier"
    with pytest.raises(cascade.CascadeError, match=r"suite\.cascade\.expensive: 'gpt'"):
        _run(ref, {**CFG, "expensive": "gpt"})
    with pytest.raises(cascade.CascadeError, match=r"suite\.cascade\.operating_points: \[1\.5\]"):
        _run(ref, {**CFG, "operating_points": [0.1, 1.5]})


def test_a_frontier_column_nobody_scored_is_not_the_expensive_judge():
    """A roster names its frontier but its column is all abstentions (the frontier was never run): the cascade
    escalates to the costliest member instead of skipping every dataset."""
    df = simulate.panel(150, 2, [0.9, 0.7, 0.65, 0.6], rho=0.3, abstain_rate=0.02, seed=5, frontier_accuracy=0.9)
    df["frontier"] = pd.NA
    t = verdicts.validate(df, frontier="frontier")
    assert t.frontier is not None and not t.has_frontier
    doc = _run(reference("sim", t, StackedLogit(), LadderSettings(n_boot=500)))
    assert doc["expensive"] == "m00" and doc["chosen_as"].startswith("most expensive member")
    assert "skipped" not in doc["datasets"]["sim"] and doc["datasets"]["sim"]["points"]


def test_abstentions_of_the_expensive_judge_keep_the_panel_verdict():
    panel = np.array([0.0, 1.0, 1.0, 0.0])
    expensive = np.array([1.0, 0.5, 0.0, 0.5])
    esc = np.array([[True, True, True, False]])
    np.testing.assert_array_equal(escalation.merge(panel, expensive, esc), [[1.0, 1.0, 0.0, 0.0]])


# ------------------------------------------------------------------------------------- suite, figure, report


def test_suite_block_figure_report_and_metrics(tmp_path):
    from src.studies.suite import run_suite

    parts = [
        simulate.panel(80, 2, [0.8] * 6, rho=0.1, abstain_rate=0.02, dataset=n, seed=i, frontier_accuracy=0.9)
        for i, n in enumerate(("a", "b"))
    ]
    import pandas as pd

    t = verdicts.validate(pd.concat(parts, ignore_index=True), frontier="frontier")
    scfg = OmegaConf.merge(OmegaConf.load("conf/suite/default.yaml"), OmegaConf.load("conf/suite/fast.yaml"))
    scfg = OmegaConf.to_container(scfg, resolve=True)
    scfg.pop("defaults", None)
    scfg["budget"].update(draws=5, curve_draws=2, curve_budgets=[10])
    scfg["mechanism"].update(subpanels=3, subpanel_boot=20)
    scfg["panel"]["n_boot"] = 20
    doc = run_suite(t, StackedLogit(), LadderSettings(n_boot=100), scfg)
    c = doc["cascade"]
    assert set(c["datasets"]) == {"a", "b"} and c["expensive"] == "frontier" and c["margin"] == 0.05
    assert "cascade" in doc["timings"]
    m = flat_metrics(doc)
    assert {
        "cascade/a/kappa_at_0.1",
        "cascade/b/kappa_at_0.2",
        "cascade/a/calls_saved",
        "cascade/calls_saved_mean",
    } <= set(m)
    paths = figures.draw(None, doc, tmp_path)
    assert tmp_path / figures.FIGURES["cascade"] in paths
    text = report.markdown(None, doc, tmp_path, tmp_path / "report.md")
    assert "## Escalation cascade (beyond the paper)" in text and "cascade.png" in text
    off = run_suite(
        t, StackedLogit(), LadderSettings(n_boot=100), {**scfg, "cascade": {**scfg["cascade"], "enabled": False}}
    )
    assert off["cascade"] == {} and "Escalation cascade" not in report.markdown(None, off, tmp_path, tmp_path / "r.md")


def test_cpu_cascade_on_the_committed_verdicts(compose_cfg):
    """The real cascade on this machine: Qwen-1.5B (the costliest member by measured seconds per verdict) behind
    the other five members, on the four committed datasets."""
    from hydra.utils import instantiate

    cfg = compose_cfg("judge.missing=skip")
    s, st = instantiate(cfg.analysis, _convert_="all"), instantiate(cfg.stacker, _convert_="all")
    table = tables.load_table(check_config(cfg))
    measured = cost.measured_from_cache(cfg.paths.cache_dir, list(table.members))
    scfg = OmegaConf.to_container(cfg.suite, resolve=True)
    costs = cost.compute(scfg["cost"], table.members, None, measured, table.frontier_name)
    refs = references(table, st, s, dataset_folds(table, s))
    doc = cascade.run(refs, table, st, s, scfg["cascade"], costs, int(scfg["seed"]))
    assert doc["expensive"] == "qwen15b" and "measured" in doc["chosen_as"]
    assert len(doc["cheap"]) == len(table.members) - 1 and len(doc["datasets"]) == 4
    for d in doc["datasets"].values():
        assert d["points"][0]["kappa"] == d["alone"]["panel"]["kappa"]
        assert d["points"][-1]["share"] == 1.0
    print(
        "cpu cascade:",
        {n: d["noninferior"] and round(d["noninferior"]["share"], 3) for n, d in doc["datasets"].items()},
        "calls saved (mean):",
        doc["summary"]["calls_saved_mean"],
    )


def test_a_flagged_item_escalates_at_every_share_and_is_counted(informative):
    """An item flagged as a prompt injection is never decided by the cheap panel: it escalates at every share (0
    included), in the cross-fitted rule, the refitted one and the suite block; ``off`` leaves the curve as it was."""
    t = informative.table
    flagged = np.zeros(len(t.gold), bool)
    flagged[::10] = True
    X = t.votes
    cf = cascade.crossfit_cascade(
        X,
        t.gold,
        t.frontier,
        informative.design.folds,
        escalation.Cascade(StackedLogit(n_votes=X.shape[1]), (0.0, 0.1, 1.0)),
        np.random.default_rng(0),
        flagged,
    )
    assert cf["escalated"][:, flagged].all() and not cf["escalated"][0, ~flagged].any()
    answered = flagged & (t.frontier != verdicts.ABSTAIN)
    np.testing.assert_array_equal(cf["verdicts"][0][answered], t.frontier[answered])
    flags = dict(zip(t.items["item_id"].astype(str), flagged))
    costs = cost.compute(COST_CFG, t.members, None, None, t.frontier_name)
    run = {
        d: cascade.run(
            {"sim": informative},
            t,
            StackedLogit(),
            LadderSettings(n_boot=100),
            {**CFG, "injection_defence": d},
            costs,
            0,
            flags,
        )
        for d in ("escalate", "off")
    }
    on, off = run["escalate"]["datasets"]["sim"], run["off"]["datasets"]["sim"]
    assert run["escalate"]["injection_defence"] == "escalate" and on["flagged"] == flagged.sum() and off["flagged"] == 0
    assert on["points"][0]["share"] == pytest.approx(flagged.mean()) and off["points"][0]["share"] == 0
    assert on["points"][0]["kappa"] != off["points"][0]["kappa"]
    with pytest.raises(cascade.CascadeError, match="suite.cascade.injection_defence: 'pray' is not one of"):
        cascade.settings({**CFG, "injection_defence": "pray"})


def test_the_suite_reads_the_flags_of_the_shipped_items_text(compose_cfg):
    from src.analyses.__main__ import shipped_flags

    ids = ["expertqa-00609-neg", "expertqa-00975-pos", "expertqa-00000-pos", "not-shipped-1"]
    df = pd.DataFrame(
        {"item_id": ids, "cluster_id": ids, "dataset": ["expertqa"] * 4, "gold": [1, 0, 0, 1], "m1": [1, 0, 0, 1]}
    )
    flags = shipped_flags(check_config(compose_cfg()), verdicts.validate(df))
    assert flags == {"expertqa-00609-neg": True, "expertqa-00975-pos": True, "expertqa-00000-pos": False}
