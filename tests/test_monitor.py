"""Live admissibility monitoring (src/studies/monitor.py): recording from served models, the windowed drift
and prevalence tests on replayed streams, the entry point's JSON, figure and MLflow step metrics."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf
from test_serve import _prefill
from test_track import tracking_store

from src.core import drift, errors
from src.core.aggregate import StackedLogit
from src.core.verdicts import ABSTAIN
from src.io import votestore
from src.mlops import packaging
from src.present.monitor import monitor_section
from src.studies import monitor, simulate
from src.studies.checked import check_config
from src.studies.estimate import segment_rates
from src.studies.pool import read_labels, read_pool

ROOT = Path(__file__).resolve().parents[1]
MEMBERS = ["m00", "m01", "m02"]


def _rows(path: Path) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT model, item_id, votes, p_hallucinated FROM votes ORDER BY seq").fetchall()
    finally:
        con.close()


# --------------------------------------------------------------------------------------------- recording


@pytest.fixture(scope="module")
def stacker_model(tmp_path_factory):
    """A real served stacker: logged as an MLflow pyfunc model and loaded back, as `mlflow models serve` does."""
    import mlflow

    tmp = tmp_path_factory.mktemp("monitor-serve")
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 300)
    X = np.column_stack([np.where(rng.random(300) < 0.8, gold, 1 - gold) for _ in MEMBERS]).astype(float)
    with tracking_store(tmp):
        with mlflow.start_run():
            uri = packaging.log_stacker(StackedLogit(n_votes=3).fit(X, gold), MEMBERS).model_uri
        yield mlflow.pyfunc.load_model(uri)


def test_served_stacker_records_each_items_votes_and_p_to_the_store(stacker_model, tmp_path, monkeypatch):
    store = tmp_path / "live" / "votes.sqlite"
    monkeypatch.setenv(votestore.STORE_ENV, str(store))
    rows = pd.DataFrame([[1, 1, 0], [0, None, 0], [None, None, None]], columns=MEMBERS, dtype=float)
    out = stacker_model.predict(rows)
    got = _rows(store)
    assert [json.loads(r[2]) for r in got] == [
        {"m00": 1, "m01": 1, "m02": 0},
        {"m00": 0, "m01": None, "m02": 0},
        {"m00": None, "m01": None, "m02": None},
    ]
    assert [r[0] for r in got] == ["stacker"] * 3 and all(r[1] is None for r in got)
    assert [r[3] for r in got[:2]] == pytest.approx(out["p_hallucinated"][:2].astype(float).tolist())
    assert got[2][3] is None  # every member abstained: no p
    stacker_model.predict(rows.iloc[:1])  # a second request appends
    assert len(_rows(store)) == 4
    # a prevalence-corrected request records the posterior as fitted (what the monitor's EM estimate needs)
    corrected = stacker_model.predict(rows.iloc[:1], params={"prevalence": "0.1"})
    assert corrected["p_hallucinated"][0] < out["p_hallucinated"][0]
    assert _rows(store)[-1][3] == pytest.approx(float(out["p_hallucinated"][0]))
    con = sqlite3.connect(store)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


def test_recording_is_off_without_a_store_and_a_failure_to_record_is_said(stacker_model, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(votestore.STORE_ENV, raising=False)
    monkeypatch.delenv(votestore.FAILURE_ENV, raising=False)
    assert votestore.store_path({}) is None and votestore.store_path({"monitor_store": " "}) is None
    rows = pd.DataFrame([[1, 0, 1]], columns=MEMBERS, dtype=float)
    before = set(tmp_path.rglob("*"))
    expect = stacker_model.predict(rows)
    assert set(tmp_path.rglob("*")) == before
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv(votestore.STORE_ENV, str(blocker / "votes.sqlite"))  # cannot be created
    with caplog.at_level(logging.WARNING, logger="raim.serve"):
        out = stacker_model.predict(rows)
    pd.testing.assert_frame_equal(out.drop(columns="monitor"), expect)  # the verdict as without a store ...
    assert out["monitor"][0].startswith("not recorded: ")  # ... and the row says it was not recorded
    assert "monitor: votes of 1 item(s) not recorded" in caplog.text


def test_served_panel_records_votes_and_item_ids_never_the_text(tmp_path, compose_cfg):
    """A real panel model (tiny roster, logged and loaded through MLflow); the store is named in its model config."""
    import mlflow

    roster = OmegaConf.to_container(compose_cfg("roster=tiny").roster, resolve=True)
    names = [m["name"] for m in roster["members"]]
    gold = np.array([0, 1] * 20)
    stacker = StackedLogit(n_votes=2).fit(np.column_stack([gold, gold]).astype(float), gold)
    with tracking_store(tmp_path):
        with mlflow.start_run():
            uri = packaging.log_panel(roster, stacker, names, default_frame="claim").model_uri
        store = tmp_path / "votes.sqlite"
        model = mlflow.pyfunc.load_model(
            uri, model_config={"cache_dir": str(tmp_path / "cache"), "compute": False, "monitor_store": str(store)}
        )
    secret = "The unmistakable sentence that must never reach the monitoring store."
    items = pd.DataFrame({"evidence": ["Some evidence."], "candidate": [secret], "item_id": ["q-17"]})
    _prefill(roster, model.unwrap_python_model(), items, tmp_path / "cache", [1])  # the LLM's verdict is cached
    out = model.predict(items)
    got = _rows(store)
    assert [(r[0], r[1]) for r in got] == [("panel", "q-17")]
    assert json.loads(got[0][2]) == {n: (None if pd.isna(out[n][0]) else int(out[n][0])) for n in names}
    blob = b"".join(p.read_bytes() for p in tmp_path.glob("votes.sqlite*"))
    assert secret.encode() not in blob and b"Some evidence" not in blob


def _writer(args):
    path, w = args
    for r in range(20):
        votestore.record(
            path,
            "stacker",
            MEMBERS,
            np.array([[w % 2, 1, 0], [1, ABSTAIN, 0]], dtype=float),
            [0.3, 0.6],
            [f"w{w}-r{r}-a", f"w{w}-r{r}-b"],
        )


def test_concurrent_requests_lose_no_record(tmp_path):
    """Several servers' first requests race to create the store (switching a new database to WAL is where
    SQLite says "database is locked" without waiting): every request's rows land, on every fresh store."""
    with multiprocessing.get_context("fork").Pool(6) as pool:
        for trial in range(4):
            store = tmp_path / f"votes{trial}.sqlite"
            pool.map(_writer, [(store, w) for w in range(6)])
            got = _rows(store)
            assert len(got) == 6 * 20 * 2 and len({r[1] for r in got}) == len(got)


