"""MLflow tracking (src/mlops/tracking.py): what one analysis logs, nesting, hashes, the stacker model, no secrets.

Every test here uses a throwaway sqlite store under pytest's tmp dir, never the repo's mlflow.db. The
helpers at the top are shared with test_registry / test_serve / test_pipeline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from src.io.config import composed, freeze
from src.io.files import written_float
from src.mlops import packaging, redact, store
from src.mlops import tracking as track
from src.present import stagefiles
from src.studies import simulate, stacking
from src.studies.checked import check_config

ROOT = Path(__file__).resolve().parents[1]
QUIET = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONWARNINGS": "ignore",
}
SECRET = "sk-ant-api03-" + "Zq7" * 14  # a fake key: must never reach the store
GOOD = dict(accuracies=[0.75] * 8, rho=0.05)  # competent, decorrelated: admissible, stacker wins
BAD = dict(accuracies=[0.93] + [0.56] * 7, rho=0.6)  # one dominant member: inadmissible, no win


# ---------------------------------------------------------------------------------------- shared helpers


def write_panels(path: Path, which=("good", "bad"), n_clusters: int = 150) -> Path:
    """A bring-your-own verdict table with simulated datasets named ``good`` / ``bad``."""
    spec = {"good": GOOD, "bad": BAD}
    parts = [simulate.panel(n_clusters, 2, dataset=name, seed=i + 1, **spec[name]) for i, name in enumerate(which)]
    pd.concat(parts, ignore_index=True).to_csv(path, index=False)
    return path


def compose_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def analysis_overrides(verdicts: Path, out: Path) -> list[str]:
    return [
        "analysis=fast",
        "analysis.abstention_contrast=false",
        f"verdicts={verdicts}",
        f"output={out}",
        "analysis.core=[good,bad]",
    ]


@contextlib.contextmanager
def tracking_store(path: Path):
    """Point MLflow (and any subprocess) at a fresh sqlite store under ``path``; restore afterwards, the active
    experiment too: ``mlflow.set_experiment`` (src.mlops.store.setup) keeps an id of this store in a module global
    and in ``$MLFLOW_EXPERIMENT_ID``, which a module-scoped store would otherwise leave to every later test (a run
    opened in another new store would look for an experiment that store never had)."""
    import mlflow
    from mlflow.tracking import fluent

    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", *QUIET)}
    active = fluent._active_experiment_id
    uri = f"sqlite:///{path / 'mlflow.db'}"
    os.environ.update({"MLFLOW_TRACKING_URI": uri, **QUIET})
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("Default")  # not the experiment an earlier test made active in another store
    try:
        yield uri
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        fluent._active_experiment_id = active
        mlflow.set_tracking_uri(None)


def log_simulated(tmp: Path, which=("good", "bad"), extra: tuple[str, ...] = ()):
    """Analyse simulated panels and log them; returns (parent run id, settings, table, results, doc). ``extra``:
    overrides of keys the checked path refuses (secrets under keys of their own), placed in the composed config
    the run logs, as scrubbing's second line behind that refusal."""
    overrides = analysis_overrides(write_panels(tmp / "verdicts.csv", which), tmp / "results.json")
    cfg = check_config(compose_cfg(*overrides))
    if extra:
        cfg = dataclasses.replace(cfg, composed=freeze(composed(compose_cfg(*overrides, *extra))))
    table, results, doc = stacking.analyse(cfg)
    return track.log_analysis(cfg, table, results, doc), cfg, table, results, doc


