"""The analysis suite on panels whose answer is known, and the vectorised code against the loops."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from sklearn.linear_model import LogisticRegression

from src.core import admissibility, verdicts
from src.core.aggregate import StackedLogit
from src.core.ladderbase import LadderSettings
from src.studies import simulate
from src.studies.suite import budget, common, cost, loops, mechanism, panel, run_suite
from src.studies.suite.reference import reference

DOMINANT = [0.95] + [0.57] * 7  # one strong member, seven weak ones
SPREAD = [0.82] * 8  # eight capable members


def _table(acc, rho, n_clusters=150, seed=0, name="sim", abstain=0.02, frontier=0.85):
    df = simulate.panel(
        n_clusters, 2, acc, rho=rho, abstain_rate=abstain, dataset=name, seed=seed, frontier_accuracy=frontier
    )
    return df


@pytest.fixture(scope="module")
def dominant():
    t = verdicts.validate(_table(DOMINANT, 0.6, 200, seed=1, name="dominant"), frontier="frontier")
    return reference("dominant", t, StackedLogit(), LadderSettings())


@pytest.fixture(scope="module")
def spread():
    t = verdicts.validate(_table(SPREAD, 0.1, 200, seed=2, name="spread"), frontier="frontier")
    return reference("spread", t, StackedLogit(), LadderSettings())


@pytest.fixture(scope="module")
def small():
    t = verdicts.validate(_table([0.9, 0.7, 0.65, 0.6, 0.8, 0.75], 0.4, 80, seed=3, abstain=0.05), frontier="frontier")
    return reference("sim", t, StackedLogit(), LadderSettings())


@pytest.fixture(scope="module")
def suite_cfg():
    cfg = OmegaConf.load("conf/suite/default.yaml")
    cfg = OmegaConf.merge(cfg, OmegaConf.load("conf/suite/fast.yaml"))
    cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg.pop("defaults", None)
    cfg["budget"].update(draws=30, curve_draws=5, curve_budgets=[10, 25, 50, 100])
    cfg["mechanism"].update(subpanels=12, subpanel_boot=100)
    cfg["panel"]["n_boot"] = 100
    return cfg


@pytest.fixture(scope="module")
def multi_doc(suite_cfg):
    parts = [
        _table(SPREAD, 0.1, 120, 11, "spread"),
        _table(DOMINANT, 0.6, 120, 12, "dominant"),
        _table([0.7] * 8, 0.85, 80, 13, "correlated"),
    ]
    t = verdicts.validate(pd.concat(parts, ignore_index=True), frontier="frontier")
    s = LadderSettings(n_boot=200, core=["spread", "dominant", "correlated"])
    return run_suite(t, StackedLogit(), s, suite_cfg)


# ------------------------------------------------------------------------------------------ building blocks


def test_batched_logit_matches_sklearn_with_weights_masks_and_one_class():
    rng = np.random.default_rng(0)
    t = verdicts.validate(_table([0.9, 0.7, 0.65, 0.6, 0.8], 0.4, 100, abstain=0.05))
    for abst in ("scalar", "category"):
        d = common.design(t, StackedLogit(abstention=abst), 5, 0)
        W = (rng.random((12, len(d.y))) < 0.3).astype(float) * rng.integers(1, 3, (12, len(d.y)))
        mask = rng.random((12, d.F.shape[1])) < 0.8
        W[0] = 0
        W[0, np.flatnonzero(d.y == 1)[:5]] = 1  # one class only
        B = common.fit_logit_many(d.F, d.y, W, mask, C=1.0)
        assert B[0, 0] > 10 and np.all(B[0, 1:] == 0)
        for m in range(1, 12):
            on = W[m] > 0
            lr = LogisticRegression(C=1.0, solver="newton-cholesky", tol=1e-10, max_iter=500)
            lr.fit(d.F[on][:, mask[m]], d.y[on], sample_weight=W[m][on])
            ref = np.zeros(d.F.shape[1])
            ref[mask[m]] = lr.coef_.ravel()
            np.testing.assert_allclose(B[m, 1:], ref, atol=1e-6)
            assert B[m, 0] == pytest.approx(lr.intercept_[0], abs=1e-6)


def test_pair_stats_give_admissibility_phi(small):
    t = small.table
    phi = admissibility.as_matrix(
        admissibility.phi_from_stats(admissibility.pair_stats(t.gold, t.votes).sum(0)), len(t.members)
    )
    np.testing.assert_allclose(phi, admissibility.phi_matrix(t.gold, t.votes), atol=1e-12)
    assert np.array_equal(admissibility.pair_sums(t.gold, t.votes), admissibility.pair_stats(t.gold, t.votes).sum(0))
    # integer weights = repeated rows
    w = np.random.default_rng(1).integers(0, 3, len(t.gold))
    rep = np.repeat(np.arange(len(t.gold)), w)
    phi_w = admissibility.phi_from_stats(
        np.tensordot(w.astype(float), admissibility.pair_stats(t.gold, t.votes), axes=1)
    )
    np.testing.assert_allclose(
        admissibility.as_matrix(phi_w, len(t.members)), admissibility.phi_matrix(t.gold[rep], t.votes[rep]), atol=1e-12
    )


def test_kappas_match_engine(small):
    from src.core.evaluate import kappa

    P = np.vstack([small.stacked, small.best_cv, small.table.votes.T])
    np.testing.assert_allclose(common.kappas(small.gold, P), [kappa(small.gold, p) for p in P], atol=1e-12)


def test_draw_clusters_whole_and_within_pool():
    rng = np.random.default_rng(0)
    sel = common.draw_clusters(30, 7, 50, rng, pool=np.arange(10, 30))
    assert np.all(sel.sum(1) == 7) and np.all(sel[:, :10] == 0)


def test_smallest_is_the_argsort_set_ties_included():
    rng = np.random.default_rng(5)
    r = rng.random((40, 30))
    r[3, [4, 9]] = r[3, np.argsort(r[3])[6]]  # a tie across the boundary of size 7 in row 3
    for size in (0, 1, 7, 29, 30):
        want = np.sort(np.argsort(r, axis=1)[:, :size], axis=1)
        assert np.array_equal(np.sort(common.smallest(r, size), axis=1), want)


def test_identical_problems_are_fitted_once_with_the_same_coefficients(small):
    d = small.design
    rng = np.random.default_rng(2)
    W = (rng.random((6, len(d.y))) < 0.5).astype(float)
    mask = np.ones((6, d.F.shape[1]), bool)
    mask[5, 0] = False
    B = common.fit_logit_many(d.F, d.y, W, mask)
    dup = [0, 1, 0, 2, 5, 1, 3, 4, 5, 0]
    first, back = common.unique_rows(W[dup], mask[dup])
    assert sorted(first.tolist()) == [0, 1, 3, 4, 6, 7] and np.array_equal(np.asarray(dup)[first][back], dup)
    assert np.array_equal(common.fit_logit_many(d.F, d.y, W[dup], mask[dup]), B[dup])  # bit for bit
    many = np.random.default_rng(4).integers(0, 6, 300)  # repeats at every position of a long batch
    first, back = common.unique_rows(W[many], mask[many])
    assert len(first) == len(np.unique(many)) and np.array_equal(many[first][back], many)


def test_masked_fits_merge_patterns_to_the_same_optimum(small):
    d = small.design
    rng = np.random.default_rng(3)
    W = (rng.random((8, len(d.y))) < 0.7).astype(float)
    mask = rng.random((8, d.F.shape[1])) < 0.5
    mask[0] = True  # an unmasked problem: its entries are left as they are
    merged = common.fit_logit_many(d.F, d.y, W, mask, patterns=d.patterns)
    plain = common.fit_logit_many(d.F, d.y, W, mask, merge=False)
    assert np.array_equal(merged[0], plain[0]) and np.all(merged[:, 1:][~mask] == 0)
    np.testing.assert_allclose(merged, plain, rtol=0, atol=1e-10)


def test_a_fold_near_the_threshold_is_refitted_unmerged(small, monkeypatch):
    d = small.design
    subsets = mechanism.draw_subpanels(len(small.table.members), 6, 3, np.random.default_rng(0))
    masks = common.member_masks(d, subsets)
    fast = common.oof_many(d, mask=masks)
    merges = []
    real = common.fit_logit_many
    monkeypatch.setattr(common, "fit_logit_many", lambda *a, **k: merges.append(k.get("merge", True)) or real(*a, **k))
    monkeypatch.setattr(common, "NEAR_THRESHOLD", 1.0)  # every fold counts as near: all refitted unmerged
    assert np.array_equal(common.oof_many(d, mask=masks), fast)
    assert merges == [True, False] * len(d.folds)


def test_each_dataset_bootstrap_is_drawn_once_and_shared(small):
    from src.core.evaluate import ClusterBootstrap

    small.boots.clear()
    long = small.bootstrap(300, 0)
    assert small.bootstrap(120, 0).weights.base is long.weights.base  # a view of the same draws
    assert np.array_equal(small.bootstrap(120, 0).weights, ClusterBootstrap(small.table.clusters, 120, 0).weights)
    assert small.bootstrap(500, 0).n_boot == 500 and small.boots[0].n_boot == 500
    small.boots.clear()


# ------------------------------------------------------------------------------- vectorised == the loops


def test_vectorised_equals_loops(small):
    a = budget.regime_recovery(small, [10, 25, 50], 25, np.random.default_rng(1), 0.3, 0.5, 0.4)
    b = loops.regime_recovery(small, [10, 25, 50], 25, np.random.default_rng(1), 0.3, 0.5, 0.4)
    assert {k: v and v["p_match"] for k, v in a["budgets"].items()} == b
    a = budget.learning_curve(small, [10, 25, 50], 4, np.random.default_rng(2))
    b = loops.learning_curve(small, StackedLogit(), [], [10, 25, 50], 4, np.random.default_rng(2))
    for k, v in b.items():
        assert a["budgets"][k]["mean"] == pytest.approx(v, abs=1e-12)
    a = panel.leave_one_out(small, 50, 0, 0.95)
    for m, v in loops.leave_one_out(small, StackedLogit(), 50, 0, 0.95).items():
        assert a["members"][m]["estimate"] == pytest.approx(v["estimate"], abs=1e-12)
        assert a["members"][m]["ci"] == pytest.approx(v["ci"], abs=1e-12)
    subs = mechanism.draw_subpanels(6, 8, 3, np.random.default_rng(0))
    a = mechanism.subpanels(small, subs, 50, 0, 0.95)
    b = loops.subpanels(small, StackedLogit(), subs, 50, 0, 0.95)
    np.testing.assert_allclose(a["stacked"], b["stacked"], atol=1e-12)
    np.testing.assert_allclose(a["best_cv"], b["best_cv"], atol=1e-12)
    np.testing.assert_allclose(a["delta_ci"][:, 0], b["delta_lo"], atol=1e-12)


# ------------------------------------------------------------------------------------ known answers


def test_dominant_member_panel(dominant):
    """One dominant member: not admissible, the stacker recovers that member, and it is load-bearing."""
    t = dominant.table
    assert not dominant.admissibility.admissible
    k_dom = dominant.member_kappa[0]
    from src.core.evaluate import kappa

    assert kappa(dominant.gold, dominant.stacked) == pytest.approx(k_dom, abs=0.05)
    beta = StackedLogit().set_params(n_votes=len(t.members)).fit(t.votes, t.gold).coef_
    assert int(np.argmax(beta)) == 0
    loo = panel.leave_one_out(dominant, 200, 0, 0.95)
    assert loo["most_load_bearing"] == t.members[0] and loo["members"][t.members[0]]["load_bearing"]
    assert loo["members"][t.members[0]]["estimate"] < -0.1
    size = panel.size_curve(dominant)
    assert size["order"][0] == t.members[0] and size["stacked"][0] == pytest.approx(k_dom, abs=0.05)
    reg = budget.regime_recovery(dominant, [10, 50, 200], 60, np.random.default_rng(0), 0.3, 0.5, 0.4)
    assert reg["budgets"]["200"] is None  # 200 clusters: the whole sample
    assert reg["budgets"]["50"]["p_match"] >= 0.9
    assert reg["budgets"]["50"]["p_best_member"] >= 0.95


def test_budget_recovery_grows_to_one_on_clear_cut_panel(spread):
    assert spread.admissibility.admissible
    reg = budget.regime_recovery(spread, [10, 25, 50, 100, 150], 100, np.random.default_rng(0), 0.3, 0.5, 0.4)
    p = [reg["budgets"][b]["p_match"] for b in ("10", "25", "50", "100", "150")]
    assert p[-1] == 1.0 and p[0] <= p[-1] and all(b >= a - 0.05 for a, b in zip(p, p[1:]))
    cur = budget.learning_curve(spread, [10, 25, 50, 100, 160], 8, np.random.default_rng(0))
    means = [cur["budgets"][b]["mean"] for b in ("10", "25", "50", "100", "160")]
    assert cur["train_records"] == 160 and cur["budgets"]["160"]["sd"] == 0.0
    assert means[-1] == pytest.approx(cur["full"], abs=1e-9)  # all training records = the full stacker
    assert means[0] < means[-1] and means[-1] > cur["best_cv"]


def test_recovery_table_on_known_panels(dominant, spread, small):
    """Recovery needs other members to be right: it rises with them; the dominant panel never recovers its
    leader's errors (the stacker *is* the leader there), so fixed effects leave it out."""
    rec = mechanism.recovery({"dominant": dominant, "spread": spread, "small": small})
    rows = {r["members_correct"]: r for r in rec["by_members_correct"]}
    assert rows[0]["n"] == 0 or rows[0]["p_recovers"] <= 0.05  # no member right: nothing to recover from
    assert rec["pointbiserial"]["r"] > 0.2
    fe = rec["logit_fe"]
    assert fe["coef"] > 0 and fe["p"] < 0.01
    assert rec["per_dataset"]["dominant"]["p_recovers"] < 0.1
    assert rec["n_items"] == sum(r["n"] for r in rec["by_members_correct"])


