"""A clean clone's outputs are the committed bytes on any machine: the same analysis under another BLAS kernel
choice and thread count writes the same results.json (src/__init__.py pins OpenBLAS's AVX2 kernels)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, name: str, **env: str) -> bytes:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "OMP_NUM", "MKL_"))}
    out = tmp_path / f"{name}.json"
    subprocess.run(
        [sys.executable, "-m", "src.run", "tracking.enabled=false", f"output={out}"],
        cwd=ROOT,
        env={**base, **env},
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out.read_bytes()


@pytest.mark.slow
def test_results_do_not_depend_on_the_blas_kernel_or_the_thread_count(tmp_path):
    """On an AVX-512 CPU OpenBLAS's own choice (no variable set) and the AVX2 kernels on one thread gave other
    last bits, and other refit intervals on truthfulqa, before the package pinned the kernels."""
    own_choice = _run(tmp_path, "own", OPENBLAS_NUM_THREADS="2")
    pinned = _run(tmp_path, "pinned", OPENBLAS_CORETYPE="Haswell", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    assert own_choice == pinned


def test_a_core_type_the_user_chose_is_kept():
    code = "import os, src; print(os.environ.get('OPENBLAS_CORETYPE'))"
    env = {**os.environ, "OPENBLAS_CORETYPE": "Zen"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "Zen"
