"""The figures (src/present/figures.py), the generated report (src/present/report.py and the section modules
beside it) that opens with the deployment decision, and the suite/report entry points end to end."""

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

from src.core import ladder, ladderbase, verdicts
from src.core.aggregate import StackedLogit
from src.present import cost, decision, figures, markdown, report
from src.present import ladder as ladder_tables
from src.studies import simulate
from src.studies.suite import run_suite

ROOT = Path(__file__).resolve().parents[1]
TABLES = (
    "Table 1",
    "Table 4",
    "Table 5",
    "Table 6",
    "Table 7",
    "Table 15",
    "Table 16",
    "Table 17",
    "Table 22",
    "Table 23",
)


def _frame() -> pd.DataFrame:
    parts = [
        simulate.panel(
            100, 2, [0.82] * 6, rho=0.1, abstain_rate=0.03, dataset="spread", seed=1, frontier_accuracy=0.85
        ),
        simulate.panel(
            70, 2, [0.95] + [0.57] * 5, rho=0.6, abstain_rate=0.03, dataset="dominant", seed=2, frontier_accuracy=0.85
        ),
    ]
    return pd.concat(parts, ignore_index=True)


def _suite_cfg() -> dict:
    cfg = OmegaConf.merge(
        OmegaConf.load(ROOT / "conf/suite/default.yaml"), OmegaConf.load(ROOT / "conf/suite/fast.yaml")
    )
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
    s = ladderbase.LadderSettings(n_boot=100, core=["spread", "dominant"])
    res = ladder.analyze(t, StackedLogit(), s)
    results = json.loads(
        json.dumps(
            ladder.to_json(res, s, {"verdicts": "sim", "members": t.members, "frontier": t.frontier_name}),
            default=float,
        )
    )
    return results, None if isinstance(frame, Path) else run_suite(t, StackedLogit(), s, _suite_cfg())


@pytest.fixture(scope="module")
def docs():
    return _docs()


@pytest.fixture(scope="module")
def drawn(docs, tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    return out, figures.draw(*docs, out)


def test_every_figure_is_drawn(drawn):
    import matplotlib.image as mpimg

    _, paths = drawn
    assert sorted(p.name for p in paths) == sorted(figures.FIGURES.values())
    for p in paths:
        img = mpimg.imread(p)
        assert img.shape[0] > 200 and img.shape[1] > 300, p.name
        assert img[..., :3].std() > 0.05, f"{p.name} looks blank"


def test_report_mirrors_the_tables(docs, drawn):
    results, suite = docs
    fig_dir, _ = drawn
    out = report.write_docs(results, suite, fig_dir, fig_dir.parent / "report.md", redraw=False)
    text = out.read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    for t in TABLES:  # the paper's numbers are references in a heading that says what the section is
        assert any(f"(paper {t}" in h and not h.startswith(f"## {t}") for h in headings), t
    assert not [h for h in headings if h.startswith(("## Table", "## Fig", "## Appendix"))], headings
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


def _rows(text: str, first_cell: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"| {first_cell} |")]


def test_report_opens_with_one_decision_per_dataset(docs, drawn, tmp_path):
    results, suite = docs
    text = report.write_docs(results, suite, drawn[0], tmp_path / "r.md", redraw=False).read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    head = "| Dataset | Decision | κ of | κ [95% CI] | Call vs the CV-best single (evidence) | Reason |"
    assert lines[:3] == ["# RAIM report", "## What to deploy", head]
    got = {n: d["action"] for n, d in results["datasets"].items() for d in [d["decision"]]}
    assert got == {"spread": "panel", "dominant": "single"}  # competent and decorrelated; one dominant member
    for name, s in results["datasets"].items():
        d = s["decision"]
        row = _rows(text.split("## The stacker")[0], name)
        assert len(row) == 1 and d["label"] in row[0] and d["reason"] in row[0], row
        # the call with the evidence it rests on: the discordant items and each arm's abstentions
        k, ab = d["discordant"], d["abstentions"]
        evidence = (
            f"{k} discordant item{'' if k == 1 else 's'}; abstentions: panel {ab['panel']}, single {ab['single']}"
        )
        assert f"| {d['call']} ({evidence}" in row[0], row
    assert "**deploy the single judge m00**" in text and "kappa_floor=0.4" in text
    whose = {n: _rows(text, n)[0].split(" | ")[2] for n in results["datasets"]}  # whose κ the row quotes
    assert whose == {"spread": "stacked panel", "dominant": "single judge m00"}


def test_the_kappa_of_nothing_deployed_names_the_better_of_the_two():
    s = {"comparators": {"stacked": {"kappa": {"estimate": 0.12}}}, "selected": {"oracle": "m03"}}
    none = {"action": "none", "member": None}
    assert decision.kappa_of({**none, "kappa": 0.12}, s) == "stacked panel (the better)"
    assert decision.kappa_of({**none, "kappa": 0.23}, s) == "CV-best single m03 (the better)"


