"""Figures and the generated report (issue 5), and the suite/report entry points end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from src import ladder, report, simulate, verdicts
from src.aggregate import StackedLogit
from src.analyses import run_suite

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("Table 1", "Table 4", "Table 5", "Table 6", "Table 7", "Table 15", "Table 16", "Table 17", "Table 22",
          "Table 23")


def _frame() -> pd.DataFrame:
    parts = [simulate.panel(70, 2, [0.82] * 6, rho=0.1, abstain_rate=0.03, dataset="spread", seed=1,
                            frontier_accuracy=0.85),
             simulate.panel(70, 2, [0.95] + [0.57] * 5, rho=0.6, abstain_rate=0.03, dataset="dominant", seed=2,
                            frontier_accuracy=0.85)]
    return pd.concat(parts, ignore_index=True)


def _suite_cfg() -> dict:
    cfg = OmegaConf.merge(OmegaConf.load(ROOT / "conf/suite/default.yaml"), OmegaConf.load(ROOT / "conf/suite/fast.yaml"))
    cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg.pop("defaults", None)
    cfg["budget"].update(draws=20, curve_draws=4, curve_budgets=[10, 25, 50])
    cfg["mechanism"].update(subpanels=6, subpanel_boot=50)
    cfg["panel"]["n_boot"] = 50
    return cfg


def _docs() -> tuple[dict, dict]:
    return _docs_for(_frame())


def _docs_for(frame) -> tuple[dict, dict | None]:
    """results.json (the ladder, as src.run writes it) and, for a frame, the suite document."""
    if isinstance(frame, Path):
        t = verdicts.load(frame, frontier="frontier")
    else:
        t = verdicts.validate(frame, frontier="frontier")
    s = ladder.LadderSettings(n_boot=100, core=["spread", "dominant"])
    res = ladder.analyze(t, StackedLogit(), s)
    results = json.loads(json.dumps(ladder.to_json(res, s, {"verdicts": "sim", "members": t.members,
                                                            "frontier": t.frontier_name}), default=float))
    return results, None if isinstance(frame, Path) else run_suite(t, StackedLogit(), s, _suite_cfg())


@pytest.fixture(scope="module")
def docs():
    return _docs()


@pytest.fixture(scope="module")
def drawn(docs, tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    return out, report.figures(*docs, out)


def test_every_figure_is_drawn(drawn):
    import matplotlib.image as mpimg

    _, paths = drawn
    assert sorted(p.name for p in paths) == sorted(report.FIGURES.values())
    for p in paths:
        img = mpimg.imread(p)
        assert img.shape[0] > 200 and img.shape[1] > 300, p.name
        assert img[..., :3].std() > 0.05, f"{p.name} looks blank"


def test_report_mirrors_the_tables(docs, drawn):
    results, suite = docs
    fig_dir, _ = drawn
    out = report.write_docs(results, suite, fig_dir, fig_dir.parent / "report.md", redraw=False)
    text = out.read_text()
    for t in TABLES:
        assert f"## {t} " in text, t
    for link in re.findall(r"\]\(([^)]+\.png)\)", text):
        assert (out.parent / link).exists(), link
    assert "not drawn" not in text
    for name, s in results["datasets"].items():  # Table 1 carries each dataset's stacked κ
        row = next(line for line in text.splitlines() if line.startswith(f"| {name} | {s['n']} |"))
        assert f"{s['comparators']['stacked']['kappa']['estimate']:.3f}" in row
    assert "$0.0390" in text and "$2.520" in text  # the paper's cost inputs
    assert "40,306" in text and "80,613" in text
    dom = suite["datasets"]["dominant"]["leave_one_out"]
    assert dom["most_load_bearing"] == "m00" and "| dominant | " in text


def _without_frontier(results: dict, suite: dict) -> tuple[dict, dict]:
    results, suite = json.loads(json.dumps(results)), json.loads(json.dumps(suite))
    results["meta"]["frontier"] = suite["frontier"] = None
    for s in results["datasets"].values():
        s["comparators"].pop("frontier"), s["deltas"].pop("frontier")
    for s in suite["appendix_c"]["subpanels"]["datasets"].values():
        s["frontier"] = None
    return results, suite


def test_report_without_frontier_or_suite(docs, drawn, tmp_path):
    results, suite = _without_frontier(*docs)
    fig_dir, _ = drawn
    text = report.write_docs(results, suite, fig_dir, tmp_path / "r.md", redraw=False).read_text()
    assert "frontier: none" in text and "## Table 6" in text and "frontier κ" not in text
    text = report.write_docs(results, None, tmp_path / "g", tmp_path / "r2.md").read_text()
    assert "## Table 1 " in text and "## Table 6" not in text
    assert len(list((tmp_path / "g").glob("*.png"))) == 3  # Figs 2, 3a, 3b need only results.json


def _run(*args: str, env: dict) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_entry_points_end_to_end(tmp_path):
    """results.json → src.analyses (MLflow on) → src.report, on a bring-your-own table."""
    csv = tmp_path / "v.csv"
    _frame().to_csv(csv, index=False)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "RAIM_HYDRA_DIR": str(tmp_path / "hydra")}
    common = [f"verdicts={csv}", f"output={tmp_path}/results.json", "analysis.n_boot=100",
              "analysis.abstention_contrast=false",
              f"suite.output={tmp_path}/suite.json", f"suite.figures_dir={tmp_path}/figures",
              f"suite.report={tmp_path}/report.md"]
    results, _ = _docs_for(csv)
    (tmp_path / "results.json").write_text(json.dumps(results))
    _run("src.analyses", *common, "suite=fast", "suite.budget.draws=20", "suite.budget.curve_draws=4",
         "suite.budget.curve_budgets=[10,25]", "suite.mechanism.subpanels=5", "suite.mechanism.subpanel_boot=50",
         "suite.panel.n_boot=50", "tracking.enabled=true", env=env)
    suite = json.loads((tmp_path / "suite.json").read_text())
    assert set(suite["datasets"]) == {"spread", "dominant"}
    assert len(list((tmp_path / "figures").glob("*.png"))) == len(report.FIGURES)
    _run("src.report", *common, env=env)
    text = (tmp_path / "report.md").read_text()
    assert "## Table 23" not in text or "abstention" in text
    assert "![Fig. 5" in text

    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["raim"], filter_string="tags.kind = 'suite'", output_format="list")
    assert len(runs) == 1
    run = runs[0]
    assert any(k.startswith("regime/") for k in run.data.metrics)
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert "suite.json" in arts and "figures" in arts
    figs = mlflow.MlflowClient().list_artifacts(run.info.run_id, "figures")
    assert len(figs) == len(report.FIGURES)
    assert np.isclose(run.data.metrics["cost/paper_panel_per_1k"], 0.039, atol=5e-4)