def test_a_bad_store_row_is_named(tmp_path):
    store = tmp_path / "votes.sqlite"
    votestore.record(store, "panel", MEMBERS, np.array([[1, 0, 1]], dtype=float))
    con = votestore.connect(store)
    with con:
        con.execute('INSERT INTO votes (ts, model, votes) VALUES (1, \'panel\', \'{"m00": 2, "m01": 0, "m02": 1}\')')
    con.close()
    with pytest.raises(errors.MonitorError, match=r"row seq=2: field 'votes.m00': 2 is not a vote"):
        votestore.read_store(store, MEMBERS)
    with pytest.raises(errors.MonitorError, match=r"row seq=1: field 'votes': members \['m00', 'm01', 'm02'\]"):
        votestore.read_store(store, ["m00", "m01"])


# ---------------------------------------------------------------------------------------------- statistics


def test_runs_rule_and_prevalence_standard_error():
    assert drift.runs_alarm([1, 0, 1, 1, 1, 0, 1, 1], 2) == [3, 7]
    # the SE is 1/sqrt(observed information): the curvature of the mixture log-likelihood at its maximum
    p = np.random.default_rng(3).beta(2, 5, 500)
    pi = 0.3

    def ll(q):
        return np.sum(np.log(q * p / 0.5 + (1 - q) * (1 - p) / 0.5))

    h = 1e-4
    curvature = -(ll(pi + h) - 2 * ll(pi) + ll(pi - h)) / h**2
    assert drift.prevalence_se(p, 0.5, pi) == pytest.approx(curvature**-0.5, rel=1e-4)


def test_drift_test_reads_a_prior_shift_as_such_and_a_flipped_member_as_drift():
    """Known answer: windows drawn from the calibration's class-conditional behaviour at another prevalence pass
    the drift test; the same window with one member's votes inverted fails it, on that member."""
    cal = simulate.panel(500, 2, [0.85, 0.8, 0.75, 0.7], rho=0.2, seed=1)
    cols = ["m00", "m01", "m02", "m03"]
    mon = drift.DriftMonitor(members=cols).fit(cal[cols].to_numpy(dtype=float), cal["gold"].to_numpy())
    st = simulate.panel(500, 2, [0.85, 0.8, 0.75, 0.7], rho=0.2, seed=2)
    keep = np.concatenate([np.flatnonzero(st["gold"] == 1)[:60], np.flatnonzero(st["gold"] == 0)[:240]])
    votes = st[cols].to_numpy(dtype=float)[keep]
    _, pv = mon.pvalues(votes, 0.2)
    assert min(drift.holm_min(pv)[1]) > 0.01
    _, pv = mon.pvalues(votes, 0.5)  # the wrong prevalence: the vote rates no longer match
    assert drift.holm_min(pv)[0] < 1e-6
    flipped = votes.copy()
    flipped[:, 2] = 1 - flipped[:, 2]
    _, pv = mon.pvalues(flipped, 0.2)
    adj = drift.holm_min(pv)[1]
    assert mon.tests_[int(np.argmin(adj))] in {"vote/m02"} | {t for t in mon.tests_ if "m02" in t and "agree" in t}
    assert adj.min() < 1e-6


