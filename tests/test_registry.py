"""Promotion to the model registry (src/mlops/registry.py): refused unless the decision is to deploy the panel
(admissible, a win vs the CV-best single, the κ floor reached); the log-panel command."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from test_track import QUIET, ROOT, children, log_simulated, tracking_store

from src.mlops import registry
from src.studies import stacking


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("registry")
    with tracking_store(tmp) as uri:
        rid, cfg, table, results, doc = log_simulated(tmp)
        yield {"uri": uri, "run_id": rid, "doc": doc, "kids": children(rid)}


def test_simulated_panels_are_what_the_tests_assume(store):
    good, bad = store["doc"]["datasets"]["good"], store["doc"]["datasets"]["bad"]
    assert good["admissibility"]["admissible"] and good["deltas"]["best_cv"]["kappa"]["call"] in registry.WINS
    assert not bad["admissibility"]["admissible"] and bad["deltas"]["best_cv"]["kappa"]["call"] not in registry.WINS


def test_refuses_an_inadmissible_panel_that_does_not_win_and_says_why(store):
    with pytest.raises(registry.PromotionRefused) as e:
        registry.promote(store["run_id"], dataset="bad")
    msg = str(e.value)
    assert "not admissible" in msg and "members at κ≥0.3" in msg
    assert "Δκ vs the CV-best single" in msg and "not a win" in msg


def test_refuses_an_ambiguous_parent_run(store):
    with pytest.raises(registry.PromotionRefused, match="pass --dataset"):
        registry.promote(store["run_id"])
    with pytest.raises(registry.PromotionRefused, match="no dataset run 'nope'"):
        registry.promote(store["run_id"], dataset="nope")


@pytest.mark.parametrize("admissible,call,ok", [
    ("true", "win", True), ("true", "clean win", True), ("true", "tie", False),
    ("false", "clean win", False), ("true", "clear worsening", False), ("true", None, False)])
def test_rule_needs_both_admissibility_and_a_win(admissible, call, ok):
    tags = {"admissible": admissible, "admissibility_reason": "r"}
    if call:
        tags["call.best_cv.kappa"] = call
    metrics = {"delta_best_cv/kappa": 0.01, "delta_best_cv/kappa_lo": -0.02, "delta_best_cv/kappa_hi": 0.04}
    assert (registry.reasons_to_refuse(tags, metrics) == []) is ok


def test_refuses_an_admissible_win_that_the_decision_does_not_deploy():
    """A run tagged with RAIM's decision: an admissible win under the κ floor is not the panel decision."""
    metrics = {"delta_best_cv/kappa": 0.05, "delta_best_cv/kappa_lo": 0.01, "delta_best_cv/kappa_hi": 0.09}
    tags = {"admissible": "true", "call.best_cv.kappa": "win", "decision": "none",
            "decision_reason": "the panel pays but is under the floor; stacked κ 0.350 < floor 0.4"}
    why = registry.reasons_to_refuse(tags, metrics)
    assert len(why) == 1 and "not to deploy the panel (the panel pays but is under the floor" in why[0]
    assert registry.reasons_to_refuse({**tags, "decision": "panel"}, metrics) == []


def test_promotes_a_winning_admissible_stacker_and_loads_it_by_alias(store):
    import mlflow

    mv = registry.promote(store["run_id"], dataset="good")
    assert mv.name == "raim-stacker-good" and mv.run_id == store["kids"]["good"].info.run_id
    client = mlflow.MlflowClient()
    assert client.get_model_version_by_alias("raim-stacker-good", "champion").version == mv.version
    model = mlflow.pyfunc.load_model("models:/raim-stacker-good@champion")
    out = model.predict(pd.DataFrame({f"m{j:02d}": [1.0, 0.0] for j in range(8)}))
    assert out["verdict"].tolist() == [1, 0] and out["p_hallucinated"][0] > 0.9 > 0.1 > out["p_hallucinated"][1]
    # promoting again makes a new version and moves the alias
    mv2 = registry.promote(store["kids"]["good"].info.run_id, alias="champion")
    assert int(mv2.version) == int(mv.version) + 1
    assert client.get_model_version_by_alias("raim-stacker-good", "champion").version == mv2.version


