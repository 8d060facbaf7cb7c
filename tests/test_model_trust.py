"""A model someone else hands a user is data (docs/security.md): RAIM's commands read a RAIM model from its JSON
document and rebuild it from the installed RAIM — a pickle or a module the model folder ships never runs, from a
local folder, a replaced run artifact or a registry entry —; a registered version's document changed after
promotion is refused; promotion decides from the run's data before it reads any model."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_cli_errors import cli
from test_track import children, log_simulated, tracking_store

from src.core.aggregate import NoiseRobustStackedLogit, StackedLogit
from src.mlops import artifact, packaging, registry, serving

MEMBERS = [f"m{j:02d}" for j in range(8)]


class Payload:
    """Unpickling it runs a command (what a hostile ``python_model.pkl`` does)."""

    def __init__(self, flag: Path):
        self.flag = flag

    def __reduce__(self):
        return (os.system, (f"touch {self.flag}",))


def plant(model_dir: Path, flag: Path) -> None:
    """Every way a pyfunc folder can run code when MLflow loads it: a pickle that runs a command, and an MLmodel
    whose loader is a module of the folder's own ``code/``."""
    (model_dir / "python_model.pkl").write_bytes(pickle.dumps(Payload(flag)))
    (model_dir / "code").mkdir(exist_ok=True)
    (model_dir / "code" / "evil_loader.py").write_text(
        f"import pathlib\npathlib.Path({str(flag)!r}).touch()\ndef _load_pyfunc(path):\n    raise SystemExit(3)\n"
    )
    mlmodel = model_dir / "MLmodel"
    text = mlmodel.read_text()
    mlmodel.write_text(text.replace("loader_module: mlflow.pyfunc.model", "loader_module: evil_loader"))