def test_fixed_effects_logit_recovers_a_known_slope():
    rng = np.random.default_rng(0)
    n = 6000
    ds = rng.choice(["a", "b", "c"], n)
    share = rng.random(n)
    alpha = pd.Series({"a": -3.0, "b": -2.0, "c": -1.0})[ds].to_numpy()
    y = rng.random(n) < 1 / (1 + np.exp(-(alpha + 4.67 * share)))
    df = pd.DataFrame({"dataset": ds, "share_correct": share, "recovered": y.astype(int), "members_correct": 0})
    fe = mechanism.fixed_effects_logit(df)
    assert fe["ci"][0] < 4.67 < fe["ci"][1]
    assert sorted(fe["datasets"]) == ["a", "b", "c"] and fe["dropped"] == []


def test_cross_dataset_spearman_known_order():
    def stub(pb, gap, n_ok):
        y = np.array([0, 1] * 50)
        best = y.astype(float).copy()
        best[:10] = 1 - y[:10]
        stacked = best.copy()
        k = int(round(gap * 100))  # fix k wrong verdicts of the best single on the stacked side
        stacked[: min(k, 10)] = y[: min(k, 10)]
        return SimpleNamespace(
            admissibility=SimpleNamespace(phi_bar=pb),
            member_kappa=np.r_[[0.5] * n_ok, [0.1] * 2],
            gold=y,
            stacked=stacked,
            best_cv=best,
        )

    refs = {"a": stub(0.1, 0.08, 6), "b": stub(0.3, 0.05, 4), "c": stub(0.5, 0.02, 2), "d": stub(0.7, 0.0, 1)}
    out = mechanism.cross_dataset(refs, 0.3, held_back=["d", "zzz"])
    assert out["rows"][0]["phi_bar"]["rho"] == pytest.approx(-1.0)
    assert out["rows"][0]["members_at_kappa0"]["rho"] == pytest.approx(1.0)
    assert [r["subset"] for r in out["rows"]] == ["all", "without d"]


