"""Shared fixtures: composed Hydra configs (shrunk), quiet environment, simulated verdict tables.

The environment CI exports in ``.ci/run`` is set here, before any test module (or llama.cpp's OpenMP runtime)
is loaded, so a bare ``python -m pytest`` behaves as CI does; a value already in the environment wins.
"""

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator
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
if os.environ.get("PYTEST_XDIST_WORKER"):  # each of `-n N`'s workers already holds a core: the analysis's threads
    os.environ.setdefault("RAIM_ANALYSIS_THREADS", "1")  # (src.core.threads) would only contend for it
# the venv's console scripts (dvc, mlflow, uvicorn) first on PATH, as CI's activated venv has them, so that
# `.venv/bin/python -m pytest` works without activating the venv
_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = os.pathsep.join([_BIN, *filter(None, [os.environ.get("PATH")])])

import pytest  # noqa: E402  (after the environment above)
from hydra import compose, initialize_config_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------- both cores (pytest-xdist)
# `python -m pytest -n 2` (CI, the README) runs the suite on two workers. A test that uses a module- or
# class-scoped fixture (a clone reproduced, a wheel installed, a server started, a store logged) runs on the
# worker of its module's other such tests, so the fixture is built once per run; every other test is a unit of
# its own, free to run on either core. The workers record each test's unit in a file the controller's scheduler
# reads; without it (another plugin's run, a failed write) a module's tests stay together (`--dist loadfile`,
# pyproject's addopts).
UNITS_FILE = "RAIM_TEST_UNITS"


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):  # the xdist controller
        import tempfile

        os.environ[UNITS_FILE] = str(Path(tempfile.mkdtemp(prefix="raim-test-units-")) / "units.json")


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput") and UNITS_FILE in os.environ:
        import shutil

        shutil.rmtree(Path(os.environ.pop(UNITS_FILE)).parent, ignore_errors=True)


def unit_of(item: pytest.Item) -> str:
    """The scheduling unit of a test: its module's file when it uses a fixture shared wider than one test
    (module, package or class scope), else the test itself."""
    info = getattr(item, "_fixtureinfo", None)
    defs = [d[-1] for d in info.name2fixturedefs.values() if d] if info is not None else []
    shared = any(d.scope in ("module", "package", "class") for d in defs)
    return item.nodeid.split("::", 1)[0] if shared else item.nodeid


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the units recorded, and the tests ordered as the controller deals them out — the units
    with the most slow tests first, the quick ones last to fill the gaps (each unit's tests together, in their
    order). Both workers collect, and so order, the same tests."""
    path = os.environ.get(UNITS_FILE)
    if not path or not hasattr(config, "workerinput"):
        return
    import collections
    import json

    units = {item.nodeid: unit_of(item) for item in items}
    slow = collections.Counter(units[item.nodeid] for item in items if item.get_closest_marker("slow"))
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(units[item.nodeid], i)
    items.sort(key=lambda item: (-slow[units[item.nodeid]], first[units[item.nodeid]]))
    part = Path(f"{path}.{config.workerinput['workerid']}")
    part.write_text(json.dumps(units), encoding="utf-8")
    os.replace(part, path)  # the workers collect the same tests: whichever lands last, the file is whole


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` (addopts) with the units above: pytest-xdist's per-scope scheduler, whose scope is a
    test's unit, dealing the units out in the workers' order (the slow ones first)."""
    if config.getvalue("dist") != "loadfile" or not os.environ.get(UNITS_FILE):
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # xdist's own order: the units with the most tests first

    class UnitScheduling(LoadScopeScheduling):
        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:
                import json

                try:
                    self.units = json.loads(Path(os.environ[UNITS_FILE]).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    self.units = {}
            return self.units.get(nodeid) or nodeid.split("::", 1)[0]

    return UnitScheduling(config, log)


@contextlib.contextmanager
def one_worker_at_a_time(factory: pytest.TempPathFactory, name: str) -> Iterator[None]:
    """Held by one pytest-xdist worker of this run at a time (a lock file in the run's temporary folder, which
    the workers share); a plain run holds nothing. Some things must not overlap on the two cores: a second
    ``ray.init()`` may join the first one's local cluster, which the first one's shutdown then ends."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    with open(factory.getbasetemp().parent / f"{name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