def children(run_id: str) -> dict:
    import mlflow

    runs = mlflow.search_runs(
        search_all_experiments=True, output_format="list", filter_string=f"tags.mlflow.parentRunId = '{run_id}'"
    )
    return {r.data.tags.get("dataset", r.info.run_name): r for r in runs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(args: list[str], port: int, ready_path: str, env: dict | None = None, timeout: float = 150):
    """Start a loopback server (``mlflow server`` / ``mlflow models serve``); stop it on exit."""
    env = {**os.environ, **QUIET, **(env or {})}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # uvicorn, gunicorn
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{args[:3]} exited {proc.returncode}:\n{proc.stdout.read()[-4000:]}")
            try:
                with urllib.request.urlopen(url + ready_path, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"{args[:3]} not ready on {url} after {timeout}s")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def post_json(url: str, payload: dict, timeout: float = 30) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """One analysis (two simulated datasets) logged with a secret in the environment and in the config."""
    tmp = tmp_path_factory.mktemp("track")
    os.environ["ANTHROPIC_API_KEY"] = SECRET
    try:
        with tracking_store(tmp):
            extra = (
                f"+judge.api_key={SECRET}",
                "+tracking.token=tok-abcdef123456",
                "+paths.remote=https://bob:hunter2secret@example.org/x",
            )
            rid, cfg, table, results, doc = log_simulated(tmp, extra=extra)
            yield {"tmp": tmp, "run_id": rid, "cfg": cfg, "table": table, "results": results, "doc": doc}
    finally:
        os.environ.pop("ANTHROPIC_API_KEY", None)


# ---------------------------------------------------------------------------------------------- tests


def test_a_store_s_experiment_stays_inside_it(tmp_path):
    """A run opened in a new store after :func:`tracking_store` closed lands in that store's default experiment,
    not in an experiment id of the closed store."""
    import mlflow

    before = os.environ.get("MLFLOW_EXPERIMENT_ID")
    with tracking_store(tmp_path):
        mlflow.set_experiment(experiment_id=mlflow.create_experiment("mine"))
        mlflow.set_experiment("another")
    assert os.environ.get("MLFLOW_EXPERIMENT_ID") == before
    (tmp_path / "new").mkdir()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}")
    try:
        with mlflow.start_run() as run:
            assert run.info.experiment_id == "0"
    finally:
        mlflow.set_tracking_uri(None)


def test_tracking_uri_env_wins_and_relative_sqlite_is_repo_absolute(monkeypatch):
    cfg = compose_cfg()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert store.tracking_uri(check_config(cfg).tracking) == f"sqlite:///{ROOT / 'mlflow.db'}"
    assert store.artifact_root(store.tracking_uri(check_config(cfg).tracking)) == (ROOT / "mlruns" / "raim").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////tmp/elsewhere/x.db")
    assert store.tracking_uri(check_config(cfg).tracking) == "sqlite:////tmp/elsewhere/x.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert store.tracking_uri(check_config(cfg).tracking) == "http://127.0.0.1:5000"
    assert store.artifact_root("http://127.0.0.1:5000") is None


def test_scrub_redacts_secret_keys_values_and_url_passwords(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "plainvalue-without-shape")
    data = {
        "judge": {"api_key": "x", "model": "qwen"},
        "note": "key sk-ant-api03-aaaaaaaaaaaaaaaa",
        "u": "https://al:pw@h/x",
        "env": "plainvalue-without-shape",
        "tokens": None,
        "n": 3,
    }
    out = redact.scrub(data)
    assert out["judge"] == {"api_key": "***", "model": "qwen"}
    assert "sk-ant" not in out["note"] and out["u"] == "https://***@h/x" and out["env"] == "***"
    assert out["tokens"] is None and out["n"] == 3


def test_parent_run_tags_params_and_results(logged):
    import mlflow

    parent = mlflow.get_run(logged["run_id"])
    t, p = parent.data.tags, parent.data.params
    assert t["kind"] == "stacking" and t["frame"] == "auto" and t["datasets"] == "good,bad"
    # a bring-your-own verdict table: no roster judged it, so none is named (tags or params); the table is
    assert "roster" not in t and not [k for k in p if k.startswith("roster.")]
    assert t["verdicts"] == str(logged["tmp"] / "verdicts.csv") == p["verdicts"]
    assert t["stacker"] == "logreg" and t["analysis"].startswith("fast (") and len(t["git_commit"]) == 40
    assert p["stacker.C"] == "1.0" and p["analysis.n_boot"] == "200" and p["judge.api_key"] == "***"
    assert t["decisions"] == "good: deploy the panel; bad: deploy the single judge m00"
    art = Path(parent.info.artifact_uri.removeprefix("file://"))
    assert art.is_relative_to(logged["tmp"] / "mlruns")
    assert json.loads((art / "results.json").read_text())["datasets"].keys() == logged["doc"]["datasets"].keys()
    assert t["verdicts_file_sha256"] == hashlib.sha256((logged["tmp"] / "verdicts.csv").read_bytes()).hexdigest()
    assert parent.data.metrics["stacked/kappa_mean"] == pytest.approx(
        np.mean([d["comparators"]["stacked"]["kappa"]["estimate"] for d in logged["doc"]["datasets"].values()])
    )


