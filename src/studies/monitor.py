"""Live admissibility monitoring of a served panel (beyond the paper).

The admissibility test of §3.3 is read once, on the labelled calibration set. A served panel can leave the
region it certified — a member's model is swapped or starts refusing, the traffic moves to a task where the
members err together — and nothing in its verdicts says so. This module watches the votes instead:

* **Recording.** The served models (:mod:`src.mlops.serving`) append each scored item's member votes (never its text),
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
  (:mod:`src.studies.prevalence`).
* **Alarm rule.** A kind alarms when ``consecutive`` successive windows are flagged (one window's test is at
  level α; the run of flags guards the many overlapping windows against a single unlucky one, as in the
  "k-of-n" runs rules of statistical process control, Montgomery, *Introduction to Statistical Quality
  Control*, §5.3).
* **False-alarm rate by design.** A window starts every ``step`` items and every alarm needs a flagged window, which
  on a stable stream happens with probability at most α per kind (Holm holds the drift test's family at α; the
  prevalence test is at α): at most 2α/``step`` false alarms per stable item. ``monitor.alpha: auto`` sets
  α = ``false_alarm_target`` · ``step`` / 2 (:func:`design_alpha`) for a rate the user chooses, e.g. 1e-5
  (one per 100,000 items); the replay measures the rate reached on fresh stable streams (:func:`stable_false_alarms`,
  with exact intervals) and ``bench/tune_monitor.py`` the trade-off with the detection delay.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from src.core.admissibility import test
from src.core.drift import DriftMonitor
from src.core.errors import MonitorError
from src.core.injection import window_shares
from src.core.names import metric_name
from src.core.verdicts import ABSTAIN
from src.io.flagstore import read_flags
from src.io.settings import Settings
from src.io.votestore import CONFIG_KEY, STORE_ENV, read_store, store_path
from src.judges import tables
from src.studies import simulate
from src.studies.checked import stacker_from
from src.studies.estimate import segment_rates
from src.studies.pool import Pool, read_labels, read_pool

log = logging.getLogger("raim.monitor")


# ------------------------------------------------------------------------------------------------- recording


# ------------------------------------------------------------------------------------------------ statistics


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

    n1 = int(round(n * prevalence))
    df = simulate.panel(n_clusters=max(n1, n - n1), per_cluster=2, accuracies=accuracies, rho=rho, seed=seed)
    rng = np.random.default_rng(seed)
    rows = np.concatenate(
        [
            rng.choice(np.flatnonzero(df["gold"] == 1), n1, replace=False),
            rng.choice(np.flatnonzero(df["gold"] == 0), n - n1, replace=False),
        ]
    )
    rows = rng.permutation(rows)
    cols = [c for c in df.columns if c.startswith("m")]
    votes = df[cols].to_numpy(dtype=float, na_value=np.nan)[rows]
    return np.where(np.isnan(votes), ABSTAIN, votes), df["gold"].to_numpy()[rows]


def replay(settings: Mapping[str, Any], scenario: str, seed: int, stacker) -> Replay:
    """Calibration set (balanced, labelled), a stable stretch, then the ``scenario``'s change (``settings``: the
    ``monitor.replay`` node). The stacker is fitted on the calibration set and scores the stream."""
    from sklearn.base import clone  # imported here, not at start-up: scikit-learn ~1.4 s

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
    return {
        "expected": expected,
        "first_alarm": after[0] if after else None,
        "delay": (after[0] - change) if after else None,
        "false_alarms": early,
        "other_alarms": other,
    }


KINDS = ("panel", "prevalence")


def design_alpha(target: float, step: int, kinds: int = len(KINDS)) -> float:
    """The per-window level α that holds a stable stream's false alarms under ``target`` per item: each alarm
    needs a flagged window, a window starts every ``step`` items, and each of the ``kinds`` tests flags a stable
    window with probability at most α, so the rate is at most ``kinds``·α/``step`` (module doc)."""
    return float(target) * int(step) / kinds


def alpha_of(node: Mapping[str, Any]) -> float:
    """``monitor.alpha``: a level in (0, 1), or ``auto`` — :func:`design_alpha` of ``monitor.false_alarm_target``."""
    if str(node["alpha"]) == "auto":
        target = node.get("false_alarm_target")
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0.0 < target < 1.0:
            raise MonitorError(
                f"monitor.false_alarm_target: {target!r} must be a rate per item in (0, 1) (monitor.alpha=auto)"
            )
        return design_alpha(target, int(node["step"]))
    try:
        alpha = float(node["alpha"])
    except (TypeError, ValueError):
        alpha = float("nan")
    if not 0.0 < alpha < 1.0:
        raise MonitorError(f"monitor.alpha: {node['alpha']!r} must be in (0, 1) or 'auto'")
    return alpha


def make_monitor(node: Mapping[str, Any], members: Sequence[str]) -> DriftMonitor:
    """A :class:`DriftMonitor` from the ``monitor`` config node (settings checked, named on error)."""
    for key in ("window", "step", "consecutive"):
        if int(node[key]) < 1:
            raise MonitorError(f"monitor.{key}: {node[key]!r} must be a positive whole number")
    prev = node["prevalence"]
    return DriftMonitor(
        window=int(node["window"]),
        step=int(node["step"]),
        alpha=alpha_of(node),
        consecutive=int(node["consecutive"]),
        tolerance=float(prev["tolerance"]),
        reference_prevalence=prev["reference"],
        reference_items=int(prev["reference_items"]),
        members=list(members),
    )


def rate_interval(count: int, exposure: float, level: float = 0.95) -> list[float]:
    """Exact (Garwood) interval of a Poisson rate: ``count`` events over ``exposure`` units."""
    from scipy.stats import chi2  # imported here, not at start-up: scipy

    a = (1 - level) / 2
    lo = chi2.ppf(a, 2 * count) / 2 if count > 0 else 0.0
    return [float(lo / exposure), float(chi2.ppf(1 - a, 2 * count + 2) / 2 / exposure)]


def share_interval(k: int, n: int, level: float = 0.95) -> list[float]:
    """Exact (Clopper–Pearson) interval of a binomial share ``k``/``n``."""
    from scipy.stats import beta  # imported here, not at start-up: scipy

    a = (1 - level) / 2
    return [float(beta.ppf(a, k, n - k + 1)) if k > 0 else 0.0, float(beta.ppf(1 - a, k + 1, n - k)) if k < n else 1.0]


def stable_false_alarms(node: Mapping[str, Any], stacker, seeds: Sequence[int], per: int = 100_000) -> dict:
    """False alarms on fresh stable streams (the replay's scenario ``none``: nothing changes, each seed its own
    calibration set and stream): alarms per ``per`` stable items with an exact Poisson interval, and the share of
    streams with any false alarm with a Clopper–Pearson interval, per kind and together."""
    counts = {k: 0 for k in KINDS}
    streams_with, items, per_seed = 0, 0, []
    for seed in seeds:
        r = replay(node["replay"], "none", seed, stacker)
        mon = make_monitor(node, r.members).fit(r.cal_votes, r.cal_gold)
        alarms = mon.alarms(mon.windows(r.votes, r.p))
        for k in KINDS:
            counts[k] += len(alarms[k])
        streams_with += any(alarms.values())
        items += len(r.votes)
        if any(alarms.values()):
            per_seed.append({"seed": int(seed), **alarms})
    total = sum(counts.values())
    return {
        "streams": len(seeds),
        "items_per_stream": items // max(len(seeds), 1),
        "items": items,
        "alarms": counts,
        "alarms_total": total,
        "per": per,
        "rate": total / items * per,
        "rate_ci": [v * per for v in rate_interval(total, items)],
        "streams_with_alarm": streams_with,
        "streams_with_alarm_ci": share_interval(streams_with, len(seeds)),
        "target": None if str(node["alpha"]) != "auto" else float(node["false_alarm_target"]) * per,
        "bound": len(KINDS) * alpha_of(node) / int(node["step"]) * per,
        "alarmed_seeds": per_seed,
    }


def scenario_seeds(first: int, n: int, scenarios: Sequence[str]) -> dict[str, list[int]]:
    """Each scenario's own block of ``n`` seeds from ``first`` on (no stable stretch is shared between scenarios)."""
    return {s: list(range(first + i * n, first + (i + 1) * n)) for i, s in enumerate(scenarios)}