# ------------------------------------------------------------------------------------------------ replays


def _cfg(compose_cfg, *extra):
    return compose_cfg(
        "monitor.evaluation.seeds=1", "monitor.evaluation.first_seed=100", "monitor.evaluation.stable_streams=2", *extra
    )


@pytest.mark.parametrize("scenario", ["accuracy", "abstain", "prevalence"])
def test_replay_flags_the_change_within_the_stated_delay_and_not_before(compose_cfg, scenario):
    cfg = _cfg(compose_cfg, f"monitor.replay.scenario={scenario}", "monitor.evaluation.scenarios=[none]")
    doc = monitor.compute(check_config(cfg))
    change, rep = doc["stream"]["change"], doc["replay"]
    assert change == cfg.monitor.replay.stable_items
    assert rep["false_alarms"] == {"panel": [], "prevalence": []}
    assert not any(w["flag_panel"] or w["flag_prevalence"] for w in doc["windows"] if w["end"] <= change)
    assert rep["delay"] is not None and 0 < rep["delay"] <= cfg.monitor.evaluation.max_delay
    assert rep["expected"] == ("prevalence" if scenario == "prevalence" else "panel")
    if scenario == "prevalence":  # the panel did not change: its drift test stays quiet; the estimate moved up
        assert doc["alarms"]["panel"] == []
        late = [w["prevalence"] for w in doc["windows"] if w["start"] >= change]
        assert np.mean(late) == pytest.approx(cfg.monitor.replay.degrade.prevalence.to, abs=0.06)
    assert doc["calibration"]["admissibility"]["admissible"]  # the replay starts inside the admissible region


def test_a_stable_stream_raises_no_alarm(compose_cfg):
    doc = monitor.compute(
        check_config(_cfg(compose_cfg, "monitor.replay.scenario=none", "monitor.evaluation.scenarios=[none]"))
    )
    assert doc["alarms"] == {"panel": [], "prevalence": []}
    assert doc["evaluation"]["none"]["false_alarm_seeds"] == 0
    text = "\n".join(monitor_section(doc))
    assert "panel alarms at items none, prevalence alarms at none" in text and "| none | — | 0/1 |" in text


def test_store_source_reads_a_recorded_stream_against_a_verdict_table(compose_cfg, tmp_path):
    cal = simulate.panel(200, 2, [0.85, 0.8, 0.75], rho=0.2, seed=5)
    cal.to_csv(tmp_path / "cal.csv", index=False)
    stream = simulate.panel(300, 2, [0.85, 0.8, 0.75], rho=0.2, seed=6)
    votes = stream[MEMBERS].to_numpy(dtype=float, na_value=np.nan)
    votes[300:, 0] = ABSTAIN  # member m00 stops answering half-way
    p = StackedLogit().fit(cal[MEMBERS].to_numpy(dtype=float), cal["gold"]).predict_proba(np.nan_to_num(votes, nan=0.5))
    votestore.record(tmp_path / "s.sqlite", "stacker", MEMBERS, votes, p[:, 1], stream["item_id"])
    source = [f"verdicts={tmp_path / 'cal.csv'}", "monitor.source=store", f"monitor.store={tmp_path / 's.sqlite'}"]
    cfg = compose_cfg(*source, "monitor.window=100", "monitor.prevalence.reference_items=200")
    doc = monitor.compute(check_config(cfg))
    assert doc["stream"]["n"] == 600 and doc["members"] == MEMBERS and "evaluation" not in doc
    assert doc["alarms"]["panel"] and min(doc["alarms"]["panel"]) > 300
    assert any("abstain/m00" in d for w in doc["windows"] for d in w["departures"])
    with pytest.raises(errors.MonitorError, match="monitor.calibration.dataset: 'nope' not among"):
        monitor.compute(check_config(compose_cfg(*source, "monitor.calibration.dataset=nope")))


