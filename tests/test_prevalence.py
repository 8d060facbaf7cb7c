"""Prior-shift correction and label-free prevalence estimate (src/studies/prevalence.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import brentq, minimize_scalar
from scipy.special import expit, logit
from sklearn.metrics import balanced_accuracy_score, brier_score_loss, f1_score

from src.core import priorshift
from src.core.aggregate import StackedLogit
from src.core.priorshift import PrevalenceError, adjust, estimate
from src.studies import prevalence

ROOT = Path(__file__).resolve().parents[1]


def calibrated_posteriors(prev: float, n: int, train: float = 0.5, mu: float = 1.0, seed: int = 0):
    """Scores N(±μ, 1) by class; the exact posterior of a model calibrated at prior ``train`` (LR = e^{2μs})."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < prev).astype(int)
    s = rng.normal(np.where(y == 1, mu, -mu), 1.0)
    return y, expit(logit(train) + 2 * mu * s)


# ------------------------------------------------------------------------------------------------ adjust


def test_adjust_is_bayes_rule_eq_2_4():
    p = np.array([0.0, 0.2, 0.5, 0.9, 1.0])
    got = adjust(p, 0.5, 0.1)
    w1, w0 = 0.1 / 0.5, 0.9 / 0.5
    assert np.allclose(got, w1 * p / (w1 * p + w0 * (1 - p)))
    assert got[0] == 0 and got[-1] == 1 and np.isclose(got[2], 0.1)  # p = train prior → the new prior
    assert np.allclose(logit(got[1:-1]), logit(p[1:-1]) + logit(0.1) - logit(0.5))  # a log-odds shift
    assert np.allclose(adjust(p, 0.3, 0.3), p)  # same prior: unchanged
    assert np.allclose(adjust(adjust(p, 0.5, 0.1), 0.1, 0.5), p)  # and back


def test_adjust_recovers_the_posterior_at_the_new_prior():
    """A model calibrated at 0.5, adjusted to 0.1, equals the exact posterior of the model calibrated at 0.1."""
    s = np.linspace(-3, 3, 13)
    assert np.allclose(adjust(expit(2 * s), 0.5, 0.1), expit(logit(0.1) + 2 * s))


@pytest.mark.parametrize(
    "args, msg",
    [
        (([0.2, 1.5], 0.5, 0.1), r"p\[1\]: 1.5 is not a probability"),
        (([0.2, np.nan], 0.5, 0.1), r"p\[1\]: nan"),
        (([0.2], 0.0, 0.1), r"train_prevalence: 0.0 is not a prevalence in \(0, 1\)"),
        (([0.2], 0.5, 1.0), r"prevalence: 1.0 is not a prevalence"),
        (([0.2], 0.5, "a"), r"prevalence: 'a' is not a number"),
        (([0.2], 0.5, True), r"prevalence: True"),
    ],
)
def test_adjust_refuses_bad_input(args, msg):
    with pytest.raises(PrevalenceError, match=msg):
        adjust(*args)


# ---------------------------------------------------------------------------------------------- estimate


def test_estimate_two_items_closed_form():
    """Two items with likelihood ratios a, b: the MLE of the mixing proportion solves
    (a−1)/(1+π(a−1)) + (b−1)/(1+π(b−1)) = 0, i.e. π = −(A+B)/(2AB) with A = a−1, B = b−1."""
    p, t = np.array([0.9, 0.2]), 0.5
    A, B = p / (1 - p) * (1 - t) / t - 1
    assert np.isclose(estimate(p, t, tol=1e-12), -(A + B) / (2 * A * B), atol=1e-8)


def test_estimate_is_the_maximum_likelihood_prior():
    """EM's fixed point maximises Σ log(π·r_i + 1 − π) (Saerens et al. 2002, §2.2), r_i the likelihood ratio."""
    y, p = calibrated_posteriors(0.2, 500, train=0.4, mu=0.8, seed=3)
    r = p / (1 - p) * 0.6 / 0.4
    ml = minimize_scalar(
        lambda q: -np.sum(np.log(q * r + 1 - q)), bounds=(1e-9, 1 - 1e-9), method="bounded", options={"xatol": 1e-10}
    ).x
    assert np.isclose(estimate(p, 0.4, tol=1e-12), ml, atol=1e-6)