def evaluate_replays(
    node: Mapping[str, Any], stacker, scenarios: Sequence[str], seeds: dict[str, Sequence[int]]
) -> dict:
    """Detection delay and false alarms per scenario over its ``seeds[scenario]`` (each seed its own replayed
    stream)."""
    from tqdm.auto import tqdm  # imported here, not at start-up: tqdm

    per: dict[str, list[dict]] = {s: [] for s in scenarios}
    for scenario, seed in tqdm([(s, k) for s in scenarios for k in seeds[s]], desc="monitor replays", leave=False):
        r = replay(node["replay"], scenario, seed, stacker)
        mon = make_monitor(node, r.members).fit(r.cal_votes, r.cal_gold)
        per[scenario].append({"seed": seed, **score_alarms(mon.alarms(mon.windows(r.votes, r.p)), r.change, scenario)})
    return {s: summarise(rows, int(node["evaluation"]["max_delay"])) for s, rows in per.items()}


def summarise(rows: list[dict], max_delay: int) -> dict:
    """One scenario's seeds: how many detected (and within ``max_delay`` items), delay (median, max), seeds
    with a false alarm (per kind)."""
    delays = [r["delay"] for r in rows if r["delay"] is not None]
    return {
        "seeds": len(rows),
        "expected": rows[0]["expected"],
        "detected": len(delays),
        "within_max_delay": sum(d <= max_delay for d in delays),
        "delay_median": float(np.median(delays)) if delays else None,
        "delay_max": int(max(delays)) if delays else None,
        "false_alarm_seeds": sum(any(r["false_alarms"].values()) for r in rows),
        **{f"false_alarm_seeds_{k}": sum(bool(r["false_alarms"][k]) for r in rows) for k in ("panel", "prevalence")},
        "false_alarms": sum(len(v) for r in rows for v in r["false_alarms"].values()),
        "other_alarm_seeds": sum(bool(r["other_alarms"]) for r in rows),
        "per_seed": rows,
    }


