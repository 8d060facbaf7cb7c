"""The intervals' coverage, small: bench/intervals.py's measurement at R = 60, B = 200, in the regime where
the audit found the paper's fixed-prediction interval of Δκ (stacked − CV-best) furthest below 95 % — one member
dominates. The refit interval the calls read must cover within a binomial band of 95 %, the fixed one clearly less.
The full tables (R ≥ 200 per cell, four regimes, n = 100 / 200 / 800): docs/intervals.md."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

# bench/intervals.py, loaded by path (bench/ is not a package). It was bench/coverage.py, which shadowed the
# ``coverage`` package for every script run from bench/ (numba imports it: bench/bench_memory.py died on import)
_spec = importlib.util.spec_from_file_location(
    "raim_bench_intervals", Path(__file__).resolve().parents[1] / "bench" / "intervals.py"
)
cov = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = cov
_spec.loader.exec_module(cov)

R, B, N = 60, 200, 200


@pytest.fixture(scope="module")
def dominant():
    truth = cov.population("dominant", n_items=200_000)
    rows = [cov.analyse(cov.sample("dominant", N, cov.seed_of("dominant", N, "test", r)), B) for r in range(R)]
    return truth, rows


def test_population_values_are_read_on_a_held_out_half():
    """The truth of the cells: the stacker fitted on one half of a large sample and scored on the other; the dominant
    member is the population's best single judge and the majority is far below it."""
    t = cov.population("dominant", n_items=200_000)
    assert t["best_cv_member"] == 0
    assert t["d_majority"] > 0.15 and abs(t["d_best_cv"]) < 0.03


@pytest.mark.slow
def test_refit_interval_covers_where_the_fixed_one_does_not(dominant):
    truth, rows = dominant
    k_refit, k_fixed = cov.covered(rows, "d_best_cv", truth["d_best_cv"])
    lo, hi = cov.wilson(int(k_refit), R)
    assert lo <= 0.95 <= hi, (k_refit, k_fixed)  # within a binomial band of 95 % (Wilson's)
    assert cov.wilson(int(k_fixed), R)[1] < 0.95, (k_refit, k_fixed)  # the fixed interval: clearly under 95 %
    assert k_refit >= k_fixed + 0.08 * R
    # the refit interval is wider, never narrower than the fixed-prediction draws' spread allows
    a = np.array([r["d_best_cv"] for r in rows])
    assert np.mean(a[:, 2] - a[:, 1]) > np.mean(a[:, 4] - a[:, 3])


def test_stacked_kappa_interval_covers(dominant):
    truth, rows = dominant
    k_refit, _ = cov.covered(rows, "stacked", truth["stacked"])
    lo, hi = cov.wilson(int(k_refit), R)
    assert lo <= 0.95 <= hi, k_refit


def test_binomial_intervals():
    assert cov.wilson(57, 60) == pytest.approx((0.8627, 0.9829), abs=1e-3)
    assert cov.clopper_pearson(0, 10)[0] == 0.0
    lo, hi = cov.clopper_pearson(95, 100)
    assert lo == pytest.approx(0.8872, abs=1e-3) and hi == pytest.approx(0.9836, abs=1e-3)


def test_numba_imports_for_a_script_run_from_bench():
    """A script run from bench/ has bench/ first on sys.path: bench/coverage.py hid the ``coverage`` module numba
    probes for, and every bench script that compiles the fold assignment (bench/bench_memory.py) died on import."""
    import subprocess
    import sys

    bench = Path(__file__).resolve().parents[1] / "bench"
    out = subprocess.run([sys.executable, "-c", "import numba"], cwd=bench, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]


# ---------------------------------------------------------------------------------- the decision cells (§3.3)


def test_tally_counts_each_run_in_one_outcome():
    """Better arm, other arm, nothing although an arm reaches the floor: each run in exactly one when an arm
    reaches it; where none does, deploying anything is the other outcome and ``nothing`` is not counted."""

    def run(estimate, lower_bound, call="tie", admissible=True):
        vetoed = call in cov.WINS and not admissible
        action = {"estimate": estimate, "lower_bound": lower_bound}
        return {"action": action, "call": call, "admissible": admissible, "vetoed": vetoed}

    runs = [
        run("single", "single", "clean win", admissible=False),  # a vetoed win
        run("panel", "panel", "win"),
        run("single", "none"),
        run("none", "none"),
    ]
    c = cov.tally(runs, "estimate", "panel", "single")
    assert c == {"reps": 4, "better": 1, "other": 2, "nothing": 1, "as_rule": 2, "win": 2, "admissible": 3, "vetoed": 1}
    assert c["better"] + c["other"] + c["nothing"] == c["reps"]
    assert cov.tally(runs, "lower_bound", "panel", "single")["nothing"] == 2
    c = cov.tally(runs[2:], "estimate", "none", "none")
    assert c == {"reps": 2, "better": 1, "other": 1, "nothing": 0, "as_rule": 1, "win": 0, "admissible": 2, "vetoed": 0}