def fitted(cls=StackedLogit, **kw) -> StackedLogit:
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 400)
    X = np.column_stack([np.where(rng.random(400) < 0.8, gold, 1 - gold) for _ in range(3)]).astype(float)
    X[rng.random(X.shape) < 0.1] = 0.5
    return cls(**kw).fit(X, gold)


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A stacker logged in a sqlite store, and a copy of its model folder on disk."""
    import mlflow
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("model-trust")
    with tracking_store(tmp) as uri:
        stacker = fitted()
        with mlflow.start_run():
            info = packaging.log_stacker(stacker, ["a", "b", "c"])
        location = MlflowClient().get_logged_model(info.model_id).artifact_location
        folder = tmp / "folder"
        shutil.copytree(location.removeprefix("file://"), folder)
        yield {"uri": uri, "tmp": tmp, "stacker": stacker, "model_uri": info.model_uri, "folder": folder}


@pytest.mark.parametrize(
    "make",
    [
        lambda: fitted(),
        lambda: fitted(abstention="category"),
        lambda: fitted(NoiseRobustStackedLogit, flip_rates=(0.1, 0.05)),
        lambda: fitted(NoiseRobustStackedLogit),
    ],
)
def test_a_stacker_rebuilt_from_its_document_predicts_bit_for_bit(make):
    stacker = make()
    doc = packaging.document_of(serving.StackerModel(stacker, ["a", "b", "c"]))
    again, rebuilt = artifact.parse(artifact.dumps(doc), "doc")
    X = np.array([[1, 0, 0.5], [0, 0, 0], [1, 1, 1], [0.5, 0.5, 0.5]], dtype=float)
    assert np.array_equal(rebuilt.predict_proba(X), stacker.predict_proba(X))
    assert again == doc


def _doc(**change) -> bytes:
    raw = json.loads(artifact.dumps(packaging.document_of(serving.StackerModel(fitted(), ["a", "b", "c"]))))
    for path, value in change.items():
        node = raw
        *parents, last = path.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    return json.dumps(raw).encode()


@pytest.mark.parametrize(
    "data, words",
    [
        (_doc(stacker__estimator="sklearn.pipeline.Pipeline"), ("estimator",)),
        (_doc(stacker__params__evil=1), ("unknown key 'evil'",)),
        (_doc(stacker__coef=[1.0]), ("coefficients",)),
        (_doc(stacker__n_features_in=9), ("n_features_in",)),
        (_doc(extra=1), ("unknown key 'extra'",)),
        (_doc(kind="panel"), ("needs its roster",)),
        (_doc(decision={"action": "panel", "exec": "x"}), ("unknown key 'exec'",)),
        (_doc(stacker__intercept="1"), ("intercept",)),
        (_doc().replace(b'"intercept": ', b'"intercept": NaN, "x": '), ("not a RAIM model document",)),
        (b'{"format": "raim-model", "format": 1}', ("appears twice",)),
        (b"\x80\x04\x95", ("not a RAIM model document",)),
    ],
)
def test_a_document_that_does_not_check_is_refused_in_one_line(data, words):
    with pytest.raises(artifact.ModelRefused) as e:
        artifact.parse(data, "m")
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_a_panel_documents_roster_is_checked_against_the_backends_allow_list(compose_cfg):
    from omegaconf import OmegaConf

    roster = OmegaConf.to_container(compose_cfg("roster=tiny").roster, resolve=True)
    model = serving.PanelModel(roster, serving.frame_configs(), "claim", fitted(), ["smollm135m", "lexical", "x"])
    doc = json.loads(artifact.dumps(packaging.document_of(model)))
    doc["roster"]["members"].append({"name": "x", "backend": {"_target_": "os.system", "command": "touch F"}})
    with pytest.raises(Exception, match="not a judge backend RAIM ships"):
        artifact.parse(json.dumps(doc).encode(), "panel")


def test_a_model_folder_that_would_run_code_is_read_from_its_document_only(logged, tmp_path):
    flag = tmp_path / "FLAG"
    folder = tmp_path / "model"
    shutil.copytree(logged["folder"], folder)
    plant(folder, flag)
    inner = packaging.load_model(str(folder))
    X = pd.DataFrame({"a": [1.0, 0.0], "b": [1.0, 0.0], "c": [1.0, 0.5]})
    expected = logged["stacker"].predict_proba(X.to_numpy())[:, 1]
    assert np.array_equal(packaging.pyfunc_model(inner).predict(X)["p_hallucinated"].to_numpy(float), expected)
    assert not flag.exists()


def test_a_folder_without_a_document_is_refused_before_anything_runs(logged, tmp_path):
    flag = tmp_path / "FLAG"
    folder = tmp_path / "pickle-only"
    shutil.copytree(logged["folder"], folder)
    plant(folder, flag)
    (folder / "artifacts" / artifact.DOCUMENT).unlink()
    with pytest.raises(artifact.ModelRefused, match="no artifacts/raim_model.json"):
        packaging.load_model(str(folder))
    assert not flag.exists()


def test_a_logged_models_document_changed_in_the_store_is_refused(logged, tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    with tracking_store(tmp_path):
        with mlflow.start_run():
            info = packaging.log_stacker(fitted(), ["a", "b", "c"])
        assert isinstance(packaging.load_model(info.model_uri), serving.StackerModel)
        location = Path(MlflowClient().get_logged_model(info.model_id).artifact_location.removeprefix("file://"))
        doc = location / "artifacts" / artifact.DOCUMENT
        raw = json.loads(doc.read_text())
        raw["stacker"]["intercept"] += 5.0  # every item "hallucinated": a quiet sabotage
        doc.write_text(json.dumps(raw))
        with pytest.raises(artifact.ModelRefused, match="changed since it was recorded"):
            packaging.load_model(info.model_uri)


@pytest.fixture(scope="module")
def promoted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("promoted")
    with tracking_store(tmp) as uri:
        rid, *_ = log_simulated(tmp)
        yield {"uri": uri, "tmp": tmp, "run_id": rid, "kids": children(rid)}


def _version_folder(name: str) -> Path:
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    mv = client.get_model_version_by_alias(name, "champion")
    return Path(client.get_logged_model(mv.source.removeprefix("models:/")).artifact_location.removeprefix("file://"))


def test_promotion_records_the_digest_and_serve_refuses_a_document_changed_after_it(promoted, tmp_path):
    import mlflow

    with tracking_store(promoted["tmp"]):
        mv = registry.promote(promoted["run_id"], dataset="good", name="trust-good")
        assert mv.tags[artifact.DIGEST_TAG] == artifact.read("models:/trust-good@champion")[2]
        flag = tmp_path / "FLAG"
        folder = _version_folder("trust-good")
        plant(folder, flag)  # the pickle and the loader replaced: RAIM never reads them
        model = packaging.load_model("models:/trust-good@champion")
        assert model.columns == MEMBERS and not flag.exists()
        doc = folder / "artifacts" / artifact.DOCUMENT
        doc.write_bytes(doc.read_bytes().replace(b'"threshold": 0.5', b'"threshold": 0.99'))
        p = cli(
            tmp_path,
            "src.serve",
            "model",
            "--model-uri",
            "models:/trust-good@champion",
            "--port",
            "1",
            env={"MLFLOW_TRACKING_URI": mlflow.get_tracking_uri()},
        )
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and "changed since it was recorded" in lines[0], p.stderr
        assert not flag.exists()


def test_promotion_decides_from_data_before_it_reads_a_model(promoted, tmp_path):
    """An inadmissible panel is refused on its run's numbers alone: its model (here one that would run a command
    if unpickled) is never read."""
    from mlflow.tracking import MlflowClient

    with tracking_store(promoted["tmp"]):
        bad = promoted["kids"]["bad"]
        model_id = bad.data.tags["stacker_model_uri"].removeprefix("models:/")
        folder = Path(MlflowClient().get_logged_model(model_id).artifact_location.removeprefix("file://"))
        flag = tmp_path / "FLAG"
        plant(folder, flag)
        (folder / "artifacts" / artifact.DOCUMENT).write_text("not json")
        with pytest.raises(registry.PromotionRefused) as e:
            registry.promote(promoted["run_id"], dataset="bad")
        assert "not admissible" in str(e.value) and "cannot" not in str(e.value)
        assert not flag.exists()


@pytest.mark.slow
def test_predict_reads_a_hostile_folder_as_data(logged, tmp_path):
    flag = tmp_path / "FLAG"
    folder = tmp_path / "model"
    shutil.copytree(logged["folder"], folder)
    plant(folder, flag)
    (folder / "artifacts" / artifact.DOCUMENT).unlink()
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"item_id": "1", "candidate": "x", "evidence": "y"}) + "\n")
    p = cli(tmp_path, "src.predict", "--model-uri", str(folder), "--roster", "tiny", str(items))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "no artifacts/raim_model.json" in lines[0], p.stderr
    assert not flag.exists()
