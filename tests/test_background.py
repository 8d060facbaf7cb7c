"""Tracking in a forked worker beside the analysis (src/mlops/background.py): the worker logs exactly what the
run would have logged in its own process, a store failure there is the same one line, and a run that ends before
logging leaves no MLflow run behind."""

from __future__ import annotations

import os

import mlflow
import pytest
from test_track import analysis_overrides, children, compose_cfg, tracking_store, write_panels

from src.core.errors import RaimError
from src.mlops import tracking as track
from src.mlops.background import TrackingWorker
from src.mlops.store import PROCESS_TAG
from src.studies import stacking
from src.studies.checked import check_config

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the worker forks")


def _analysed(tmp_path):
    cfg = compose_cfg(
        *analysis_overrides(write_panels(tmp_path / "verdicts.csv", ("good", "bad")), tmp_path / "r.json")
    )
    return cfg, *stacking.analyse(check_config(cfg))


def _logged(run_id: str) -> dict:
    """What a parent run and its dataset runs hold, without what differs between two runs (ids, times, the process
    that logged them)."""
    run = mlflow.get_run(run_id)
    out = {"metrics": run.data.metrics, "params": run.data.params, "children": {}}
    for name, child in sorted(children(run_id).items()):
        out["children"][name] = {
            "metrics": child.data.metrics,
            "params": child.data.params,
            "tags": {
                k: v
                for k, v in child.data.tags.items()
                if not k.startswith("mlflow.") and k not in ("stacker_model_uri", PROCESS_TAG)
            },
            "artifacts": sorted(a.path for a in mlflow.MlflowClient().list_artifacts(child.info.run_id)),
        }
    return out


def test_the_worker_logs_what_the_run_logs_in_its_own_process(tmp_path):
    with tracking_store(tmp_path):
        cfg, table, results, doc = _analysed(tmp_path)
        worker = TrackingWorker.start(check_config(cfg))
        assert worker is not None and worker.pid != os.getpid()
        by_worker = worker.log(table, results, doc)
        inline = track.log_analysis(check_config(cfg), table, results, doc)
        assert by_worker != inline and mlflow.get_run(by_worker).info.status == "FINISHED"
        assert _logged(by_worker) == _logged(inline)
        for child in children(by_worker).values():  # the stacker model, loadable from the worker's run
            assert mlflow.pyfunc.load_model(child.data.tags["stacker_model_uri"]) is not None


def test_a_store_failure_in_the_worker_is_the_same_one_line(tmp_path, monkeypatch):
    with tracking_store(tmp_path):
        cfg, table, results, doc = _analysed(tmp_path)
    bad = tmp_path / "mlflow.db"
    bad.write_text("not a sqlite database\n" * 100)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{bad}")
    with pytest.raises(RaimError) as inline:
        track.log_analysis(check_config(cfg), table, results, doc)
    worker = TrackingWorker.start(check_config(cfg))
    with pytest.raises(RaimError) as forked:
        worker.log(table, results, doc)
    assert str(forked.value) == str(inline.value) and "\n" not in str(forked.value)


def test_a_cancelled_worker_exits_and_logs_nothing(tmp_path):
    with tracking_store(tmp_path) as uri:
        cfg, *_ = _analysed(tmp_path)
        worker = TrackingWorker.start(check_config(cfg))
        worker.cancel()
        with pytest.raises(ChildProcessError):
            os.waitpid(worker.pid, os.WNOHANG)  # reaped
        exp = mlflow.get_experiment_by_name(cfg.tracking.experiment or "raim")
        runs = mlflow.search_runs([exp.experiment_id]) if exp else []
        assert len(runs) == 0, uri


def test_the_workers_warm_up_loads_no_judge_engine():
    """The worker's warm-up (what it imports while the analysis runs) is on a tracked run's critical path: it
    loads MLflow, the tracking and serving modules, and none of the judges' engines (tokenizers alone ~0.2 s)."""
    import subprocess
    import sys

    from src.mlops.background import WARM, WARM_AFTER

    engines = ("tokenizers", "safetensors", "torch", "transformers", "llama_cpp", "vllm", "anthropic")
    code = f"import importlib, sys\nfor m in {WARM + WARM_AFTER!r}: importlib.import_module(m)\n"
    code += f"print(sorted(m for m in {engines!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=track.ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


FORK_WATCH = """
import runpy, sys
from src.mlops import background
start = background.TrackingWorker.start.__func__
def watched(cls, cfg):
    print("loaded at fork:", sorted(m for m in ("sklearn", "scipy", "pandas") if m in sys.modules), flush=True)
    return start(cls, cfg)
background.TrackingWorker.start = classmethod(watched)
sys.argv = ["src.run", *sys.argv[1:]]
runpy.run_module("src.run", run_name="__main__")
"""


def test_the_worker_is_forked_once_the_analysis_libraries_are_loaded(tmp_path):
    """The worker inherits scikit-learn, SciPy and pandas from the run instead of importing them again beside the
    analysis (the unpickled analysis needs them): the same import work is not done twice on a two-core machine."""
    import subprocess
    import sys

    from test_track import ROOT

    csv = write_panels(tmp_path / "verdicts.csv", ("good", "bad"))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db", "MLFLOW_DISABLE_TELEMETRY": "true"}
    args = [*analysis_overrides(csv, tmp_path / "r.json"), f"hydra.run.dir={tmp_path}/h"]
    proc = subprocess.run(
        [sys.executable, "-c", FORK_WATCH, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loaded at fork: ['pandas', 'scipy', 'sklearn']" in proc.stdout
    assert "MLflow run " in proc.stdout and (tmp_path / "r.json").is_file()