def test_the_better_arm_and_the_rules_arm():
    """The better arm is the one of higher population κ at the floor; the rule's arm leaves out an inadmissible
    panel however much it wins (one strong member among weak ones)."""
    assert cov.better_arm(0.50, 0.45) == "panel" and cov.better_arm(0.35, 0.45) == "single"
    assert cov.better_arm(0.39, 0.30) == "none" and cov.better_arm(0.40, 0.30) == "panel"  # the floor, reached exactly
    strong_weak = {"admissible": False, "d_deploy": 0.04, "stacked": 0.74, "kappa_best_cv_deployed": 0.70}
    assert cov.rule_arm(strong_weak) == "single"
    assert cov.rule_arm({**strong_weak, "admissible": True}) == "panel"
    assert cov.rule_arm({**strong_weak, "admissible": True, "kappa_best_cv_deployed": 0.3, "stacked": 0.35}) == "none"
    # the rule reads the deployed comparison: a panel that loses on the items the single judge answers (§2) but
    # wins once the single judge must answer them all is the rule's arm
    assert cov.rule_arm({**strong_weak, "admissible": True, "d_best_cv": -0.01}) == "panel"


@pytest.mark.parametrize(("accuracy", "arm"), [(0.9, "panel"), (0.5, "none")])
def test_decision_runs_where_the_outcome_is_forced(monkeypatch, accuracy, arm):
    """Five members of accuracy 0.9 (the panel wins by far, admissibly) or 0.5 (nothing reaches κ 0.40): every run
    decides the population's better arm, under both floor rules, and the tally says so."""
    monkeypatch.setitem(cov.ALL_REGIMES, "forced", {"accuracies": [accuracy] * 5, "rho": 0.0})
    t = cov.decision_truth("forced", n_items=20_000)
    assert t["better"] == t["rule"] == arm
    runs = [cov.decision_rep("forced", 200, seed, 200) for seed in range(3)]
    for rule in cov.FLOOR_RULES:
        c = cov.tally(runs, rule, t["better"], t["rule"])
        assert (c["better"], c["other"], c["nothing"], c["as_rule"], c["vetoed"]) == (3, 0, 0, 3, 0), (rule, runs)
        assert c["win"] == c["admissible"] == (3 if arm == "panel" else 0), (rule, runs)


def test_cascade_cells_read_the_suites_refit_and_fixed_intervals(capsys):
    """bench/intervals.py cascade: each run is the suite's own cascade call, refit and fixed intervals side by side,
    and the report counts the runs whose intervals hold the population values."""
    truth = cov.cascade_population("independent", n_items=100_000)
    reps = [cov.cascade_rep("independent", 200, cov.seed_of("independent", 200, "test", r), 100) for r in range(3)]
    for r in reps:
        assert np.shape(r["kappa"]) == (len(cov.CASCADE_SHARES), 5) and np.shape(r["delta"]) == (6, 5)
        assert r["cpu_s"] > 0 and r["cpu_fixed_s"] > 0
    cell = {"kind": "cascade_refit", "regime": "independent", "n": 200, "reps": 3, "n_boot": 100}
    cell |= {"shares": list(cov.CASCADE_SHARES), "truth": truth, "results": reps}
    c = cov.cascade_covered(cell)
    k = np.array([r["kappa"] for r in reps])
    inside = (k[:, :, 1] <= truth["kappa"]) & (np.array(truth["kappa"]) <= k[:, :, 2])
    np.testing.assert_array_equal(c["kappa_refit"], inside.sum(axis=0))
    for key in ("kappa_fixed", "delta_refit", "delta_fixed", "delta_over_refit", "delta_over_fixed"):
        assert ((0 <= c[key]) & (c[key] <= 3)).all()
    cov.report_cascade([cell])
    assert "share 0.95" in capsys.readouterr().out