@pytest.mark.parametrize("prev", [0.05, 0.1, 0.3])
def test_estimate_lands_near_the_true_prevalence(prev):
    y, p = calibrated_posteriors(prev, 20000, seed=int(prev * 100))
    got = estimate(p, 0.5)
    assert abs(got - prev) < 0.01 and abs(got - y.mean()) < 0.01
    assert abs(p.mean() - prev) > 0.05  # the naive mean posterior is far off: the estimate is not it


def test_estimate_boundary_and_vectorised_rows_agree():
    assert estimate([1.0, 1.0], 0.5) == 1.0 and estimate([0.0, 0.0], 0.5) == 0.0
    assert estimate([0.7] * 5, 0.5) > 0.999  # every posterior above the train prior: the MLE is π = 1
    rng = np.random.default_rng(0)
    P = rng.random((7, 50))
    rows = priorshift._ml_rows(P, 0.5, 1e-6, 1000)
    assert np.allclose(rows, [estimate(r, 0.5) for r in P], rtol=0, atol=0)


@pytest.mark.parametrize(
    "args, msg",
    [
        (([], 0.5), "empty"),
        (([0.3, -0.1], 0.5), r"p\[1\]"),
        (([0.3], 1.2), "train_prevalence"),
        (([0.3], 0.5, 0.0), "tol"),
        (([0.3], 0.5, 1e-6, 0), "max_iter"),
    ],
)
def test_estimate_refuses_bad_input(args, msg):
    with pytest.raises(PrevalenceError, match=msg):
        estimate(*args)


# ----------------------------------------------------------------------------------------------- serving


def test_served_correction_uses_the_stored_train_prevalence():
    X = np.array([[1, 1], [1, 0], [0, 0], [0, 1], [1, 1], [0, 0], [1, 1], [0, 0]], float)
    y = np.array([1, 1, 0, 1, 1, 0, 1, 0])
    st = StackedLogit().fit(X, y)
    assert st.train_prevalence_ == 0.625
    p = st.predict_proba(X)[:, 1]
    assert priorshift.served(p, st, None)[1] is None
    q, used = priorshift.served(p, st, "0.1")
    assert used == 0.1 and np.allclose(q, adjust(p, 0.625, 0.1))
    window = np.tile(p, 10)  # "estimate" needs a window of at least MIN_ESTIMATE_ROWS answered rows
    q, used = priorshift.served(window, st, "Estimate")
    assert np.isclose(used, estimate(window, 0.625)) and np.allclose(q, adjust(window, 0.625, used))
    with pytest.raises(PrevalenceError, match="needs at least 50 answered rows in the request, got 8"):
        priorshift.served(p, st, "estimate")
    with pytest.raises(PrevalenceError, match="parameter 'prevalence': 'often' is neither"):
        priorshift.served(p, st, "often")
    del st.train_prevalence_  # a stacker fitted before RAIM stored it
    with pytest.raises(PrevalenceError, match="log it again"):
        priorshift.served(p, st, 0.1)


# ----------------------------------------------------------------------------------------------- metrics


def test_metrics_match_scikit_learn_and_the_ece_definition():
    rng = np.random.default_rng(1)
    P = rng.random((3, 40))
    y = (np.arange(40) < 12).astype(int)
    m = prevalence.window_metrics(P, y, 0.5, 10)
    for i in range(3):
        assert np.isclose(m["brier"][i], brier_score_loss(y, P[i]))
        assert np.isclose(m["f1"][i], f1_score(y, P[i] >= 0.5))
        assert np.isclose(m["bacc"][i], balanced_accuracy_score(y, P[i] >= 0.5))
        b = np.minimum((P[i] * 10).astype(int), 9)
        want = sum(np.mean(b == k) * abs(y[b == k].mean() - P[i][b == k].mean()) for k in range(10) if np.any(b == k))
        assert np.isclose(m["ece"][i], want)
    calibrated = np.array([[0.25] * 4 + [0.75] * 4])
    assert prevalence.ece(calibrated, np.array([1, 0, 0, 0, 1, 1, 1, 0]), 2)[0] == 0.0
    assert np.isclose(prevalence.ece(calibrated, np.array([1, 1, 0, 0, 1, 1, 1, 1]), 2)[0], 0.5 * 0.25 + 0.5 * 0.25)