def test_subpanels_rule_matches_decide(small):
    subs = mechanism.draw_subpanels(6, 200, 3, np.random.default_rng(0))
    assert len(subs) == 1 + 20 + 15 + 6 and subs[0].all()  # every proper sub-panel of ≥3, full first
    assert len({tuple(s) for s in subs}) == len(subs)
    sp = mechanism.subpanels(small, subs[:15], 50, 0, 0.95)
    calls = mechanism._admits(sp, 0.3, 0.5, 0.4)
    for s, call in zip(subs[:15], calls):
        cols = np.flatnonzero(s)
        a = admissibility.test(small.gold, small.table.votes[:, cols], 0.3, 0.5, 0.4)
        assert call == a.admissible
    big = mechanism.draw_subpanels(12, 50, 3, np.random.default_rng(0))
    assert len(big) == 51 and big.sum(1).min() >= 3


def test_suite_document(multi_doc):
    doc = json.loads(json.dumps(multi_doc))  # JSON-clean
    assert set(doc["datasets"]) == {"spread", "dominant", "correlated"}
    op = doc["appendix_c"]["operating"]
    assert op["admitted_full"] == ["spread"]
    assert op["admitted"]["share_above_best"] >= op["rejected"]["share_above_best"]
    assert doc["appendix_c"]["n_panels"] == 3 * 13
    inv = doc["appendix_c"]["invariance"]
    i = inv["c"].index(0.5)
    j = int(np.argmin(np.abs(np.array(inv["phi0"]) - 0.4)))
    assert inv["same"][i][j]
    assert doc["datasets"]["dominant"]["leave_one_out"]["most_load_bearing"] == "m00"
    assert set(doc["transfer"]) == {"spread", "dominant", "correlated"}
    assert doc["transfer"]["dominant"]["trained_on"] == ["spread", "correlated"]
    assert doc["cross_dataset"]["rows"][0]["n"] == 3
    lf = doc["datasets"]["dominant"]["label_free"]["majority_minus_best_cv"]
    assert lf["ci"][1] < 0  # the weak majority clearly loses to the dominant member
    assert doc["cost"]["paper"]["panel_per_1k"] == pytest.approx(0.039, abs=5e-4)


