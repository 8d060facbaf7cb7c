"""A clean clone's outputs are the committed bytes on any machine: the same analysis and studies under another BLAS
kernel and thread count write the same files — ties are decided by rule (:func:`src.core.verdicts.at_or_over`), β
rounded (:func:`src.core.aggregate.reported_beta`) and every float of a JSON result written by one rule
(:func:`src.io.files.written_float`), so no output hangs on a computation's last bits and nothing pins OpenBLAS's
kernels (docs/data.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The study stages of dvc.yaml (entry module, its outputs' settings), each as `dvc repro` runs it but writing into a
# temporary folder; rate with fewer replicates (its cells differed in the last bits on every replicate count).
STUDIES = [
    ("src.analyses", ["suite.output={d}/suite.json", "suite.figures_dir={d}/figures"]),
    ("src.prevalence", ["prevalence.output={d}/prevalence.json", "prevalence.figure={d}/prevalence.png"]),
    ("src.monitor", ["monitor.output={d}/monitor.json", "monitor.figure={d}/monitor.png"]),
    ("src.noise", ["noise.output={d}/noise.json", "noise.figure={d}/noise.png"]),
    ("src.rate", ["rate.output={d}/rate.json", "rate.figure={d}/rate.png", "rate.replicates=100"]),
]


def _clean_env(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "OMP_NUM", "MKL_"))}
    return {**base, **env}


def _module(module: str, args: list[str], env: dict[str, str], hydra_dir: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", module, "tracking.enabled=false", *args]
        + [f"hydra.run.dir={hydra_dir}", "hydra.output_subdir=null"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=900,
    )


def _run(out: Path, **env: str) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The files of the stacking stage, and those of the stacking and the study stages, under ``env``, by name.
    Every run writes into the same folder, emptied after it: the documents record their own paths."""
    results = out / "results.json"
    _module("src.run", [f"output={results}"], _clean_env(**env), out / "hydra")
    stacking = _files(out)
    for module, args in STUDIES:
        _module(module, [f"output={results}", *(a.format(d=out) for a in args)], _clean_env(**env), out / "hydra")
    files = _files(out)
    shutil.rmtree(out)
    return stacking, files


def _files(out: Path) -> dict[str, bytes]:
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    return {k: v for k, v in files.items() if not k.startswith("hydra")}


# OpenBLAS's AVX2 (Haswell) and AVX-512 (SkylakeX) kernels on one and two threads, and the kernel it picks by itself;
# the analysis on one thread and on two (src.core.threads)
SETTINGS = {
    "its own choice, 2 threads": {"OPENBLAS_NUM_THREADS": "2", "RAIM_ANALYSIS_THREADS": "2"},
    "Haswell, 1 thread": {
        "OPENBLAS_CORETYPE": "Haswell",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "RAIM_ANALYSIS_THREADS": "1",
    },
    "SkylakeX, 2 threads": {"OPENBLAS_CORETYPE": "SkylakeX", "OPENBLAS_NUM_THREADS": "2", "RAIM_ANALYSIS_THREADS": "2"},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[dict[str, bytes], dict[str, bytes]]]:
    """The stacking stage and then the study stages under each of :data:`SETTINGS`, once for both tests below."""
    out = tmp_path_factory.mktemp("blas") / "out"
    return {name: _run(out, **env) for name, env in SETTINGS.items()}


def _avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False


def _differing(runs: dict[str, dict[str, bytes]]) -> dict[str, list[str]]:
    first = next(iter(runs.values()))
    return {
        k: sorted(f for f in first.keys() | files.keys() if first.get(f) != files.get(f)) for k, files in runs.items()
    }


needs_avx512 = pytest.mark.skipif(not _avx512(), reason="OpenBLAS's SkylakeX kernels need a CPU with AVX-512")


@pytest.mark.slow
@needs_avx512
def test_results_do_not_depend_on_the_blas_kernel_or_the_thread_count(runs):
    """OpenBLAS's AVX2 (Haswell) and AVX-512 (SkylakeX) kernels on one and two threads, and the kernel it picks by
    itself, write the same bytes. Before the tie rule the two kernels decided TruthfulQA's tied refits differently
    (its intervals moved in the fourth digit) and wrote other last bits of every β."""
    stacking = {name: run[0] for name, run in runs.items()}
    assert not any(_differing(stacking).values()), _differing(stacking)


@pytest.mark.slow
@needs_avx512
def test_the_studies_do_not_depend_on_the_blas_kernel_or_the_thread_count(runs):
    """The study stages (suite, prevalence, monitor, noise, rate: JSON and figures) write the same bytes under the
    Haswell kernels on one thread and the SkylakeX ones on two, and under OpenBLAS's own choice. Before floats were
    written by one rule their standard errors, window bounds and cross-check differences differed in the last bits
    (suite.json, prevalence.json, monitor.json and rate.json; rate.json between one and two threads too)."""
    studies = {name: run[1] for name, run in runs.items()}
    assert len(next(iter(studies.values()))) >= 12  # 6 JSON files and their figures
    assert not any(_differing(studies).values()), _differing(studies)


def test_last_bits_counts_the_floats_that_differ_and_the_chance_of_a_flip(tmp_path):
    """scripts/last_bits.py (the count docs/data.md quotes): the floats two runs' JSON results differ in, and the
    expected number of written figures a rounding boundary between them flips (|a − b| over the written step)."""
    for run, bias in (("a", 8.061902904955398e-06), ("b", 8.061902904971051e-06)):
        (tmp_path / run / "results").mkdir(parents=True)
        doc = {"n": 200, "cells": [{"bias": bias, "width": 0.25}], "label": "x"}
        (tmp_path / run / "results" / "rate.json").write_text(json.dumps(doc))
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "last_bits.py"), str(tmp_path / "a"), str(tmp_path / "b")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "results/rate.json: 1 floats differ, largest by 1.6e-17 (1.9e-12 relative)"
    # the written step of 8.06e-6 is the 9th decimal: 1.6e-17 / 1e-9
    assert out[-1] == "1 floats differ; expected written figures flipped (7 digits, 9 decimals): 1.6e-08"
