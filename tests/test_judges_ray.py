"""``judge.engine=ray`` (src/judges/ray_engine.py) on a local Ray cluster started here (2 CPUs, no dashboard), the
`tiny` roster (SmolLM2-135M via llama.cpp + the lexical judge) on 32 TruthfulQA items: the verdicts equal a
single-process run's; a worker killed mid-run (Ray restarts it and retries its batch) and a driver killed mid-run
(the rerun resumes from the cache) lose and duplicate nothing; a complete cache loads no model and starts no pool.

Needs the `ray` and `llama` extras and the SmolLM2 weights; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import one_worker_at_a_time

from src.judges import tables
from src.judges.ray_engine import RayEngine, RayEngineError, RaySettings, engine_from_cfg, uses_gpu

ROOT = Path(__file__).resolve().parents[1]
N_ITEMS = 32
VOLATILE = ("seconds", "created")  # differ between any two runs


# -- settings (no cluster) --------------------------------------------------------------------------------------
def test_settings_are_validated_field_by_field():
    assert engine_from_cfg({"engine": "local"}) is None
    eng = engine_from_cfg({"engine": "ray", "ray": {"actors_per_member": 3, "batch_size": 64}})
    assert isinstance(eng, RayEngine) and eng.settings.actors_per_member == 3 and eng.runs == []
    with pytest.raises(RayEngineError, match=r"judge.engine='spark'"):
        engine_from_cfg({"engine": "spark"})
    with pytest.raises(RayEngineError, match=r"judge.ray.batch_size: 0 is not a number >= 1"):
        RaySettings.from_cfg({"batch_size": 0})
    with pytest.raises(RayEngineError, match=r"judge.ray.actors_per_member: 1.5 .*whole number"):
        RaySettings.from_cfg({"actors_per_member": 1.5})
    with pytest.raises(RayEngineError, match=r"judge.ray: unknown keys \['gpus'\]"):
        RaySettings.from_cfg({"gpus": 1})


def test_cli_options_override_the_config_node():
    import argparse

    from src.judges.ray_engine import add_engine_args, engine_from_args

    ap = argparse.ArgumentParser()
    add_engine_args(ap)
    assert engine_from_args(ap.parse_args([])) is None  # conf/config.yaml: judge.engine=local
    eng = engine_from_args(ap.parse_args(["--engine", "ray", "--ray-address", "None", "--ray-actors", "3"]))
    assert eng.settings == RaySettings(address=None, actors_per_member=3, batch_size=16)  # DVC's None = default
    with pytest.raises(RayEngineError, match=r"judge.ray.actors_per_member: 0"):
        engine_from_args(ap.parse_args(["--engine", "ray", "--ray-actors", "0"]))


def test_only_gpu_backends_ask_for_gpus():
    assert uses_gpu({"_target_": "src.judges.backends.vllm_backend.VLLMBackend", "model": "m"})
    assert uses_gpu({"_target_": "src.judges.backends.hf.HFBackend", "model": "m"})
    assert not uses_gpu({"_target_": "src.judges.backends.hf.HFBackend", "model": "m", "device": "cpu"})
    assert not uses_gpu({"_target_": "src.judges.backends.llamacpp.LlamaCppBackend", "model": "smollm2-135m"})
    assert not uses_gpu({"_target_": "src.judges.backends.nonllm.LexicalSupportBackend"})


# -- on a local cluster -----------------------------------------------------------------------------------------
ray = pytest.importorskip("ray")
pytest.importorskip("llama_cpp")
from src.judges import weights  # noqa: E402

try:
    weights.resolve("smollm2-135m")
except (ModuleNotFoundError, FileNotFoundError) as e:  # pragma: no cover
    pytest.skip(f"SmolLM2 weights not installed: {e}", allow_module_level=True)

from src.io.datasets import read_dataset  # noqa: E402
from src.judges.config import load_frame_cfgs, load_roster  # noqa: E402
from src.judges.runner import cluster_subsample, verdict_table  # noqa: E402
from src.studies.checked import check_config  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with one_worker_at_a_time(tmp_path_factory, "ray"):  # one local cluster at a time under `pytest -n 2`
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
        yield ray.get_runtime_context().gcs_address
        ray.shutdown()


@pytest.fixture(scope="module")
def setup():
    items = cluster_subsample(read_dataset(ROOT / "datasets", "truthfulqa"), N_ITEMS, seed=0)
    assert len(items) == N_ITEMS
    return load_roster("tiny"), items, load_frame_cfgs()


@pytest.fixture(scope="module")
def reference(setup, tmp_path_factory):
    """The single-process run (the runner's default engine) into its own cache."""
    roster, items, frames = setup
    cache = tmp_path_factory.mktemp("ref")
    table = verdict_table(roster, items, frames, cache, compute=True, progress=False)
    return cache, table, records(cache)


def records(cache: Path) -> dict[str, dict]:
    """Every record of a cache folder by key (the volatile fields dropped); fails on a duplicated key."""
    out = {}
    for p in sorted(cache.glob("*/*/*.jsonl")):
        keys = [json.loads(x)["key"] for x in p.read_bytes().splitlines()]
        assert len(keys) == len(set(keys)), f"duplicate records in {p}"
        for x in p.read_bytes().splitlines():
            r = json.loads(x)
            out[r["key"]] = {k: v for k, v in r.items() if k not in VOLATILE}
    return out


def assert_same_records(got: dict[str, dict], ref: dict[str, dict]) -> None:
    assert got.keys() == ref.keys() and len(ref) == 2 * N_ITEMS
    for k, r in ref.items():
        assert got[k].keys() == r.keys()
        for f, v in r.items():
            assert got[k][f] == (pytest.approx(v, abs=1e-6) if isinstance(v, float) else v), (k, f)


def smol_lines(cache: Path) -> int:
    files = list(cache.glob("*/smollm135m/*.jsonl"))
    return len(files[0].read_bytes().splitlines()) if files else 0


def wait_for(cond, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_ray_verdicts_equal_the_single_process_run(cluster, setup, reference, tmp_path):
    roster, items, frames = setup
    ref_cache, ref_table, ref = reference
    eng = RayEngine(RaySettings(actors_per_member=2, batch_size=4, num_cpus_per_actor=1))
    table = verdict_table(roster, items, frames, tmp_path, compute=True, progress=False, engine=eng)
    assert [r["member"] for r in eng.runs] == ["smollm135m", "lexical"]
    assert all(r["items"] == N_ITEMS and r["actors"] == 2 and r["gpus_per_actor"] == 0 for r in eng.runs)
    assert_same_records(records(tmp_path), ref)
    for m in ("smollm135m", "lexical"):
        assert table[m].tolist() == ref_table[m].tolist()
        assert table.attrs["report"][m]["computed"] == N_ITEMS


def _our_actor_pids() -> list[int]:
    """Ray Data actors of the cluster this test process started (worker → raylet → this process)."""

    def stat(pid: str) -> tuple[int, str]:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
        return int(s[s.rindex(")") + 2 :].split()[1]), open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="ignore")

    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid, cmd = stat(pid)
            if "MapWorker" in cmd and stat(str(ppid))[0] == os.getpid():
                out.append(int(pid))
        except (OSError, ValueError, IndexError):
            continue
    return out


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_restarted_and_nothing_is_lost_or_duplicated(cluster, setup, reference, tmp_path):
    roster, items, frames = setup
    killed: dict = {}

    def kill_one_actor():  # once the LLM member's first batch is cached, SIGKILL its actor mid-way
        wait_for(lambda: smol_lines(tmp_path) >= 4)
        pids = _our_actor_pids()
        killed.update(pids=pids, lines=smol_lines(tmp_path))
        os.kill(pids[0], signal.SIGKILL)

    t = threading.Thread(target=kill_one_actor, daemon=True)
    t.start()
    eng = RayEngine(RaySettings(actors_per_member=1, batch_size=4, num_cpus_per_actor=1))
    table = verdict_table(roster, items, frames, tmp_path, compute=True, progress=False, engine=eng)
    t.join(timeout=5)
    assert len(killed["pids"]) == 1 and 4 <= killed["lines"] < N_ITEMS, killed  # killed mid-run
    assert eng.runs[0]["items"] == N_ITEMS
    assert_same_records(records(tmp_path), reference[2])
    assert table.attrs["report"]["smollm135m"]["computed"] == N_ITEMS


def _cli(cache: Path, tables: Path, address: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "src.judges",
        "--roster",
        "tiny",
        "--datasets",
        "truthfulqa",
        "--items-dir",
        str(ROOT / "datasets"),
        "--per-dataset",
        str(N_ITEMS),
        "--cache-dir",
        str(cache),
        "--tables-dir",
        str(tables),
        "--compute",
        "--no-progress",
        "--engine",
        "ray",
        "--ray-address",
        address,
        "--ray-batch-size",
        "4",
        "--ray-actors",
        "1",
    ]


@pytest.mark.slow
def test_a_driver_killed_mid_run_resumes_from_the_cache(cluster, reference, tmp_path):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    cache, tables = tmp_path / "c", tmp_path / "t"
    p = subprocess.Popen(
        _cli(cache, tables, cluster), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: smol_lines(cache) >= 4 or p.poll() is not None, timeout=150)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    n_before = smol_lines(cache)
    assert 4 <= n_before < N_ITEMS, "the driver was not killed mid-run"
    f = next(cache.glob("*/smollm135m/*.jsonl"))
    with open(f, "ab") as fh:  # and a record torn by the kill
        fh.write(b'{"key": "torn", "vote": 1, "p_h')
    out = subprocess.run(_cli(cache, tables, cluster), cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"smollm135m   cached {N_ITEMS}/{N_ITEMS} abstained" in out.stderr
    assert f"computed {N_ITEMS - n_before} " in out.stderr  # only the missing items were scored
    assert_same_records(records(cache), reference[2])


@pytest.mark.slow
def test_a_complete_cache_loads_no_model_and_starts_no_pool(cluster, setup, reference, monkeypatch):
    from src.judges import ray_engine
    from src.judges.backends.llamacpp import LlamaCppBackend

    roster, items, frames = setup
    ref_cache, ref_table, _ = reference

    def refuse(*a, **k):
        raise AssertionError("a model was loaded or a Ray pool was started for a complete cache")

    monkeypatch.setattr(LlamaCppBackend, "load", refuse)
    monkeypatch.setattr(ray_engine, "_connect", refuse)
    monkeypatch.setattr(ray.data, "from_items", refuse)
    monkeypatch.setattr(ray.data.Dataset, "map_batches", refuse)
    eng = RayEngine(RaySettings())
    table = verdict_table(roster, items, frames, ref_cache, compute=True, progress=False, engine=eng)
    assert eng.runs == []
    assert all(r["computed"] == 0 and r["cached"] == N_ITEMS for r in table.attrs["report"].values())
    assert table["smollm135m"].tolist() == ref_table["smollm135m"].tolist()


@pytest.mark.slow
def test_src_run_judges_on_ray_with_judge_engine_ray(cluster, compose_cfg, tmp_path, monkeypatch):
    from src.judges import runner

    def refuse(*a, **k):
        raise AssertionError("scored in the driver, not on Ray")

    monkeypatch.setattr(runner, "local_scores", refuse)  # the driver's in-process engine must not run
    cfg = compose_cfg(
        "roster=tiny",
        "dataset=truthfulqa",
        f"paths.cache_dir={tmp_path}",
        "judge.compute=true",
        "judge.engine=ray",
        "judge.per_dataset=8",
        "judge.ray.batch_size=4",
        "analysis=fast",
        "tracking.enabled=false",
    )
    table = tables.load_table(check_config(cfg))
    assert len(table.items) == 8 and table.members == ["smollm135m", "lexical"]
    cache = table.provenance["cache"]["truthfulqa"]
    assert all(cache[m]["cached"] == 8 for m in table.members)
    assert len(records(tmp_path)) == 16


@pytest.mark.slow
def test_a_member_failing_on_the_workers_is_one_error_naming_it_and_its_cause(cluster, setup, tmp_path):
    _, items, frames = setup
    roster = {
        "name": "bad",
        "members": [
            {
                "name": "ghost",
                "backend": {
                    "_target_": "src.judges.backends.llamacpp.LlamaCppBackend",
                    "model_path": str(tmp_path / "no.gguf"),
                    "sha256": "0" * 64,
                },
            }
        ],
    }
    with pytest.raises(
        RayEngineError, match=r"^member ghost on Ray: src\.judges\.weights\.WeightsMissing: .*no\.gguf not found"
    ):
        verdict_table(
            roster,
            items.iloc[:4],
            frames,
            tmp_path / "c",
            compute=True,
            progress=False,
            engine=RayEngine(RaySettings()),
        )
    assert records(tmp_path / "c") == {}
