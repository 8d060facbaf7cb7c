"""The day-to-day loop: Hydra CLI runs and sweeps land in MLflow (found through the server's REST API),
params.yaml is the composition of conf/, and the DVC pipeline reproduces on a clean clone without models.

MLflow goes to a throwaway sqlite store; the clean-clone tests work on a `git clone` of HEAD in tmp with no
sibling `shared/` folder, as a clone from a forge is; a bare `python -m pytest` gets CI's environment.
"""

from __future__ import annotations

import os

ENV_AT_IMPORT = dict(os.environ)  # before this module imports anything: what conftest.py has set by now
# ruff: noqa: E402 (the imports below come after ENV_AT_IMPORT on purpose)

import hashlib
import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from test_track import QUIET, ROOT, free_port, post_json, server, tracking_store, write_panels

from src.io import config

VENV_BIN = str(Path(sys.executable).parent)
SIBLING_RAW = (ROOT.parent / "shared" / "data" / "raw").resolve()  # data.dvc's import source, beside the checkout


# the beyond-the-paper studies' stages, in dvc.yaml's order (each: python -m src.<name>, conf/<name>/)
BEYOND = ("prevalence", "monitor", "noise", "rate", "injection", "traces")


def sh(args, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    p = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{args}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def child_env(**extra) -> dict:
    env = {**os.environ, **QUIET, **extra}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


# ---------------------------------------------------------------------------------------------- Hydra + MLflow


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """`python -m src.run roster=ablation_no_gemma` and a `-m` sweep, from the repo root, into a tmp store."""
    tmp = tmp_path_factory.mktemp("cli")
    verdicts = write_panels(tmp / "verdicts.csv", n_clusters=60)
    before = {p.name for p in ROOT.iterdir()}
    with tracking_store(tmp) as uri:
        env = child_env(MLFLOW_TRACKING_URI=uri, RAIM_HYDRA_DIR=str(tmp / "hydra"))
        common = [
            "analysis=fast",
            "analysis.abstention_contrast=false",
            f"verdicts={verdicts}",
            f"output={tmp}/results.json",
        ]
        single = sh([sys.executable, "-m", "src.run", "roster=ablation_no_gemma", *common], ROOT, env)
        sweep = sh([sys.executable, "-m", "src.run", "-m", "stacker.C=0.1,10", "roster=cpu", *common], ROOT, env)
        yield {"uri": uri, "tmp": tmp, "before": before, "single": single, "sweep": sweep}


def _runs(filter_string: str):
    import mlflow

    return mlflow.search_runs(search_all_experiments=True, output_format="list", filter_string=filter_string)


@pytest.mark.slow
def test_cli_run_logs_one_tagged_run_with_dataset_children(cli_runs):
    with tracking_store(cli_runs["tmp"]):
        runs = _runs("tags.stacker = 'logreg' and tags.kind = 'stacking'")
        parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
        assert len(parents) == 1  # the sweep's jobs are tagged `logreg (C=0.1)`, `logreg (C=10)`
        p = parents[0]
        assert p.data.tags["frame"] == "auto"
        # a bring-your-own verdict table: no roster was used, so none is tagged
        assert "roster" not in p.data.tags and "roster.name" not in p.data.params
        assert p.data.params["verdicts"].endswith("verdicts.csv")
        kids = _runs(f"tags.mlflow.parentRunId = '{p.info.run_id}'")
        assert sorted(k.data.tags["dataset"] for k in kids) == ["bad", "good"]


@pytest.mark.slow
def test_multirun_sweep_is_a_parent_with_nested_job_runs(cli_runs):
    with tracking_store(cli_runs["tmp"]):
        sweeps = _runs("tags.kind = 'sweep'")
        assert len(sweeps) == 1
        jobs = _runs(f"tags.mlflow.parentRunId = '{sweeps[0].info.run_id}'")
        assert sorted(j.data.params["stacker.C"] for j in jobs) == ["0.1", "10"]
        names = []
        for j in jobs:
            kids = _runs(f"tags.mlflow.parentRunId = '{j.info.run_id}'")
            assert len(kids) == 2  # good, bad
            swept = f"stacker.C={j.data.params['stacker.C']}"  # what tells the job's runs apart in the UI
            names += [j.info.run_name, *(k.info.run_name for k in kids)]
            assert all(n.endswith(f" {swept}") and "roster=" not in n for n in names[-3:]), names
        assert len(set(names)) == 6, names
        assert sweeps[0].data.tags["sweep_dir"].startswith(str(cli_runs["tmp"] / "hydra" / "multirun"))


@pytest.mark.slow
def test_results_json_depends_on_the_inputs_only(cli_runs):
    """results.json is a DVC output: a run id in it would change dvc.lock on every clean-clone `dvc repro`; the
    MLflow run id goes beside the run folder's copy instead."""
    doc = json.loads((cli_runs["tmp"] / "results.json").read_text())
    assert "mlflow_run_id" not in doc
    ids = list((cli_runs["tmp"] / "hydra" / "runs").glob("*/mlflow_run_id"))
    assert len(ids) == 1 and len(ids[0].read_text().strip()) == 32
    assert f"MLflow run {ids[0].read_text().strip()}" in cli_runs["single"].stdout


@pytest.mark.slow
def test_a_sweep_ends_with_a_table_of_its_jobs(cli_runs):
    import pandas as pd

    out = cli_runs["sweep"].stdout
    table = out[out.index("RAIM sweep summary") :].splitlines()
    assert table[1].split() == [
        "job",
        "dataset",
        "stacked_kappa",
        "call_vs_cv_best",
        "admissible",
        "decision",
        "run_id",
    ]
    csv = list((cli_runs["tmp"] / "hydra" / "multirun").glob("*/sweep_summary.csv"))
    assert len(csv) == 1
    df = pd.read_csv(csv[0])
    assert sorted(zip(df["job"], df["dataset"])) == [
        ("stacker.C=0.1", "bad"),
        ("stacker.C=0.1", "good"),
        ("stacker.C=10", "bad"),
        ("stacker.C=10", "good"),
    ]
    assert df["run_id"].str.len().eq(32).all()  # each job's MLflow run
    assert df["decision"].str.startswith(("deploy the panel", "deploy the single judge", "nothing here")).all()
    assert all(r in out for r in df["run_id"])
    # each job wrote its own results.json; none overwrote the file named by output=
    assert len(list((cli_runs["tmp"] / "hydra" / "multirun").glob("*/*/results.json"))) == 2


@pytest.mark.slow
def test_hydra_outputs_stay_out_of_the_repo(cli_runs):
    new = {p.name for p in ROOT.iterdir()} - cli_runs["before"]
    assert not new & {"outputs", "multirun", ".hydra", "run.log"}, new
    assert not (ROOT / "outputs").exists() and not (ROOT / "multirun").exists()
    hydra = cli_runs["tmp"] / "hydra"
    assert list((hydra / "runs").glob("*/.hydra/config.yaml")) and list((hydra / "multirun").glob("*/1/.hydra"))


@pytest.mark.slow
def test_mlflow_server_finds_the_runs_over_rest(cli_runs):
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        cli_runs["uri"],
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with server(args, port, "/health") as url:
        with urllib.request.urlopen(url + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=raim") as r:
            exp = json.loads(r.read())["experiment"]
        status, body = post_json(
            url + "/api/2.0/mlflow/runs/search",
            {"experiment_ids": [exp["experiment_id"]], "filter": "tags.kind = 'sweep'"},
        )
        assert status == 200 and len(body["runs"]) == 1
        sweep_id = body["runs"][0]["info"]["run_id"]
        status, body = post_json(
            url + "/api/2.0/mlflow/runs/search",
            {
                "experiment_ids": [exp["experiment_id"]],
                "filter": f"tags.mlflow.parentRunId = '{sweep_id}'",
                "order_by": ["params.`stacker.C` ASC"],
            },
        )
        assert status == 200 and len(body["runs"]) == 2
        status, body = post_json(
            url + "/api/2.0/mlflow/runs/search",
            {
                "experiment_ids": [exp["experiment_id"]],
                "filter": "tags.dataset = 'good' and metrics.`stacked/kappa` > 0",
            },
        )
        assert status == 200 and len(body["runs"]) == 3  # one per analysis (single run + two sweep jobs)
        with urllib.request.urlopen(url + "/") as r:
            assert r.status == 200 and b"<html" in r.read(2000).lower()


# ---------------------------------------------------------------------------------------------- DVC


def test_params_yaml_is_the_composition_of_conf(tmp_path, monkeypatch):
    """params.yaml is generated from conf/ (as `dvc exp run` does): edit conf/, never params.yaml by hand."""
    from dvc.utils.hydra import compose_and_dump

    for var in config.ENV_DEPENDENT:
        monkeypatch.delenv(var, raising=False)
    compose_and_dump(tmp_path / "params.yaml", str(ROOT / "conf"), None, "config", "", [])
    assert yaml.safe_load((tmp_path / "params.yaml").read_text()) == yaml.safe_load(
        (ROOT / "params.yaml").read_text()
    ), "regenerate: python -m src.track params (see README)"


def _dvc_deps():
    import importlib.util

    spec = importlib.util.spec_from_file_location("dvc_deps", ROOT / "scripts" / "dvc_deps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_dvc_yaml_src_deps_are_the_import_graph_of_each_stage():
    """Each stage depends on exactly the src/ files its command's module imports (transitively, plus the
    `_target_` modules Hydra imports): an edit to one of them reruns it, an edit elsewhere does not."""
    dd = _dvc_deps()
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    want = dd.derived(spec, yaml.safe_load((ROOT / "params.yaml").read_text()))
    for name, st in spec["stages"].items():
        assert dd.declared(st.get("do", st)) == want[name], (
            f"dvc.yaml stage {name}: src/ deps differ from its import graph; run python scripts/dvc_deps.py --write"
        )


@pytest.mark.slow
def test_the_derived_deps_follow_an_import(tmp_path):
    """The derivation reads imports: the report stage reaches its entry and src/present/report.py; the verdicts
    stage reaches the roster's backends through their `_target_` (Hydra and the runner import them at run time)."""
    dd = _dvc_deps()
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    want = dd.derived(spec, yaml.safe_load((ROOT / "params.yaml").read_text()))
    assert "src/present/report.py" in want["report"] and "src/report.py" in want["report"]
    assert "src/judges/backends/llamacpp.py" in want["verdicts"]
    assert "src/mlops/tracking.py" in want["stacking"]  # it logs the run and writes the stage's metrics


def test_no_stage_depends_on_an_empty_file():
    """DVC warns "'<file>' is empty" for every empty dependency before each stage it checks: a package's
    ``__init__.py`` carries its docstring, so a `dvc repro` says nothing that tells nothing."""
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    deps = {d for st in spec.values() for d in st.get("do", st).get("deps", []) if "${" not in d}
    assert {d for d in deps if (ROOT / d).is_file() and (ROOT / d).stat().st_size == 0} == set()
    assert len(deps) > 20


def test_dvc_yaml_declares_an_honest_pipeline():
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert list(spec) == ["balance", "verdicts", "coverage", "stacking", "suite", *BEYOND, "report"]
    # one balance and one verdicts stage per dataset, each depending on its own raw folder and spec only
    assert spec["balance"]["foreach"] == spec["verdicts"]["foreach"] == "${dataset.datasets}"
    bal, ver = spec["balance"]["do"], spec["verdicts"]["do"]
    assert {"${item}", "conf/dataset/${key}.yaml"} <= set(bal["deps"]) and "${paths.raw_dir}" not in bal["deps"]
    assert [list(o)[0] for o in bal["outs"]] == [
        "${paths.datasets_dir}/${key}.jsonl",
        "${paths.datasets_dir}/summary/${key}.json",
        "${paths.cache_dir}/${key}/README.md",  # the set's cache folder exists before it is judged
    ]
    assert all(list(o.values())[0] == {"cache": False} for o in bal["outs"] + ver["outs"])  # committed to git
    # a dataset's verdict-cache folder is a dependency of its own verdicts stage, never an output a stage could
    # delete (only the balance stage's README in it is one)
    assert "${paths.cache_dir}/${key}" in ver["deps"] and "${paths.datasets_dir}/${key}.jsonl" in ver["deps"]
    cache_outs = [
        list(o)[0] for st in spec.values() for o in st.get("do", st).get("outs", []) if "cache_dir" in list(o)[0]
    ]
    assert cache_outs == ["${paths.cache_dir}/${key}/README.md"]
    assert "${paths.cache_dir}" in spec["stacking"]["deps"]
    assert "stacker" in spec["stacking"]["params"] and "stacker" not in ver["params"]
    # only the stacking stage writes the tracked results.json; an unjudged dataset is skipped, not fatal
    assert "output=${output}" in spec["stacking"]["cmd"] and "judge.missing=skip" in spec["stacking"]["cmd"]
    assert "${output}" in spec["suite"]["deps"] and "${suite.output}" in spec["report"]["deps"]
    assert spec["stacking"]["metrics"] == [{"results/metrics.json": {"cache": False}}]
    # each beyond-the-paper study: its module and its config node in, its document and figure out, into the report
    for name in BEYOND:
        st = spec[name]
        assert f"python -m src.{name} " in st["cmd"] and f"src/{name}.py" in st["deps"] and name in st["params"]
        paths = {k: [o if isinstance(o, str) else next(iter(o)) for o in st[k]] for k in ("outs", "plots")}
        assert paths == {"outs": [f"${{{name}.output}}"], "plots": [f"${{{name}.figure}}"]}
        assert {f"${{{name}.output}}", f"${{{name}.figure}}"} <= set(spec["report"]["deps"])
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    names = list(yaml.safe_load((ROOT / "params.yaml").read_text())["dataset"]["datasets"])
    assert set(lock) == {f"{st}@{n}" for st in ("balance", "verdicts") for n in names} | {
        "coverage",
        "stacking",
        "suite",
        *BEYOND,
        "report",
    }


def _dvc(*args, cwd, env, timeout=900):
    return sh([os.path.join(VENV_BIN, "dvc"), *args], cwd, env, timeout)


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_data_dvc_is_the_provenance_record_of_the_committed_raw_snapshot():
    """data/shipped/ is in git; data.dvc records where it was imported from (frozen: `dvc repro` never re-imports,
    `dvc update data.dvc` refreshes it where the source exists) and its directory md5, which DVC checks against the
    committed files; data/shipped.md5 lists every file's md5; each shipped benchmark has its SOURCE.md."""
    rec = yaml.safe_load((ROOT / "data.dvc").read_text())
    (dep,), (out,) = rec["deps"], rec["outs"]
    assert rec["frozen"] is True and dep["path"] == "../shared/data/raw"
    assert out["path"] == "data/shipped" and out["cache"] is False and out["md5"] == dep["md5"]
    shipped = ROOT / "data" / "shipped"
    files = sorted(p for p in shipped.rglob("*") if p.is_file())
    assert len(files) == out["nfiles"] and sum(p.stat().st_size for p in files) == out["size"]
    listing = [ln.split("  ", 1) for ln in (ROOT / "data" / "shipped.md5").read_text().splitlines()]
    assert [(f, m) for m, f in listing] == [(p.relative_to(ROOT / "data").as_posix(), _md5(p)) for p in files]
    tracked = sh(["git", "ls-files", "data/shipped"], ROOT, child_env()).stdout.split()
    assert tracked == [p.relative_to(ROOT).as_posix() for p in files]  # committed, not gitignored
    # DVC's own hash of the committed folder against the recorded one
    assert json.loads(_dvc("status", "--json", "data.dvc", cwd=ROOT, env=child_env()).stdout) == {}
    datasets = yaml.safe_load((ROOT / "conf" / "dataset" / "all.yaml").read_text())["datasets"]
    for name, folder in datasets.items():
        assert folder == f"${{paths.raw_dir}}/{name}"
        assert "License" in (shipped / name / "SOURCE.md").read_text(), name


@pytest.mark.skipif(
    not SIBLING_RAW.is_dir(),
    reason="no ../shared/data/raw beside this checkout (data.dvc's import source; a forge clone has none)",
)
def test_committed_raw_snapshot_is_the_import_source():
    theirs = sorted(p for p in SIBLING_RAW.rglob("*") if p.is_file())
    ours = [("shipped/" + p.relative_to(SIBLING_RAW).as_posix(), _md5(p)) for p in theirs]
    assert [tuple(ln.split("  ", 1)[::-1]) for ln in (ROOT / "data" / "shipped.md5").read_text().splitlines()] == ours


def _ci_exports() -> dict[str, str]:
    """The constant variables .ci/run exports before it runs the tests."""
    lines = [ln.split("#")[0] for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("export ")]
    return {k: v for ln in lines for k, v in re.findall(r"(\w+)=(\S+)", ln) if "$" not in v}


def test_ci_environment_is_set_before_test_modules_import():
    """What .ci/run exports, a bare `python -m pytest` has too (tests/conftest.py), before any test module or
    native library is imported; the venv's console scripts come first on PATH."""
    ci = _ci_exports()
    assert {"OMP_WAIT_POLICY", "DVC_NO_ANALYTICS"} <= set(ci)
    assert {k: ENV_AT_IMPORT.get(k) for k in ci} == ci
    assert ENV_AT_IMPORT["PATH"].split(os.pathsep)[0] == VENV_BIN
    if os.environ.get("RAIM_ENV_PROBE"):
        Path(os.environ["RAIM_ENV_PROBE"]).write_text(json.dumps(ENV_AT_IMPORT))


@pytest.mark.slow
def test_bare_pytest_behaves_like_ci(tmp_path):
    """The check above, in a `python -m pytest` started with none of CI's variables and no venv on PATH."""
    ci = _ci_exports()
    env = {k: v for k, v in os.environ.items() if k not in ci and not k.startswith("PYTEST_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != VENV_BIN)
    env["RAIM_ENV_PROBE"] = str(tmp_path / "env.json")
    sh(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_pipeline.py::test_ci_environment_is_set_before_test_modules_import",
        ],
        ROOT,
        env,
    )
    seen = json.loads((tmp_path / "env.json").read_text())
    assert {k: seen.get(k) for k in ci} == ci


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A clean clone of HEAD as from a forge: no sibling `shared/` folder (data.dvc's import source), no DVC
    remote, no DVC cache, no models."""
    base = tmp_path_factory.mktemp("clone")
    repo = base / "repo"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(repo)], check=True, timeout=300)
    assert not (base / "shared").exists() and not (repo / ".dvc" / "cache").exists()
    env = child_env(
        MLFLOW_TRACKING_URI=f"sqlite:///{base / 'mlflow.db'}",
        RAIM_HYDRA_DIR=str(base / "hydra"),
        RAIM_MODELS_DIR=str(base / "no-models"),
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    env.pop("RAIM_RAW_DIR", None)
    yield repo, env
    shutil.rmtree(base, ignore_errors=True)


def _git_status(repo: Path, env: dict) -> str:
    return sh(["git", "status", "--porcelain", "--untracked-files=all"], repo, env).stdout


def _ran(out: str) -> set[str]:
    return {ln.split("'")[1] for ln in out.splitlines() if ln.startswith("Running stage '")}


@pytest.fixture(scope="module")
def reproduced(clone):
    """`dvc repro` once in the forge clone: the DVC status before it and its output."""
    repo, env = clone
    before = json.loads(_dvc("status", "--json", cwd=repo, env=env).stdout)
    return before, _dvc("repro", cwd=repo, env=env).stdout


@pytest.mark.slow
def test_forge_clone_reproduces_to_a_clean_git_status(clone, reproduced):
    """Without the sibling folder: the raw snapshot is committed (data.dvc is its frozen import record, never
    re-imported), so the sets and the verdicts are up to date; only the analysis stages, whose outputs are not
    committed, run, and they reproduce dvc.lock and the committed metrics byte for byte."""
    repo, env = clone
    before, out = reproduced
    analysis = {"stacking", "suite", *BEYOND, "report"}
    assert set(before) == analysis, before
    assert _ran(out) == analysis, out
    assert "Importing" not in out and "'data.dvc' didn't change" in out
    assert _git_status(repo, env) == ""
    assert not Path(env["RAIM_MODELS_DIR"]).exists()  # no judge weights were looked for


@pytest.mark.slow
def test_forge_clone_second_repro_runs_nothing(clone, reproduced):
    repo, env = clone
    again = _dvc("repro", cwd=repo, env=env).stdout
    assert not _ran(again) and "Data and pipelines are up to date." in again, again
    assert _git_status(repo, env) == ""


@pytest.mark.slow
def test_forge_clone_rebuilds_the_committed_sets_byte_identical(clone, reproduced):
    """Forcing every `balance` stage rebuilds datasets/ from the committed raw snapshot: nothing changes."""
    repo, env = clone
    names = list(yaml.safe_load((repo / "params.yaml").read_text())["dataset"]["datasets"])
    out = _dvc("repro", "--force", "--single-item", *[f"balance@{n}" for n in names], cwd=repo, env=env).stdout
    assert _ran(out) == {f"balance@{n}" for n in names}, out
    assert _git_status(repo, env) == ""


# The studies' settings in the clone's `dvc repro`s after the first: fewer draws and replicates, and the study of
# candidates that instruct the judges on one dataset, so that each rerun of the analysis chain takes about half the
# committed settings' time. What those tests check (which stages run, which files change) holds at any setting; the
# first `dvc repro` runs the committed settings and reproduces dvc.lock byte for byte. The monitor keeps its
# committed settings here: the test that adds a dataset sees DVC's run cache restore its outputs.
SMALLER_STUDIES = (
    "suite=fast",
    "prevalence.n_boot=20",
    "noise.n_boot=100",
    "noise.draws=1",
    "rate.replicates=50",
    "rate.crosscheck.ppi_py=10",
    "rate.crosscheck.cje.replicates=10",
    "injection.datasets=[medhallu]",
)
SMALLER_MONITOR = ("monitor.evaluation.seeds=4", "monitor.evaluation.stable_streams=20")


@pytest.mark.slow
def test_clean_clone_exp_run_reruns_only_the_analysis(clone, reproduced):
    repo, env = clone
    # `dvc exp run -S` recomposes params.yaml from conf/ with the overrides, then reproduces in the workspace:
    # a stacker parameter reruns the stacking stage and what follows it, never the sets or the judges
    settings = ("stacker.C=0.5", "analysis.n_boot=200", *SMALLER_STUDIES, *SMALLER_MONITOR)
    out = _dvc("exp", "run", *(a for s in settings for a in ("-S", s)), cwd=repo, env=env).stdout
    assert all(f"Running stage '{s}'" in out for s in ("stacking", "suite", *BEYOND, "report")), out
    assert "Running stage 'balance@" not in out and "Running stage 'verdicts@" not in out
    params = yaml.safe_load((repo / "params.yaml").read_text())
    assert params["stacker"]["C"] == 0.5 and params["analysis"]["n_boot"] == 200
    assert json.loads((repo / "results" / "results.json").read_text())["settings"]["n_boot"] == 200
    assert (repo / "results" / "metrics.json").exists() and (repo / "results" / "report.md").exists()
    report = (repo / "results" / "report.md").read_text()
    for heading, figure in (
        ("## Prevalence shift", "prevalence.png"),
        ("## Live monitoring", "monitor.png"),
        ("## Noisy calibration labels", "noise.png"),
        ("## Escalation cascade", "cascade.png"),
    ):
        assert heading in report and f"{figure})" in report, heading
        assert list((repo / "results").rglob(figure)), figure
    again = _dvc("repro", cwd=repo, env=env).stdout
    assert "Running stage" not in again and "up to date" in again
    assert not Path(env["RAIM_MODELS_DIR"]).exists()  # no judge weights were looked for


@pytest.mark.slow
def test_adding_a_dataset_runs_only_its_stages_and_never_deletes_the_users_raw_file(clone):
    """A new set in `dataset=all` (README, "Your own benchmark", step 5): its own balance and verdicts stages and
    the analysis run, nothing else; with no verdicts yet it is left out and named, the others are analysed; the
    raw file under data/own/ survives `dvc repro`."""
    repo, env = clone
    fix = ROOT / "tests" / "fixtures" / "newbench"
    raw = repo / "data" / "own" / "newbench" / "qa.json"
    raw.parent.mkdir(parents=True)
    shutil.copy(fix / "newbench.json", raw)
    spec = (fix / "newbench.yaml").read_text().replace("newbench/newbench.json", "newbench/qa.json")
    (repo / "conf" / "dataset" / "newbench.yaml").write_text(spec)
    listed = repo / "conf" / "dataset" / "all.yaml"
    listed.write_text(listed.read_text() + "  newbench: ${paths.own_dir}/newbench\n")
    sh([sys.executable, "-m", "src.track", "params", *SMALLER_STUDIES], repo, env)
    out = _dvc("repro", cwd=repo, env=env).stdout
    ran = _ran(out)
    # (the monitor reads no dataset: recomposing params.yaml from conf/ undoes the previous test's `dvc exp run -S
    # stacker.C=0.5 -S analysis.n_boot=200` and its smaller monitor, settings its replay uses, back to those of the
    # first `dvc repro`, so DVC's run cache restores its outputs instead of running it)
    assert {
        "balance@newbench",
        "verdicts@newbench",
        "coverage",
        "stacking",
        "suite",
        "prevalence",
        "noise",
        "rate",
        "injection",
        "traces",
        "report",
    } == ran, out
    assert "Stage 'monitor' is cached - skipping run, checking out outputs" in out, out
    assert raw.exists() and (repo / "datasets" / "newbench.jsonl").exists()
    doc = json.loads((repo / "results" / "results.json").read_text())
    assert sorted(doc["datasets"]) == ["expertqa", "medhallu", "truthfulqa", "wice"]
    assert (
        doc["skipped"]["newbench"]["command"]
        == "python -m src.judges --roster cpu --datasets newbench --per-dataset 200 --compute"
    )
    assert "newbench" in (repo / "results" / "report.md").read_text()
    again = _dvc("repro", cwd=repo, env=env).stdout
    assert "Running stage" not in again and raw.exists()
    assert not Path(env["RAIM_MODELS_DIR"]).exists()  # no judge weights were looked for


SHIPPED = ("medhallu", "wice", "truthfulqa", "expertqa")


@pytest.mark.slow
def test_judging_a_new_set_reruns_only_its_own_stages_and_leaves_the_shipped_files_alone(clone):
    """README, "Your own benchmark", step 3 then step 5 again: the new set's verdicts go to its own folder of the
    cache, so `dvc repro` reruns its `verdicts` stage and the analysis, never a shipped set's `verdicts` stage, and
    no shipped set's cache file, table or audit changes; the headline `python -m src.run` stays green. (Follows
    the test above, which added the set to `dataset=all` and left the smaller studies' settings in params.yaml.)"""
    repo, env = clone
    shipped = {
        p: p.read_bytes()
        for ds in SHIPPED
        for p in [*(repo / "verdicts" / "cache" / ds).rglob("*"), *(repo / "verdicts" / "tables").rglob(f"{ds}*")]
        if p.is_file()
    }
    judge_env = {**env, "RAIM_MODELS_DIR": str(repo.parent / "models")}  # the default install's weights
    sh(
        [
            sys.executable,
            "-m",
            "src.judges",
            "--roster",
            "tiny",
            "--datasets",
            "newbench",
            "--per-dataset",
            "200",
            "--compute",
            "--no-progress",
        ],
        repo,
        judge_env,
    )
    assert sorted(p.parent.name for p in (repo / "verdicts" / "cache" / "newbench").glob("*/*.jsonl")) == [
        "lexical",
        "smollm135m",
    ]
    out = _dvc("repro", cwd=repo, env=env).stdout
    ran = _ran(out)
    assert "verdicts@newbench" in ran and not any(f"verdicts@{ds}" in ran for ds in SHIPPED), out
    assert not any(s.startswith("balance@") for s in ran), out
    assert {p: p.read_bytes() for p in shipped} == shipped
    changed = [ln[3:] for ln in _git_status(repo, env).splitlines()]
    assert not any(f"/{ds}" in c or f"/{ds}." in c for c in changed for ds in SHIPPED), changed
    doc = json.loads((repo / "results" / "results.json").read_text())
    assert doc["skipped"]["newbench"]["command"].startswith("python -m src.judges --roster cpu --datasets newbench ")
    headline = sh([sys.executable, "-m", "src.run"], repo, env)
    assert "newbench" in headline.stdout + headline.stderr  # named among the sets left out, with its command
    assert "medhallu: stacked κ" in headline.stdout


def test_dvc_lock_records_the_code_as_committed():
    """Every source file and config a stage depends on has the md5 dvc.lock records: an edit committed without
    `dvc repro` reruns stages on a clean clone and leaves `git status` dirty (the slow clone test finds that in
    minutes, this in a second)."""
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())["stages"]
    deps = {d["path"]: d["md5"] for st in lock.values() for d in st.get("deps", []) if "md5" in d}
    stale = sorted(
        p
        for p, md5 in deps.items()
        if p.startswith(("src/", "conf/")) and (ROOT / p).is_file() and _md5(ROOT / p) != md5
    )
    assert stale == [], f"dvc.lock is stale for {stale}: run `dvc repro` and commit dvc.lock"
