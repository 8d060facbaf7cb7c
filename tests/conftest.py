"""Shared fixtures: composed Hydra configs (shrunk), quiet environment, simulated verdict tables.

The environment CI exports in ``.ci/run`` is set here, before any test module (or llama.cpp's OpenMP runtime)
is loaded, so a bare ``python -m pytest`` behaves as CI does; a value already in the environment wins.
"""

import os
import sys
from pathlib import Path

CI_ENV = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_WAIT_POLICY": "PASSIVE",  # llama.cpp's OpenMP threads would otherwise spin on the shared cores
}
for _k, _v in CI_ENV.items():
    os.environ.setdefault(_k, _v)
# the venv's console scripts (dvc, mlflow, uvicorn) first on PATH, as CI's activated venv has them, so that
# `.venv/bin/python -m pytest` works without activating the venv
_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = os.pathsep.join([_BIN, *filter(None, [os.environ.get("PATH")])])

import pytest  # noqa: E402  (after the environment above)
from hydra import compose, initialize_config_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_inherited_mlflow_experiment():
    """``mlflow.set_experiment`` (src.mlops.store.setup) leaves the experiment's id in a module global and in
    ``$MLFLOW_EXPERIMENT_ID``: an id of one test's store. After each test the global is cleared and the variable
    is what it was when the test started, so a later test that opens a run in its own new store does not look for
    an experiment that store never had; a module-scoped store (test_track.tracking_store) set up before the test
    restores both when it closes."""
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


def shipped_files(folder: str) -> list[Path]:
    """The checkout's files under ``folder`` that the project ships (tracked by git), not a user's own additions
    (a ``conf/dataset/<name>.yaml`` written as docs/own-benchmark.md says); every file there outside a git
    checkout. A test that enumerates conf/ options compares the project's own ones with what it expects."""
    import subprocess

    done = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return sorted(p for p in (ROOT / folder).rglob("*") if p.is_file())
    return sorted(ROOT / name for name in done.stdout.split("\0") if name)


@pytest.fixture(scope="session")
def shipped_conf(tmp_path_factory) -> Path:
    """A copy of conf/ with the project's own options only (:func:`shipped_files`), for a test whose answer
    depends on which options exist (a tag naming the option a config's values match)."""
    import shutil

    out = tmp_path_factory.mktemp("shipped") / "conf"
    for path in shipped_files("conf"):
        target = out / path.relative_to(ROOT / "conf")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return out
