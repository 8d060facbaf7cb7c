"""The deploy path a newcomer walks (docs/deploy.md): a model whose own run did not decide "deploy the panel"
says so when it predicts or serves; a judge whose weights are not installed is one line naming the install
command; runs have names that say what they analysed; ``registry show`` lists a model's input columns; a
refusal is an ``error:`` line; the server prints one "ready on" line; the shipped simulated example table is
one on which the panel is admissible, wins and is promoted.

Every MLflow store here is a throwaway sqlite one under pytest's tmp dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_track import QUIET, compose_cfg, free_port, tracking_store

from src import predict
from src.core.aggregate import StackedLogit
from src.judges import weights
from src.mlops import packaging, registry
from src.mlops import serving as serve
from src.mlops import tracking as track
from src.studies.checked import check_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "simulated-panel.csv"
EXAMPLE_CLUSTERS = 150
NONE = {"action": "none", "label": "nothing here is good enough", "reason": "neither reaches κ_min = 0.40"}
PANEL = {"action": "panel", "label": "deploy the panel", "reason": "admissible, a win, κ 0.61 ≥ 0.40"}
ITEM = ["--evidence", "Paris is the capital of France.", "--candidate", "The capital of France is Lyon."]


def fitted(n: int, seed: int = 0) -> StackedLogit:
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, 300)
    X = np.column_stack([np.where(rng.random(300) < q, gold, 1 - gold) for q in (0.8, 0.7, 0.65)[:n]])
    return StackedLogit(n_votes=n).fit(X.astype(float), gold)


def cli(capsys, main, *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    got = capsys.readouterr()
    return code, got.out, got.err


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Lexical-only stackers (the lexical judge needs no weights): one whose model carries the decision
    "nothing here is good enough", one "deploy the panel", and one logged without a decision in a run tagged
    ``decision=single`` (a model logged before models carried their decision)."""
    import mlflow

    tmp = tmp_path_factory.mktemp("deploy")
    tags = {"roster": "tiny", "dataset": "wice", "frame": "auto", "kind": "stacking"}
    with tracking_store(tmp) as uri:
        uris = {}
        for name, decision, extra in (
            ("none", NONE, {}),
            ("panel", PANEL, {}),
            (
                "tagged",
                None,
                {
                    "decision": "single",
                    "decision_member": "lexical",
                    "decision_reason": "the CV-best single reaches κ_min",
                },
            ),
        ):
            with mlflow.start_run(tags={**tags, **extra}):
                uris[name] = packaging.log_stacker(fitted(1), ["lexical"], decision=decision).model_uri
        yield {"uri": uri, "tmp": tmp, **uris}


# ----------------------------------------------------------------------- the run's decision travels with the model


def test_a_stacker_whose_run_did_not_decide_panel_says_so_in_every_output_row(store):
    import mlflow

    votes = pd.DataFrame({"lexical": [1.0, 0.0]})
    out = mlflow.pyfunc.load_model(store["none"]).predict(votes)
    assert out["run_decision"].tolist() == ["nothing here is good enough"] * 2
    assert "run_decision" not in mlflow.pyfunc.load_model(store["panel"]).predict(votes)
    info = mlflow.models.get_model_info(store["none"])
    assert info.metadata["run_decision"] == "nothing here is good enough"
    assert serve.decision_warning(PANEL) is None and serve.decision_warning(None) is None
    assert "'nothing here is good enough', not 'deploy the panel'" in serve.decision_warning(NONE)


@pytest.mark.parametrize(
    "which, label",
    [("none", "nothing here is good enough"), ("tagged", "deploy the single judge lexical"), ("panel", None)],
)
def test_predict_warns_and_records_when_the_models_run_did_not_decide_panel(store, capsys, tmp_path, which, label):
    out_path = tmp_path / "out.jsonl"
    code, out, err = cli(
        capsys,
        predict.main,
        "--model-uri",
        store[which],
        "--roster",
        "tiny",
        *ITEM,
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(out_path),
        "--no-progress",
    )
    assert code == 0, err
    rows = [json.loads(ln) for ln in out_path.read_text().splitlines()]
    if label is None:
        assert "warning" not in err and "run_decision" not in rows[0]
        return
    assert f"warning: this model's run decided {label!r}, not 'deploy the panel'" in err
    assert rows[0]["run_decision"] == label
    assert f"the model's own run decided {label!r}" in out


def test_a_panel_model_carries_its_stackers_decision(store, tmp_path):
    import mlflow

    from src.io.config import thaw
    from src.judges.config import load_roster

    with tracking_store(store["tmp"]):
        roster = thaw(load_roster("tiny"))
        with mlflow.start_run():
            uri = packaging.log_panel(roster, fitted(1), ["lexical"], cache_dir=tmp_path / "c", decision=NONE).model_uri
        out = mlflow.pyfunc.load_model(uri).predict(
            pd.DataFrame({"evidence": ["Paris is in France."], "candidate": ["Paris is in Spain."]})
        )
    assert out["run_decision"].tolist() == ["nothing here is good enough"]


