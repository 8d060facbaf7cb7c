"""Promotion to the model registry (src/mlops/registry.py): refused unless the decision is to deploy the panel
(admissible, a win vs the CV-best single, the κ floor reached); the log-panel command."""

from __future__ import annotations

import copy
import subprocess
import sys

import pandas as pd
import pytest
from test_track import QUIET, ROOT, children, log_simulated, tracking_store

from src.core.evidence import comparison
from src.mlops import registry
from src.studies import stacking
from src.studies.checked import check_config


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


def _variant(
    s: dict, kappas: float | None = None, ci: tuple | None = None, oracle_lo: float | None = None, record: bool = True
) -> dict:
    """A copy of a results.json entry with its members' κ, its Δκ interval vs the CV-best single or the oracle's
    lower bound changed; ``record``: its recorded verdict, call and decision follow (as RAIM would write them)."""
    s, key = copy.deepcopy(s), comparison(s)  # the comparison the decision reads: the CV-best single as deployed
    if kappas is not None:
        for m in s["members"].values():
            m["kappa"] = kappas
    if ci is not None:
        s["deltas"][key]["kappa"]["ci"] = list(ci)
    if oracle_lo is not None:
        s["deltas"]["oracle"]["kappa"]["ci"][0] = oracle_lo
    if record:
        r = registry.rederive(s, SETTINGS)
        s["admissibility"]["admissible"] = r["admissible"]
        s["deltas"][key]["kappa"]["call"] = r["call"]
        s["decision"] = r["decision"].as_dict()
    return s


SETTINGS = {"kappa0": 0.30, "c": 0.5, "phi0": 0.40, "kappa_floor": 0.40}


@pytest.mark.parametrize(
    "change,ok",
    [
        ({}, True),
        ({"oracle_lo": 0.01}, True),
        ({"ci": (-0.01, 0.2)}, False),
        ({"kappas": 0.1}, False),
        ({"ci": (-0.3, -0.1)}, False),
        ({"kappas": 0.1, "ci": (0.05, 0.2)}, False),
    ],
)
def test_rule_needs_both_admissibility_and_a_win(store, change, ok):
    s = _variant(store["doc"]["datasets"]["good"], **change)
    assert (registry.reasons_to_refuse(s, SETTINGS) == []) is ok


def test_the_gate_reads_the_comparison_the_decision_reads(store):
    """The gate re-derives the call against the CV-best single as deployed (its abstentions answered), as the
    decision does; §2's comparison (the single judge on the items it answers) is recorded beside it and not read."""
    good = store["doc"]["datasets"]["good"]
    assert comparison(good) == "best_cv_deployed" and good["decision"]["comparison"] == "best_cv_deployed"
    s = copy.deepcopy(good)
    s["deltas"]["best_cv"]["kappa"] |= {"ci": [-0.01, 0.2], "call": "tie"}  # §2's a tie: the gate does not read it
    assert registry.reasons_to_refuse(s, SETTINGS) == []
    s = copy.deepcopy(good)
    s["deltas"]["best_cv_deployed"]["kappa"] |= {"ci": [-0.01, 0.2], "call": "tie"}
    assert "a tie, not a win" in "; ".join(registry.reasons_to_refuse(s, SETTINGS))


@pytest.mark.parametrize("change", [{"kappas": 0.1}, {"ci": (-0.01, 0.2)}])
def test_an_entry_whose_recorded_verdict_or_call_its_numbers_contradict_is_refused(store, change):
    """Recorded admissible / win / deploy-the-panel, numbers that give otherwise: the numbers decide."""
    s = _variant(store["doc"]["datasets"]["good"], **change, record=False)
    why = registry.reasons_to_refuse(s, SETTINGS)
    assert why and any("where its own numbers give" in w for w in why)


def test_refuses_an_admissible_win_that_the_decision_does_not_deploy(store):
    """An admissible win under the κ floor is not the panel decision."""
    s = _variant(store["doc"]["datasets"]["good"])
    floor = {**SETTINGS, "kappa_floor": 0.99}
    why = registry.reasons_to_refuse(s, floor)
    assert "not to deploy the panel (the panel pays but is under the floor" in why[0]
    assert registry.reasons_to_refuse(s, SETTINGS) == []