def test_windows_hold_the_prevalence_and_respect_the_bootstrap():
    y = np.tile([1, 0], 50)
    clusters = np.repeat(np.arange(50), 2)
    idx = prevalence.windows(y, clusters, 0.1, 40, n_boot=6, n_draws=3, seed=0)
    assert idx.shape == (6, 3, 40)
    assert (y[idx[..., :4]] == 1).all() and (y[idx[..., 4:]] == 0).all()
    from src.core.evaluate import ClusterBootstrap

    w = ClusterBootstrap(clusters, 6, 0).item_weights()
    for b in range(6):
        assert (w[b, idx[b].ravel()] > 0).all()  # only items of clusters this replicate drew
    with pytest.raises(PrevalenceError, match="at least one of each class"):
        prevalence.windows(y, clusters, 0.01, 40, 2, 2, 0)


# ---------------------------------------------------------------------------------------------- the study


@pytest.fixture(scope="module")
def sim_doc():
    """The study on a simulated admissible panel only (no real table), small settings."""
    from src.core.ladderbase import LadderSettings

    s = {
        "prevalences": [0.05, 0.2],
        "window": 200,
        "n_boot": 40,
        "n_draws": 5,
        "seed": 0,
        "level": 0.95,
        "ece_bins": 10,
        "tol": 1e-6,
        "max_iter": 1000,
        "simulations": [
            {
                "name": "sim",
                "n_clusters": 600,
                "accuracies": [0.8, 0.78, 0.76, 0.74, 0.72, 0.7],
                "rho": 0.2,
                "abstain_rate": 0.02,
                "seed": 11,
            }
        ],
    }
    return prevalence.study(None, StackedLogit(), LadderSettings(), s)


def test_study_on_a_simulated_admissible_panel(sim_doc):
    """Known answers: the correction with the true prevalence improves calibration; the EM estimate lands within
    0.03 of the truth on windows of 200; the served 0.5 rule on corrected posteriors raises accuracy, lowers bacc."""
    d = sim_doc["datasets"]["sim"]
    assert d["kind"] == "simulated" and d["n"] == 1200 and abs(d["train_prevalence"] - 0.5) < 0.01
    for q, cell in d["prevalences"].items():
        assert cell["n_hallucinated"] == round(float(q) * 200)
        for c in ("true", "estimated"):
            assert cell["deltas"]["brier"][c]["call"] == "clear improvement"
            assert cell["deltas"]["ece"][c]["call"] == "clear improvement"
            assert cell["deltas"]["brier"][c]["estimate"] < 0
        assert cell["deltas"]["accuracy"]["true"]["estimate"] > 0 and cell["deltas"]["bacc"]["true"]["estimate"] < 0
        pe = cell["prevalence_estimate"]
        assert pe["mae"] < 0.03 and pe["ci"][0] <= float(q) + 0.01 and pe["mean_posterior"]["mae"] > 0.05
    assert sim_doc["summary"]["simulated"]["cells"] == 2
    assert any("EM estimate" in line for line in prevalence.statements(sim_doc))


def test_study_settings_are_checked():
    with pytest.raises(PrevalenceError, match=r"prevalence.n_boot=0"):
        prevalence.check_study(
            {
                "prevalences": [0.1],
                "window": 200,
                "n_boot": 0,
                "n_draws": 5,
                "seed": 0,
                "level": 0.95,
                "ece_bins": 10,
                "tol": 1e-6,
                "max_iter": 10,
            }
        )
    with pytest.raises(PrevalenceError, match=r"missing setting\(s\) \['window'"):
        prevalence.check_study({"prevalences": [0.1]})


