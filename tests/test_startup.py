"""Start-up: ``python -m src.run --help`` and its one-line error paths before the analysis (a bad override, an
output that cannot be written) load none of the heavy modules — those are imported where first needed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# bench/harness.py, loaded by path (bench/ on sys.path would shadow installed modules): its -X importtime total
_spec = importlib.util.spec_from_file_location("bench_harness", ROOT / "bench" / "harness.py")
assert _spec is not None and _spec.loader is not None
HARNESS = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(HARNESS)
HEAVY = ("numpy", "pandas", "scipy", "sklearn", "mlflow", "matplotlib", "numba")


def imported(tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess, set[str], float]:
    """The run's exit, the top-level packages it imported, and its imports' total time (s, ``-X importtime``)."""
    env = {**os.environ, "RAIM_HYDRA_DIR": str(tmp / "hydra"), "MLFLOW_DISABLE_TELEMETRY": "true", "RAIM_DEBUG": "0"}
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "src.run", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = [ln.split("|") for ln in r.stderr.splitlines() if ln.startswith("import time:") and "cumulative" not in ln]
    names = {row[2].strip().split(".")[0] for row in rows}
    return r, names, HARNESS.import_seconds(r.stderr)


@pytest.mark.parametrize(
    "args, rc", [(("--help",), 0), (("output=/", "tracking.enabled=false"), 2), (("stacker.C=1,2",), 2)]
)
def test_help_and_early_errors_load_no_heavy_module(tmp_path, args, rc):
    r, names, top = imported(tmp_path, *args)
    assert r.returncode == rc, r.stdout + r.stderr[-2000:]
    assert not names & set(HEAVY), f"imported at start-up: {sorted(names & set(HEAVY))} ({top:.2f} s of imports)"


# modules `python -m src.run` imports (leaves, so that importing their parents here does not write them)
MAIN_JOB_MODULES = (
    "sklearn.linear_model._logistic",
    "scipy.stats._stats_py",
    "pandas.core.frame",
    "mlflow.tracking.fluent",
    "mlflow.store.tracking.sqlalchemy_store",
    "sqlalchemy.orm.session",
    "hydra._internal.hydra",
    "numpy.linalg._linalg",
)


@pytest.mark.parametrize("name", MAIN_JOB_MODULES)
def test_the_installed_modules_carry_their_bytecode(name):
    """scripts/setup.sh byte-compiles the venv: where PYTHONDONTWRITEBYTECODE is set (many container images, this
    project's CI), Python never writes bytecode on import, and a venv without it compiles every module a command
    imports on every run (5 s of the main job's 6 s here)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    cached = importlib.util.cache_from_source(spec.origin)
    assert os.path.exists(cached), f"{name}: no bytecode at {cached} (scripts/setup.sh compiles it)"


def test_the_benchmarks_paired_ratio_reads_each_round_against_its_own_baseline():
    """A busy spell slows both sides of a round: the median of the rounds' ratios is 2 here, where the ratio of
    the minima (2/1) and of the medians (9/3) disagree."""
    slow, fast = [2.0, 9.0, 12.0], [1.0, 3.0, 6.0]
    assert HARNESS.paired(slow, fast) == "2.00x (median of 3 rounds' ratios, 2.00–3.00)"