def test_promotes_a_winning_admissible_stacker_and_loads_it_by_alias(store):
    import mlflow

    mv = registry.promote(store["run_id"], dataset="good")
    assert mv.name == "raim-stacker-good" and mv.run_id == store["kids"]["good"].info.run_id
    client = mlflow.MlflowClient()
    assert client.get_model_version_by_alias("raim-stacker-good", "champion").version == mv.version
    got = client.get_model_version("raim-stacker-good", mv.version)  # a bring-your-own table: no roster judged it
    assert got.description.startswith("RAIM stacker for good (verdicts verdicts.csv), run ")
    assert (got.tags["roster"], got.tags["verdicts"]) == ("", "verdicts.csv")
    model = mlflow.pyfunc.load_model("models:/raim-stacker-good@champion")
    out = model.predict(pd.DataFrame({f"m{j:02d}": [1.0, 0.0] for j in range(8)}))
    assert out["verdict"].tolist() == [1, 0] and out["p_hallucinated"][0] > 0.9 > 0.1 > out["p_hallucinated"][1]
    # promoting again makes a new version and moves the alias
    mv2 = registry.promote(store["kids"]["good"].info.run_id, alias="champion")
    assert int(mv2.version) == int(mv.version) + 1
    assert client.get_model_version_by_alias("raim-stacker-good", "champion").version == mv2.version


@pytest.mark.slow
def test_cli_exit_status_and_message(store, capsys):
    env = {"MLFLOW_TRACKING_URI": store["uri"], **QUIET, "PATH": "/usr/bin:/bin"}
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.registry",
            "promote",
            "--run-id",
            store["run_id"],
            "--dataset",
            "bad",
            "--alias",
            "champion",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == registry.REFUSED and refused.stderr.startswith("error: refusing to promote")
    assert "not admissible" in refused.stderr and len(refused.stderr.splitlines()) == 1
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.registry",
            "promote",
            "--run-id",
            store["run_id"],
            "--dataset",
            "good",
            "--name",
            "cli-stacker",
            "--alias",
            "staging",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert "models:/cli-stacker@staging" in ok.stdout
    assert registry.main(["show", "--name", "cli-stacker"]) == 0
    shown = capsys.readouterr().out
    assert "aliases=['staging']" in shown
    assert "  input columns: m00, m01, m02" in shown  # what a request to the served stacker must hold


# ------------------------------------------------------------------------- models that cannot predict


@pytest.mark.slow
def test_a_panel_with_a_silent_judge_promotes_a_model_that_predicts_its_own_example(tmp_path):
    """Stop-9 defect: a member that never voted was dropped from the stacker but kept in the logged signature
    and example; the registry promoted that model, which failed on every input, its own example included."""
    import mlflow
    from test_track import GOOD, simulate

    from src.mlops import packaging

    df = simulate.panel(150, 2, dataset="good", seed=1, **GOOD)
    df.insert(4, "silent", pd.array([pd.NA] * len(df), dtype="Int64"))  # a judge that never voted here
    (tmp_path / "v.csv").write_text(df.to_csv(index=False))
    with tracking_store(tmp_path):
        from test_track import analysis_overrides, compose_cfg

        from src.mlops import tracking as track

        cfg = compose_cfg(*analysis_overrides(tmp_path / "v.csv", tmp_path / "r.json"))
        table, results, doc = stacking.analyse(check_config(cfg))
        assert doc["datasets"]["good"]["excluded_members"] == ["silent"]
        rid = track.log_analysis(check_config(cfg), table, results, doc)
        mv = registry.promote(rid, dataset="good")
        uri = f"models:/{mv.name}@champion"
        assert packaging.self_check(uri) is None
        model = mlflow.pyfunc.load_model(uri)
        assert model.metadata.get_input_schema().input_names() == [f"m{j:02d}" for j in range(8)]
        example = model.metadata.load_input_example(mlflow.artifacts.download_artifacts(uri))
        assert len(model.predict(example)) == len(example)