def test_children_carry_the_ladder_betas_and_admissibility(logged):
    kids = children(logged["run_id"])
    assert set(kids) == {"good", "bad"}
    for name, child in kids.items():
        s, m, t = logged["doc"]["datasets"][name], child.data.metrics, child.data.tags
        assert t["dataset"] == name and t["kind"] == "stacking"
        for comp in ("stacked", "best_cv", "majority", "oracle"):
            for metric in ("kappa", "bacc", "f1"):
                est = s["comparators"][comp][metric]
                assert m[f"{comp}/{metric}"] == pytest.approx(est["estimate"])
                assert m[f"{comp}/{metric}_lo"] <= m[f"{comp}/{metric}_hi"]
        d = s["deltas"]["best_cv"]["kappa"]
        assert m["delta_best_cv/kappa"] == pytest.approx(d["estimate"])
        assert m["delta_best_cv/kappa_p_holm"] == pytest.approx(d["p_holm"])
        assert (
            t["call.best_cv.kappa"] == d["call"] and t["call.majority.bacc"] == s["deltas"]["majority"]["bacc"]["call"]
        )
        assert t["admissible"] == str(s["admissibility"]["admissible"]).lower()
        d = s["decision"]
        assert (t["decision"], t["decision_member"], t["decision_reason"]) == (
            d["action"],
            d["member"] or "none",
            d["reason"],
        )
        p = child.data.params  # what sets this analysis apart, on the dataset run itself (MLflow's Compare)
        assert p["stacker.C"] == "1.0" and p["analysis.n_boot"] == "200" and p["analysis.kappa_floor"] == "0.4"
        assert p["verdicts"] == str(logged["tmp"] / "verdicts.csv") and "roster.name" not in p
        assert m["adm/phi_bar"] == pytest.approx(s["admissibility"]["phi_bar"])
        for f, b in s["stacker"]["beta_mean"].items():
            assert m[f"beta/{f}"] == pytest.approx(b)
        beta = pd.read_csv(Path(child.info.artifact_uri.removeprefix("file://")) / "beta.csv")
        assert list(beta["feature"]) == ["intercept"] + [f"m{j:02d}" for j in range(8)]
        assert beta["full"].tolist() == pytest.approx(list(s["stacker"]["beta_full"].values()))
        assert len(t["verdict_table_sha256"]) == 64
    assert kids["good"].data.tags["admissible"] == "true" and kids["bad"].data.tags["admissible"] == "false"
    assert kids["good"].data.tags["decision"] == "panel" and kids["bad"].data.tags["decision_member"] == "m00"
    assert kids["good"].data.tags["verdict_table_sha256"] != kids["bad"].data.tags["verdict_table_sha256"]