@pytest.mark.slow
def test_entry_point_on_the_committed_caches(tmp_path, compose_cfg):
    """`python -m src.prevalence` (the DVC stage's command shape): JSON, figure and an MLflow run of kind
    prevalence, on the committed cpu caches with shrunk settings."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db", "RAIM_HYDRA_DIR": str(tmp_path / "h")}
    out, fig = tmp_path / "prevalence.json", tmp_path / "prevalence.png"
    cmd = [
        sys.executable,
        "-m",
        "src.prevalence",
        "judge.compute=false",
        "judge.missing=skip",
        f"hydra.run.dir={tmp_path}/h",
        "hydra.output_subdir=null",
        f"prevalence.output={out}",
        f"prevalence.figure={fig}",
        "prevalence.n_boot=10",
        "prevalence.n_draws=4",
        "prevalence.prevalences=[0.1]",
        "prevalence.simulations=[]",
        "dataset=medhallu",
    ]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert list(doc["datasets"]) == ["medhallu"] and doc["datasets"]["medhallu"]["kind"] == "real"
    cell = doc["datasets"]["medhallu"]["prevalences"]["0.1"]
    assert cell["deltas"]["brier"]["true"]["call"] == "clear improvement"
    assert fig.stat().st_size > 10_000
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["raim"], filter_string="tags.kind = 'prevalence'", output_format="list")
    assert len(runs) == 1 and "medhallu/p0.1/brier/true" in runs[0].data.metrics
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(runs[0].info.run_id)}
    assert "prevalence.json" in arts and "figures" in arts
    bad = subprocess.run(
        cmd[:3] + ["prevalence.window=1", f"hydra.run.dir={tmp_path}/h2", "tracking.enabled=false"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        bad.returncode == 2
        and bad.stderr.strip().splitlines()[-1] == "error: prevalence.window=1: must be an integer ≥ 2"
    )


# ------------------------------------------------------------------------------------------ served models


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A stacker logged as MLflow logs it (src.mlops.packaging.log_stacker), and one logged the old way: a signature
    without parameters and a stacker without ``train_prevalence_``."""
    import mlflow
    from test_track import tracking_store

    from src.mlops import packaging
    from src.mlops import serving as serve

    rng = np.random.default_rng(0)
    gold = np.tile([0, 1], 200)
    X = np.column_stack([np.where(rng.random(400) < a, gold, 1 - gold) for a in (0.85, 0.8, 0.75)]).astype(float)
    st = StackedLogit(n_votes=3).fit(X, gold)
    cols = ["a", "b", "c"]
    old = StackedLogit(n_votes=3).fit(X, gold)
    del old.train_prevalence_
    sig = packaging.stacker_signature(cols, 3)
    sig.params = None
    with tracking_store(tmp_path_factory.mktemp("prev-serve")):
        with mlflow.start_run():
            new_uri = packaging.log_stacker(st, cols).model_uri
            old_uri = packaging._log_pyfunc(
                "old", serve.StackerModel(old, cols), sig, pd.DataFrame([[1.0] * 3, [0.0] * 3], columns=cols)
            ).model_uri
        yield {
            "stacker": st,
            "X": X,
            "cols": cols,
            "new": mlflow.pyfunc.load_model(new_uri),
            "old": mlflow.pyfunc.load_model(old_uri),
        }


def test_served_stacker_takes_a_prevalence(logged):
    from mlflow.exceptions import MlflowException

    st, model = logged["stacker"], logged["new"]
    df = pd.DataFrame(logged["X"][:60], columns=logged["cols"])
    df.iloc[0] = 0.5  # every member abstained: no answer, and not part of the estimate
    p = st.predict_proba(df.to_numpy())[:, 1]
    plain = model.predict(df)
    assert plain["p_hallucinated"][1:].to_numpy(float) == pytest.approx(p[1:])
    out = model.predict(df, params={"prevalence": "0.1"})
    assert out["p_hallucinated"][1:].to_numpy(float) == pytest.approx(adjust(p[1:], 0.5, 0.1))
    assert out["verdict"][1:].tolist() == (adjust(p[1:], 0.5, 0.1) >= 0.5).astype(int).tolist()
    assert pd.isna(out["p_hallucinated"][0]) and out["label"][0] == "abstained"
    est = model.predict(df, params={"prevalence": "estimate"})
    q = estimate(p[1:], 0.5)
    assert est["p_hallucinated"][1:].to_numpy(float) == pytest.approx(adjust(p[1:], 0.5, q))
    assert est.attrs["prevalence"] == pytest.approx(q)
    inner = model.unwrap_python_model()  # a float works on the python model itself
    assert inner.predict(None, df, {"prevalence": 0.1})["p_hallucinated"].equals(out["p_hallucinated"])
    with pytest.raises(MlflowException, match="parameter 'prevalence': '1.5' is neither a prevalence"):
        model.predict(df, params={"prevalence": "1.5"})
    # a handful of rows cannot estimate a prevalence (one row at p = 0.7 gives π̂ ≈ 1): refused, not pushed to 0/1
    with pytest.raises(MlflowException, match=r"'estimate' needs at least 50 answered rows in the request, got 9"):
        model.predict(df.head(10), params={"prevalence": "estimate"})
    assert model.predict(df.head(10), params={"prevalence": "0.1"})["p_hallucinated"][1:].to_numpy(
        float
    ) == pytest.approx(adjust(p[1:10], 0.5, 0.1))