def test_cli_exit_status_and_message(store, capsys):
    env = {"MLFLOW_TRACKING_URI": store["uri"], **QUIET, "PATH": "/usr/bin:/bin"}
    refused = subprocess.run([sys.executable, "-m", "src.registry", "promote", "--run-id", store["run_id"],
                              "--dataset", "bad", "--alias", "champion"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == registry.REFUSED and "REFUSED" in refused.stderr and "not admissible" in refused.stderr
    ok = subprocess.run([sys.executable, "-m", "src.registry", "promote", "--run-id", store["run_id"],
                         "--dataset", "good", "--name", "cli-stacker", "--alias", "staging"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "models:/cli-stacker@staging" in ok.stdout
    assert registry.main(["show", "--name", "cli-stacker"]) == 0
    assert "aliases=['staging']" in capsys.readouterr().out


# ------------------------------------------------------------------------- models that cannot predict

def test_a_panel_with_a_silent_judge_promotes_a_model_that_predicts_its_own_example(tmp_path):
    """Stop-9 defect: a member that never voted was dropped from the stacker but kept in the logged signature
    and example; the registry promoted that model, which failed on every input, its own example included."""
    import mlflow
    from test_track import GOOD, simulate

    from src.mlops import serving as serve

    df = simulate.panel(150, 2, dataset="good", seed=1, **GOOD)
    df.insert(4, "silent", pd.array([pd.NA] * len(df), dtype="Int64"))  # a judge that never voted here
    (tmp_path / "v.csv").write_text(df.to_csv(index=False))
    with tracking_store(tmp_path):
        from test_track import analysis_overrides, compose_cfg

        from src.mlops import tracking as track

        cfg = compose_cfg(*analysis_overrides(tmp_path / "v.csv", tmp_path / "r.json"))
        table, results, doc = stacking.analyse(cfg)
        assert doc["datasets"]["good"]["excluded_members"] == ["silent"]
        rid = track.log_analysis(cfg, table, results, doc)
        mv = registry.promote(rid, dataset="good")
        uri = f"models:/{mv.name}@champion"
        assert serve.self_check(uri) is None
        model = mlflow.pyfunc.load_model(uri)
        assert model.metadata.get_input_schema().input_names() == [f"m{j:02d}" for j in range(8)]
        example = model.metadata.load_input_example(mlflow.artifacts.download_artifacts(uri))
        assert len(model.predict(example)) == len(example)


def test_refuses_a_logged_stacker_that_cannot_predict_its_example(tmp_path):
    import mlflow

    from src.mlops import serving as serve

    with tracking_store(tmp_path):
        rid, cfg, table, results, doc = log_simulated(tmp_path, which=("good",))
        kid = children(rid)["good"].info.run_id
        cols = [f"m{j:02d}" for j in range(8)] + ["ghost"]  # one column more than the stacker was fitted on
        example = pd.DataFrame([[1.0] * 9, [0.0] * 9], columns=cols)
        with mlflow.start_run(run_id=kid):
            info = serve._log_pyfunc("broken", serve.StackerModel(results["good"].stacker, cols),
                                     serve.stacker_signature(cols), example)
            mlflow.set_tag("stacker_model_uri", info.model_uri)
        with pytest.raises(registry.PromotionRefused) as e:
            registry.promote(kid)
        assert "cannot serve: it cannot predict its own input example" in str(e.value)
        assert "9 features" in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(ValueError, match="cannot be logged"):  # and RAIM itself never logs such a model
            with mlflow.start_run():
                serve.log_stacker(results["good"].stacker, cols, example)


@pytest.mark.parametrize("args,expect", [
    (["promote", "--run-id", "0123456789abcdef"], "promote: Run with id=0123456789abcdef not found"),
    (["show", "--name", "no-such-model"], "show: Registered Model with name=no-such-model not found"),
    (["log-panel", "--roster", "nope", "--stacker-uri", "models:/x@y"], "no roster 'nope' under conf/roster"),
])
def test_cli_errors_are_one_line(store, args, expect):
    env = {"MLFLOW_TRACKING_URI": store["uri"], **QUIET, "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "src.registry", *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.startswith(f"error: {expect}") and len(p.stderr.splitlines()) == 1
