"""`python -m src.run verdicts=PATH` end to end: results.json holds what the spine issue asks for."""

import json
import os
import subprocess
import sys

import pytest

from src import run, simulate
from src.ladder import COMPARATORS
from src.verdicts import VerdictError

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table_csv(tmp_path_factory):
    p = tmp_path_factory.mktemp("byo") / "verdicts.csv"
    df = simulate.suite(n_datasets=2, n_items=300, n_members=6, seed=4)
    df.to_csv(p, index=False)
    return p


def test_cli_writes_results_json(table_csv, tmp_path):
    out = tmp_path / "res" / "results.json"
    env = dict(os.environ, RAIM_HYDRA_DIR=str(tmp_path / "hydra"))
    proc = subprocess.run([sys.executable, "-m", "src.run", f"verdicts={table_csv}", "analysis=fast",
                           "tracking.enabled=false", f"output={out}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["datasets"]) == {"sim0", "sim1"}
    for name, d in doc["datasets"].items():
        assert set(d["comparators"]) == set(COMPARATORS)
        for c, v in d["comparators"].items():
            for m in ("kappa", "bacc", "f1"):
                lo, hi = v[m]["ci"]
                assert lo <= v[m]["estimate"] + 1e-9 and v[m]["estimate"] <= hi + 1e-9 or c == "oracle"
        for c, v in d["deltas"].items():
            assert v["kappa"]["call"] in {"win", "clean win", "tie", "clear improvement", "clear worsening",
                                          "unresolved"}
            assert set(v["bacc"]) >= {"estimate", "ci", "p_one_sided", "p_holm", "call"}
        assert set(d["stacker"]["beta_mean"]) == {"intercept", *[f"m{j:02d}" for j in range(6)]}
        assert len(d["stacker"]["beta_folds"]) == 5
        assert set(d["members"]["m00"]) >= {"kappa", "bacc", "coverage"}
        assert set(d["admissibility"]) >= {"phi_bar", "agreement_proxy", "members_at_kappa0", "kappa0", "c",
                                           "phi0", "admissible"}
    assert "sim0" in proc.stderr + proc.stdout  # the per-dataset log lines


def test_dataset_filter_and_errors(compose_cfg, table_csv, tmp_path):
    cfg = compose_cfg(f"verdicts={table_csv}", "analysis=fast", "dataset=medhallu")
    with pytest.raises(VerdictError, match="no rows with dataset == 'medhallu'"):
        run.load_table(cfg)
    cfg = compose_cfg(f"verdicts={tmp_path / 'missing.csv'}")
    with pytest.raises(VerdictError, match="not found"):
        run.load_table(cfg)


def test_stacker_group_switches_abstention_encoding(compose_cfg, table_csv):
    cfg = compose_cfg(f"verdicts={table_csv}", "analysis=fast", "stacker=logreg_categorical",
                      "analysis.abstention_contrast=false")
    _, results, doc = run.analyse(cfg)
    names = doc["datasets"]["sim0"]["stacker"]["features"]
    assert names[:2] == ["m00=1", "m01=1"] and "m00=abstain" in names


def test_members_that_never_voted_are_set_aside(tmp_path):
    from src import ladder, verdicts
    from src.aggregate import StackedLogit

    df = simulate.panel(n_clusters=60, accuracies=[0.9, 0.8, 0.7], seed=2)
    df["m02"] = None  # e.g. an evidence-based judge on an ungrounded set, or a member not run yet
    res = ladder.analyze(verdicts.validate(df), StackedLogit(), ladder.LadderSettings(n_boot=50))["sim"].summary
    assert res["excluded_members"] == ["m02"] and set(res["members"]) == {"m00", "m01"}
    assert res["admissibility"]["n_members"] == 2 and res["selected"]["best_avg"] == "m00"