def test_stacker_model_signature_requirements_and_probabilities(logged):
    import mlflow

    child = children(logged["run_id"])["good"]
    uri = child.data.tags["stacker_model_uri"]
    model = mlflow.pyfunc.load_model(uri)
    cols = [f"m{j:02d}" for j in range(8)]
    assert model.metadata.get_input_schema().input_names() == cols
    assert model.metadata.get_output_schema().input_names() == [
        "p_hallucinated",
        "verdict",
        "label",
        "train_prevalence",
    ]
    reqs = Path(mlflow.pyfunc.get_model_dependencies(uri)).read_text().split()
    assert {r.split("==")[0] for r in reqs} >= {"mlflow", "scikit-learn", "numpy", "pandas", "cloudpickle"}
    assert all("==" in r for r in reqs)
    table = logged["table"].by_dataset()["good"]
    X = pd.DataFrame(table.votes[:50], columns=cols)
    out = model.predict(X)
    expect = logged["results"]["good"].stacker.predict_proba(table.votes[:50])[:, 1]
    assert out["p_hallucinated"].to_numpy() == pytest.approx(expect)
    assert (out["verdict"] == (expect >= 0.5)).all()
    # an abstention may be sent as 0.5 or as a null: same answer
    both = model.predict(pd.DataFrame({c: [1.0, 1.0] if c == "m00" else [0.5, None] for c in cols}))
    assert both["p_hallucinated"][0] == pytest.approx(both["p_hallucinated"][1])
    # a row where every member abstained has no verdict (not one read off the intercept)
    none = model.predict(pd.DataFrame({c: [None] for c in cols}))
    assert none["label"].tolist() == ["abstained"]
    assert pd.isna(none["p_hallucinated"][0]) and pd.isna(none["verdict"][0])
    with pytest.raises(Exception, match=r"row 1: column 'm00': 2 is not a vote: 0, 1, or 0.5 / null"):
        model.predict(pd.DataFrame({c: [2.0] for c in cols}))


ALONE = """
import json, sys
# the checkout's src must not be importable: only the model's own copy of the code
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path_hooks = [h for h in sys.path_hooks if "editable" not in repr(h).lower()]
sys.path = [p for p in sys.path if p not in ("", sys.argv[2])]
import mlflow.pyfunc, pandas as pd
model = mlflow.pyfunc.load_model(sys.argv[1])
X = pd.DataFrame(json.loads(sys.argv[3]))
out = [model.predict(X)["p_hallucinated"].tolist(), model.predict(X, params={"prevalence": "0.1"})["p_hallucinated"].tolist()]
import src
print(json.dumps({"src": src.__file__, "p": out}))
"""


def test_a_stacker_model_ships_the_code_it_imports_and_runs_from_it_alone(logged, tmp_path):
    """A logged stacker carries the package's modules its model and stacker import (at any depth, inside functions
    too: the prior-shift path runs only when a request names a prevalence), not the whole package: a fresh
    interpreter that cannot import the checkout loads it and predicts from that copy alone, as it does here."""
    import mlflow

    uri = children(logged["run_id"])["good"].data.tags["stacker_model_uri"]
    path = Path(mlflow.artifacts.download_artifacts(uri))
    code = path / "code" / "src"
    shipped = {p.relative_to(code).as_posix() for p in code.rglob("*.py")}
    assert {"__init__.py", "mlops/serving.py", "core/aggregate.py", "core/priorshift.py", "core/errors.py"} <= shipped
    assert not shipped & {"run.py", "mlops/tracking.py", "studies/stacking.py", "core/ladder.py", "present/report.py"}
    assert not list(code.rglob("*.yaml")) and not list(code.rglob("__pycache__"))
    rows = {f"m{j:02d}": [1.0, 0.0, float(j % 2), 0.5 if j else 1.0] for j in range(8)}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", ALONE, str(path), str(ROOT), json.dumps(rows)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    alone = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(alone["src"]).resolve().is_relative_to(code.resolve())
    here = mlflow.pyfunc.load_model(uri)
    X = pd.DataFrame(rows)
    assert alone["p"][0] == pytest.approx(here.predict(X)["p_hallucinated"].tolist())
    assert alone["p"][1] == pytest.approx(here.predict(X, params={"prevalence": "0.1"})["p_hallucinated"].tolist())
    assert alone["p"][0] != pytest.approx(alone["p"][1])


def test_each_logged_stacker_carries_its_datasets_metrics(logged):
    """The model is logged before the metrics, which then carry its id (one batch): MLflow's Models view shows
    the dataset's κ on the model, as when MLflow copies earlier metrics onto it one query per name."""
    import mlflow

    client = mlflow.MlflowClient()
    for child in children(logged["run_id"]).values():
        model_id = client.get_run(child.info.run_id).outputs.model_outputs[0].model_id
        on_model = {m.key: m.value for m in client.get_logged_model(model_id).metrics}
        on_run = child.data.metrics
        assert set(on_model) == set(on_run)  # the series (β per fold) with their step-0 value
        scalars = [k for k in on_run if not k.startswith("beta_fold/")]
        assert "stacked/kappa" in scalars
        assert [on_model[k] for k in scalars] == pytest.approx([on_run[k] for k in scalars])