def test_a_window_with_gold_labels_reports_its_rate_with_an_interval(compose_cfg, tmp_path):
    """monitor.labels: each store window holding at least min_labels labelled items gets its PPI++ rate, the same
    number src.rate gives for those items; a window with fewer gets its count and no rate."""
    cal = simulate.panel(200, 2, [0.85, 0.8, 0.75], rho=0.2, seed=5)
    cal.to_csv(tmp_path / "cal.csv", index=False)
    stream = simulate.panel(300, 2, [0.85, 0.8, 0.75], rho=0.2, seed=6).sample(frac=1.0, random_state=0)
    votes = stream[MEMBERS].to_numpy(dtype=float, na_value=np.nan)
    p = StackedLogit().fit(cal[MEMBERS].to_numpy(dtype=float), cal["gold"]).predict_proba(votes)[:, 1]
    votestore.record(tmp_path / "s.sqlite", "stacker", MEMBERS, votes, p, stream["item_id"], train_prevalence=0.5)
    labelled = stream.iloc[list(range(0, 100, 4)) + list(range(100, 600, 20))]  # 25 in the first window, then 5
    labelled[["item_id", "gold"]].to_csv(tmp_path / "gold.csv", index=False)
    source = [f"verdicts={tmp_path / 'cal.csv'}", "monitor.source=store", f"monitor.store={tmp_path / 's.sqlite'}"]
    cfg = compose_cfg(*source, "monitor.window=100", "monitor.step=100", f"monitor.labels={tmp_path / 'gold.csv'}")
    windows = monitor.compute(check_config(cfg))["windows"]
    first = windows[0]
    assert first["rate_labels"] == 25 and first["rate_ppi_lo"] <= first["rate_ppi"] <= first["rate_ppi_hi"]
    pool = read_pool(tmp_path / "s.sqlite")
    lab, y = read_labels(tmp_path / "gold.csv", pool)
    want = segment_rates(pool, np.arange(100), lab, y, None, 0.95, 0.5)["ppi"].row()
    assert [first["rate_ppi"], first["rate_ppi_lo"], first["rate_ppi_hi"]] == pytest.approx(
        [want["estimate"], *want["ci"]]
    )
    assert 0.2 < first["rate_ppi"] < 0.8  # a shuffled balanced stream
    assert all(w["rate_labels"] == 5 and w["rate_ppi"] is None for w in windows[1:])
    (tmp_path / "bad.csv").write_text("item_id,gold\nnope,1\n")
    with pytest.raises(errors.RaimError, match=r"bad.csv.*field 'item_id': 'nope' is not an item of the pool"):
        monitor.compute(check_config(compose_cfg(*source, f"monitor.labels={tmp_path / 'bad.csv'}")))


def test_bad_settings_are_named(compose_cfg):
    with pytest.raises(errors.RaimError, match=r"monitor.replay: scenario='drift' is not Literal"):
        monitor.compute(check_config(_cfg(compose_cfg, "monitor.replay.scenario=drift")))
    with pytest.raises(errors.MonitorError, match=r"monitor.alpha: 1.5 must be in \(0, 1\)"):
        monitor.compute(check_config(_cfg(compose_cfg, "monitor.alpha=1.5")))
    with pytest.raises(errors.MonitorError, match=r"stream: 100 items, fewer than one window"):
        drift.DriftMonitor(window=200).fit(np.array([[0.0], [1.0]]), np.array([0, 1])).windows(
            np.zeros((100, 1)), np.full(100, 0.5)
        )


# ------------------------------------------------------------------------------------------------- the job


@pytest.mark.slow
def test_main_writes_json_and_figure_and_logs_windows_as_step_metrics(tmp_path):
    import mlflow

    out, fig = tmp_path / "monitor.json", tmp_path / "monitor.png"
    env = {**os.environ, "RAIM_HYDRA_DIR": str(tmp_path / "hydra")}
    with tracking_store(tmp_path) as uri:
        env["MLFLOW_TRACKING_URI"] = uri
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "src.monitor",
                f"monitor.output={out}",
                f"monitor.figure={fig}",
                "monitor.evaluation.seeds=2",
                "monitor.evaluation.scenarios=[none,abstain]",
                "monitor.evaluation.stable_streams=3",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        doc = json.loads(out.read_text())
        assert fig.stat().st_size > 10_000
        run = mlflow.search_runs(
            search_all_experiments=True, filter_string="tags.kind = 'monitor'", output_format="list"
        )[0]
        client = mlflow.MlflowClient()
        hist = sorted(client.get_metric_history(run.info.run_id, "monitor/agreement_proxy"), key=lambda m: m.step)
        assert [m.step for m in hist] == list(range(len(doc["windows"])))
        assert [m.value for m in hist] == pytest.approx([w["agreement_proxy"] for w in doc["windows"]])
        ends = client.get_metric_history(run.info.run_id, "monitor/end")
        assert sorted(m.value for m in ends) == [w["end"] for w in doc["windows"]]
        assert run.data.metrics["monitor/delay"] == doc["replay"]["delay"]
        assert run.data.metrics["monitor/eval/abstain/detected"] == 2
        assert {a.path for a in client.list_artifacts(run.info.run_id, "figures")} == {"figures/monitor.png"}
    assert doc["evaluation_settings"]["seeds"] == {"none": [100, 101], "abstain": [102, 103]}
    assert doc["false_alarms"]["streams"] == 3 and doc["false_alarms"]["seeds"] == [10000, 10002]