@pytest.mark.slow
def test_refuses_a_logged_stacker_that_cannot_predict_its_example(tmp_path):
    import mlflow

    from src.mlops import packaging
    from src.mlops import serving as serve

    with tracking_store(tmp_path):
        rid, cfg, table, results, doc = log_simulated(tmp_path, which=("good",))
        kid = children(rid)["good"].info.run_id
        cols = [f"m{j:02d}" for j in range(8)] + ["ghost"]  # one column more than the stacker was fitted on
        example = pd.DataFrame([[1.0] * 9, [0.0] * 9], columns=cols)
        with mlflow.start_run(run_id=kid):
            info = packaging._log_pyfunc(
                "broken", serve.StackerModel(results["good"].stacker, cols), packaging.stacker_signature(cols), example
            )
            mlflow.set_tag("stacker_model_uri", info.model_uri)
        with pytest.raises(registry.PromotionRefused) as e:
            registry.promote(kid)
        assert "cannot serve: it cannot be read or cannot predict" in str(e.value)  # its document does not check
        assert "n_features_in=8, but it has 9 columns" in str(e.value) and "\n" not in str(e.value)
        with pytest.raises(ValueError, match="cannot be logged"):  # and RAIM itself never logs such a model
            with mlflow.start_run():
                packaging.log_stacker(results["good"].stacker, cols, example)