# ------------------------------------------------------------------------------------------------ cost


def test_cost_reproduces_the_paper():
    c = OmegaConf.to_container(OmegaConf.load("conf/suite/default.yaml").cost)
    p = cost.paper(c)
    assert round(p["panel_per_1k"], 3) == 0.039
    assert round(p["frontier"]["per_1k"], 2) == 2.52
    assert 64 <= p["ratio"] < 65 and round(100 * p["panel_share_of_frontier"], 2) == 1.55
    be = p["calibration"]["all"]["records"]
    assert be["50"]["cost"] == 100 and be["100"]["cost"] == 200
    assert 40_000 <= be["50"]["break_even_items"] <= 41_000 and 80_000 <= be["100"]["break_even_items"] <= 81_000


def test_cost_uses_measured_throughput_and_tokens(tmp_path):
    c = OmegaConf.to_container(OmegaConf.load("conf/suite/default.yaml").cost)
    for name, recs in {
        "qwen": [{"key": "a", "vote": 1, "seconds": 0.5}, {"key": "b", "vote": 0, "seconds": 1.5}],
        "sonnet": [{"key": "c", "vote": None, "n_prompt_tokens": 1000}],
    }.items():
        (tmp_path / "d" / name).mkdir(parents=True)  # the cache's folder of dataset d
        # a bad line (not a verdict record) is skipped, never read as seconds
        (tmp_path / "d" / name / "x.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in recs) + '42\n{"seconds": 9}\n'
        )
    meas = cost.measured_from_cache(tmp_path, ["qwen", "llama", "sonnet"])
    assert meas["qwen"]["seconds_per_item"] == 1.0 and "llama" not in meas
    out = cost.compute(c, ["qwen", "llama"], {"d": 1.5}, meas, "sonnet")
    assert out["members"]["qwen"]["source"] == "measured"
    assert out["members"]["qwen"]["per_1k"] == pytest.approx(2.0 / 3.6)  # $2/h × 1 s/item × 1000 items
    assert out["members"]["llama"]["source"] == "config"
    assert out["frontier"]["per_1k"] == pytest.approx(1000 * (1000 * 3 + 10 * 15) / 1e6)
    assert cost.break_even(100, 3.0, 2.0) is None