def test_an_old_logged_model_still_loads_and_predicts(logged):
    from mlflow.exceptions import MlflowException

    st, model = logged["stacker"], logged["old"]
    df = pd.DataFrame(logged["X"][:5], columns=logged["cols"])
    out = model.predict(df)
    assert out["p_hallucinated"].to_numpy(float) == pytest.approx(st.predict_proba(df.to_numpy())[:, 1])
    assert model.predict(df, params={"prevalence": "0.1"}).equals(out)  # no params schema: MLflow ignores it
    with pytest.raises(MlflowException, match="log it again"):
        model.unwrap_python_model().predict(None, df, {"prevalence": 0.1})


def test_panel_model_takes_a_prevalence(monkeypatch):
    from src.mlops import serving as serve

    X = np.array([[1, 1], [1, 0], [0, 0], [0, 1]], float)
    st = StackedLogit(n_votes=2).fit(np.vstack([X] * 5), np.array([1, 1, 0, 0] * 5))

    def table(roster, items, frames, cache, compute, progress, allow_empty=False):
        t = pd.DataFrame({"m1": pd.array([1, 1, 0, 0], "Int64"), "m2": pd.array([1, 0, 0, 1], "Int64")})
        t.attrs["cached"] = {"m1": [True] * 4, "m2": [True] * 4}
        return t

    monkeypatch.setattr(serve, "verdict_table", table)  # where the panel model looks it up
    model = serve.PanelModel({"name": "r", "members": []}, {}, "claim", st, ["m1", "m2"])
    items = pd.DataFrame({"candidate": list("abcd")})
    p = st.predict_proba(X)[:, 1]
    out = model.predict(None, items, {"prevalence": "0.2"})
    assert out["p_hallucinated"].to_numpy(float) == pytest.approx(adjust(p, 0.5, 0.2))


@pytest.mark.parametrize("module, key", [("src.prevalence", "prevalence"), ("src.monitor", "monitor")])
@pytest.mark.slow
def test_study_entries_refuse_a_directory_output_before_any_work(tmp_path, module, key):
    """Like `python -m src.noise`: the output is checked before the study runs (src.mlops.tracking.run_study), so a bad
    path costs nothing and leaves no figure behind."""
    fig = tmp_path / "study.png"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            f"{key}.output={tmp_path}",
            f"{key}.figure={fig}",
            "tracking.enabled=false",
            f"hydra.run.dir={tmp_path}/h",
            "hydra.output_subdir=null",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0
    assert (
        p.stderr.strip().splitlines()[-1]
        == f"error: output={tmp_path}: is a directory (give a file path, e.g. {tmp_path / 'results.json'})"
    )
    assert not fig.exists()


def test_estimate_converges_on_the_likelihood_where_it_is_flat():
    """Posteriors near the training prior (a flat likelihood, as on TruthfulQA): EM's steps shrink under 1e-6 while
    it is still far from the maximum; the estimate is within tol of the maximiser of Σ log(π·aᵢ + (1 − π)·bᵢ)
    (the root of its derivative, found by brentq)."""
    rng = np.random.default_rng(4)
    interior = 0
    for _ in range(40):
        p = np.clip(0.5 + 0.03 * rng.standard_normal(200), 0.01, 0.99)
        a, b = p / 0.5, (1 - p) / 0.5

        def slope(q, a=a, b=b):
            return np.sum((a - b) / (q * a + (1 - q) * b))

        if not (slope(0.0) > 0 > slope(1.0)):
            continue
        interior += 1
        ml = brentq(slope, 0.0, 1.0, xtol=1e-14)
        assert abs(estimate(p, 0.5) - ml) < 1e-6
        rows = priorshift._ml_rows(np.vstack([p, p]), 0.5, 1e-9, 1000)
        assert np.abs(rows - ml).max() < 1e-9
    assert interior >= 10