# ----------------------------------------------------------------------------------------------- the job


def _windows_doc(frame: pd.DataFrame) -> list[dict]:
    return json.loads(frame.to_json(orient="records"))


RATE_COLUMNS = ("rate_labels", "rate_ppi", "rate_ppi_lo", "rate_ppi_hi")


def window_rates(pool: Pool, labelled: np.ndarray, y: np.ndarray, bounds, min_labels: int, level: float) -> dict:
    """The hallucination rate of each window ``[start, end)`` that holds at least ``min_labels`` gold labels:
    PPI++ with the stacker's p on all the window's items (:func:`src.studies.estimate.segment_rates`; the labels a
    uniform random sample of the window), its interval valid whatever the panel's quality. A window with fewer
    labels has its label count and no rate."""
    cols: dict[str, list] = {c: [] for c in RATE_COLUMNS}
    for start, end in bounds:
        idx = np.arange(int(start), int(end))
        n = int(labelled[idx].sum())
        cols["rate_labels"].append(n)
        row = segment_rates(pool, idx, labelled, y, None, level, 0.5)["ppi"].row() if n >= min_labels else None
        cols["rate_ppi"].append(None if row is None else row["estimate"])
        cols["rate_ppi_lo"].append(None if row is None else row["ci"][0])
        cols["rate_ppi_hi"].append(None if row is None else row["ci"][1])
    return cols


def store_rates(node, path, frame: pd.DataFrame) -> dict | None:
    """``monitor.labels`` (item_id, gold) read against the store's rows → :func:`window_rates`; None when unset."""
    if not node.get("labels"):
        return None
    pool = read_pool(path, model=node["model"])
    labelled, y = read_labels(node["labels"], pool)
    return window_rates(pool, labelled, y, zip(frame["start"], frame["end"]), int(node["min_labels"]), 0.95)


def calibration_doc(mon: DriftMonitor, votes: np.ndarray, gold: np.ndarray, analysis: Mapping[str, Any]) -> dict:
    """The calibration set's size, prevalence, agreement proxy and admissibility (§3.3, ``analysis``'s thresholds)."""
    adm = test(gold, votes, float(analysis["kappa0"]), float(analysis["c"]), float(analysis["phi0"])).as_dict()
    return {"n": int(len(gold)), "prevalence": mon.prevalence_, "agreement_proxy": mon.agreement_, "admissibility": adm}


