"""`python -m src.run verdicts=PATH` end to end: results.json holds what the spine issue asks for."""

import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from src.core import verdicts
from src.core.ladderbase import COMPARATORS
from src.core.verdicts import VerdictError
from src.judges import tables
from src.studies import simulate, stacking
from src.studies.checked import check_config

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def table_csv(tmp_path_factory):
    p = tmp_path_factory.mktemp("byo") / "verdicts.csv"
    df = simulate.suite(n_datasets=2, n_items=300, n_members=6, seed=4)
    df.to_csv(p, index=False)
    return p


def test_cli_writes_results_json(table_csv, tmp_path):
    out = tmp_path / "res" / "results.json"
    env = dict(os.environ, RAIM_HYDRA_DIR=str(tmp_path / "hydra"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.run",
            f"verdicts={table_csv}",
            "analysis=fast",
            "tracking.enabled=false",
            f"output={out}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["datasets"]) == {"sim0", "sim1"}
    for d in doc["datasets"].values():
        assert set(d["comparators"]) == set(COMPARATORS)
        for c, v in d["comparators"].items():
            for m in ("kappa", "bacc", "f1"):
                lo, hi = v[m]["ci"]
                assert lo <= v[m]["estimate"] + 1e-9 and v[m]["estimate"] <= hi + 1e-9 or c == "oracle"
        for v in d["deltas"].values():
            assert v["kappa"]["call"] in {
                "win",
                "clean win",
                "tie",
                "clear improvement",
                "clear worsening",
                "unresolved",
            }
            assert set(v["bacc"]) >= {"estimate", "ci", "p_one_sided", "p_holm", "call"}
        assert set(d["stacker"]["beta_mean"]) == {"intercept", *[f"m{j:02d}" for j in range(6)]}
        assert len(d["stacker"]["beta_folds"]) == 5
        assert set(d["members"]["m00"]) >= {"kappa", "bacc", "coverage"}
        assert set(d["admissibility"]) >= {
            "phi_bar",
            "agreement_proxy",
            "members_at_kappa0",
            "kappa0",
            "c",
            "phi0",
            "admissible",
        }
    assert "sim0" in proc.stderr + proc.stdout  # the per-dataset log lines


def test_dataset_filter_and_errors(compose_cfg, table_csv, tmp_path):
    cfg = compose_cfg(f"verdicts={table_csv}", "analysis=fast", "dataset=medhallu")
    with pytest.raises(VerdictError, match="no rows with dataset == 'medhallu'"):
        tables.load_table(check_config(cfg))
    cfg = compose_cfg(f"verdicts={tmp_path / 'missing.csv'}")
    with pytest.raises(VerdictError, match="not found"):
        tables.load_table(check_config(cfg))


def test_stacker_group_switches_abstention_encoding(compose_cfg, table_csv):
    cfg = compose_cfg(
        f"verdicts={table_csv}", "analysis=fast", "stacker=logreg_categorical", "analysis.abstention_contrast=false"
    )
    _, results, doc = stacking.analyse(check_config(cfg))
    names = doc["datasets"]["sim0"]["stacker"]["features"]
    assert names[:2] == ["m00=1", "m01=1"] and "m00=abstain" in names


def test_members_that_never_voted_are_set_aside(tmp_path):
    from src.core import ladder, ladderbase, verdicts
    from src.core.aggregate import StackedLogit

    df = simulate.panel(n_clusters=60, accuracies=[0.9, 0.8, 0.7], seed=2)
    df["m02"] = None  # e.g. an evidence-based judge on an ungrounded set, or a member not run yet
    res = ladder.analyze(verdicts.validate(df), StackedLogit(), ladderbase.LadderSettings(n_boot=50))["sim"].summary
    assert res["excluded_members"] == ["m02"] and set(res["members"]) == {"m00", "m01"}
    assert res["admissibility"]["n_members"] == 2 and res["selected"]["best_avg"] == "m00"


# ----------------------------------------------------------------------- the verdict cache at the boundary

CACHE = ROOT / "verdicts" / "cache"


@pytest.fixture
def cache_copy(tmp_path):
    """A writable copy of the committed cpu verdict cache (to damage)."""
    import shutil

    dst = tmp_path / "cache"
    shutil.copytree(CACHE, dst)
    return dst


def _wice(compose_cfg, cache, *extra):
    return check_config(
        compose_cfg(
            "dataset=wice",
            f"paths.cache_dir={cache}",
            "analysis=fast",
            "tracking.enabled=false",
            "analysis.abstention_contrast=false",
            *extra,
        )
    )


def _member_file(cache, member: str):
    return next(cache.glob(f"*/{member}/*.jsonl"))


def test_items_without_a_cached_verdict_stop_the_run_unless_judged_only_is_asked(compose_cfg, cache_copy):
    """Stop-9 defect: 170 of 200 items without a verdict were analysed as abstentions (exit 0)."""
    f = _member_file(cache_copy, "qwen05b")
    lines = f.read_text().splitlines(keepends=True)
    gone = set([ln for ln in lines if '"dataset": "wice"' in ln][:170])
    f.write_text("".join(ln for ln in lines if ln not in gone))
    with pytest.raises(
        tables.MissingVerdicts,
        match=r"wice: 170 of 200 items \(missing per judge: qwen05b 170\); "
        r"compute them with `python -m src\.judges --roster cpu --datasets "
        r"wice --per-dataset 200 --members qwen05b --compute`",
    ):
        tables.load_table(_wice(compose_cfg, cache_copy))
    table = tables.load_table(_wice(compose_cfg, cache_copy, "judge.missing=judged_only"))
    assert len(table.gold) == 30 and not (table.votes == verdicts.ABSTAIN).all(axis=0).any()
    assert table.provenance["judged_only"]["wice"] == {
        "items": 200,
        "judged": 30,
        "dropped": 170,
        "missing_per_judge": {"qwen05b": 170},
    }
    with pytest.raises(verdicts.RaimError, match="missing='maybe' is not"):
        tables.load_table(_wice(compose_cfg, cache_copy, "judge.missing=maybe"))


def _drop_dataset(cache, dataset: str, members=None) -> None:
    """Delete a dataset's verdicts (of ``members``; all: the dataset's folder keeps only its README)."""
    for f in (cache / dataset).glob("*/*.jsonl"):
        if members is None or f.parent.name in members:
            f.unlink()


def test_a_dataset_not_judged_at_all_names_the_command_instead_of_a_bare_error(compose_cfg, cache_copy):
    """A new dataset in `dataset=all` used to fail with "no member returned a single verdict" and no way out."""
    _drop_dataset(cache_copy, "wice")
    with pytest.raises(
        tables.MissingVerdicts,
        match=r"wice: 200 of 200 items .*compute them with `python -m "
        r"src\.judges --roster cpu --datasets wice --per-dataset 200 --compute`",
    ):
        tables.load_table(_wice(compose_cfg, cache_copy))


def test_skip_leaves_an_unjudged_dataset_out_whole_and_names_it(compose_cfg, cache_copy):
    """judge.missing=skip (the DVC stages): the judged datasets are analysed, the other is named with its command."""
    _drop_dataset(cache_copy, "wice", members={"smollm135m"})
    cfg = compose_cfg(
        "dataset=all", f"paths.cache_dir={cache_copy}", "analysis=fast", "tracking.enabled=false", "judge.missing=skip"
    )
    table = tables.load_table(check_config(cfg))
    assert sorted(set(table.items["dataset"])) == ["expertqa", "medhallu", "truthfulqa"]
    skipped = table.provenance["skipped"]
    assert (
        list(skipped) == ["wice"]
        and skipped["wice"]["reason"] == "wice: 200 of 200 items (missing per judge: smollm135m 200)"
    )
    assert skipped["wice"]["command"].endswith("--datasets wice --per-dataset 200 --members smollm135m --compute")
    _drop_dataset(cache_copy, "medhallu")
    _drop_dataset(cache_copy, "truthfulqa")
    _drop_dataset(cache_copy, "expertqa")
    with pytest.raises(tables.MissingVerdicts, match="medhallu: 200 of 200 items"):  # nothing left to analyse
        tables.load_table(check_config(cfg))


def test_verdicts_of_another_rosters_judge_say_why_they_are_not_read(
    compose_cfg, cache_copy, shipped_conf, monkeypatch, tmp_path
):
    """A set judged with `roster=tiny` then analysed with `cpu`: tiny's smollm135m (n_ctx 2048) is not cpu's
    (n_ctx 1024), so its verdicts are not read; the line says so, whose they are and what reads them, beside the
    command that computes cpu's. The rosters searched are the project's own (a user's copy of tiny is named too)."""
    from src.judges import config
    from src.judges.cache import VerdictCache, identity_hash, write_identity
    from src.judges.config import load_roster
    from src.judges.runner import build_backend, roster_judges

    monkeypatch.setattr(config, "CONF_DIR", shipped_conf)
    tiny = {n: b for n, b, _ in roster_judges(load_roster("tiny"))}
    theirs = build_backend(tiny["smollm135m"]).identity()
    ours = next((cache_copy / "wice" / "smollm135m").glob("*.jsonl"))
    ours.with_name(ours.name.replace(".jsonl", ".identity.json")).unlink()
    ours.rename(ours.with_name(f"{identity_hash(theirs)[:16]}.jsonl"))
    write_identity(VerdictCache(cache_copy / "wice", "smollm135m", theirs))
    why = (
        "smollm135m: 200 verdict(s) of roster tiny's smollm135m are there (n_ctx 2048 there, 1024 here), not read "
        "here: a judge reads only the verdicts of its own identity (backend, model, sha256, template, n_ctx, "
        "scoring mode, mass floor); an analysis with roster=tiny reads them"
    )
    with pytest.raises(tables.MissingVerdicts) as refused:
        tables.load_table(_wice(compose_cfg, cache_copy))
    assert f"(missing per judge: smollm135m 200); {why}; compute them with `" in str(refused.value)
    cfg = compose_cfg("dataset=all", f"paths.cache_dir={cache_copy}", "analysis=fast", "tracking.enabled=false")
    assert tables.load_table(check_config(cfg)).provenance["skipped"]["wice"]["reason"].endswith(why)
    both = tmp_path / "conf"  # a user's copy of tiny beside it: both are named
    shutil.copytree(shipped_conf, both)
    tiny_text = (both / "roster" / "tiny.yaml").read_text()
    (both / "roster" / "mine.yaml").write_text(tiny_text.replace("name: tiny", "name: mine"))
    monkeypatch.setattr(config, "CONF_DIR", both)
    with pytest.raises(tables.MissingVerdicts) as refused:
        tables.load_table(_wice(compose_cfg, cache_copy))
    assert "of roster mine or tiny's smollm135m are there" in str(refused.value)
    assert "an analysis with roster=mine or roster=tiny reads them" in str(refused.value)


def test_by_default_a_list_leaves_an_unjudged_set_out_and_a_set_asked_by_name_stops(compose_cfg, cache_copy):
    """judge.missing=auto (the default): a set added to `dataset=all` but not judged by this roster yet no longer
    fails the headline `python -m src.run` (and every sweep) with exit 2; asking for that set alone still does."""
    _drop_dataset(cache_copy, "wice", members={"smollm135m"})
    table = tables.load_table(
        check_config(
            compose_cfg("dataset=all", f"paths.cache_dir={cache_copy}", "analysis=fast", "tracking.enabled=false")
        )
    )
    assert sorted(set(table.items["dataset"])) == ["expertqa", "medhallu", "truthfulqa"]
    assert table.provenance["skipped"]["wice"]["command"].endswith("--members smollm135m --compute")
    with pytest.raises(tables.MissingVerdicts, match="wice: 200 of 200 items"):
        tables.load_table(_wice(compose_cfg, cache_copy))


def test_skipped_datasets_reach_results_json_and_the_summary(compose_cfg, cache_copy, tmp_path):
    _drop_dataset(cache_copy, "wice")
    env = dict(os.environ, RAIM_HYDRA_DIR=str(tmp_path / "hydra"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.run",
            "dataset=all",
            f"paths.cache_dir={cache_copy}",
            "analysis=fast",
            "analysis.abstention_contrast=false",
            "tracking.enabled=false",
            "judge.missing=skip",
            f"output={tmp_path}/r.json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert "wice" not in doc["datasets"] and doc["skipped"]["wice"]["command"].endswith("--compute")
    assert any(ln.startswith("wice: left out, wice: 200 of 200 items") for ln in proc.stdout.splitlines())


def test_ad_hoc_runs_write_their_own_folder_never_the_tracked_results(tmp_path):
    """Only the DVC stage (which names output=) writes results/results.json; a plain run writes its Hydra folder."""
    import hashlib

    tracked = ROOT / "results" / "results.json"
    before = hashlib.sha256(tracked.read_bytes()).hexdigest() if tracked.exists() else None
    env = dict(os.environ, RAIM_HYDRA_DIR=str(tmp_path / "hydra"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.run",
            "dataset=wice",
            "analysis=fast",
            "tracking.enabled=false",
            "analysis.abstention_contrast=false",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    own = list((tmp_path / "hydra" / "runs").glob("*/results.json"))
    assert len(own) == 1 and list(json.loads(own[0].read_text())["datasets"]) == ["wice"]
    assert f"results: {own[0]}" in proc.stdout
    assert (hashlib.sha256(tracked.read_bytes()).hexdigest() if tracked.exists() else None) == before


def test_bad_cache_lines_are_reported_by_file_and_line_and_never_become_votes(compose_cfg, cache_copy, caplog):
    """Stop-9 defects: a garbage line turned its item into an abstention; a line `42` crashed every reader."""
    import json

    f = _member_file(cache_copy, "lexical")
    lines = f.read_text().splitlines(keepends=True)
    n = len(lines)
    wice = next(ln for ln in lines if '"dataset": "wice"' in ln)
    bad_vote = json.dumps({**json.loads(wice), "vote": 2})
    f.write_text("".join(lines) + "42\n{not json\n" + bad_vote + '\n{"key": "torn')
    with caplog.at_level("WARNING"):
        table = tables.load_table(_wice(compose_cfg, cache_copy))  # every item still has its good record
    assert table.provenance["bad_cache_lines"] == 4 and table.provenance["bad_cache_files"] == [str(f)]
    text = caplog.text
    assert f"{f}: line {n + 1}: not a JSON object (int '42'); not read as a verdict" in text
    assert f"{f}: line {n + 2}: not JSON" in text
    assert f"{f}: line {n + 3}: field 'vote': 2 not in {{0, 1, null}}" in text
    assert f"{f}: line {n + 4}: torn last record" in text
    # a good record replaced by garbage: its item is not cached, so the run stops (it is not an abstention)
    f.write_text("".join("garbage\n" if ln == wice else ln for ln in lines))
    with pytest.raises(tables.MissingVerdicts, match=r"wice: 1 of 200 items \(missing per judge: lexical 1\)"):
        tables.load_table(_wice(compose_cfg, cache_copy))


def test_bad_cache_lines_are_counted_in_mlflow(compose_cfg, cache_copy, tmp_path):
    import mlflow
    from test_track import tracking_store

    from src.mlops import tracking as track

    f = _member_file(cache_copy, "minilm")
    f.write_text(f.read_text() + "42\n[]\n")
    with tracking_store(tmp_path):
        cfg = _wice(compose_cfg, cache_copy, "tracking.enabled=true")
        table, results, doc = stacking.analyse(check_config(cfg))
        rid = track.log_analysis(check_config(cfg), table, results, doc)
        r = mlflow.get_run(rid)
        assert r.data.metrics["cache/bad_lines"] == 2.0
        report = json.loads(mlflow.artifacts.load_text(f"runs:/{rid}/verdict_cache_report.json"))
        assert report["cache"]["wice"]["minilm"]["bad_lines"] == 2


def test_cli_missing_verdicts_is_one_line_and_leaves_results_alone(cache_copy, tmp_path):
    f = _member_file(cache_copy, "smollm135m")
    f.write_text("".join(ln for ln in f.read_text().splitlines(keepends=True) if '"dataset": "wice"' not in ln))
    out = tmp_path / "results.json"
    out.write_text("{}\n")
    env = dict(os.environ, RAIM_HYDRA_DIR=str(tmp_path / "hydra"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.run",
            "dataset=wice",
            f"paths.cache_dir={cache_copy}",
            "tracking.enabled=false",
            f"output={out}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "wice: 200 of 200 items (missing per judge: smollm135m 200)" in err[0]
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr
    assert out.read_text() == "{}\n"


@pytest.mark.slow
def test_cli_run_on_the_committed_caches_ends_with_a_summary_and_no_mlflow_chatter(tmp_path):
    env = dict(os.environ, RAIM_HYDRA_DIR=str(tmp_path / "hydra"), MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/m.db")
    proc = subprocess.run(
        [sys.executable, "-m", "src.run", "analysis=fast", f"output={tmp_path}/r.json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    tail = proc.stdout.strip().splitlines()
    assert tail[-7] == "RAIM summary"
    for name, line in zip(("medhallu", "wice", "truthfulqa", "expertqa"), tail[-6:-2]):
        assert line.startswith(f"{name}: stacked κ ") and ("; admissible" in line or "; not admissible" in line)
    assert tail[-1].startswith("MLflow run ") and f"mlflow ui --backend-store-uri sqlite:///{tmp_path}/m.db" in tail[-1]
    both = proc.stdout + proc.stderr
    for chatter in (
        "CloudPickle",
        "Validating input example",
        "Failed to validate serving input",
        "Creating initial MLflow database tables",
        "X has 6 features",
    ):
        assert chatter not in both


# ------------------------------------------------------------------------------- single-judge comparators


def test_a_member_that_barely_voted_is_not_a_single_judge_comparator():
    """Stop-9 defect: a member that voted on 2 of 193 items (κ 1.0 there) became the oracle and the CV-best."""
    from src.core import ladder, ladderbase
    from src.core.aggregate import StackedLogit

    df = simulate.panel(n_clusters=100, accuracies=[0.75, 0.7, 0.65], rho=0.2, seed=3)
    df["lucky"] = pd.array([pd.NA] * len(df), dtype="Int64")
    df.loc[[0, 1], "lucky"] = df.loc[[0, 1], "gold"]  # right on the two items it judged
    res = ladder.analyze(verdicts.validate(df), StackedLogit(), ladderbase.LadderSettings(n_boot=100))["sim"].summary
    sel = res["selected"]
    assert "lucky" not in sel["best_cv_per_fold"] and sel["oracle"] != "lucky" and sel["best_avg"] != "lucky"
    assert sel["ineligible"] == {"lucky": "coverage 0.010 < 0.5"}
    assert res["comparators"]["oracle"]["kappa"]["estimate"] < 1.0
    assert "lucky" in res["members"]  # still a panel member, and the avg member still counts it


def test_best_on_average_needs_coverage_on_every_dataset():
    """Stop-9 defect: best_avg picked a member that voted on one dataset only: κ 0 with [0, 0] elsewhere."""
    from src.core import ladder, ladderbase
    from src.core.aggregate import StackedLogit

    a = simulate.panel(n_clusters=80, accuracies=[0.7, 0.6, 0.95], rho=0.2, dataset="a", seed=1)
    b = simulate.panel(n_clusters=80, accuracies=[0.7, 0.6, 0.55], rho=0.2, dataset="b", seed=2)
    b["m02"] = pd.array([pd.NA] * len(b), dtype="Int64")  # m02 judges only dataset a
    res = ladder.analyze(
        verdicts.validate(pd.concat([a, b], ignore_index=True)), StackedLogit(), ladderbase.LadderSettings(n_boot=100)
    )
    for name in ("a", "b"):
        sel = res[name].summary["selected"]
        assert sel["best_avg"] == "m00"
        assert sel["best_avg_ineligible"] == {"m02": "coverage 0.000 < 0.5 on b"}
    assert res["b"].summary["comparators"]["best_avg"]["kappa"]["ci"][1] > 0


def test_a_dataset_with_no_eligible_member_is_one_clear_error():
    from src.core import ladder, ladderbase
    from src.core.aggregate import StackedLogit

    df = simulate.panel(n_clusters=60, accuracies=[0.8, 0.7], rho=0.2, abstain_rate=0.7, seed=5)
    with pytest.raises(ladderbase.AnalysisError, match=r"dataset 'sim': no member answers at least 0.5 of the items"):
        ladder.analyze(verdicts.validate(df), StackedLogit(), ladderbase.LadderSettings(n_boot=50))
    ok = ladder.analyze(verdicts.validate(df), StackedLogit(), ladderbase.LadderSettings(n_boot=50, min_coverage=0.2))
    assert ok["sim"].summary["selected"]["min_coverage"] == 0.2


def test_output_naming_the_verdict_table_itself_is_refused(tmp_path):
    """``output=`` naming the ``verdicts=`` table (the same path, another spelling, a link) would replace the table
    with results.json: one line before any work, the table untouched."""
    from test_cli_errors import cli

    table = tmp_path / "v.csv"
    shutil.copy(ROOT / "examples" / "simulated-panel.csv", table)
    before = table.read_bytes()
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.csv").symlink_to(table)
    for out in (table, tmp_path / "sub" / ".." / "v.csv", tmp_path / "link.csv"):
        p = cli(tmp_path, "src.run", f"verdicts={table}", f"output={out}", "tracking.enabled=false", "analysis=fast")
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, p.stderr[-2000:]
        assert lines[0].startswith(f"error: output= {out}: is the verdict table {table} itself"), lines[0]
    assert table.read_bytes() == before