def test_model_pins_are_the_installed_versions_so_mlflows_check_is_skipped_while_logging_only():
    """src.serve skips MLflow's pin-vs-environment check while logging (it cannot fail: the pins are read from
    this interpreter) and puts MLflow's check back afterwards."""
    from importlib.metadata import version

    import mlflow.pyfunc
    from mlflow.utils import environment

    pins = dict(r.split("==") for r in packaging.pip_requirements())
    assert pins == {name: version(name) for name in pins}
    before = [m.warn_dependency_requirement_mismatches for m in (environment, mlflow.pyfunc)]
    with packaging._pins_from_this_environment():
        assert environment.warn_dependency_requirement_mismatches is not before[0]
        assert mlflow.pyfunc.warn_dependency_requirement_mismatches is not before[1]
    assert [m.warn_dependency_requirement_mismatches for m in (environment, mlflow.pyfunc)] == before


def test_secrets_never_reach_params_tags_artifacts_or_the_database(logged):
    import mlflow

    secrets = [SECRET, "tok-abcdef123456", "hunter2secret"]
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert len(runs) == 3
    for r in runs:
        blob = json.dumps([r.data.params, r.data.tags])
        assert not [s for s in secrets if s in blob], r.info.run_name
    files = [p for p in logged["tmp"].rglob("*") if p.is_file() and p.name != "verdicts.csv"]
    assert any(p.name == "config.yaml" for p in files) and any(p.name == "mlflow.db" for p in files)
    leaks = [(str(p), s) for p in files for s in secrets if s.encode() in p.read_bytes()]
    assert not leaks


@pytest.mark.slow
def test_start_run_nests_under_active_run_and_logs_figures(tmp_path):
    import mlflow

    fig = tmp_path / "fig.png"
    fig.write_bytes(b"\x89PNG fake")
    with tracking_store(tmp_path):
        cfg = compose_cfg("dataset=wice", "stacker=logreg_categorical")
        with track.start_run(check_config(cfg), "budget", tags={"budget": 50}) as parent:
            with track.start_run(check_config(cfg), "budget", tags={"budget": 100}) as child:
                assert track.log_figures([fig, tmp_path / "missing.png"]) == ["fig.png"]
        got = mlflow.get_run(child.info.run_id)
        assert got.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert got.data.tags["dataset"] == "wice" and got.data.tags["budget"] == "100"
        assert mlflow.get_run(parent.info.run_id).data.params["stacker.abstention"] == "category"
        assert not got.data.params  # the config is logged once, on the parent
        assert [a.path for a in mlflow.MlflowClient().list_artifacts(child.info.run_id, "figures")] == [
            "figures/fig.png"
        ]


def test_beta_folds_are_one_series_per_feature_logged_in_one_batch(logged):
    import mlflow

    client = mlflow.MlflowClient()
    for name, child in children(logged["run_id"]).items():
        folds = logged["doc"]["datasets"][name]["stacker"]["beta_folds"]
        for k in folds[0]:
            hist = sorted(client.get_metric_history(child.info.run_id, f"beta_fold/{k}"), key=lambda m: m.step)
            assert [m.step for m in hist] == list(range(len(folds)))
            assert [m.value for m in hist] == pytest.approx([f[k] for f in folds])
            assert len({m.timestamp for m in hist}) == 1  # one batch


def test_the_store_is_set_up_once_per_run(tmp_path, monkeypatch):
    calls = []
    real = store._experiment_id
    monkeypatch.setattr(store, "_experiment_id", lambda *a: calls.append(a) or real(*a))
    with tracking_store(tmp_path):
        cfg = compose_cfg()
        with track.start_run(check_config(cfg), "stacking"):
            for name in ("a", "b", "c"):
                with track.start_run(check_config(cfg), "stacking", tags={"dataset": name}, run_name=name):
                    track.log_metrics({"x": 1.0}, {"y": [1.0, 2.0]})
        assert len(calls) == 1
        with track.start_run(check_config(cfg), "stacking"):  # a new run sets up again
            pass
        assert len(calls) == 2