def compute(cfg: Settings) -> dict:
    """The monitor's document for the configured source (a replay, or a served model's store)."""

    node = cfg.node("monitor")
    stacker = stacker_from(cfg.stacker)
    if node["source"] == "replay":
        rs = node["replay"]
        r = replay(rs, rs["scenario"], int(rs["seed"]), stacker)
        members, cal_v, cal_g, votes, p, change = r.members, r.cal_votes, r.cal_gold, r.votes, r.p, r.change
        stream = {
            "n": int(len(votes)),
            "change": change,
            "scenario": r.scenario,
            "seed": int(rs["seed"]),
            "true_prevalence": [float(r.gold[:change].mean()), float(r.gold[change:].mean())],
        }
    elif node["source"] == "store":
        cal = calibration_table(cfg)
        members, cal_v, cal_g = cal.members, cal.votes, cal.gold
        path = store_path({CONFIG_KEY: node["store"]})
        if path is None:
            raise MonitorError(f"monitor.store: no store named (set it, or {STORE_ENV})")
        s = read_store(path, members, node["model"])
        votes, p, change = s.votes, s.p, None
        flags = read_flags(path, node["model"])  # the served panel's injection flags, joined by item id
        item_flags = [flags.get(str(i)) if i is not None else None for i in s.item_ids]
        stream = {
            "n": int(len(votes)),
            "store": str(path),
            "model": node["model"],
            "first_ts": float(s.ts[0]) if len(s.ts) else None,
            "last_ts": float(s.ts[-1]) if len(s.ts) else None,
        }
    else:
        raise MonitorError(f"monitor.source: {node['source']!r} is not 'replay' or 'store'")
    mon = make_monitor(node, members).fit(cal_v, cal_g)
    frame = mon.windows(votes, p)
    alarms = mon.alarms(frame)
    if node["source"] == "store":  # share of each window's items whose text looked like a prompt injection
        frame["injection_flagged"] = window_shares(item_flags, zip(frame["start"], frame["end"]))
        for col, values in (store_rates(node, path, frame) or {}).items():  # gold labels: each window's rate
            frame[col] = values
    settings = {k: node[k] for k in ("window", "step", "consecutive")}
    settings.update(
        alpha=mon.alpha,
        alpha_setting=str(node["alpha"]),
        false_alarm_target=node.get("false_alarm_target"),
        false_alarm_bound=len(KINDS) * mon.alpha / int(node["step"]),
        tolerance=float(node["prevalence"]["tolerance"]),
        reference_prevalence=frame.attrs["reference_prevalence"],
        reference_se=frame.attrs["reference_se"],
    )
    doc = {
        "source": str(node["source"]),
        "members": members,
        "settings": settings,
        "calibration": calibration_doc(mon, cal_v, cal_g, cfg.analysis),
        "stream": stream,
        "windows": _windows_doc(frame),
        "alarms": alarms,
    }
    if node["source"] == "replay":
        doc["replay"] = score_alarms(alarms, change, stream["scenario"])
        ev = cfg.monitor.evaluation
        seeds = scenario_seeds(int(ev.first_seed), int(ev.seeds), list(ev.scenarios))
        doc["evaluation"] = evaluate_replays(node, stacker, list(ev.scenarios), seeds)
        doc["evaluation_settings"] = {
            "scenarios": list(ev.scenarios),
            "seeds": {s: [v[0], v[-1]] for s, v in seeds.items()},
            "stated_max_delay": int(ev.max_delay),
        }
        stable = range(int(ev.stable_first_seed), int(ev.stable_first_seed) + int(ev.stable_streams))
        doc["false_alarms"] = stable_false_alarms(node, stacker, list(stable))
        doc["false_alarms"]["seeds"] = [stable.start, stable.stop - 1]
    return doc


def calibration_table(cfg: Settings):
    """The labelled calibration set of a served panel: the verdict table of :func:`src.judges.tables.load_table` (the
    roster's cache, or ``verdicts=…``), rows of ``monitor.calibration.dataset`` (all rows when null)."""

    table = tables.load_table(cfg)
    name = cfg.monitor.calibration.dataset
    if name is None:
        return table
    keep = table.items["dataset"].to_numpy() == name
    if not keep.any():
        raise MonitorError(f"monitor.calibration.dataset: {name!r} not among the table's datasets {table.datasets}")
    return table.subset(keep)


def window_series(doc: dict) -> dict[str, list[float]]:
    """Per-window values as MLflow step series (step = window number; ``monitor/window_end`` maps it to items)."""

    keys = [k for k in doc["windows"][0] if k not in ("start", "departures")]
    nan = float("nan")
    return {metric_name("monitor", k): [nan if w[k] is None else float(w[k]) for w in doc["windows"]] for k in keys}


def summary_metrics(doc: dict) -> dict[str, float]:
    out: dict[str, float] = {
        "monitor/alarms_panel": len(doc["alarms"]["panel"]),
        "monitor/alarms_prevalence": len(doc["alarms"]["prevalence"]),
    }
    rep = doc.get("replay") or {}
    if rep.get("delay") is not None:
        out["monitor/delay"] = rep["delay"]
    if rep:
        out["monitor/false_alarms"] = sum(len(v) for v in rep["false_alarms"].values())
    fa = doc.get("false_alarms")
    if fa:
        out["monitor/stable/false_alarms_per_100k"] = fa["rate"]
        out["monitor/stable/false_alarms_per_100k_hi"] = fa["rate_ci"][1]
        out["monitor/stable/streams_with_alarm"] = fa["streams_with_alarm"]
    for s, v in (doc.get("evaluation") or {}).items():
        out[f"monitor/eval/{s}/detected"] = v["detected"]
        out[f"monitor/eval/{s}/false_alarm_seeds"] = v["false_alarm_seeds"]
        if v["delay_max"] is not None:
            out[f"monitor/eval/{s}/delay_median"] = v["delay_median"]
            out[f"monitor/eval/{s}/delay_max"] = v["delay_max"]
    return out
