"""Noisy calibration labels (the noisy-label study beyond the paper; TRIVIA+'s label types): the injectors, TRIVIA+'s own columns, the robust stacker, the study and
its entry point, on panels whose answer is known."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from scipy.stats import spearmanr

from src.core import verdicts
from src.core.aggregate import BestSingle, NoiseRobustStackedLogit, StackedLogit, cluster_folds, crossfit
from src.core.evaluate import kappa
from src.core.ladderbase import LadderSettings
from src.studies import noise, simulate

ROOT = Path(__file__).resolve().parents[1]
ACC = [0.78, 0.76, 0.74, 0.72, 0.70, 0.70]


def _sim(n_clusters=300, seed=0, frontier=0.8, acc=ACC, rho=0.15):
    return verdicts.validate(
        simulate.panel(n_clusters, 2, acc, rho=rho, abstain_rate=0.02, seed=seed, frontier_accuracy=frontier),
        frontier="frontier",
    )


@pytest.fixture(scope="module")
def sim():
    return _sim()


# ------------------------------------------------------------------------------------------------ injectors


@pytest.mark.parametrize("rate", [0.05, 0.15, 0.25])
def test_every_injector_flips_exactly_its_rate_and_is_seeded(sim, rate):
    y, v = sim.gold, sim.votes
    for kind in ("rf", "dw", "dl", "ws"):
        a = noise.inject(kind, y, v, sim.frontier, rate, np.random.default_rng(3))
        b = noise.inject(kind, y, v, sim.frontier, rate, np.random.default_rng(3))
        assert np.array_equal(a, b) and set(np.unique(a)) <= {0, 1}
        cap = np.sum(sim.frontier != y) if kind == "ws" else len(y)  # WS: at most the judge's own errors (~19 %)
        assert np.sum(a != y) == min(round(rate * len(y)), cap), kind
    assert not np.array_equal(
        noise.random_flip(y, 0.15, np.random.default_rng(1)), noise.random_flip(y, 0.15, np.random.default_rng(2))
    )


def test_ws_flips_only_where_the_judge_is_wrong_and_is_capped_at_its_error_rate(sim):
    y, judge = sim.gold, sim.frontier
    noisy = noise.weak_supervision(y, judge, 0.15, np.random.default_rng(0))
    flipped = noisy != y
    assert np.all(judge[flipped] != y[flipped])  # (no abstention in the simulated frontier column)
    err = np.mean(judge != y)
    capped = noise.weak_supervision(y, judge, 0.45, np.random.default_rng(0))
    assert np.mean(capped != y) == pytest.approx(err) and np.array_equal(capped, judge.astype(int))


def test_rf_is_sample_independent_dl_follows_disagreement(sim):
    """Over many draws: RF's flip frequency does not depend on member disagreement; DL's rises with it."""
    y, v = sim.gold, sim.votes
    d = noise.disagreement(v)
    rng = np.random.default_rng(0)
    freq = {k: np.mean([noise.inject(k, y, v, None, 0.15, rng) != y for _ in range(200)], axis=0) for k in ("rf", "dl")}
    low, high = d <= np.quantile(d, 0.33), d >= np.quantile(d, 0.67)
    assert abs(freq["rf"][high].mean() - freq["rf"][low].mean()) < 0.02
    assert freq["dl"][high].mean() > 3 * freq["dl"][low].mean()
    assert spearmanr(d, freq["dl"])[0] > 0.5 and abs(spearmanr(d, freq["rf"])[0]) < 0.15
    # the two classes are hit alike by DL (no annotator bias)
    assert abs(freq["dl"][y == 1].mean() - freq["dl"][y == 0].mean()) < 0.03


def test_dw_is_class_asymmetric_and_follows_hardness(sim):
    y, v = sim.gold, sim.votes
    h = noise.hardness(y, v)
    rng = np.random.default_rng(1)
    draws = [noise.dissenting_worker(y, v, 0.15, rng, bias=0.8) for _ in range(200)]
    flips = np.array([n != y for n in draws])
    share_hidden = np.mean([np.sum(f & (y == 1)) / f.sum() for f in flips])
    assert share_hidden == pytest.approx(0.8, abs=0.005)  # 80 % of the flips hide a hallucination
    freq = flips.mean(axis=0)
    for c in (0, 1):  # within each class the flip probability rises with the share of members wrong
        m = y == c
        assert spearmanr(h[m], freq[m])[0] > 0.5
        assert freq[m & (h >= 0.5)].mean() > 3 * freq[m & (h == 0)].mean()


def test_features_and_bad_settings():
    v = np.array([[1, 1, 1, 1], [1, 0, 1, 0], [0.5, 0.5, 0.5, 0.5], [1, 1, 0, 0.5]])
    assert noise.disagreement(v) == pytest.approx([0, 1, 1, 2 / 3])
    assert noise.hardness(np.array([1, 1, 0, 0]), v) == pytest.approx([0, 0.5, 0.5, 2 / 3])
    with pytest.raises(noise.NoiseError, match=r"rate 0\.6"):
        noise.random_flip(np.zeros(10, int), 0.6)
    with pytest.raises(noise.NoiseError, match="'xx'"):
        noise.inject("xx", np.zeros(10, int), v, None, 0.1, np.random.default_rng(0))
    with pytest.raises(noise.NoiseError, match="noise.rates"):
        noise.settings_from({"types": ["rf"], "rates": [0.1, 0.7], "draws": 1, "n_boot": 10})
    with pytest.raises(noise.NoiseError, match="noise.draws"):
        noise.settings_from({"types": ["rf"], "rates": [0.1], "draws": 0, "n_boot": 10})
    # a headline rate the study does not run would leave every headline silently empty
    with pytest.raises(noise.NoiseError, match=r"noise\.default_rate=0\.15: must be one of noise\.rates \[0\.1\]"):
        noise.settings_from({"types": ["rf"], "rates": [0.1], "draws": 1, "n_boot": 10, "default_rate": 0.15})


# ------------------------------------------------------------------------------------- TRIVIA+'s own columns


def _trivia_fixture(tmp_path: Path, bad: bool = False) -> tuple[verdicts.VerdictTable, Path]:
    """A small TRIVIA+-like dataset file (the builder's noisy columns) and a verdict table of its items."""
    df = simulate.panel(30, 2, ACC, rho=0.15, dataset="triviaplus", seed=5)
    rng = np.random.default_rng(0)
    cols = {f"noisy_{k}": np.where(rng.random(len(df)) < 0.15, 1 - df.gold, df.gold) for k in noise.TYPES}
    items = pd.DataFrame(
        {
            "item_id": df.item_id,
            "cluster_id": df.cluster_id,
            "dataset": "triviaplus",
            "frame": "def_on",
            "question": "q",
            "evidence": "e",
            "candidate": "c",
            "gold": df.gold,
            **cols,
        }
    )
    if bad:
        items.loc[7, "noisy_dw"] = None
    path = tmp_path / "datasets"
    path.mkdir()
    items.to_json(path / "triviaplus.jsonl", orient="records", lines=True)
    return verdicts.validate(df), path


def test_native_trivia_columns_replace_injection(tmp_path):
    table, ddir = _trivia_fixture(tmp_path)
    same, native = noise.native_labels(table, ddir)
    assert same.members == table.members and set(native["triviaplus"]) == set(noise.TYPES)
    truth = pd.read_json(ddir / "triviaplus.jsonl", lines=True).set_index("item_id")
    assert np.array_equal(native["triviaplus"]["dw"], truth.loc[table.items.item_id, "noisy_dw"].to_numpy())
    # a bring-your-own table with the columns: taken out of the panel, used as the noisy labels
    frame = table.to_frame().assign(noisy_rf=truth.loc[table.items.item_id, "noisy_rf"].to_numpy())
    byo, native2 = noise.native_labels(verdicts.validate(frame), None)
    assert byo.members == table.members and np.array_equal(native2["triviaplus"]["rf"], native["triviaplus"]["rf"])
    # the study uses them at their own rate, once, instead of injected draws
    s = noise.settings_from(
        {"types": ["rf", "dw"], "rates": [0, 0.1], "draws": 2, "n_boot": 50, "seed": 0, "dw": {}, "dl": {}}
    )
    doc = noise.study_dataset(
        "triviaplus", table, {"logreg": StackedLogit()}, s, LadderSettings(), {"rf": native["triviaplus"]["rf"]}
    )
    assert doc["source"] == {"rf": "native", "dw": "injected"}
    rf = [p for p in doc["points"] if p["type"] == "rf"]
    assert len(rf) == 1 and rf[0]["rate"] == "native" and rf[0]["draws"] == 1
    assert rf[0]["realised_rate"] == pytest.approx(np.mean(native["triviaplus"]["rf"] != table.gold))


def test_a_bad_native_cell_names_the_item_and_the_field(tmp_path):
    table, ddir = _trivia_fixture(tmp_path, bad=True)
    with pytest.raises(noise.NoiseError, match=r"triviaplus\.jsonl: item_id='triviaplus-000007': field 'noisy_dw'"):
        noise.native_labels(table, ddir)


# ------------------------------------------------------------------------------------------ robust stacker


def _class_conditional(y, rho1, rng):
    """A share ``rho1`` of the hallucinated items labelled supported (uniform within the class)."""
    out = y.copy()
    pos = np.flatnonzero(y == 1)
    out[rng.choice(pos, round(rho1 * len(pos)), replace=False)] = 0
    return out


def test_robust_stacker_recovers_the_clean_kappa_under_class_conditional_noise():
    t = _sim(300, seed=4)
    y, X = t.gold, t.votes
    folds = cluster_folds(y, t.clusters, 5, 0)
    clean = kappa(y, crossfit(StackedLogit(), X, y, folds).pred)
    rng = np.random.default_rng(0)
    plain, robust, rates = [], [], []
    for _ in range(3):
        yn = _class_conditional(y, 0.35, rng)
        plain.append(kappa(y, crossfit(StackedLogit(), X, yn, folds).pred))
        cf = crossfit(NoiseRobustStackedLogit(), X, yn, folds)
        robust.append(kappa(y, cf.pred))
        rates += [e.flip_rates_ for e in cf.estimators]
    lost, kept = clean - np.mean(plain), np.mean(robust) - np.mean(plain)
    assert lost > 0.1  # the plain stacker loses a lot …
    assert kept > 0.6 * lost  # … the robust one recovers most of it
    assert np.mean(rates, axis=0) == pytest.approx([0.0, 0.35], abs=0.06)  # Dawid–Skene finds the flip rates
    # with the true rates given, the same recovery
    known = kappa(y, crossfit(NoiseRobustStackedLogit(flip_rates=(0.0, 0.35)), X, yn, folds).pred)
    assert known > np.mean(plain) + 0.6 * lost


def test_robust_stacker_records_the_clean_prevalence_its_posteriors_assume():
    """Served with a `prevalence` setting, a stacker's posteriors are shifted from its training prevalence
    (src.studies.prevalence.adjust): for the robust stacker that is the clean labels' prevalence, not the noisy share."""
    t = _sim(300, seed=4)
    y = _class_conditional(t.gold, 0.35, np.random.default_rng(0))  # 35 % of hallucinations labelled supported
    est = NoiseRobustStackedLogit(flip_rates=(0.0, 0.35)).fit(t.votes, y)
    assert y.mean() == pytest.approx(0.5 * 0.65, abs=0.03)  # the noisy share is far from the truth …
    assert est.train_prevalence_ == pytest.approx(y.mean() / 0.65)  # … the implied clean share is the truth's
    assert est.train_prevalence_ == pytest.approx(t.gold.mean(), abs=0.03)
    assert NoiseRobustStackedLogit(flip_rates=(0, 0)).fit(t.votes, y).train_prevalence_ == y.mean()


def test_robust_stacker_is_the_plain_one_at_zero_rates_and_sklearn_style():
    t = _sim(100, seed=2)
    plain = StackedLogit().fit(t.votes, t.gold)
    r = NoiseRobustStackedLogit(flip_rates=(0, 0)).fit(t.votes, t.gold)
    assert r.coef_ == pytest.approx(plain.coef_) and r.intercept_ == pytest.approx(plain.intercept_)
    est = NoiseRobustStackedLogit(flip_rates=[0.1, 0.2])
    assert est.get_params()["flip_rates"] == [0.1, 0.2] and not hasattr(est, "flip_rates_")
    est.fit(t.votes, t.gold)
    p = est.predict_proba(t.votes)[:, 1]
    assert np.allclose(p, 1 / (1 + np.exp(-(est.intercept_ + t.votes @ est.coef_))))
    with pytest.raises(ValueError, match="flip_rates"):
        NoiseRobustStackedLogit(flip_rates=(-0.1, 0.2)).fit(t.votes, t.gold)


def test_logreg_robust_is_a_stacker_option(compose_cfg):
    cfg = compose_cfg("stacker=logreg_robust")
    est = instantiate(cfg.stacker, _convert_="all")
    assert isinstance(est, NoiseRobustStackedLogit) and est.C == 1.0 and est.abstention == "scalar"
    assert instantiate(noise.stacker_option("logreg_robust"), _convert_="all").get_params() == est.get_params()


# -------------------------------------------------------------------------------------------------- study


@pytest.fixture(scope="module")
def sim_doc():
    s = noise.settings_from(
        {
            "types": list(noise.TYPES),
            "rates": [0, 0.15, 0.25],
            "draws": 2,
            "n_boot": 200,
            "seed": 0,
            "default_rate": 0.15,
            "dw": {"bias": 1.0},
            "dl": {},
            "native": True,
            "simulation": {"enabled": False},
        }
    )
    stackers = {"logreg": StackedLogit(), "logreg_robust": NoiseRobustStackedLogit()}
    return noise.study_dataset("sim", _sim(200, seed=0), stackers, s, LadderSettings()), s


def test_study_on_the_admissible_simulation(sim_doc):
    doc, s = sim_doc
    c = doc["clean"]
    assert c["admissible"] and c["call"] in ("win", "clean win")  # something to lose
    assert doc["ws_judge"]["name"] == "frontier" and not doc["ws_judge"]["member"]
    pts = {(p["type"], p["rate"]): p for p in doc["points"]}
    assert set(pts) == {(k, r) for k in noise.TYPES for r in (0.15, 0.25)}
    for p in pts.values():
        assert p["draws"] == 2 and set(p["train"]["call_same"]) == {"logreg", "logreg_robust"}
        d = p["train"]["logreg"]["delta_vs_clean"]
        assert d["ci"][0] <= d["estimate"] <= d["ci"][1]
        # a noisy test label can only make the clean-trained panel look worse than it is here
        assert p["measure"]["bias"]["logreg"] < 0
    dw = pts[("dw", 0.25)]["train"]
    assert dw["logreg"]["delta_vs_clean"]["ci"][1] < 0  # one-sided annotator: a clear loss for the plain stacker
    assert dw["logreg_robust"]["kappa"] > dw["logreg"]["kappa"] + 0.03  # the robust stacker takes much of it back
    assert set(dw["calls"]["logreg"]) <= {"win", "clean win", "tie", "clear worsening"}
    head = noise.headline(doc, 0.15)
    assert set(head) == set(noise.TYPES) and head["dw"]["rate"] == 0.15


def test_cpu_tables_ws_judge_is_a_member():
    t = _sim(60, seed=1, frontier=None)
    j = noise.ws_judge(t, 0.5)
    assert j["member"] and j["name"] in t.members


def test_ws_judge_is_chosen_without_gold():
    """A user with weak labels only cannot pick their label source on clean gold: the pick reads no gold (the
    same member whatever the gold), and on a panel with one strong member it is that member."""
    t = _sim(150, seed=2, frontier=None)
    picks = {noise.ws_judge(t, 0.5)["name"]}
    for seed in range(3):
        shuffled = t.subset(np.ones(len(t.gold), bool), list(t.members))
        shuffled.items["gold"] = np.random.default_rng(seed).permutation(t.gold)
        picks.add(noise.ws_judge(shuffled, 0.5)["name"])
    assert len(picks) == 1
    strong = verdicts.validate(simulate.panel(150, 2, [0.9, 0.65, 0.62, 0.6, 0.58], 0.2, seed=4))
    assert noise.ws_judge(strong, 0.5)["name"] == "m00"


def test_noisy_fits_are_cross_fitted_on_folds_stratified_on_the_noisy_labels():
    """The folds a user with noisy labels can build: stratified on those labels, not on clean gold."""
    t = _sim(100, seed=3, frontier=None)
    s = LadderSettings()
    yn = noise.random_flip(t.gold, 0.25, np.random.default_rng(1))
    own = noise._fits(t.votes, t.votes, yn, t.clusters, {"logreg": StackedLogit(n_votes=len(t.members))}, s)
    folds = cluster_folds(yn, t.clusters, 5, 0)
    assert np.array_equal(own["logreg"], crossfit(StackedLogit(), t.votes, yn, folds).pred)
    assert np.array_equal(own["best_cv"], crossfit(BestSingle(), t.votes, yn, folds).pred)
    gold_folds = cluster_folds(t.gold, t.clusters, 5, 0)
    assert any(not np.array_equal(a[1], b[1]) for a, b in zip(folds, gold_folds))  # the two splits differ here


@pytest.mark.slow
def test_entry_point_writes_json_figure_and_mlflow_run(tmp_path):
    out, fig = tmp_path / "noise.json", tmp_path / "noise.png"
    env = dict(os.environ, RAIM_HYDRA_DIR=str(tmp_path / "hydra"), MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/m.db")
    cmd = [
        sys.executable,
        "-m",
        "src.noise",
        "dataset=wice",
        "judge.missing=skip",
        f"noise.output={out}",
        f"noise.figure={fig}",
        "noise.draws=1",
        "noise.n_boot=50",
        "noise.rates=[0,0.15]",
        "noise.simulation.n_clusters=80",
    ]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert list(doc["datasets"]) == ["wice"] and doc["simulation"]["check"]["stacker_wins_with_clean_labels"]
    assert doc["datasets"]["wice"]["ws_judge"]["member"]  # the cpu roster has no frontier: WS is a member
    assert fig.stat().st_size > 10_000 and "Noisy calibration labels" in r.stdout
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    runs = mlflow.search_runs(experiment_names=["raim"], filter_string="tags.kind = 'noise'")
    assert len(runs) == 1 and "metrics.noise/wice/rf/15pct/kappa_logreg" in runs.columns
    assert "metrics.noise/wice/dw/15pct/call_same_logreg_robust" in runs.columns
    bad = subprocess.run(
        cmd[:4] + ["noise.rates=[0,0.7]"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 2 and "noise.rates" in bad.stderr + bad.stdout


def test_the_robust_stacker_is_logged_and_served_like_the_plain_one(tmp_path, monkeypatch, sim):
    """`stacker=logreg_robust` runs are logged with their stacker as a pyfunc model
    (src.mlops.packaging.log_stacker): it must load, predict its own input example and give the robust stacker's
    probabilities."""
    import mlflow

    from src.mlops import packaging

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'm.db'}")
    X, y, cols = sim.votes, sim.gold, list(sim.members)
    st = NoiseRobustStackedLogit(flip_rates=(0.1, 0.2)).fit(X, y)
    with mlflow.start_run():
        info = packaging.log_stacker(st, cols, pd.DataFrame(X[:5], columns=cols))
    assert packaging.self_check(info.model_uri) is None
    out = mlflow.pyfunc.load_model(info.model_uri).predict(pd.DataFrame(X[:20], columns=cols))
    assert out["p_hallucinated"].to_numpy(float) == pytest.approx(st.predict_proba(X[:20])[:, 1])