OPEN_RUNS = """
import os, signal, sys
sys.path[:0] = [{root!r}, {tests!r}]
from test_track import compose_cfg
from src.mlops import tracking as track
from src.studies.checked import check_config
cfg = compose_cfg()
with track.start_run(check_config(cfg), "stacking") as run:
    with track.start_run(check_config(cfg), "stacking", tags={{"dataset": "d"}}):
        print(run.info.run_id, flush=True)
        {then}
"""


def test_a_process_is_gone_only_when_this_host_knows_it_is(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    tag = store.process_tag(dead.pid)  # while it runs (or a zombie): its start is readable
    dead.wait()
    assert store.process_gone(tag)
    assert not store.process_gone(store.process_tag())  # this process
    host, pid, start = store.process_tag().rsplit(":", 2)
    assert store.process_gone(f"{host}:{pid}:{int(start or 0) + 1}") == bool(start)  # the pid used again
    assert (
        not store.process_gone(f"another-host:{dead.pid}:1")
        and not store.process_gone("")
        and not store.process_gone("x:y:z")
    )


@pytest.mark.slow
def test_runs_a_killed_process_left_running_are_closed_by_the_next_run(tmp_path, capsys):
    """Two processes open a parent and a nested run each: one waits, alive; the other is SIGKILLed inside them.
    The next run into the store closes the killed one's two runs as KILLED, says how many, and leaves the live
    one's."""
    import mlflow

    with tracking_store(tmp_path) as uri:
        env = {**os.environ, **QUIET, "MLFLOW_TRACKING_URI": uri}

        def opened(then: str) -> subprocess.Popen:
            code = OPEN_RUNS.format(root=str(ROOT), tests=str(ROOT / "tests"), then=then)
            return subprocess.Popen(
                [sys.executable, "-c", code],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )

        alive, killed = opened("sys.stdin.read()"), opened("os.kill(os.getpid(), signal.SIGKILL)")
        alive_id = alive.stdout.readline().strip()
        killed.wait(timeout=120)
        assert killed.returncode == -9
        client = mlflow.MlflowClient()
        running = client.search_runs(["0", *[e.experiment_id for e in client.search_experiments()]], "")
        assert sum(r.info.status == "RUNNING" for r in running) == 4  # two of each process
        capsys.readouterr()
        with track.start_run(check_config(compose_cfg()), "stacking") as new:
            pass
        note = capsys.readouterr().err
        assert "note: closed 2 MLflow run(s) left RUNNING by a process that is gone, as KILLED" in note
        runs = {r.info.run_id: r for r in client.search_runs([new.info.experiment_id], "")}
        closed = [r for r in runs.values() if r.info.status == "KILLED"]
        assert len(closed) == 2 and all("was gone" in r.data.tags["raim_closed"] for r in closed)
        assert runs[alive_id].info.status == "RUNNING"  # its process is alive: left as it is
        alive.communicate("", timeout=120)
        assert client.get_run(alive_id).info.status == "FINISHED"


def test_one_analysis_reads_its_config_and_git_once_for_all_its_runs(tmp_path, monkeypatch):
    """The parent and every child share one reading of the config (its choices, git's commit, the logged
    config): each reading resolves and scans the whole config and asks git twice."""
    import mlflow

    calls = dict.fromkeys(("choices", "git_commit", "run_config"), 0)

    def counted(name):
        real = getattr(track, name)

        def call(*args):
            calls[name] += 1
            return real(*args)

        return call

    for name in calls:
        monkeypatch.setattr(track, name, counted(name))
    with tracking_store(tmp_path):
        rid, *_ = log_simulated(tmp_path)
        parent, kids = mlflow.get_run(rid), children(rid)
    assert sorted(kids) == ["bad", "good"]
    assert calls == {"choices": 1, "git_commit": 1, "run_config": 1}
    for kid in kids.values():  # what the shared reading gave each child: the parent's tags and params
        assert kid.data.tags["stacker"] == parent.data.tags["stacker"]
        assert kid.data.tags.get("git_commit") == parent.data.tags.get("git_commit")
        assert {k: kid.data.params[k] for k in kid.data.params if k.startswith("stacker.")} == {
            k: v for k, v in parent.data.params.items() if k.startswith("stacker.")
        }


def test_tags_are_read_off_values_alike_under_src_run_and_the_dvc_stage(shipped_conf, monkeypatch):
    """`python -m src.run` has Hydra's group choices; the DVC stage (`--config-name params`) has none: the tags
    must not differ between the two for the same values (they read `logreg`/`StackedLogit` before). The options
    the tags are matched against are the project's own (a user's conf/stacker/mine.yaml with C=0.5 would be the
    right tag for C=0.5)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from src.io import config

    monkeypatch.setattr(config, "CONF_DIR", shipped_conf)

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=["stacker.C=0.5", "analysis=fast"], return_hydra_config=True)
    params_yaml = OmegaConf.create({k: v for k, v in OmegaConf.to_container(cfg).items() if k != "hydra"})
    HydraConfig.instance().set_config(cfg)
    try:
        as_run = track.choices(check_config(params_yaml))
    finally:
        HydraConfig.instance().cfg = None
    assert track.choices(check_config(params_yaml)) == as_run
    assert as_run["stacker"] == "logreg (C=0.5)" and as_run["analysis"] == "fast" and as_run["roster"] == "cpu"
    assert track.choices(check_config(compose_cfg("stacker=logreg_categorical")))["stacker"] == "logreg_categorical"
    byo = track.choices(check_config(compose_cfg("verdicts=/tmp/v.csv", "roster=tiny")))
    assert "roster" not in byo and byo["verdicts"] == "/tmp/v.csv"


def test_a_sweep_jobs_runs_carry_its_swept_overrides_and_the_parent_is_told_from_its_children(tmp_path, monkeypatch):
    """`-m stacker.C=0.5,1`: each job's parent and dataset runs carry `stacker.C=<its value>` in their names (not
    the overrides every job shares), and a parent is not named like one of its children."""
    import mlflow
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    verdicts = write_panels(tmp_path / "verdicts.csv", ("good", "bad"))
    fixed = analysis_overrides(verdicts, tmp_path / "results.json")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        hc = compose(config_name="config", overrides=["stacker.C=0.5", *fixed], return_hydra_config=True)
    with open_dict(hc):
        hc.hydra.mode = "MULTIRUN"
    monkeypatch.setattr(sys, "argv", ["src/run.py", "-m", "stacker.C=0.5,1", *fixed])
    HydraConfig.instance().set_config(hc)
    try:
        assert track.sweep_job_overrides() == "stacker.C=0.5"
        assert track.sweep_job_overrides(["-m", "stacker.C=0.5"]).startswith("stacker.C=0.5 analysis=fast")
        with tracking_store(tmp_path):
            rid, *_ = log_simulated(tmp_path, extra=("stacker.C=0.5",))
            parent, kids = mlflow.get_run(rid), children(rid)
    finally:
        HydraConfig.instance().cfg = None
    assert parent.info.run_name == "stacking/verdicts=verdicts.csv/all (2 datasets) stacker.C=0.5"
    assert sorted(k.info.run_name for k in kids.values()) == [
        "stacking/verdicts=verdicts.csv/bad stacker.C=0.5",
        "stacking/verdicts=verdicts.csv/good stacker.C=0.5",
    ]
    assert track.sweep_job_overrides() == ""  # outside a sweep: nothing added


def test_stage_files_and_judge_args(logged, tmp_path):
    stagefiles.write_stage_files(logged["doc"], tmp_path / "m.json", tmp_path / "b.csv")
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["good"]["admissible"] is True and m["bad"]["admissible"] is False
    assert (m["good"]["decision"], m["bad"]["decision"], m["bad"]["decision_member"]) == ("panel", "single", "m00")
    assert m["good"]["stacked"]["kappa"] == written_float(  # written by the rule of every JSON result
        logged["doc"]["datasets"]["good"]["comparators"]["stacked"]["kappa"]["estimate"]
    )
    b = pd.read_csv(tmp_path / "b.csv")
    assert set(b["dataset"]) == {"good", "bad"} and len(b) == 2 * 9


@pytest.mark.slow
def test_every_logged_stacker_of_a_real_run_predicts_its_own_example(tmp_path):
    """The committed cpu caches, where MiniLM and lexical never vote on TruthfulQA (stop-9 defect: that dataset's
    logged stacker expected 4 columns, its signature and example had 6, and it failed on every input)."""
    import mlflow
    from mlflow.models import Model

    from src.mlops import packaging

    with tracking_store(tmp_path):
        cfg = compose_cfg("analysis=fast", "analysis.abstention_contrast=false", f"output={tmp_path}/r.json")
        table, results, doc = stacking.analyse(check_config(cfg))
        rid = track.log_analysis(check_config(cfg), table, results, doc)
        kids = children(rid)
        assert set(kids) == {"medhallu", "wice", "truthfulqa", "expertqa"}
        for name, kid in kids.items():
            uri = kid.data.tags["stacker_model_uri"]
            assert packaging.self_check(uri) is None, name
            path = mlflow.artifacts.download_artifacts(uri)
            example = Model.load(path).load_input_example(path)
            model = mlflow.pyfunc.load_model(path)
            assert model.metadata.get_input_schema().input_names() == results[name].members == list(example.columns)
            out = model.predict(example)
            assert len(out) == len(example) and set(out["label"]) <= {"hallucinated", "supported", "abstained"}
        assert results["truthfulqa"].members == ["qwen15b", "qwen05b", "smollm135m", "gemma270m"]


def _study_parts(tmp_path: Path, computed: list):
    """A study's compute / draw / metrics for :func:`src.mlops.tracking.run_study` (``computed`` records each compute)."""

    def compute(cfg):
        computed.append(True)
        return {"datasets": {"a": 1}, "value": 0.5}

    def draw(doc, path):
        Path(path).write_bytes(b"png")
        return Path(path)

    return compute, draw, lambda doc: {"study/value": doc["value"]}


