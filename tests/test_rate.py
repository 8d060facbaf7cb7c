"""Hallucination rates with valid intervals (src/core/rates.py, src/studies/, src/rate.py): known answers,
the authors' packages as references, coverage on fast simulations, the tool's files and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from itertools import product
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from src.core import rates
from src.core.aggregate import StackedLogit
from src.core.rates import RateError
from src.io import votestore
from src.studies import rate as study
from src.studies.estimate import ESTIMAND, NO_CLUSTERS, em_rates, plan_labels
from src.studies.pool import Pool, read_pool

ROOT = Path(__file__).resolve().parents[1]


def ppi_py():
    with warnings.catch_warnings():  # ppi_py switches every warning off when imported
        return pytest.importorskip("ppi_py")


# ------------------------------------------------------------------------------------------- known answers


def test_ppi_hand_computed():
    """Y = (1, 0, 1, 0) on f = (.8, .2, .6, .4); unlabelled f = (.9, .1, .5) or (.9, .7, .8)."""
    y, fl = np.array([1, 0, 1, 0.0]), np.array([0.8, 0.2, 0.6, 0.4])
    lab = np.r_[np.ones(4, bool), np.zeros(3, bool)]
    f = np.r_[fl, 0.9, 0.1, 0.5]
    r = rates.ppi(np.r_[y, np.nan, np.nan, np.nan], f, lab, lam=1.0, interval="wald")
    # θ̂ = mean f_U + mean(Y − f_L) = 0.5 + 0; Var = var(f_U)/3 + var(Y − f_L)/4 = (0.32/3)/3 + 0.1/4
    assert r.estimate[0] == pytest.approx(0.5, abs=1e-15)
    assert r.se[0] ** 2 == pytest.approx(0.32 / 9 + 0.025, abs=1e-15)
    z = rates.z_value(0.95)
    assert [r.lo[0], r.hi[0]] == pytest.approx([0.5 - z * r.se[0], 0.5 + z * r.se[0]], abs=1e-15)
    # tuned: λ = Cov_L(Y, f) / ((1 + n/N_U)·Var(f over all 7, ddof 1)) = 0.1 / ((7/3)·0.52/6) = 1.8/3.64
    tuned = rates.ppi(np.r_[y, [np.nan] * 3], f, lab, interval="wald")
    assert tuned.lam[0] == pytest.approx(1.8 / 3.64, abs=1e-15)
    assert tuned.estimate[0] == pytest.approx(0.5, abs=1e-15)  # f̄_U = f̄_L: λ moves nothing here
    lam = 1.8 / 3.64
    var = lam**2 * (0.32 / 3) / 3 + np.var(y - lam * fl) / 4
    assert tuned.se[0] ** 2 == pytest.approx(var, abs=1e-15)
    shifted = rates.ppi(np.r_[y, [np.nan] * 3], np.r_[fl, 0.9, 0.7, 0.8], lab, lam=1.0)
    assert shifted.estimate[0] == pytest.approx(0.8, abs=1e-15)  # 0.8 + mean(Y − f_L) = 0.8 + 0
    assert rates.ppi(np.r_[y, [np.nan] * 3], f, lab, lam=0.0).estimate[0] == 0.5  # λ = 0: the labelled share


def test_active_hand_computed_and_unbiased_by_enumeration():
    f = np.array([0.2, 0.8, 0.5, 0.5])
    pi = np.array([0.5, 0.5, 1.0, 0.25])
    y = np.array([1.0, 1.0, 0.0, 0.0])
    lab = np.array([True, False, True, False])
    r = rates.active(np.where(lab, y, np.nan), f, lab, pi, lam=1.0, interval="wald")
    # z = f + (y − f)·ξ/π: 0.2 + 0.8/0.5, 0.8, 0.5 − 0.5, 0.5 → mean 3.1/4
    assert r.estimate[0] == pytest.approx(3.1 / 4, abs=1e-15)
    zs = np.array([1.8, 0.8, 0.0, 0.5])
    assert r.se[0] ** 2 == pytest.approx(np.var(zs) / 4, abs=1e-15)
    # E over every labelling pattern (item 2 always labelled) is the items' share, for any fixed λ
    for lam in (0.0, 0.3, 1.0):
        total = 0.0
        for xi in product([0, 1], repeat=4):
            xi = np.array(xi, bool)
            if not xi[2]:
                continue
            w = np.prod(np.where(xi, pi, 1 - pi))
            z = lam * f + np.where(xi, (y - lam * f) / pi, 0.0)
            total += w * z.mean()
        assert total == pytest.approx(y.mean(), abs=1e-12)


def test_classical_is_wilson_and_wald():
    from statsmodels.stats.proportion import proportion_confint

    y = np.array([1] * 7 + [0] * 33, float)
    lab = np.ones(40, bool)
    w = rates.classical(y, lab)
    lo, hi = proportion_confint(7, 40, alpha=0.05, method="wilson")
    assert [w.lo[0], w.hi[0]] == pytest.approx([lo, hi], abs=1e-12)
    assert w.effective_labels[0] == pytest.approx(40)
    zero = rates.classical(np.zeros(25), np.ones(25, bool))  # no positive labelled: Wilson still has an upper side
    assert [zero.lo[0], zero.hi[0]] == pytest.approx(proportion_confint(0, 25, method="wilson"), abs=1e-12)


def test_cluster_robust_variance_counts_a_cluster_once():
    """Every item copied twice into its own cluster: the same standard error as the originals (and twice the
    item-level information if the clusters are ignored)."""
    rng = np.random.default_rng(3)
    y = (rng.random(60) < 0.3).astype(float)
    f = np.clip(0.4 * y + 0.3 + 0.1 * rng.standard_normal(60), 0, 1)
    lab = np.zeros(60, bool)
    lab[:30] = True
    one = rates.ppi(y, f, lab, lam=0.7)
    two = rates.ppi(np.repeat(y, 2), np.repeat(f, 2), np.repeat(lab, 2), np.repeat(np.arange(60), 2), lam=0.7)
    assert two.estimate[0] == pytest.approx(one.estimate[0], abs=1e-15)
    assert two.se[0] == pytest.approx(one.se[0], rel=1e-12)
    ignored = rates.ppi(np.repeat(y, 2), np.repeat(f, 2), np.repeat(lab, 2), None, lam=0.7)
    assert ignored.se[0] == pytest.approx(one.se[0] / np.sqrt(2), rel=1e-12)
    c1 = rates.classical(y, lab, np.arange(60))  # one item per cluster
    c2 = rates.classical(np.repeat(y, 2), np.repeat(lab, 2), np.repeat(np.arange(60), 2))
    assert [c2.lo[0], c2.hi[0]] == pytest.approx([c1.lo[0], c1.hi[0]], abs=1e-12)  # Wilson at the same n/deff


# ------------------------------------------------------------------------------------------- references


def test_ppi_equals_ppi_py_to_1e9():
    """Where the estimators coincide (items not clustered, the papers' Wald interval): RAIM's PPI++ is
    ``ppi_py.ppi_mean_ci`` / ``ppi_mean_pointestimate`` (tuned λ, λ = 1, λ = 0) and its classical Wald interval
    ``ppi_py.classical_mean_ci``; the default Wilson interval keeps the same estimate and standard error."""
    pp = ppi_py()
    rng = np.random.default_rng(11)
    for case in range(30):
        N, n = int(rng.integers(50, 3000)), int(rng.integers(5, 400))
        n = min(n, N - 2)
        y = (rng.random(N) < rng.uniform(0.02, 0.5)).astype(float)
        f = np.clip(rng.uniform(0, 0.8) * y + rng.uniform(0, 0.4) + 0.2 * rng.standard_normal(N), 0, 1)
        if case % 5 == 0:
            f = 1 - f  # anti-correlated: λ clips at 0
        lab = np.zeros(N, bool)
        lab[rng.choice(N, n, replace=False)] = True
        level = float(rng.choice([0.9, 0.95, 0.99]))
        for lam in (None, 1.0, 0.0):
            mine = rates.ppi(np.where(lab, y, np.nan), f, lab, level=level, lam=lam, interval="wald")
            lo, hi = pp.ppi_mean_ci(y[lab], f[lab], f[~lab], alpha=1 - level, lam=lam)
            est = pp.ppi_mean_pointestimate(y[lab], f[lab], f[~lab], lam=lam)
            z = rates.z_value(level)
            assert abs(mine.estimate[0] - float(est[0])) < 1e-9
            assert abs(mine.estimate[0] - z * mine.se[0] - float(lo[0])) < 1e-9
            assert abs(mine.estimate[0] + z * mine.se[0] - float(hi[0])) < 1e-9
            wil = rates.ppi(np.where(lab, y, np.nan), f, lab, level=level, lam=lam)
            assert wil.estimate[0] == mine.estimate[0] and wil.se[0] == mine.se[0]
        c = rates.classical(y, lab, level=level, interval="wald")
        lo, hi = pp.classical_mean_ci(y[lab], alpha=1 - level)
        assert abs(c.estimate[0] - (lo + hi) / 2) < 1e-9 and abs(c.se[0] * z - (hi - lo) / 2) < 1e-9


def test_cje_side_by_side_on_one_pool():
    """cje-eval's calibrated mean (isotonic judge calibration on the labelled slice) and RAIM's PPI++ on the same
    pool: both near the truth, intervals of comparable width."""
    cje = pytest.importorskip("cje")
    rng = np.random.default_rng(5)
    N, n = 3000, 300
    y = (rng.random(N) < 0.2).astype(float)
    f = np.clip(0.5 * y + 0.25 + 0.15 * rng.standard_normal(N), 0, 1)
    lab = np.zeros(N, bool)
    lab[rng.choice(N, n, replace=False)] = True
    mine = rates.ppi(np.where(lab, y, np.nan), f, lab)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = cje.calibrated_mean_ci(f, np.where(lab, y, np.nan), alpha=0.05)
    assert abs(theirs.estimate - mine.estimate[0]) < 3 * mine.se[0]
    assert 0.5 < (theirs.ci[1] - theirs.ci[0]) / (mine.hi[0] - mine.lo[0]) < 2.0


# ------------------------------------------------------------------------------------------- the design


def test_sampling_probabilities():
    rng = np.random.default_rng(0)
    f = rng.random(500)
    pi = rates.sampling_probabilities(f, 50, tau=0.5)[0]
    assert pi.sum() == pytest.approx(50) and pi.max() <= 1 and pi.min() >= 0.5 * 50 / 500 - 1e-12
    u = rates.uncertainty(f)
    assert np.all(np.diff(pi[np.argsort(u)]) >= -1e-12)  # more uncertain, more likely labelled
    assert rates.sampling_probabilities(f, 50, tau=1.0)[0] == pytest.approx(np.full(500, 0.1))
    capped = rates.sampling_probabilities(f, 450, tau=0.0)[0]  # pure uncertainty sampling, most items capped
    assert capped.sum() == pytest.approx(450) and capped.max() == 1.0 and (capped == 1.0).sum() > 100
    done = np.zeros(500, bool)
    done[:100] = True
    part = rates.sampling_probabilities(f, 40, eligible=~done)[0]
    assert np.all(part[:100] == 1.0) and part[100:].sum() == pytest.approx(40)
    draws = rates.draw(np.tile(pi, (4000, 1)), np.random.default_rng(1))
    assert draws.mean(axis=0) == pytest.approx(pi, abs=0.03)  # Poisson sampling at the stated probabilities
    with pytest.raises(RateError, match="budget: 501 items to label"):
        rates.sampling_probabilities(f, 501)


# ------------------------------------------------------------------------------------------- coverage


@pytest.fixture(scope="module")
def sources():
    spec = {
        "accuracies": [0.82, 0.8, 0.78, 0.76, 0.74, 0.72],
        "rho": 0.2,
        "abstain_rate": 0.02,
        "n_clusters": 300,
        "seed": 3,
    }
    return {
        "admissible": study.simulated_source({"name": "admissible", **spec}, StackedLogit()),
        "clustered": study.simulated_source(
            {"name": "clustered", **spec, "cluster_size": 10, "icc_gold": 0.5, "icc_difficulty": 0.5}, StackedLogit()
        ),
        "anticorrelated": study.simulated_source(
            {"name": "anticorrelated", **spec, "traffic_accuracies": [0.3] * 6}, StackedLogit()
        ),
    }


def _coverage(r, truth):
    return float(np.mean((r.lo <= truth) & (truth <= r.hi)))


def test_coverage_on_a_fast_simulation(sources):
    """600 pools of 1000 items at π = 0.2 with 100 labels: PPI++ and active cover 0.95 to Monte Carlo error and
    beat the classical width; the naive flag share and the EM estimate do not cover on an anti-correlated panel."""
    rng = np.random.default_rng(7)
    q, R, N, n = 0.2, 600, 1000, 100
    f, y, t, codes = sources["admissible"].draw(R, N, q, rng)
    lab = study.uniform_labels(R, N, n, rng)
    pi = rates.sampling_probabilities(f, n)
    act = rates.draw(pi, rng)
    got = {"classical": rates.classical(y, lab), "ppi": rates.ppi(y, f, lab), "active": rates.active(y, f, act, pi)}
    for m, r in got.items():
        assert 0.925 <= _coverage(r, q) <= 0.975, m
    assert np.median(got["ppi"].width) < 0.85 * np.median(got["classical"].width)
    assert np.median(got["active"].width) < np.median(got["ppi"].width)
    assert np.median(got["ppi"].effective_labels) > 1.3 * n
    f, y, t, codes = sources["anticorrelated"].draw(R, N, q, rng)
    lab = study.uniform_labels(R, N, n, rng)
    assert 0.925 <= _coverage(rates.ppi(y, f, lab), q) <= 0.975  # λ → 0: never worse than the labels alone
    assert _coverage(rates.naive(f), q) < 0.05 and _coverage(em_rates(f, t, 0.95), q) < 0.05


def test_clustered_traffic_needs_the_cluster_robust_interval(sources):
    rng = np.random.default_rng(8)
    q, R, N, n = 0.2, 600, 1000, 200
    f, y, t, codes = sources["clustered"].draw(R, N, q, rng)
    assert codes is not None
    lab = study.uniform_labels(R, N, n, rng)
    assert 0.925 <= _coverage(rates.ppi(y, f, lab, codes), q) <= 0.975
    assert _coverage(rates.ppi(y, f, lab, None), q) < 0.85  # the item-level (ppi_py) variance undercovers
    pi = rates.sampling_probabilities(f, n)
    act = rates.draw(pi, rng)
    assert 0.925 <= _coverage(rates.active(y, f, act, pi, codes), q) <= 0.975


def test_the_wilson_interval_fixes_the_small_count_undercoverage(sources):
    """π = 0.02 with 50 labels (one labelled hallucination expected): the papers' Wald intervals collapse, the
    Wilson interval at the effective sample size covers."""
    rng = np.random.default_rng(9)
    q, R, N, n = 0.02, 600, 1000, 50
    f, y, t, codes = sources["admissible"].draw(R, N, q, rng)
    lab = study.uniform_labels(R, N, n, rng)
    assert _coverage(rates.ppi(y, f, lab, interval="wald"), q) < 0.75
    assert _coverage(rates.ppi(y, f, lab), q) >= 0.925


def test_the_plan_reaches_its_half_width(sources):
    """The planner's label count for a ±0.03 interval, drawn 400 times on the same pool: the median half-width
    lands within 15 % of 0.03."""
    rng = np.random.default_rng(10)
    f, y, t, codes = sources["admissible"].draw(1, 4000, 0.15, rng)
    f, y = f[0], y[0]
    first = study.uniform_labels(1, 4000, 300, rng)[0]  # a first uniform sample the plan is read from
    pool = Pool("sim", np.array([f"i{i}" for i in range(4000)], dtype=object), f)
    plan = plan_labels(pool, first, np.where(first, y, np.nan), 0.03)
    n = plan["labels"]["ppi"]
    assert n is not None and plan["labels"]["classical"] > n
    lab = study.uniform_labels(400, 4000, n, rng)
    half = np.median(rates.ppi(np.tile(y, (400, 1)), np.tile(f, (400, 1)), lab).width) / 2
    assert half == pytest.approx(0.03, rel=0.15)
    model = plan_labels(
        Pool("sim", pool.item_ids, f, train_prevalence=0.5), np.zeros(4000, bool), np.full(4000, np.nan), 0.03
    )
    assert model["basis"].startswith("the stacker's posteriors") and model["labels"]["classical"] > 0


def test_an_unreachable_plan_says_the_narrowest_half_width_and_the_pool_that_reaches_it(sources):
    """On 300 items no method reaches ±0.01: the plan gives each one's floor (every item labelled) and the pool
    size whose floor is ±0.01; a pool of that traffic that large (the same items repeated) reaches it."""
    f, y, _, _ = sources["admissible"].draw(1, 300, 0.15, np.random.default_rng(3))
    rows = np.arange(300)
    small = rates.plan(f[0], rows, y[0], 0.01)
    assert all(n is None for n in small.labels.values())
    assert all(0.01 < small.narrowest[m] < 0.1 and small.pool_needed[m] > 300 for m in small.labels)
    k = int(np.ceil(small.pool_needed["classical"] / 300))
    big = rates.plan(np.tile(f[0], k), np.arange(300 * k), np.tile(y[0], k), 0.01)
    assert big.labels["classical"] is not None and big.narrowest["classical"] is None
    assert big.labels["classical"] == pytest.approx(small.pool_needed["classical"], rel=0.01)


# ------------------------------------------------------------------------------------------- the tool


@pytest.fixture
def pool_files(tmp_path, sources):
    rng = np.random.default_rng(12)
    f, y, t, codes = sources["admissible"].draw(1, 600, 0.15, rng)
    ids = [f"item-{i:04d}" for i in range(600)]
    pd.DataFrame(
        {
            "item_id": ids,
            "cluster_id": [f"c{i // 2}" for i in range(600)],
            "dataset": np.where(np.arange(600) < 300, "a", "b"),
            "p_hallucinated": f[0],
            "train_prevalence": 0.5,
        }
    ).to_csv(tmp_path / "pool.csv", index=False)
    pick = rng.choice(600, 120, replace=False)
    pd.DataFrame({"item_id": [ids[i] for i in pick], "gold": y[0, pick].astype(int)}).to_csv(
        tmp_path / "gold.csv", index=False
    )
    return tmp_path, ids, y[0]


def run_cli(*args):
    from src import rate

    try:
        return rate.cli(list(args))
    except SystemExit as e:
        return e.code


def test_estimate_by_segment(pool_files, capsys):
    tmp, ids, y = pool_files
    assert (
        run_cli(
            "estimate",
            str(tmp / "pool.csv"),
            "--labels",
            str(tmp / "gold.csv"),
            "--segment",
            "dataset",
            "--out",
            str(tmp / "out.json"),
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "ppi" in text and "no valid interval" in text and "estimand:" in text
    doc = json.loads((tmp / "out.json").read_text())
    assert list(doc["segments"]) == ["all", "a", "b"]
    allm = doc["segments"]["all"]["methods"]
    assert set(allm) == {"naive", "em", "classical", "ppi"}
    assert allm["naive"]["valid_interval"] is False and allm["naive"]["effective_labels"] is None
    assert allm["ppi"]["labels"] == 120 and allm["ppi"]["ci"][0] <= allm["ppi"]["estimate"] <= allm["ppi"]["ci"][1]
    assert doc["pool"]["clusters"] == 300 and doc["labeller"] == "gold labels"


def test_estimate_warns_when_the_pool_has_no_clusters(pool_files, capsys):
    tmp, ids, y = pool_files
    pool = pd.read_csv(tmp / "pool.csv")
    pool.drop(columns="cluster_id").to_csv(tmp / "flat.csv", index=False)
    for name, warned in (("pool.csv", False), ("flat.csv", True)):
        args = ("estimate", str(tmp / name), "--labels", str(tmp / "gold.csv"), "--out", str(tmp / "o.json"))
        assert run_cli(*args) == 0
        text = capsys.readouterr().out
        doc = json.loads((tmp / "o.json").read_text())
        assert ("warning: the pool has no cluster_id" in text) is warned, name
        assert doc["pool"]["warnings"] == ([NO_CLUSTERS] if warned else []), name


def test_propose_then_estimate_with_the_proposal(pool_files, capsys):
    tmp, ids, y = pool_files
    prop = tmp / "next.json"
    assert (
        run_cli(
            "propose",
            str(tmp / "pool.csv"),
            "80",
            "--proposal",
            str(prop),
            "--seed",
            "4",
            "--labels",
            str(tmp / "gold.csv"),
        )
        == 0
    )
    doc = json.loads(prop.read_text())
    assert doc["already_labelled"] == 120 and 50 < len(doc["proposed"]) < 110
    status = dict(zip(doc["items"]["item_id"], doc["items"]["status"]))
    gold = pd.read_csv(tmp / "gold.csv")
    assert all(status[i] == "labelled" for i in gold["item_id"])
    template = pd.read_csv(tmp / "next.labels.csv")
    assert list(template["item_id"]) == doc["proposed"] and template["gold"].isna().all()
    again = tmp / "again.json"
    run_cli(
        "propose",
        str(tmp / "pool.csv"),
        "80",
        "--proposal",
        str(again),
        "--seed",
        "4",
        "--labels",
        str(tmp / "gold.csv"),
    )
    assert json.loads(again.read_text())["proposed"] == doc["proposed"]  # seeded
    index = {i: k for k, i in enumerate(ids)}
    answers = pd.concat(
        [gold, pd.DataFrame({"item_id": doc["proposed"], "gold": [int(y[index[i]]) for i in doc["proposed"]]})]
    )
    answers.to_csv(tmp / "answers.csv", index=False)
    capsys.readouterr()
    assert (
        run_cli(
            "estimate",
            str(tmp / "pool.csv"),
            "--labels",
            str(tmp / "answers.csv"),
            "--proposal",
            str(prop),
            "--labeller",
            "sonnet",
            "--out",
            str(tmp / "active.json"),
        )
        == 0
    )
    out = json.loads((tmp / "active.json").read_text())
    assert set(out["segments"]["all"]["methods"]) == {"naive", "em", "classical", "active"}
    assert "what sonnet would say" in capsys.readouterr().out and "sonnet calls hallucinated" in out["estimand"]
    assert (
        run_cli(
            "plan",
            str(tmp / "pool.csv"),
            "--halfwidth",
            "0.04",
            "--labels",
            str(tmp / "answers.csv"),
            "--proposal",
            str(prop),
        )
        == 0
    )
    assert "ppi" in capsys.readouterr().out


BAD = {
    "unknown item": (
        lambda t: t / "gold.csv",
        "item_id,gold\nitem-0001,1\nnope,0\n",
        "field 'item_id': 'nope' is not an item of the pool",
    ),
    "gold not 0/1": (
        lambda t: t / "gold.csv",
        "item_id,gold\nitem-0001,1\nitem-0002,yes\n",
        "row 2: field 'gold': 'yes' is not 0 (supported) or 1 (hallucinated)",
    ),
    "two golds": (
        lambda t: t / "gold.csv",
        "item_id,gold\nitem-0001,1\nitem-0001,0\n",
        "'item-0001' was labelled 1 before, now 0",
    ),
    "too few labels": (
        lambda t: t / "gold.csv",
        "item_id,gold\nitem-0001,1\nitem-0002,0\n",
        "the pool: 2 labelled item(s), fewer than --min-labels 10 for an interval",
    ),
}


def test_the_tools_help_names_its_commands_not_hydras_configuration(monkeypatch, capsys):
    from src import rate

    monkeypatch.setattr(sys, "argv", ["python -m src.rate", "--help"])
    with pytest.raises(SystemExit) as done:
        rate.main()
    out = capsys.readouterr().out
    assert done.value.code == 0 and len(out.splitlines()) < 30, out[:2000]
    assert all(f"    {c} " in out for c in ("estimate", "propose", "plan")) and "--cfg job" in out


def test_plan_out_of_reach_and_a_zero_budget_say_what_to_do(pool_files, capsys):
    tmp, _, _ = pool_files
    assert run_cli("plan", str(tmp / "pool.csv"), "--halfwidth", "0.005", "--labels", str(tmp / "gold.csv")) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  ")]
    assert len(lines) == 3 and all("at best (every item labelled); a pool of about " in ln for ln in lines), lines
    assert run_cli("propose", str(tmp / "pool.csv"), "0", "--proposal", str(tmp / "p.json")) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("error: propose: budget 0 (the number of items to label, after POOL)") and "--propose" not in err
    )


def test_a_file_it_writes_naming_a_file_it_reads_is_refused(pool_files, capsys):
    """``propose``'s proposal or its labels template, ``estimate --out``: never one of the pool, the labels or the
    proposal read (a second round's ``--labels p.labels.csv`` with the same ``--proposal p.json`` would empty the
    labels just filled in); one line before any work, the files untouched."""
    tmp, _, _ = pool_files
    pool, gold = tmp / "pool.csv", tmp / "gold.csv"
    assert run_cli("propose", str(pool), "50", "--proposal", str(tmp / "p.json")) == 0
    labelled = tmp / "p.labels.csv"
    labelled.write_text(labelled.read_text().replace(",\n", ",1\n"))  # labels filled in
    before = {f: f.read_bytes() for f in (pool, gold, labelled, tmp / "p.json")}
    (tmp / "sub").mkdir()
    capsys.readouterr()
    for args, words in [
        (["propose", str(pool), "50", "--labels", str(labelled), "--proposal", str(tmp / "p.json")], "labels file"),
        (["propose", str(pool), "50", "--proposal", str(tmp / "sub" / ".." / "pool.csv")], "pool"),
        (["estimate", str(pool), "--labels", str(gold), "--out", str(gold)], "labels file"),
        (
            [
                "estimate",
                str(pool),
                "--labels",
                str(gold),
                "--proposal",
                str(tmp / "p.json"),
                "--out",
                str(tmp / "p.json"),
            ],
            "proposal",
        ),
    ]:
        assert run_cli(*args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"is the {words} " in err and "would replace it" in err, err
    assert {f: f.read_bytes() for f in before} == before


@pytest.mark.parametrize("case", list(BAD))
def test_bad_labels_are_one_line_exit_2(pool_files, capsys, case):
    tmp, ids, y = pool_files
    where, text, expect = BAD[case]
    where(tmp).write_text(text)
    assert run_cli("estimate", str(tmp / "pool.csv"), "--labels", str(tmp / "gold.csv")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expect in err[0], err


def test_a_proposal_is_read_against_its_own_pool_only(pool_files, capsys):
    tmp, ids, y = pool_files
    prop = tmp / "p.json"
    assert run_cli("propose", str(tmp / "pool.csv"), "40", "--proposal", str(prop)) == 0
    other = pd.read_csv(tmp / "pool.csv").iloc[:500]
    other.to_csv(tmp / "other.csv", index=False)
    pd.read_csv(tmp / "gold.csv").query("item_id < 'item-0500'").to_csv(tmp / "g2.csv", index=False)
    capsys.readouterr()
    assert run_cli("estimate", str(tmp / "other.csv"), "--labels", str(tmp / "g2.csv"), "--proposal", str(prop)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "a proposal drawn from another pool" in err and "\n" not in err
    drawn = json.loads(prop.read_text())["proposed"]
    pd.DataFrame({"item_id": drawn[:-1], "gold": 0}).to_csv(tmp / "part.csv", index=False)
    assert run_cli("estimate", str(tmp / "pool.csv"), "--labels", str(tmp / "part.csv"), "--proposal", str(prop)) == 2
    assert "1 item(s) drawn by" in capsys.readouterr().err
    pd.DataFrame({"item_id": drawn + ["item-0599"] * ("item-0599" not in drawn), "gold": 0}).to_csv(
        tmp / "extra.csv", index=False
    )
    if "item-0599" not in drawn:
        assert (
            run_cli("estimate", str(tmp / "pool.csv"), "--labels", str(tmp / "extra.csv"), "--proposal", str(prop)) == 2
        )
        assert "did not draw it" in capsys.readouterr().err
    (tmp / "junk.json").write_text('{"kind": "something else"}')
    assert (
        run_cli(
            "estimate", str(tmp / "pool.csv"), "--labels", str(tmp / "gold.csv"), "--proposal", str(tmp / "junk.json")
        )
        == 2
    )
    assert "not a proposal of src.rate" in capsys.readouterr().err


def test_a_monitoring_store_is_a_pool(tmp_path, capsys):

    rng = np.random.default_rng(2)
    votes = (rng.random((300, 3)) < 0.5).astype(float)
    p = rng.random(300)
    votestore.record(tmp_path / "s.db", "m", ["a", "b", "c"], votes, p, [f"x{i}" for i in range(300)], ts=1.7e9)
    pd.DataFrame({"item_id": [f"x{i}" for i in range(0, 300, 10)], "gold": (p[::10] > 0.5).astype(int)}).to_csv(
        tmp_path / "g.csv", index=False
    )
    assert (
        run_cli(
            "estimate",
            str(tmp_path / "s.db"),
            "--labels",
            str(tmp_path / "g.csv"),
            "--window",
            "86400",
            "--train-prevalence",
            "0.5",
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "2023-11-14T22:13:20Z" in out and "em" in out


def _stacker(train_share: float, seed: int = 0) -> StackedLogit:
    rng = np.random.default_rng(seed)
    y = (rng.random(400) < train_share).astype(int)
    X = np.where(rng.random((400, 3)) < 0.8, y[:, None], 1 - y[:, None]).astype(float)
    return StackedLogit().fit(X, y)


def test_served_and_predicted_rows_carry_the_prior_their_p_assumes(tmp_path):
    """A served model's (and so ``src.predict``'s) rows carry ``train_prevalence``: the stacker's training share,
    or the prevalence the p was corrected to; ``src.rate`` reads it from the table, so its EM estimate needs no flag."""
    from src.mlops.serving import stacked_output

    stacker = _stacker(0.3)
    X = np.array([[1, 1, 0], [0, 0, 0], [0.5, 0.5, 0.5], [1, 1, 1]], dtype=float)
    out = stacked_output(stacker, X)
    assert out["train_prevalence"].tolist() == [stacker.train_prevalence_] * 4
    assert abs(stacker.train_prevalence_ - 0.3) < 0.06
    assert stacked_output(stacker, X, "0.1")["train_prevalence"].tolist() == [0.1] * 4  # p was shifted to 0.1
    out.insert(0, "item_id", [f"i{k}" for k in range(4)])
    out.to_csv(tmp_path / "predicted.csv", index=False)
    assert read_pool(tmp_path / "predicted.csv").train_prevalence == stacker.train_prevalence_
    mixed = out.assign(train_prevalence=[0.5, 0.5, 0.3, None])  # two stackers' rows in one table
    mixed.to_csv(tmp_path / "mixed.csv", index=False)
    with pytest.raises(
        RateError, match=r"field 'train_prevalence': the items disagree \(0.3…0.5\); pass the stacker's"
    ):
        read_pool(tmp_path / "mixed.csv")
    del stacker.train_prevalence_  # a stacker pickled before it recorded its training share: unknown, not a guess
    old = stacked_output(stacker, X)
    assert old["train_prevalence"].isna().all()
    old.insert(0, "item_id", [f"i{k}" for k in range(4)])
    old.to_csv(tmp_path / "old.csv", index=False)
    assert read_pool(tmp_path / "old.csv").train_prevalence is None  # then --train-prevalence gives it


def test_a_store_records_the_training_prevalence_and_an_old_store_gains_the_column(tmp_path):
    import sqlite3

    old = tmp_path / "old.db"  # a store written before rows carried it
    con = sqlite3.connect(old)
    con.execute(
        "CREATE TABLE votes (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, model TEXT NOT NULL, "
        "item_id TEXT, votes TEXT NOT NULL, p_hallucinated REAL)"
    )
    con.execute(
        "INSERT INTO votes (ts, model, item_id, votes, p_hallucinated) VALUES (1.7e9, 'm', 'o1', ?, 0.2)",
        ('{"a": 1, "b": 0}',),
    )
    con.commit()
    con.close()
    assert read_pool(old).train_prevalence is None  # nothing recorded it: --train-prevalence is needed
    votestore.record(old, "m", ["a", "b"], np.array([[1.0, 1.0]]), [0.9], ["n1"], ts=1.7e9, train_prevalence=0.5)
    stream = votestore.read_store(old, ["a", "b"])
    assert np.isnan(stream.train_prevalence[0]) and stream.train_prevalence[1] == 0.5
    assert read_pool(old).train_prevalence == 0.5
    votestore.record(old, "m2", ["a", "b"], np.array([[0.0, 0.0]]), [0.1], ["n2"], ts=1.7e9, train_prevalence=0.3)
    with pytest.raises(RateError, match=r"field 'train_prevalence': the rows disagree \(0.3…0.5\)"):
        read_pool(old)
    assert read_pool(old, model="m2").train_prevalence == 0.3


def test_a_served_panel_records_its_prior_in_the_store(tmp_path, monkeypatch):
    from src.mlops.serving import StackerModel

    stacker = _stacker(0.5)
    monkeypatch.setenv(votestore.STORE_ENV, str(tmp_path / "live.db"))
    StackerModel(stacker, ["a", "b", "c"]).predict(None, pd.DataFrame({"a": [1, 0], "b": [1, 0], "c": [0, 0]}))
    assert (
        votestore.read_store(tmp_path / "live.db", ["a", "b", "c"]).train_prevalence.tolist()
        == [stacker.train_prevalence_] * 2
    )


# ------------------------------------------------------------------------------------------- the study


@pytest.mark.slow
def test_study_entry_writes_json_figure_and_run(tmp_path):
    """`python -m src.rate` (the DVC stage's command shape) with shrunk settings on the committed medhallu cache:
    JSON with per regime and method coverage / width / effective labels, the figure, an MLflow run of kind rate."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db", "RAIM_HYDRA_DIR": str(tmp_path / "h")}
    out, fig = tmp_path / "rate.json", tmp_path / "rate.png"
    cmd = [
        sys.executable,
        "-m",
        "src.rate",
        "judge.compute=false",
        "judge.missing=skip",
        "dataset=medhallu",
        f"hydra.run.dir={tmp_path}/h",
        "hydra.output_subdir=null",
        f"rate.output={out}",
        f"rate.figure={fig}",
        "rate.replicates=40",
        "rate.pool=300",
        "rate.labels=[30,60]",
        "rate.prevalences=[0.1,0.3]",
        "rate.crosscheck.ppi_py=5",
        "rate.crosscheck.cje.replicates=0",
        "rate.simulations=[{name:admissible,description:competent,accuracies:[0.82,0.8,0.78,0.76],rho:0.2,"
        "abstain_rate:0.02,n_clusters:200,seed:21}]",
    ]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert "seconds" not in doc  # a DVC output: its wall time would change dvc.lock on every run
    assert list(doc["regimes"]) == ["admissible", "medhallu", f"medhallu-{doc['meta']['labeller']['name']}"]
    for reg in doc["summary"].values():
        for m in ("classical", "naive", "em", "ppi", "active"):
            assert {"coverage", "width", "effective_labels"} <= set(reg[m])
    assert doc["summary"]["admissible"]["naive"]["effective_labels"] is None
    assert doc["crosscheck"]["ppi_py"]["max_abs_diff"] < 1e-9
    assert fig.stat().st_size > 10_000
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["raim"], filter_string="tags.kind = 'rate'", output_format="list")
    assert len(runs) == 1 and "admissible/ppi/coverage" in runs[0].data.metrics
    bad = subprocess.run(
        cmd[:3]
        + [
            "rate.labels=[1]",
            f"hydra.run.dir={tmp_path}/h2",
            "tracking.enabled=false",
            f"rate.output={tmp_path}/x.json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        bad.returncode == 2
        and bad.stderr.strip().splitlines()[-1] == "error: rate.labels: 1 must be an integer in [2, rate.pool)"
    )


def test_study_entry_refuses_a_directory_output_before_any_work(tmp_path):
    fig = tmp_path / "study.png"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.rate",
            f"rate.output={tmp_path}",
            f"rate.figure={fig}",
            "tracking.enabled=false",
            f"hydra.run.dir={tmp_path}/h",
            "hydra.output_subdir=null",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert (
        p.stderr.strip().splitlines()[-1]
        == f"error: output={tmp_path}: is a directory (give a file path, e.g. {tmp_path / 'results.json'})"
    )
    assert not fig.exists()


def test_the_report_section_reads_the_document():
    from src.present import rate as present

    doc = {
        "settings": {"pool": 100, "prevalences": [0.1], "labels": [50], "replicates": 10, "level": 0.95},
        "estimand": ESTIMAND,
        "regimes": {},
        "summary": {},
        "crosscheck": {"ppi_py": {"max_abs_diff": None, "clustered_coverage": {}}, "cje": {}},
    }
    cell = {
        m: {"coverage": 0.95, "width": 0.1, "width_rel": 1.0, "multiplier": 1.0, "effective_labels": 50.0}
        for m in study.STUDY_METHODS
    }
    doc["regimes"]["sim"] = {"kind": "simulated", "cells": {"0.1": {"labels": {"50": {"methods": cell}}}}}
    doc["summary"] = study.summary(
        {"sim": {"cells": {"0.1": {"labels": {"50": {"methods": {**cell, **{m: cell["ppi"] for m in study.WALD}}}}}}}}
    )
    lines = present.rate_section(doc)
    assert lines[0].startswith("## How much of the traffic hallucinates?")
    assert any("| sim | PPI++ | 0.950–0.950 (1/1) |" in ln for ln in lines)


def test_the_ppi_py_crosscheck_says_when_its_difference_is_rounding_noise():
    """ppi_py and RAIM's PPI++ are the same estimator: their difference (~1e-16, another summation order) is
    written 0 in rate.json, and the statement says so instead of printing 0.0e+00; a real difference is shown."""
    from src.io.files import to_json

    doc = {"summary": {}, "crosscheck": {"ppi_py": {"max_abs_diff": 1.6e-15, "cells": 300, "clustered_coverage": {}}}}
    written = json.loads(to_json(doc))
    noise = "ppi_py.ppi_mean_ci: largest difference from RAIM's PPI++ below 1e-9 (rounding noise, written 0) over"
    assert study.statements(written) == [f"{noise} 300 cells"]
    doc["crosscheck"]["ppi_py"]["max_abs_diff"] = 2.5e-6
    assert study.statements(doc) == ["ppi_py.ppi_mean_ci: largest difference from RAIM's PPI++ 2.5e-06 over 300 cells"]