def test_an_older_results_json_is_decided_by_the_report(docs, tmp_path):
    results = json.loads(json.dumps(docs[0]))
    for s in results["datasets"].values():
        s.pop("decision")
    results["skipped"] = {
        "newset": {"reason": "no verdict cached", "command": "python -m src.judges --datasets newset"}
    }
    text = report.markdown(results, None, tmp_path, tmp_path / "r.md")
    for name, s in docs[0]["datasets"].items():
        assert s["decision"]["label"] in _rows(text, name)[0]
    assert "| newset | not analysed | — | — | — | no verdict cached; compute with `python -m src.judges" in text
    assert "## What to deploy" not in report.markdown(None, docs[1], tmp_path, tmp_path / "r.md")


def test_ladder_tables_name_the_chosen_single_judges(docs):
    results, _ = docs
    s = results["datasets"]["dominant"]
    row = _rows(ladder_tables.table1(results), "dominant")[0].split(" | ")
    best_avg, best_cv, oracle = row[5:8]
    assert best_cv == f"{s['comparators']['best_cv']['kappa']['estimate']:.3f} (m00)" and oracle.endswith("(m00)")
    assert best_avg.endswith(f"({s['selected']['best_avg']})")
    folds = {"best_cv_per_fold": ["a", "b", "a", "a", "b"]}
    assert ladder_tables.chosen({"selected": folds}, "best_cv") == "a 3/5, b 2/5"
    ladder_k = ladder_tables.method_ladder(results, "kappa")
    assert any(line.startswith("| best single (CV) |") and "(m00)" in line for line in ladder_k.splitlines())


def test_dash_cells_say_why(docs):
    _, suite = docs
    suite = json.loads(json.dumps(suite))
    panel = suite["cost"]["panel"]
    panel["panel_per_1k"], panel["frontier"]["per_1k"] = 14.02, 2.52
    panel["calibration"]["all"] = {
        "price_per_label": 1.0,
        "labels_per_record": 2.0,
        "records": {"50": {"cost": 100.0, "break_even_items": None}},
    }
    text = cost.cost_section(suite)
    assert "| 50 | $100 | — |" in text
    assert "—: never: the panel costs $14.02 per 1k items, the frontier judge $2.52" in text
    assert markdown.dash_note([["a", "1"]], "why") == "" and markdown.dash_note([["a", "—"]], "why") == "\n\n—: why"


def test_no_figure_without_datasets(tmp_path):
    assert figures.draw({"datasets": {}}, {"datasets": {}, "cost": {}}, tmp_path) == []


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
    assert "frontier: none" in text and "(paper Table 6)" in text and "frontier κ" not in text
    text = report.write_docs(results, None, tmp_path / "g", tmp_path / "r2.md").read_text()
    assert "(paper Table 1)" in text and "(paper Table 6)" not in text
    assert len(list((tmp_path / "g").glob("*.png"))) == 3  # Figs 2, 3a, 3b need only results.json


def _run(*args: str, env: dict) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.mark.slow
def test_entry_points_end_to_end(tmp_path):
    """results.json → src.analyses (MLflow on) → src.report, on a bring-your-own table."""
    csv = tmp_path / "v.csv"
    _frame().to_csv(csv, index=False)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
        "RAIM_HYDRA_DIR": str(tmp_path / "hydra"),
    }
    common = [
        f"verdicts={csv}",
        f"output={tmp_path}/results.json",
        "analysis.n_boot=100",
        "analysis.abstention_contrast=false",
        f"suite.output={tmp_path}/suite.json",
        f"suite.figures_dir={tmp_path}/figures",
        f"suite.report={tmp_path}/report.md",
    ]
    results, _ = _docs_for(csv)
    (tmp_path / "results.json").write_text(json.dumps(results))
    _run(
        "src.analyses",
        *common,
        "suite=fast",
        "suite.budget.draws=20",
        "suite.budget.curve_draws=4",
        "suite.budget.curve_budgets=[10,25]",
        "suite.mechanism.subpanels=5",
        "suite.mechanism.subpanel_boot=50",
        "suite.panel.n_boot=50",
        "tracking.enabled=true",
        env=env,
    )
    suite = json.loads((tmp_path / "suite.json").read_text())
    assert set(suite["datasets"]) == {"spread", "dominant"}
    assert len(list((tmp_path / "figures").glob("*.png"))) == len(figures.FIGURES)
    _run("src.report", *common, env=env)
    text = (tmp_path / "report.md").read_text()
    assert "(paper Table 23)" not in text or "abstention" in text
    assert "![Leave-one-member-out Δκ (paper Fig. 5)](" in text

    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=["raim"], filter_string="tags.kind = 'suite'", output_format="list")
    assert len(runs) == 1
    run = runs[0]
    assert any(k.startswith("regime/") for k in run.data.metrics)
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert "suite.json" in arts and "figures" in arts
    figs = mlflow.MlflowClient().list_artifacts(run.info.run_id, "figures")
    assert len(figs) == len(figures.FIGURES)
    assert np.isclose(run.data.metrics["cost/paper_panel_per_1k"], 0.039, atol=5e-4)