def test_a_study_checks_its_outputs_before_any_work(tmp_path):
    """prevalence, monitor and noise entries (src.mlops.tracking.run_study): a directory given as the output is refused
    before the study is computed, naming the setting."""
    computed: list = []
    compute, draw, metrics = _study_parts(tmp_path, computed)
    cfg = compose_cfg("tracking.enabled=false")
    with pytest.raises(track.RaimError, match="is a directory"):
        track.run_study(check_config(cfg), "study", compute, tmp_path, tmp_path / "s.png", draw, metrics)
    assert not computed and not (tmp_path / "s.png").exists()


def test_a_failed_tracking_leaves_the_previous_study_json_in_place(tmp_path, monkeypatch):
    computed: list = []
    compute, draw, metrics = _study_parts(tmp_path, computed)
    out = tmp_path / "study.json"
    out.write_text('{"previous": true}')
    (tmp_path / "not_a_dir").write_text("")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/not_a_dir/m.db")  # the store cannot be made
    cfg = compose_cfg()
    with pytest.raises(track.RaimError) as e:  # the store's folder is a file: one line naming the store
        track.run_study(check_config(cfg), "study", compute, out, tmp_path / "s.png", draw, metrics)
    assert str(e.value).startswith(f"MLflow tracking at sqlite:///{tmp_path}/not_a_dir/m.db failed (")
    assert str(e.value).endswith("nothing was written to study.json (tracking.enabled=false runs without MLflow)")
    assert computed and json.loads(out.read_text()) == {"previous": True}
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    doc, path, fig = track.run_study(
        compose_cfg("tracking.enabled=false"), "study", compute, out, tmp_path / "s.png", draw, metrics
    )
    assert path == out and json.loads(out.read_text()) == doc and fig.read_bytes() == b"png"