@pytest.mark.slow
def test_the_server_prints_one_ready_line_and_warns_about_the_runs_decision(store):
    port = free_port()
    env = {**os.environ, **QUIET, "MLFLOW_TRACKING_URI": store["uri"]}
    proc = subprocess.Popen(
        [sys.executable, "-m", "src.serve", "model", "--model-uri", store["none"], "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()  # blocks until the server is listening (or has died)
        import urllib.request

        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            method="POST",
            data=json.dumps({"dataframe_records": [{"lexical": 1}]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            answer = json.loads(r.read())
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
    err = proc.stderr.read()
    assert line.startswith(f"ready on http://127.0.0.1:{port}/invocations (StackerModel ")
    assert "member columns ['lexical']" in line
    assert proc.stdout.read().strip() == ""  # one line, nothing else on stdout
    assert "warning: this model's run decided 'nothing here is good enough'" in err
    assert answer["predictions"][0]["run_decision"] == "nothing here is good enough"


# ------------------------------------------------------------------------------------------- missing weights


def test_a_missing_weight_package_is_one_line_naming_the_install_command(store, capsys, tmp_path, monkeypatch):
    """A stacker of the `cpu` roster's qwen05b on an install without that judge's weight packages."""
    import mlflow

    w = weights.WEIGHTS["qwen2.5-coder-0.5b"]
    monkeypatch.setitem(
        weights.WEIGHTS,
        w.key,
        weights.Weight(w.key, w.filename, w.sha256, w.packages, "parts", ("raim_test_no_such_model_part1",)),
    )
    monkeypatch.setattr(weights, "MODELS_DIR", tmp_path / "models")
    with pytest.raises(weights.WeightsMissing) as e:
        weights.resolve(w.key)
    assert "RAIM_MODELS=all bash scripts/setup.sh" in str(e.value) and "\n" not in str(e.value)
    with tracking_store(store["tmp"]):
        with mlflow.start_run(tags={"roster": "cpu", "dataset": "wice", "frame": "auto", "kind": "stacking"}):
            uri = packaging.log_stacker(fitted(2), ["qwen05b", "lexical"], decision=NONE).model_uri
        capsys.readouterr()  # MLflow's own chatter while logging
        code, out, err = cli(
            capsys, predict.main, "--model-uri", uri, *ITEM, "--cache-dir", str(tmp_path / "cache"), "--no-progress"
        )
    lines = [ln for ln in err.splitlines() if not ln.startswith("warning: ")]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: ") and "'qwen2.5-coder-0.5b'" in lines[0]
    assert "install them with `RAIM_MODELS=all bash scripts/setup.sh`" in lines[0]
    assert "Traceback" not in err


# ------------------------------------------------------------------------------------------------- MLflow UI


def test_runs_are_named_kind_roster_dataset():
    assert track.default_run_name("stacking", {"roster": "cpu", "dataset": "wice"}) == "stacking/cpu/wice"
    assert (
        track.default_run_name("stacking", {"verdicts": "/x/v.csv", "dataset": "all"}) == "stacking/verdicts=v.csv/all"
    )
    assert track.default_run_name("panel", {"roster": "tiny"}) == "panel/tiny"


def test_an_analysis_run_and_its_dataset_runs_carry_those_names(tmp_path):
    import mlflow

    with tracking_store(tmp_path):
        cfg = compose_cfg(
            "analysis=fast",
            "analysis.abstention_contrast=false",
            f"verdicts={EXAMPLE}",
            f"output={tmp_path / 'results.json'}",
        )
        from src.studies import stacking

        table, results, doc = stacking.analyse(check_config(cfg))
        run_id = track.log_analysis(check_config(cfg), table, results, doc)
        parent = mlflow.get_run(run_id)
        kids = mlflow.search_runs(
            search_all_experiments=True, output_format="list", filter_string=f"tags.mlflow.parentRunId = '{run_id}'"
        )
    assert parent.info.run_name == "stacking/verdicts=simulated-panel.csv/all (1 dataset)"
    assert [k.info.run_name for k in kids] == ["stacking/verdicts=simulated-panel.csv/simulated"]


# ------------------------------------------------------------------------------ the shipped simulated example


def test_the_shipped_example_is_the_simulation_it_says_it_is():
    """examples/simulated-panel.csv is simulated (src.studies.simulate), never measured: regenerate it."""
    from src.studies import simulate

    again = simulate.panel(EXAMPLE_CLUSTERS, 2, dataset="simulated", seed=1, accuracies=[0.75] * 8, rho=0.05)
    assert again.to_csv(index=False) == EXAMPLE.read_text()


@pytest.mark.slow
def test_on_the_shipped_example_the_panel_is_promoted_and_serves(tmp_path, capsys):
    """The walk-through of docs/deploy.md: src.run on the simulated table decides "deploy the panel", the
    promotion passes the gate, ``registry show`` lists the input columns and the champion scores votes."""
    import mlflow

    env = {**os.environ, **QUIET, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    run = subprocess.run(
        [sys.executable, "-m", "src.run", f"verdicts={EXAMPLE}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "simulated: " in run.stdout and "admissible" in run.stdout and "→ deploy the panel" in run.stdout
    run_id = next(ln for ln in run.stdout.splitlines() if ln.startswith("MLflow run ")).split()[2].rstrip("…;")
    with tracking_store(tmp_path):
        full = mlflow.search_runs(
            search_all_experiments=True,
            output_format="list",
            filter_string="tags.kind = 'stacking' and tags.dataset = 'all'",
        )
        run_id = next(r.info.run_id for r in full if r.info.run_id.startswith(run_id))
        code, out, err = cli(capsys, registry.main, "promote", "--run-id", run_id, "--dataset", "simulated")
        assert code == 0, err
        assert "promoted: raim-stacker-simulated version 1" in out
        code, out, err = cli(capsys, registry.main, "show", "--name", "raim-stacker-simulated")
        assert "input columns: m00, m01, m02, m03, m04, m05, m06, m07" in out
        model = mlflow.pyfunc.load_model("models:/raim-stacker-simulated@champion")
        got = model.predict(pd.DataFrame([{f"m0{j}": 1.0 for j in range(8)}]))
    assert got["label"].tolist() == ["hallucinated"] and "run_decision" not in got
