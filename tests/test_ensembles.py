"""The stacked panel against MLflow's own judge ensembles (src/studies/ensembles.py, src.mlops.scorers, `python -m
src.traces`): the comparison's statistics on a simulated table (fake aggregations are enough there), the same
paired intervals as the ladder's, MLflow's real make_scorer_ensemble over RAIM's member scorers on the committed
cpu verdict cache, and the study's command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from src.core import ladder, ladderbase
from src.core.aggregate import StackedLogit
from src.core.verdicts import ABSTAIN, validate
from src.io.config import thaw
from src.studies import ensembles
from src.studies.checked import check_config

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ladderbase.LadderSettings(n_boot=300, seed=0)


def simulated(n_clusters: int = 120, seed: int = 0, abstain: float = 0.05):
    """A verdict table of four members of unequal accuracy, pairs of items per cluster, some abstentions."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(n_clusters):
        for g in (0, 1):
            row = {"item_id": f"c{c}-{g}", "cluster_id": f"c{c}", "dataset": "sim", "gold": g}
            for m, acc in zip("abcd", (0.85, 0.75, 0.65, 0.6)):
                v = g if rng.random() < acc else 1 - g
                row[m] = None if rng.random() < abstain else v
            rows.append(row)
    return validate(pd.DataFrame(rows), source="simulated")


def numpy_ensembles(table):
    """MLflow's rules written out: majority_vote refuses an item with an abstention and breaks a tie to False;
    mean flags at ≥ 0.5 of the members."""

    def fn(name, members):
        V = table.votes
        refused = (V == ABSTAIN).any(axis=1)
        share = np.where(refused, np.nan, V.mean(axis=1))
        maj = np.where(refused, ABSTAIN, (share > 0.5).astype(float))
        mean = np.where(refused, ABSTAIN, (share >= 0.5).astype(float))
        n = int(refused.sum())
        return {"majority_vote": maj, "mean": mean}, {"majority_vote": n, "mean": n}, V.copy()

    return fn


def test_the_comparison_scores_every_aggregation_and_pairs_the_deltas():
    table = simulated()
    doc = ensembles.study(table, StackedLogit(), SETTINGS, numpy_ensembles(table))
    d = doc["datasets"]["sim"]
    assert list(d["methods"]) == ["stacked", "mlflow_majority_vote", "mlflow_mean", "raim_majority"]
    assert d["methods"]["mlflow_mean"]["refused"] == d["items_with_an_abstention"] > 0
    assert d["methods"]["mlflow_mean"]["coverage"] == pytest.approx(1 - d["items_with_an_abstention"] / d["n"])
    for k, per in d["deltas"].items():
        est = d["methods"]["stacked"]["kappa"]["estimate"] - d["methods"][k]["kappa"]["estimate"]
        assert per["kappa"]["estimate"] == pytest.approx(est)
        lo, hi = per["kappa"]["ci"]
        assert lo < per["kappa"]["estimate"] < hi and per["kappa"]["se"] > 0
    assert sum(doc["summary"]["mlflow_mean"][c] for c in ("clear improvement", "unresolved", "clear worsening")) == 1
    assert any("MLflow refused" in line for line in ensembles.statements(doc))
    assert ensembles.flat_metrics(doc)["sim/delta_mlflow_mean/kappa"] == d["deltas"]["mlflow_mean"]["kappa"]["estimate"]


def test_the_reference_majority_delta_is_the_ladders():
    """stacked − RAIM's majority here is the ladder's own Δ (same folds, draws, refit and correction)."""
    table = simulated(seed=3)
    doc = ensembles.study(table, StackedLogit(), SETTINGS, numpy_ensembles(table))
    ours = doc["datasets"]["sim"]["deltas"]["raim_majority"]
    ((name, t),) = list(table.each_dataset())
    theirs = ladder.analyze_dataset(t, StackedLogit(), SETTINGS, None).summary["deltas"]["majority"]
    for m in ("kappa", "bacc"):
        assert ours[m]["estimate"] == pytest.approx(theirs[m]["estimate"])
        assert ours[m]["ci"] == pytest.approx(theirs[m]["ci"], abs=1e-9)


