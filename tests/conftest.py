"""Shared fixtures: composed Hydra configs (shrunk), quiet environment, simulated verdict tables."""

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _no_inherited_mlflow_experiment():
    """``mlflow.set_experiment`` (src.mlops.tracking.setup) leaves the experiment's id in a module global and in
    ``$MLFLOW_EXPERIMENT_ID``: an id of one test's store. Both are cleared after each test, so a later test that
    opens a run in its own new store does not look for an experiment that store never had."""
    saved = os.environ.get("MLFLOW_EXPERIMENT_ID")
    yield
    import sys

    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is not None:
        fluent._active_experiment_id = None
    if saved is None:
        os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
    else:
        os.environ["MLFLOW_EXPERIMENT_ID"] = saved


@pytest.fixture
def compose_cfg():
    """Compose conf/config.yaml with overrides, as `python -m src.run` would."""

    def _compose(*overrides: str):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
            return compose(config_name="config", overrides=list(overrides))

    return _compose
