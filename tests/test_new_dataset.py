"""A benchmark RAIM has never seen, added by config alone (one YAML file, one raw JSON file, no Python): built
into balanced items (Appendix J), judged by the `tiny` roster (SmolLM2-135M through llama.cpp + the lexical
judge: real weights), analysed on the ladder (Table 1) and given a deployment decision, as the README's
"Your own benchmark" section does it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from test_pipeline import child_env, sh

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "newbench"
pytestmark = pytest.mark.slow  # the module fixture judges the new set with the tiny roster's real weights


@pytest.fixture(scope="module")
def added(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("newbench")
    specs = tmp / "conf" / "dataset"
    specs.mkdir(parents=True)
    shutil.copy(FIX / "newbench.yaml", specs)
    (tmp / "own" / "newbench").mkdir(parents=True)
    shutil.copy(FIX / "newbench.json", tmp / "own" / "newbench")
    (tmp / "shipped").mkdir()
    env = child_env(RAIM_HYDRA_DIR=str(tmp / "hydra"), MLFLOW_TRACKING_URI=f"sqlite:///{tmp}/mlflow.db")
    py = [sys.executable, "-m"]
    built = sh(
        [
            *py,
            "src.data",
            "--raw-dir",
            str(tmp / "shipped"),
            "--own-dir",
            str(tmp / "own"),
            "--out-dir",
            str(tmp / "datasets"),
            "--datasets",
            "newbench",
            "--spec-dir",
            str(specs),
        ],
        ROOT,
        env,
    )
    judged = sh(
        [
            *py,
            "src.judges",
            "--roster",
            "tiny",
            "--datasets",
            "newbench",
            "--items-dir",
            str(tmp / "datasets"),
            "--cache-dir",
            str(tmp / "cache"),
            "--tables-dir",
            str(tmp / "tables"),
            "--compute",
            "--no-progress",
        ],
        ROOT,
        env,
        timeout=900,
    )
    ran = sh(
        [
            *py,
            "src.run",
            "dataset=newbench",
            "roster=tiny",
            f"hydra.searchpath=[file://{tmp / 'conf'}]",
            f"paths.datasets_dir={tmp / 'datasets'}",
            f"paths.cache_dir={tmp / 'cache'}",
            "judge.per_dataset=null",
            "analysis=fast",
            f"output={tmp / 'results.json'}",
        ],
        ROOT,
        env,
    )
    return {"tmp": tmp, "built": built, "judged": judged, "ran": ran}


def test_the_yaml_builds_balanced_clustered_items_and_reports_the_duplicate(added):
    tmp = added["tmp"]
    summary = json.loads((tmp / "datasets" / "summary" / "newbench.json").read_text())
    assert (summary["n"], summary["n_clusters"], summary["n_hallucinated"]) == (40, 20, 20)
    assert summary["duplicates"]["count"] == 1  # the record exported twice is kept once, and said
    items = [json.loads(ln) for ln in (tmp / "datasets" / "newbench.jsonl").read_text().splitlines()]
    first = next(it for it in items if it["question"] == "What is the capital of France?" and it["gold"] == 1)
    assert first["candidate"] == "The capital of France is Lyon." and first["frame"] == "def_on"
    assert first["evidence"].startswith("France is a country whose capital city is Paris.")


def test_the_tiny_roster_judges_every_item(added):
    cov = json.loads((added["tmp"] / "tables" / "tiny" / "coverage" / "newbench.json").read_text())
    assert {r["member"]: r["cached"] for r in cov["rows"]} == {"smollm135m": 40, "lexical": 40}


def test_the_analysis_runs_on_it_and_decides(added):
    doc = json.loads((added["tmp"] / "results.json").read_text())
    s = doc["datasets"]["newbench"]
    assert s["n"] == 40 and set(s["members"]) == {"smollm135m", "lexical"}
    assert s["decision"]["action"] in ("panel", "single", "none") and s["decision"]["reason"]
    lines = added["ran"].stdout.splitlines()
    assert any(ln.startswith("newbench: stacked κ ") for ln in lines)


def test_run_with_judge_compute_scores_the_misses_with_a_progress_bar(added, tmp_path):
    """`src.run judge.compute=true` judges what the cache lacks, showing progress as `src.judges` does."""
    tmp = added["tmp"]
    shutil.copytree(tmp / "cache", tmp_path / "cache")
    shutil.rmtree(tmp_path / "cache" / "newbench" / "lexical")  # one member's verdicts to compute again
    env = child_env(RAIM_HYDRA_DIR=str(tmp_path / "hydra"))
    ran = sh(
        [
            sys.executable,
            "-m",
            "src.run",
            "dataset=newbench",
            "roster=tiny",
            f"hydra.searchpath=[file://{tmp / 'conf'}]",
            f"paths.datasets_dir={tmp / 'datasets'}",
            f"paths.cache_dir={tmp_path / 'cache'}",
            "judge.per_dataset=null",
            "judge.compute=true",
            "analysis=fast",
            "tracking.enabled=false",
        ],
        ROOT,
        env,
    )
    # the tqdm bar of the one member computed, named with its dataset and its place in the roster
    assert "newbench lexical (2/2): 100%" in ran.stderr and "40/40" in ran.stderr
    assert "smollm135m" not in ran.stderr  # fully cached: nothing to compute, no bar
    assert len(next((tmp_path / "cache" / "newbench" / "lexical").glob("*.jsonl")).read_text().splitlines()) == 40
