"""A clean clone's outputs are the committed bytes on any machine: the same analysis under another BLAS kernel
and thread count writes the same results.json — ties are decided by rule (:func:`src.core.verdicts.at_or_over`) and
β written to 10 decimals (:func:`src.core.aggregate.reported_beta`), so no output hangs on a fit's last bits."""

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


def _avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _avx512(), reason="OpenBLAS's SkylakeX kernels need a CPU with AVX-512")
def test_results_do_not_depend_on_the_blas_kernel_or_the_thread_count(tmp_path):
    """OpenBLAS's AVX2 (Haswell) and AVX-512 (SkylakeX) kernels on one and two threads, and the kernel it picks by
    itself, write the same bytes. Before the tie rule the two kernels decided TruthfulQA's tied refits differently
    (its intervals moved in the fourth digit) and wrote other last bits of every β."""
    runs = {
        "its own choice, 2 threads": _run(tmp_path, "own", OPENBLAS_NUM_THREADS="2"),
        "Haswell, 1 thread": _run(
            tmp_path, "haswell", OPENBLAS_CORETYPE="Haswell", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"
        ),
        "SkylakeX, 2 threads": _run(tmp_path, "skylakex", OPENBLAS_CORETYPE="SkylakeX", OPENBLAS_NUM_THREADS="2"),
    }
    assert len(set(runs.values())) == 1, {k: len(v) for k, v in runs.items()}