# ------------------------------------------------------------------------------------------- false alarms


def test_alpha_auto_is_set_by_the_false_alarm_target(compose_cfg):
    """α = target·step/2: each alarm needs a flagged window, one starts every step items, two tests per window."""
    cfg = compose_cfg("monitor.false_alarm_target=1e-5", "monitor.step=50")
    mon = monitor.make_monitor(cfg.monitor, MEMBERS)
    assert cfg.monitor.alpha == "auto" and mon.alpha == pytest.approx(2.5e-4)
    assert monitor.make_monitor(compose_cfg("monitor.alpha=0.01").monitor, MEMBERS).alpha == 0.01
    with pytest.raises(
        monitor.MonitorError, match=r"monitor.false_alarm_target: 0 must be a rate per item in \(0, 1\)"
    ):
        monitor.make_monitor(compose_cfg("monitor.false_alarm_target=0").monitor, MEMBERS)
    with pytest.raises(monitor.MonitorError, match=r"monitor.alpha: 'often' must be in \(0, 1\) or 'auto'"):
        monitor.make_monitor(compose_cfg("monitor.alpha=often").monitor, MEMBERS)


def test_false_alarms_on_fresh_stable_streams_with_exact_intervals(compose_cfg):
    from scipy.stats import beta, chi2

    node = OmegaConf.to_container(compose_cfg("monitor.alpha=0.02").monitor, resolve=True)  # a loose α: alarms
    fa = monitor.stable_false_alarms(node, StackedLogit(), [10_000, 10_001, 10_002, 10_003])
    n, k, total = fa["streams"], fa["streams_with_alarm"], fa["alarms_total"]
    assert n == 4 and fa["items"] == 4 * fa["items_per_stream"] and total >= 1
    assert total == fa["alarms"]["panel"] + fa["alarms"]["prevalence"]
    assert fa["rate"] == pytest.approx(total / fa["items"] * 1e5)
    assert fa["rate_ci"] == pytest.approx(
        [chi2.ppf(0.025, 2 * total) / 2 / fa["items"] * 1e5, chi2.ppf(0.975, 2 * total + 2) / 2 / fa["items"] * 1e5]
    )
    lo = beta.ppf(0.025, k, n - k + 1) if k else 0.0
    hi = beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    assert fa["streams_with_alarm_ci"] == pytest.approx([lo, hi])
    assert fa["bound"] == pytest.approx(2 * 0.02 / node["step"] * 1e5) and fa["target"] is None


def test_the_monitoring_page_states_the_configured_alarm_rule():
    """The manual's monitoring page describes the rule the default config runs: α set by the false-alarm target
    (``alpha: auto``), the target itself and the run length an alarm needs (a page left at a retired α and run
    length misleads every reader of its measured table)."""
    conf = OmegaConf.load(ROOT / "conf" / "monitor" / "default.yaml")
    page = (ROOT / "docs" / "beyond" / "monitoring.md").read_text(encoding="utf-8")
    assert conf.alpha == "auto" and "`monitor.alpha: auto` (the default)" in page
    assert f"(default {conf.false_alarm_target:g}:".replace("e-0", "e-") in page
    assert f"`monitor.consecutive` successive flagged windows ({conf.consecutive} by default)" in page
    stable = conf.evaluation.stable_streams
    assert f"on {stable} fresh stable streams" in page and f"seeds {conf.evaluation.stable_first_seed}–" in page


def test_each_scenario_has_its_own_seeds():
    seeds = monitor.scenario_seeds(100, 20, ["none", "accuracy", "abstain"])
    assert seeds["none"] == list(range(100, 120)) and seeds["abstain"] == list(range(140, 160))
    flat = [x for v in seeds.values() for x in v]
    assert len(flat) == len(set(flat))
