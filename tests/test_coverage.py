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