@pytest.mark.parametrize(
    "args,expect",
    [
        (["promote", "--run-id", "0123456789abcdef"], "promote: Run with id=0123456789abcdef not found"),
        (["show", "--name", "no-such-model"], "show: Registered Model with name=no-such-model not found"),
        (
            ["log-panel", "--roster", "nope", "--stacker-uri", "models:/x@y"],
            "roster=nope: no option 'nope' in the 'roster' group",
        ),
    ],
)
@pytest.mark.slow
def test_cli_errors_are_one_line(store, args, expect):
    env = {"MLFLOW_TRACKING_URI": store["uri"], **QUIET, "PATH": "/usr/bin:/bin"}
    p = subprocess.run(
        [sys.executable, "-m", "src.registry", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2 and p.stderr.startswith(f"error: {expect}") and len(p.stderr.splitlines()) == 1


# ------------------------------------------------------------------------------ forged runs and tampered tags

WIN_TAGS = {
    "kind": "stacking",
    "admissible": "true",
    "admissibility_reason": "8/8 members at κ≥0.3",
    "call.best_cv.kappa": "clean win",
    "best_cv_call": "clean win",
    "decision": "panel",
    "decision_reason": "the panel pays",
}


@pytest.fixture(scope="module")
def forge(tmp_path_factory):
    """A store with a genuine analysis (datasets good and bad) beside which forged runs are made."""
    tmp = tmp_path_factory.mktemp("forge")
    with tracking_store(tmp) as uri:
        rid, cfg, table, results, doc = log_simulated(tmp)
        yield {
            "uri": uri,
            "run_id": rid,
            "doc": doc,
            "kids": children(rid),
            "results": results,
            "by": table.by_dataset(),
        }


def _claims_a_win(s: dict) -> dict:
    s = copy.deepcopy(s)
    s["admissibility"]["admissible"] = True
    s["deltas"]["best_cv"]["kappa"]["call"] = "clean win"
    s["decision"] = {**s["decision"], "action": "panel", "label": "deploy the panel"}
    return s


def _forged_run(
    forge,
    experiment: str | None = None,
    tags: dict | None = None,
    artifacts: dict | None = None,
    stacker_of: str | None = None,
) -> str:
    """A hand-made run: ``tags``, JSON ``artifacts``, and (``stacker_of``) its own copy of that dataset's stacker."""
    import mlflow

    from src.io.files import to_json
    from src.mlops import packaging
    from src.mlops import tracking as track

    exp = (
        mlflow.set_experiment(experiment).experiment_id
        if experiment
        else mlflow.get_run(forge["run_id"]).info.experiment_id
    )
    with mlflow.start_run(experiment_id=exp, tags=tags or {}) as run:
        for name, doc in (artifacts or {}).items():  # written as RAIM writes its JSON (a copy of its bytes)
            mlflow.log_text(to_json(doc), name)
        if stacker_of:
            example = track.stacker_example(forge["by"][stacker_of], forge["results"][stacker_of])
            info = packaging.log_stacker(forge["results"][stacker_of].stacker, list(example.columns), example)
            mlflow.set_tag("stacker_model_uri", info.model_uri)
    return run.info.run_id


def _forgery(forge, case: str) -> str:
    doc, kids, parent = forge["doc"], forge["kids"], forge["run_id"]
    good, bad = doc["datasets"]["good"], doc["datasets"]["bad"]
    uri = {d: kids[d].data.tags["stacker_model_uri"] for d in kids}
    if case == "another experiment, tags claim a win, another run's stacker":
        return _forged_run(forge, "forged", {**WIN_TAGS, "dataset": "bad", "stacker_model_uri": uri["good"]})
    if case == "a child of the analysis pointing at another run's stacker":
        return _forged_run(
            forge,
            tags={**WIN_TAGS, "dataset": "good", "mlflow.parentRunId": parent, "stacker_model_uri": uri["good"]},
            artifacts={"summary.json": good},
        )
    if case == "its own stacker, a summary.json claiming a win":
        return _forged_run(
            forge,
            tags={**WIN_TAGS, "dataset": "bad", "mlflow.parentRunId": parent},
            artifacts={"summary.json": _claims_a_win(bad)},
            stacker_of="bad",
        )
    if case == "a hand-made analysis whose results.json claims a win":
        entry = _claims_a_win(bad)
        fake = _forged_run(
            forge,
            tags={"kind": "stacking"},
            artifacts={"results.json": {"settings": doc["settings"], "datasets": {"bad": entry}}},
        )
        return _forged_run(
            forge,
            tags={**WIN_TAGS, "dataset": "bad", "mlflow.parentRunId": fake},
            artifacts={"summary.json": entry},
            stacker_of="bad",
        )
    if case == "a genuine winning entry, another dataset's stacker":
        return _forged_run(
            forge,
            tags={**WIN_TAGS, "dataset": "good", "mlflow.parentRunId": parent},
            artifacts={"summary.json": good},
            stacker_of="bad",
        )
    if case == "tags edited on a genuine losing run":
        import mlflow

        mlflow.MlflowClient().set_tag(kids["bad"].info.run_id, "admissible", "true")
        for k, v in WIN_TAGS.items():
            mlflow.MlflowClient().set_tag(kids["bad"].info.run_id, k, v)
        return kids["bad"].info.run_id
    raise AssertionError(case)


FORGERIES = {
    "another experiment, tags claim a win, another run's stacker": "not a dataset run of a RAIM analysis",
    "a child of the analysis pointing at another run's stacker": "was logged by run",
    "its own stacker, a summary.json claiming a win": "its summary.json is not the 'bad' entry",
    "a hand-made analysis whose results.json claims a win": "where its own numbers give",
    "a genuine winning entry, another dataset's stacker": "is not the stacker its results describe",
    "tags edited on a genuine losing run": "the panel is not admissible",
}


@pytest.mark.parametrize("case", FORGERIES)
def test_a_forged_or_tampered_run_is_refused_in_one_line(forge, case):
    rid = _forgery(forge, case)
    with pytest.raises(registry.PromotionRefused) as e:
        registry.promote(rid)
    msg = str(e.value)
    assert msg.startswith(f"refusing to promote the stacker of run {rid}") and FORGERIES[case] in msg, msg
    assert "\n" not in msg


@pytest.mark.slow
def test_the_cli_refuses_a_forged_run_in_one_line_and_the_genuine_candidate_still_promotes(forge):
    import mlflow

    rid = _forgery(forge, "another experiment, tags claim a win, another run's stacker")
    env = {"MLFLOW_TRACKING_URI": forge["uri"], **QUIET, "PATH": "/usr/bin:/bin"}
    p = subprocess.run(
        [sys.executable, "-m", "src.registry", "promote", "--run-id", rid],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        p.returncode == registry.REFUSED
        and p.stderr.startswith("error: refusing to promote ")
        and len(p.stderr.splitlines()) == 1
    )
    assert mlflow.MlflowClient().search_registered_models() == []  # nothing was registered
    mv = registry.promote(forge["kids"]["good"].info.run_id, name="genuine")
    assert mv.run_id == forge["kids"]["good"].info.run_id and mv.tags["call.best_cv.kappa"] in registry.WINS
