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


@pytest.fixture
def compose_cfg():
    """Compose conf/config.yaml with overrides, as `python -m src.run` would."""

    def _compose(*overrides: str):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
            return compose(config_name="config", overrides=list(overrides))

    return _compose