def test_scorers_that_disagree_with_the_table_are_refused():
    table = simulated()

    def lying(name, members):
        preds, refused, seen = numpy_ensembles(table)(name, members)
        seen[7, 2] = 1 - seen[7, 2] if seen[7, 2] != ABSTAIN else 0.0
        return preds, refused, seen

    with pytest.raises(ensembles.EnsembleStudyError, match="item 'c3-1': member 'c' scored .* through MLflow but"):
        ensembles.study(table, StackedLogit(), SETTINGS, lying)


@pytest.fixture(scope="module")
def expertqa(tmp_path_factory):
    """The committed cpu roster's expertqa verdicts (one item has an abstaining member) and its items."""
    from hydra import compose, initialize_config_dir

    from src import traces
    from src.judges.tables import load_table

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=["dataset=expertqa"])
    table = load_table(check_config(cfg))
    return cfg, table, traces.benchmark_items(check_config(cfg), "expertqa", table)


def test_mlflow_make_scorer_ensemble_over_raim_member_scorers(expertqa):
    from omegaconf import OmegaConf

    from src.judges.tables import frame_for
    from src.mlops import scorers, traces

    cfg, table, items = expertqa
    t, _ = ladderbase.active_members(table)
    frame = frame_for(check_config(cfg), "expertqa")
    roster = OmegaConf.to_container(cfg.roster, resolve=True)
    votes = scorers.Votes(roster, {frame["name"]: thaw(frame)}, frame["name"], ROOT / cfg.paths.cache_dir, False)
    s = traces.settings()
    preds, refused, seen = scorers.ensemble_predictions(
        votes, items, list(t.members), ["majority_vote", "mean"], 0.5, s.mapping, "expertqa"
    )
    assert np.array_equal(seen, t.votes)  # every member scorer read the table's vote
    gone = (t.votes == ABSTAIN).any(axis=1)
    assert refused == {"majority_vote": int(gone.sum()), "mean": int(gone.sum())} and gone.sum() == 1
    share = t.votes[~gone].mean(axis=1)
    assert np.array_equal(preds["majority_vote"][~gone], (share > 0.5).astype(float))  # a 3–3 tie: False
    assert np.array_equal(preds["mean"][~gone], (share >= 0.5).astype(float))
    assert (preds["mean"][gone] == ABSTAIN).all()


@pytest.mark.slow
def test_the_study_command_writes_its_document_figure_and_run(tmp_path):
    out, fig = tmp_path / "traces.json", tmp_path / "traces.png"
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "RAIM_HYDRA_DIR": str(tmp_path / "h")}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.traces",
            "dataset=medhallu",
            f"traces.output={out}",
            f"traces.figure={fig}",
            "analysis.n_boot=200",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, **env},
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(out.read_text())
    d = doc["datasets"]["medhallu"]
    assert set(d["methods"]) == {"stacked", "mlflow_majority_vote", "mlflow_mean", "raim_majority"}
    assert doc["meta"]["mlflow"].startswith("3.17") and fig.stat().st_size > 10_000
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    (run,) = mlflow.search_runs(experiment_names=["raim"], filter_string="tags.kind = 'traces'", output_format="list")
    assert run.data.metrics["medhallu/delta_mlflow_majority_vote/kappa"] == pytest.approx(
        d["deltas"]["mlflow_majority_vote"]["kappa"]["estimate"]
    )
    mlflow.set_tracking_uri(None)


def test_the_report_section_and_figure_of_the_study(tmp_path):
    from src.present import report
    from src.present.traces import traces_figure, traces_section

    table = simulated()
    doc = ensembles.study(table, StackedLogit(), SETTINGS, numpy_ensembles(table))
    doc["settings"], doc["meta"] = {"ensembles": ["majority_vote", "mean"], "mean_threshold": 0.5}, {"mlflow": "3.17.2"}
    text = "\n".join(traces_section(doc))
    assert "MLflow make_scorer_ensemble: majority_vote" in text and "refused by MLflow" in text
    assert (
        f"| sim | RAIM stacked panel (cross-fitted) | {doc['datasets']['sim']['methods']['stacked']['kappa']['estimate']:.3f}"
        in text
    )
    fig = traces_figure(doc, tmp_path / "traces.png")
    assert fig.read_bytes()[:4] == b"\x89PNG"
    md = "\n".join(report.beyond_sections({"traces": (doc, fig)}, tmp_path / "report.md"))
    assert md.startswith("## The panel against MLflow's own judge ensembles") and "traces.png" in md
