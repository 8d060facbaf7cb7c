"""The suite on both cores (``python -m pytest -n 2``, tests/conftest.py): a module-scoped fixture is built once
per run, the tests that use no shared fixture spread over the two workers, and what must not overlap does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a pytest run of its own on two workers
def test_shared_fixtures_are_built_once_and_the_other_tests_use_both_workers(tmp_path):
    log = tmp_path / "log.txt"
    sample = ROOT / "tests" / "fixtures" / "parallel" / "sample_units.py"
    done = subprocess.run(
        [sys.executable, *"-m pytest -n 2 -p no:cacheprovider -o python_files=sample_*.py".split(), str(sample)],
        cwd=ROOT,
        env={**os.environ, "RAIM_SAMPLE_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [ln.split() for ln in log.read_text().splitlines()]
    workers = {what: [r[1] for r in rows if r[0] == what] for what in ("built", "shared", "independent", "alone")}
    assert len(workers["built"]) == 1 and set(workers["shared"]) == set(workers["built"])  # one module, one worker
    assert len(workers["shared"]) == len(workers["independent"]) == 6
    assert set(workers["independent"]) | set(workers["shared"]) == {"gw0", "gw1"}, rows
    (a0, a1), (b0, b1) = sorted((float(r[2]), float(r[3])) for r in rows if r[0] == "alone")
    assert a1 <= b0, rows  # the lock held them apart
