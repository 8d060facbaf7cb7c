"""RAIM installed as a package (``pip install .``, not editable) works from a folder outside the checkout: the
configuration ships inside the package, the console scripts run the main job and ``src.predict``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _sh(cmd, cwd, timeout=600, env=None):
    r = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A wheel of this checkout installed into a new venv whose dependencies are this venv's (a .pth line:
    no editable finder comes with it, so `src` can only be the installed copy)."""
    tmp = tmp_path_factory.mktemp("install")
    _sh(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ".", "-w", tmp / "dist"], ROOT
    )
    wheel = next((tmp / "dist").glob("raim-*.whl"))
    _sh([sys.executable, "-m", "venv", tmp / "venv"], tmp)
    py = tmp / "venv" / "bin" / "python"
    site = Path(_sh([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).stdout.strip())
    (site / "raim-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _sh([py, "-m", "pip", "install", "-q", "--no-deps", wheel], tmp)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return tmp, py.parent, elsewhere, wheel


def test_the_wheel_ships_the_configuration_and_the_commands(installed):
    _, _, _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    assert "src/conf/config.yaml" in names and "src/conf/roster/cpu.yaml" in names
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for script in ("raim-run", "raim-judges", "raim-predict", "raim-serve", "raim-registry", "raim-traces"):
        assert f"{script} = " in entry


def test_installed_main_job_and_predict_run_outside_the_checkout(installed):
    tmp, bin_, elsewhere, _ = installed
    where = _sh(
        [bin_ / "python", "-c", "import src, src.io.paths as p; print(src.__file__, p.CONF_DIR, p.CHECKOUT)"], elsewhere
    ).stdout.split()
    assert str(ROOT) not in where[0] and where[1].endswith("site-packages/src/conf") and where[2] == "None"
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    run = _sh(
        [
            bin_ / "raim-run",
            f"paths.datasets_dir={ROOT / 'datasets'}",
            f"paths.cache_dir={ROOT / 'verdicts/cache'}",
            f"tracking.uri={store}",
            f"hydra.run.dir={tmp / 'run'}",
        ],
        elsewhere,
    )
    assert "RAIM summary" in run.stdout and "medhallu: stacked κ" in run.stdout
    run_id = (tmp / "run" / "mlflow_run_id").read_text().strip()
    assert json.loads((tmp / "run" / "results.json").read_text())["datasets"]
    ids = set(pd.read_csv(ROOT / "verdicts/tables/cpu/medhallu.csv")["item_id"].astype(str).head(3))
    items = [
        ln
        for ln in (ROOT / "datasets/medhallu.jsonl").read_text().split("\n")
        if ln and str(json.loads(ln)["item_id"]) in ids
    ]
    (elsewhere / "items.jsonl").write_text("\n".join(items) + "\n")
    pred = _sh(
        [
            bin_ / "raim-predict",
            "items.jsonl",
            "--run-id",
            run_id,
            "--dataset",
            "medhallu",
            "--tracking-uri",
            store,
            "--cache-dir",
            ROOT / "verdicts/cache",
            "--no-compute",
            "--no-progress",
            "--out",
            "out.jsonl",
        ],
        elsewhere,
    )
    assert "3 items:" in pred.stdout and "read from the cache: 18" in pred.stdout
    out = [json.loads(ln) for ln in (elsewhere / "out.jsonl").read_text().split("\n") if ln]
    assert len(out) == 3 and all(0 <= r["p_hallucinated"] <= 1 for r in out)
    assert not (elsewhere / "mlflow.db").exists()  # nothing landed in the folder by accident


@pytest.mark.parametrize("entry", ["src.analyses", "src.rate", "src.prevalence", "src.report"])
def test_installed_study_commands_compose_the_packaged_configuration(installed, entry):
    """The suite and the studies find the configuration inside the installed package (there is no conf/ beside
    it); ``--cfg job`` composes it without running the study."""
    _, bin_, elsewhere, _ = installed
    job = _sh([bin_ / "python", "-m", entry, "--cfg", "job"], elsewhere).stdout
    assert "roster:" in job and "output: results/results.json" in job
