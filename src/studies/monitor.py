"""Live admissibility monitoring of a served panel (beyond the paper; issue 11 §3).

The admissibility test of §3.3 is read once, on the labelled calibration set. A served panel can leave the
region it certified — a member's model is swapped or starts refusing, the traffic moves to a task where the
members err together — and nothing in its verdicts says so. This module watches the votes instead:

* **Recording.** The served models (:mod:`src.serve`) append each scored item's member votes (never its text),
  the stacker's p(hallucinated), a timestamp and the item id (when given) to a sqlite store — stdlib, one file,
  readable by pandas, and safe under concurrent requests: WAL journal, a busy timeout and one transaction per
  request. Recording is on when a store is named (a panel model's config ``monitor_store``, else
  ``$RAIM_MONITOR_STORE``); a failure to record is logged by the server, never raised.
* **Windows.** Over sliding windows of the stream: the label-free agreement proxy (the members' mean pairwise
  agreement on jointly voted items, :func:`src.core.admissibility.agreement_matrix`; it carries the correlation
  coordinate of the test before normalisation, §3.3 / Appendix C), each member's vote and abstention rates, and
  the deployment prevalence estimated from the stacker's posteriors (EM, Saerens, Latinne & Decaestecker 2002,
  :func:`src.studies.prevalence.estimate`).
* **Drift test.** Against the calibration set's *class-conditional* behaviour: under a pure prior shift to π
  (p(votes | class) unchanged) the expected share of items on which member j votes 1, member j abstains, and
  members i, j both vote and agree is π·μ₁ + (1 − π)·μ₀, with μ_y the calibration shares within class y.
  Each share of a window is tested against that expectation at the window's estimated π by a two-sample z-test
  (the calibration shares' own sampling variance included; counts smoothed by +½ in the variances), two-sided,
  Holm-adjusted over the window's 2K + K(K−1)/2 tests (Holm 1979, valid under any dependence). A rejection
  means the members no longer behave as they did where admissibility was certified — a change that a prevalence
  shift does not explain — so the test's verdict and the stacker's weights no longer hold ("panel" flag).
  Competence itself has no assumption-free label-free counterpart (§3.3): a flag calls for re-labelling, it is
  not a new admissibility verdict.
* **Prevalence flag.** The window's estimated prevalence differs from the reference (configured, or estimated
  on the stream's first ``reference_items``) by more than a tolerance *and* significantly at level α (a z-test
  with the estimates' standard errors from the observed information of the mixture likelihood that the EM
  maximises, Saerens et al. 2002 §2.2): re-estimate the prevalence or re-adjust the threshold
  (:mod:`src.prevalence`).
* **Alarm rule.** A kind alarms when ``consecutive`` successive windows are flagged (one window's test is at
  level α; the run of flags guards the many overlapping windows against a single unlucky one, as in the
  "k-of-n" runs rules of statistical process control, Montgomery, *Introduction to Statistical Quality
  Control*, §5.3).

``python -m src.monitor`` runs it on a served model's store (``monitor.source=store``) or, by default (the DVC
stage), on a replayed stream: a simulated panel (:func:`src.studies.simulate.panel`) calibrated on labelled items,
stable for a stretch at a deployment prevalence, then degraded (members' accuracy drops, errors become
correlated, a member starts abstaining) or prevalence-shifted; it measures the detection delay and false alarms
over several seeds. Writes ``monitor.output`` (JSON) and ``monitor.figure`` (PNG); logs the windows to MLflow as
step metrics (run kind ``monitor``).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator

from src.core.errors import RaimError, one_line
from src.core.verdicts import ABSTAIN

log = logging.getLogger("raim.monitor")

STORE_ENV = "RAIM_MONITOR_STORE"
CONFIG_KEY = "monitor_store"
_SCHEMA = ("CREATE TABLE IF NOT EXISTS votes (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, "
           "model TEXT NOT NULL, item_id TEXT, votes TEXT NOT NULL, p_hallucinated REAL)")


class MonitorError(RaimError):
    """A store, a stream or a setting the monitor cannot use; one line naming the record and the field."""


# ------------------------------------------------------------------------------------------------- recording


def store_path(config: Mapping[str, Any] | None = None) -> Path | None:
    """The store a served model records to: ``config['monitor_store']`` (a panel model's config), else
    ``$RAIM_MONITOR_STORE``; None (recording off) when neither is set or it is empty."""
    value = (config or {}).get(CONFIG_KEY) or os.environ.get(STORE_ENV) or ""
    return Path(value).expanduser() if str(value).strip() else None


def connect(path: str | Path) -> sqlite3.Connection:
    """Open (creating) the store: WAL journal (readers never block the writers), 30 s busy timeout.

    Switching a new database to WAL needs it to itself, and SQLite answers "database is locked" at once instead of
    waiting (no busy handler for it): the processes that find it not yet in WAL take turns through an exclusive
    lock on ``<store>.lock``. The mode is persistent, so later connections skip this."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(path), timeout=30.0)
    con.execute("PRAGMA busy_timeout = 30000")
    if str(con.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        with open(f"{path}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                con.execute("PRAGMA journal_mode = WAL")
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    con.execute(_SCHEMA)
    return con


def _vote_json(row: np.ndarray, members: Sequence[str]) -> str:
    return json.dumps({m: (None if (np.isnan(v) or v == ABSTAIN) else int(v)) for m, v in zip(members, row)})


def record(path: str | Path, model: str, members: Sequence[str], votes: np.ndarray, p: Sequence | None = None,
           item_ids: Sequence | None = None, ts: float | None = None) -> int:
    """Append one request's items to the store in one transaction; returns the rows written. ``votes`` is
    n × K (0 / 1; 0.5 or NaN = abstained), ``p`` the stacker's p(hallucinated) (null when every member
    abstained)."""
    votes = np.asarray(votes, dtype=float)
    n = len(votes)
    p = [None] * n if p is None else [None if pd.isna(x) else float(x) for x in p]
    ids = [None] * n if item_ids is None else [None if pd.isna(x) else str(x) for x in item_ids]
    now = time.time() if ts is None else ts
    rows = [(now, model, ids[i], _vote_json(votes[i], members), p[i]) for i in range(n)]
    con = connect(path)
    try:
        with con:
            con.executemany("INSERT INTO votes (ts, model, item_id, votes, p_hallucinated) VALUES (?, ?, ?, ?, ?)",
                            rows)
    finally:
        con.close()
    return n


def record_from(config: Mapping[str, Any] | None, model: str, members: Sequence[str], votes: np.ndarray,
                p: Sequence | None = None, item_ids: Sequence | None = None) -> int:
    """:func:`record` to the configured store (:func:`store_path`); 0 when recording is off."""
    path = store_path(config)
    return 0 if path is None else record(path, model, members, votes, p, item_ids)


@dataclass
class Stream:
    """Recorded items in arrival order: votes n × K (ABSTAIN for an abstention), p (NaN where none)."""

    members: list[str]
    votes: np.ndarray
    p: np.ndarray
    ts: np.ndarray
    item_ids: list


def _stream_vote(v: Any, where: str) -> float:
    if v is None:
        return ABSTAIN
    if isinstance(v, bool) or v not in (0, 1):
        raise MonitorError(f"{where}: {v!r} is not a vote (0, 1 or null)")
    return float(v)


def read_store(path: str | Path, members: Sequence[str], model: str | None = None) -> Stream:
    """The store's rows (optionally of one ``model``) as a :class:`Stream` over ``members``; a row without
    exactly those members, or with a bad vote, is an error naming the row (its ``seq``) and the field."""
    path = Path(path)
    if not path.is_file():
        raise MonitorError(f"{path}: no monitoring store there (record with {STORE_ENV}=… on the served model)")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    try:
        sql = "SELECT seq, ts, item_id, votes, p_hallucinated FROM votes"
        rows = con.execute(sql + (" WHERE model = ?" if model else "") + " ORDER BY seq",
                           (model,) if model else ()).fetchall()
    except sqlite3.DatabaseError as e:
        raise MonitorError(f"{path}: not a readable monitoring store ({e})") from None
    finally:
        con.close()
    votes = np.empty((len(rows), len(members)))
    for r, (seq, _, _, text, _) in enumerate(rows):
        where = f"{path}: row seq={seq}"
        try:
            doc = json.loads(text)
        except ValueError:
            raise MonitorError(f"{where}: field 'votes': not JSON") from None
        if not isinstance(doc, dict) or set(doc) != set(members):
            got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
            raise MonitorError(f"{where}: field 'votes': members {got}, the calibration set's are {list(members)}")
        votes[r] = [_stream_vote(doc[m], f"{where}: field 'votes.{m}'") for m in members]
    p = np.array([np.nan if r[4] is None else r[4] for r in rows], dtype=float)
    return Stream(list(members), votes, p, np.array([r[1] for r in rows], dtype=float), [r[2] for r in rows])


# ------------------------------------------------------------------------------------------------ statistics


def pair_names(members: Sequence[str]) -> list[str]:
    from src.core.admissibility import pair_index

    i, j = pair_index(len(members))
    return [f"{members[a]}~{members[b]}" for a, b in zip(i, j)]


def indicators(votes: np.ndarray) -> np.ndarray:
    """Per item, the 0/1 events the drift test counts: member votes 1 (K), member abstains (K), both members of
    a pair vote and agree (K(K−1)/2, in :func:`src.core.admissibility.pair_index` order)."""
    from src.core.admissibility import pair_index

    voted = votes != ABSTAIN
    i, j = pair_index(votes.shape[1])
    agree = voted[:, i] & voted[:, j] & (votes[:, i] == votes[:, j])
    return np.column_stack([voted & (votes == 1), ~voted, agree]).astype(float)


def test_names(members: Sequence[str]) -> list[str]:
    return ([f"vote/{m}" for m in members] + [f"abstain/{m}" for m in members]
            + [f"agree/{p}" for p in pair_names(members)])


def agreement_proxy(votes: np.ndarray) -> float:
    """The label-free agreement proxy of a window (:func:`src.core.admissibility.agreement_proxy`, §3.3); NaN when
    no pair of members voted on a common item (a window's metric is a number)."""
    from src.core.admissibility import agreement_proxy as proxy

    value = proxy(votes)
    return float("nan") if value is None else value


def holm_min(pvalues: np.ndarray) -> tuple[float, np.ndarray]:
    """(smallest Holm-adjusted p, all adjusted p) of one window's family (:func:`src.core.evaluate.holm`)."""
    from src.core.evaluate import holm

    adj = np.asarray(holm(list(pvalues)))
    return float(adj.min()), adj


def prevalence_se(p: np.ndarray, train_prevalence: float, prevalence: float) -> float:
    """Standard error of the EM prevalence estimate: 1/√I, I the observed information of the mixture likelihood
    Σ log(π·aᵢ + (1 − π)·bᵢ) that the EM maximises (aᵢ = pᵢ/t, bᵢ = (1 − pᵢ)/(1 − t): the class likelihoods up
    to a common factor, t the training prevalence; Saerens et al. 2002 §2.2)."""
    a, b = p / train_prevalence, (1.0 - p) / (1.0 - train_prevalence)
    info = float(np.sum((a - b) ** 2 / (prevalence * a + (1.0 - prevalence) * b) ** 2))
    return 1.0 / np.sqrt(info) if info > 0 else float("inf")


def runs_alarm(flags: Sequence[bool], consecutive: int) -> list[int]:
    """Window indices at which a run of ``consecutive`` flagged windows completes (each run alarms once)."""
    out, run = [], 0
    for w, f in enumerate(flags):
        run = run + 1 if f else 0
        if run == consecutive:
            out.append(w)
    return out


class DriftMonitor(BaseEstimator):
    """Windowed admissibility / prevalence monitor, fitted on a labelled calibration set (see module doc).

    ``fit(votes, gold)`` learns the class-conditional event shares ``mu_`` (2 × T), the class counts
    ``n_class_``, the calibration prevalence ``prevalence_`` and agreement proxy ``agreement_``;
    :meth:`windows` scores a stream, :meth:`alarms` applies the alarm rule.
    """

    def __init__(self, window: int = 200, step: int = 50, alpha: float = 0.01, consecutive: int = 2,
                 tolerance: float = 0.1, reference_prevalence: float | None = None, reference_items: int = 500,
                 members: Sequence[str] = ()):
        self.window = window
        self.step = step
        self.alpha = alpha
        self.consecutive = consecutive
        self.tolerance = tolerance
        self.reference_prevalence = reference_prevalence
        self.reference_items = reference_items
        self.members = members

    def fit(self, votes: np.ndarray, gold: np.ndarray) -> "DriftMonitor":
        votes, gold = np.asarray(votes, dtype=float), np.asarray(gold, dtype=int)
        if not ({0, 1} <= set(np.unique(gold).tolist())):
            raise MonitorError("calibration set: field 'gold': both classes are needed (0 = supported, "
                               "1 = hallucinated)")
        F = indicators(votes)
        self.n_class_ = np.array([np.sum(gold == 0), np.sum(gold == 1)], dtype=float)
        self.sums_ = np.stack([F[gold == 0].sum(0), F[gold == 1].sum(0)])
        self.mu_ = self.sums_ / self.n_class_[:, None]
        self.prevalence_ = float(gold.mean())
        self.agreement_ = agreement_proxy(votes)
        self.members_ = list(self.members) or [f"m{j}" for j in range(votes.shape[1])]
        self.tests_ = test_names(self.members_)
        return self

    def pvalues(self, votes: np.ndarray, prevalence: float) -> tuple[np.ndarray, np.ndarray]:
        """(observed shares, two-sided p-values) of one window's events against the calibration's shares
        mixed at ``prevalence`` (a two-sample z-test per event)."""
        from scipy.stats import norm

        F = indicators(np.asarray(votes, dtype=float))
        n, obs = len(F), F.mean(0)
        w = np.array([1.0 - prevalence, prevalence])
        expect = w @ self.mu_
        smooth = (self.sums_ + 0.5) / (self.n_class_[:, None] + 1.0)
        e_s = w @ smooth
        o_s = (F.sum(0) + 0.5) / (n + 1.0)
        var = o_s * (1 - o_s) / n + (w**2 / self.n_class_) @ (smooth * (1 - smooth))
        z = (obs - expect) / np.sqrt(np.maximum(var, e_s * (1 - e_s) / n))
        return obs, 2.0 * norm.sf(np.abs(z))

    def _estimate(self, p: np.ndarray) -> tuple[float, float]:
        """(EM prevalence estimate, its standard error) from the window's posteriors (NaN, NaN when none)."""
        from src.studies.prevalence import estimate

        p = p[np.isfinite(p)]
        if not len(p):
            return float("nan"), float("nan")
        est = estimate(p, self.prevalence_)
        return est, prevalence_se(p, self.prevalence_, est)

    def reference(self, p: np.ndarray) -> tuple[float, float]:
        """(reference prevalence, its standard error): the configured value (exact), else the estimate on the
        stream's first ``reference_items``."""
        if self.reference_prevalence is not None:
            return float(self.reference_prevalence), 0.0
        return self._estimate(np.asarray(p, dtype=float)[: int(self.reference_items)])

    def prevalence_flag(self, est: float, se: float, ref: tuple[float, float]) -> bool:
        """Moved by more than the tolerance and significantly (two-sided z-test at α)."""
        from scipy.stats import norm

        diff = abs(est - ref[0])
        z = diff / max(np.hypot(se, ref[1]), 1e-12)
        return bool(diff > self.tolerance + 1e-12 and z > norm.isf(self.alpha / 2))

    def windows(self, votes: np.ndarray, p: np.ndarray) -> pd.DataFrame:
        """One row per window (``start``, ``end`` exclusive): prevalence estimate, agreement proxy, vote and
        abstention rates, the smallest Holm-adjusted p, the strongest departures, and the two flags."""
        votes, p = np.asarray(votes, dtype=float), np.asarray(p, dtype=float)
        n, W = len(votes), int(self.window)
        if n < W:
            raise MonitorError(f"stream: {n} items, fewer than one window (monitor.window={W})")
        ref = self.reference(p)
        rows = [self._window(votes[s:s + W], p[s:s + W], s, s + W, ref) for s in range(0, n - W + 1, int(self.step))]
        frame = pd.DataFrame(rows)
        frame.attrs["reference_prevalence"], frame.attrs["reference_se"] = ref
        return frame

    def _window(self, votes: np.ndarray, p: np.ndarray, start: int, end: int, ref: tuple[float, float]) -> dict:
        prev, se = self._estimate(p)
        obs, pv = self.pvalues(votes, prev if np.isfinite(prev) else self.prevalence_)
        p_min, adj = holm_min(pv)
        K = len(self.members_)
        voted = votes != ABSTAIN
        row = {"start": start, "end": end, "prevalence": prev, "prevalence_se": se,
               "agreement_proxy": agreement_proxy(votes), "p_holm_min": p_min, "flag_panel": bool(p_min < self.alpha),
               "flag_prevalence": self.prevalence_flag(prev, se, ref)}
        for j, m in enumerate(self.members_):
            row[f"vote_rate/{m}"] = float(obs[j] / max(voted[:, j].mean(), 1e-12)) if voted[:, j].any() else np.nan
            row[f"abstention/{m}"] = float(obs[K + j])
        worst = np.argsort(adj)[:3]
        row["departures"] = [f"{self.tests_[t]} {obs[t]:.3f} (p_holm {adj[t]:.2g})" for t in worst
                             if adj[t] < self.alpha]
        return row

    def alarms(self, frame: pd.DataFrame) -> dict[str, list[int]]:
        """Per kind, the item positions (window ends) where the alarm rule fires."""
        return {kind: [int(frame["end"].iloc[w]) for w in runs_alarm(frame[f"flag_{kind}"].tolist(),
                                                                     int(self.consecutive))]
                for kind in ("panel", "prevalence")}


# ---------------------------------------------------------------------------------------------------- replay

SCENARIOS = ("none", "accuracy", "correlated", "abstain", "prevalence")


@dataclass
class Replay:
    """A replayed stream with its labelled calibration set; ``change`` = first item of the changed part."""

    members: list[str]
    cal_votes: np.ndarray
    cal_gold: np.ndarray
    votes: np.ndarray
    gold: np.ndarray
    p: np.ndarray
    change: int
    scenario: str


def _sim_votes(n: int, prevalence: float, accuracies, rho: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n items of a simulated panel (:func:`src.studies.simulate.panel`) at ``prevalence``, in random order."""
    from src.studies import simulate

    n1 = int(round(n * prevalence))
    df = simulate.panel(n_clusters=max(n1, n - n1), per_cluster=2, accuracies=accuracies, rho=rho, seed=seed)
    rng = np.random.default_rng(seed)
    rows = np.concatenate([rng.choice(np.flatnonzero(df["gold"] == 1), n1, replace=False),
                           rng.choice(np.flatnonzero(df["gold"] == 0), n - n1, replace=False)])
    rows = rng.permutation(rows)
    cols = [c for c in df.columns if c.startswith("m")]
    votes = df[cols].to_numpy(dtype=float, na_value=np.nan)[rows]
    return np.where(np.isnan(votes), ABSTAIN, votes), df["gold"].to_numpy()[rows]


def replay(settings: Mapping[str, Any], scenario: str, seed: int, stacker) -> Replay:
    """Calibration set (balanced, labelled), a stable stretch, then the ``scenario``'s change (``settings``: the
    ``monitor.replay`` node). The stacker is fitted on the calibration set and scores the stream."""
    from sklearn.base import clone

    if scenario not in SCENARIOS:
        raise MonitorError(f"monitor.replay.scenario: {scenario!r} is not one of {list(SCENARIOS)}")
    acc, rho, prev = list(settings["accuracies"]), float(settings["rho"]), float(settings["prevalence"])
    deg = settings["degrade"]
    cal_v, cal_g = _sim_votes(int(settings["calibration_items"]), 0.5, acc, rho, 1000 * seed + 1)
    st_v, st_g = _sim_votes(int(settings["stable_items"]), prev, acc, rho, 1000 * seed + 2)
    acc2, rho2, prev2 = list(acc), rho, prev
    if scenario == "accuracy":
        for j in deg["accuracy"]["members"]:
            acc2[j] = float(deg["accuracy"]["to"])
    elif scenario == "correlated":
        rho2 = float(deg["correlated"]["rho"])
    elif scenario == "prevalence":
        prev2 = float(deg["prevalence"]["to"])
    dg_v, dg_g = _sim_votes(int(settings["changed_items"]), prev2, acc2, rho2, 1000 * seed + 3)
    if scenario == "abstain":
        rng = np.random.default_rng(1000 * seed + 4)
        j = int(deg["abstain"]["member"])
        dg_v[rng.random(len(dg_v)) < float(deg["abstain"]["rate"]), j] = ABSTAIN
    votes, gold = np.vstack([st_v, dg_v]), np.concatenate([st_g, dg_g])
    fitted = clone(stacker).fit(cal_v, cal_g)
    p = fitted.predict_proba(votes)[:, 1]
    p[(votes == ABSTAIN).all(axis=1)] = np.nan
    members = [f"m{j:02d}" for j in range(len(acc))]
    return Replay(members, cal_v, cal_g, votes, gold, p, len(st_v), scenario)


def score_alarms(alarms: dict[str, list[int]], change: int | None, scenario: str) -> dict:
    """Detection delay of the expected alarm (the first one after ``change``: ``panel`` for a degradation,
    ``prevalence`` for a prevalence shift, none for ``none``) and the false alarms (any alarm before the change;
    after it, an alarm of a kind the scenario does not call for)."""
    expected = {"none": None, "prevalence": "prevalence"}.get(scenario, "panel")
    cut = float("inf") if change is None or scenario == "none" else change
    early = {kind: [a for a in alarms[kind] if a <= cut] for kind in alarms}
    after = [a for a in alarms.get(expected, []) if a > cut] if expected else []
    other = sorted(a for kind in alarms if kind != expected for a in alarms[kind] if a > cut)
    return {"expected": expected, "first_alarm": after[0] if after else None,
            "delay": (after[0] - change) if after else None, "false_alarms": early, "other_alarms": other}


def replay_settings(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg.monitor.replay, resolve=True)


def make_monitor(node: Mapping[str, Any], members: Sequence[str]) -> DriftMonitor:
    """A :class:`DriftMonitor` from the ``monitor`` config node (settings checked, named on error)."""
    for key in ("window", "step", "consecutive"):
        if int(node[key]) < 1:
            raise MonitorError(f"monitor.{key}: {node[key]!r} must be a positive whole number")
    if not 0.0 < float(node["alpha"]) < 1.0:
        raise MonitorError(f"monitor.alpha: {node['alpha']!r} must be in (0, 1)")
    prev = node["prevalence"]
    return DriftMonitor(window=int(node["window"]), step=int(node["step"]), alpha=float(node["alpha"]),
                        consecutive=int(node["consecutive"]), tolerance=float(prev["tolerance"]),
                        reference_prevalence=prev["reference"], reference_items=int(prev["reference_items"]),
                        members=list(members))


def evaluate_replays(node: Mapping[str, Any], stacker, scenarios: Sequence[str], seeds: Sequence[int]) -> dict:
    """Detection delay and false alarms per scenario over ``seeds`` (each seed its own replayed stream)."""
    from tqdm.auto import tqdm

    per: dict[str, list[dict]] = {s: [] for s in scenarios}
    for scenario, seed in tqdm([(s, k) for s in scenarios for k in seeds], desc="monitor replays", leave=False):
        r = replay(node["replay"], scenario, seed, stacker)
        mon = make_monitor(node, r.members).fit(r.cal_votes, r.cal_gold)
        per[scenario].append({"seed": seed, **score_alarms(mon.alarms(mon.windows(r.votes, r.p)), r.change,
                                                           scenario)})
    return {s: summarise(rows, int(node["evaluation"]["max_delay"])) for s, rows in per.items()}


def summarise(rows: list[dict], max_delay: int) -> dict:
    """One scenario's seeds: how many detected (and within ``max_delay`` items), delay (median, max), seeds
    with a false alarm (per kind)."""
    delays = [r["delay"] for r in rows if r["delay"] is not None]
    return {"seeds": len(rows), "expected": rows[0]["expected"], "detected": len(delays),
            "within_max_delay": sum(d <= max_delay for d in delays),
            "delay_median": float(np.median(delays)) if delays else None,
            "delay_max": int(max(delays)) if delays else None,
            "false_alarm_seeds": sum(any(r["false_alarms"].values()) for r in rows),
            **{f"false_alarm_seeds_{k}": sum(bool(r["false_alarms"][k]) for r in rows)
               for k in ("panel", "prevalence")},
            "false_alarms": sum(len(v) for r in rows for v in r["false_alarms"].values()),
            "other_alarm_seeds": sum(bool(r["other_alarms"]) for r in rows), "per_seed": rows}


# ----------------------------------------------------------------------------------------------- the job


def _windows_doc(frame: pd.DataFrame) -> list[dict]:
    return json.loads(frame.to_json(orient="records"))


def calibration_doc(mon: DriftMonitor, votes: np.ndarray, gold: np.ndarray, analysis) -> dict:
    from src.core.admissibility import test

    adm = test(gold, votes, float(analysis.kappa0), float(analysis.c), float(analysis.phi0)).as_dict()
    return {"n": int(len(gold)), "prevalence": mon.prevalence_, "agreement_proxy": mon.agreement_,
            "admissibility": adm}


def compute(cfg) -> dict:
    """The monitor's document for the configured source (a replay, or a served model's store)."""
    from hydra.utils import instantiate

    node = cfg.monitor
    stacker = instantiate(cfg.stacker, _convert_="all")
    if node.source == "replay":
        rs = replay_settings(cfg)
        r = replay(rs, rs["scenario"], int(rs["seed"]), stacker)
        members, cal_v, cal_g, votes, p, change = r.members, r.cal_votes, r.cal_gold, r.votes, r.p, r.change
        stream = {"n": int(len(votes)), "change": change, "scenario": r.scenario, "seed": int(rs["seed"]),
                  "true_prevalence": [float(r.gold[:change].mean()), float(r.gold[change:].mean())]}
    elif node.source == "store":
        cal = calibration_table(cfg)
        members, cal_v, cal_g = cal.members, cal.votes, cal.gold
        path = store_path({CONFIG_KEY: node.store})
        if path is None:
            raise MonitorError(f"monitor.store: no store named (set it, or {STORE_ENV})")
        s = read_store(path, members, node.model)
        votes, p, change = s.votes, s.p, None
        stream = {"n": int(len(votes)), "store": str(path), "model": node.model,
                  "first_ts": float(s.ts[0]) if len(s.ts) else None, "last_ts": float(s.ts[-1]) if len(s.ts) else None}
    else:
        raise MonitorError(f"monitor.source: {node.source!r} is not 'replay' or 'store'")
    mon = make_monitor(node, members).fit(cal_v, cal_g)
    frame = mon.windows(votes, p)
    alarms = mon.alarms(frame)
    settings = {k: node[k] for k in ("window", "step", "alpha", "consecutive")}
    settings.update(tolerance=float(node.prevalence.tolerance),
                    reference_prevalence=frame.attrs["reference_prevalence"], reference_se=frame.attrs["reference_se"])
    doc = {"source": str(node.source), "members": members, "settings": settings,
           "calibration": calibration_doc(mon, cal_v, cal_g, cfg.analysis), "stream": stream,
           "windows": _windows_doc(frame), "alarms": alarms}
    if node.source == "replay":
        doc["replay"] = score_alarms(alarms, change, stream["scenario"])
        ev = node.evaluation
        seeds = range(int(ev.first_seed), int(ev.first_seed) + int(ev.seeds))
        doc["evaluation"] = evaluate_replays(node, stacker, list(ev.scenarios), seeds)
        doc["evaluation_settings"] = {"scenarios": list(ev.scenarios), "seeds": [seeds.start, seeds.stop - 1],
                                      "stated_max_delay": int(ev.max_delay)}
    return doc


def calibration_table(cfg):
    """The labelled calibration set of a served panel: the verdict table of :func:`src.run.load_table` (the
    roster's cache, or ``verdicts=…``), rows of ``monitor.calibration.dataset`` (all rows when null)."""
    from src import run

    table = run.load_table(cfg)
    name = cfg.monitor.calibration.dataset
    if name is None:
        return table
    keep = table.items["dataset"].to_numpy() == name
    if not keep.any():
        raise MonitorError(f"monitor.calibration.dataset: {name!r} not among the table's datasets {table.datasets}")
    return table.subset(keep)


def window_series(doc: dict) -> dict[str, list[float]]:
    """Per-window values as MLflow step series (step = window number; ``monitor/window_end`` maps it to items)."""
    from src.mlops.tracking import metric_name

    keys = [k for k in doc["windows"][0] if k not in ("start", "departures")]
    nan = float("nan")
    return {metric_name("monitor", k): [nan if w[k] is None else float(w[k]) for w in doc["windows"]] for k in keys}


def summary_metrics(doc: dict) -> dict[str, float]:
    out: dict[str, float] = {"monitor/alarms_panel": len(doc["alarms"]["panel"]),
                             "monitor/alarms_prevalence": len(doc["alarms"]["prevalence"])}
    rep = doc.get("replay") or {}
    if rep.get("delay") is not None:
        out["monitor/delay"] = rep["delay"]
    if rep:
        out["monitor/false_alarms"] = sum(len(v) for v in rep["false_alarms"].values())
    for s, v in (doc.get("evaluation") or {}).items():
        out[f"monitor/eval/{s}/detected"] = v["detected"]
        out[f"monitor/eval/{s}/false_alarm_seeds"] = v["false_alarm_seeds"]
        if v["delay_max"] is not None:
            out[f"monitor/eval/{s}/delay_median"] = v["delay_median"]
            out[f"monitor/eval/{s}/delay_max"] = v["delay_max"]
    return out
