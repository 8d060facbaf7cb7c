"""How much of my traffic hallucinates? Rates with valid intervals on a scored pool, and the study that checks them.

The application (``python -m src.rate estimate | propose | plan``) reads a scored **pool** and its gold labels
(:mod:`src.studies.pool`), proposes **which items to label** (:mod:`src.studies.proposal`) and gives the rate per
segment with its interval and the labels a target half-width needs (:mod:`src.studies.estimate`). This module is
the study that checks those intervals.

The study (:func:`study`, ``python -m src.rate`` / the ``rate`` DVC stage): pools of ``pool`` items of simulated
traffic from panels in several regimes — admissible, weak, correlated, anti-correlated (members that err on most
traffic items after being calibrated where they were competent: p falls as the truth rises), and clustered
traffic (items in conversations that share their hallucination and difficulty) — and the committed verdict
tables' cross-fitted posteriors resampled to the deployment prevalences (each item's class drawn at π, then an
item of that class with replacement: the traffic is i.i.d. from the set's class-conditional posteriors, so π is
the truth), also with the roster's most expensive member (or the frontier column) as the labeller and the
other members as the panel. Per regime × prevalence × labels, ``replicates`` pools, each labelled by a uniform
draw of n items (classical, PPI++) and by an active draw of n expected items (active inference); per method the
coverage of θ (and of the pool's own share), the median width, its ratio to the classical width, the median
effective labels and their multiplier over n. Side by side on the same replicates: ``ppi_py.ppi_mean_ci`` (the
same estimator: equal to rounding where items are not clustered) and ``cje-eval``'s calibrated mean
(``cje.calibrated_mean_ci``, isotonic judge calibration on the labelled slice, cluster-robust interval).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import norm
from sklearn.base import clone
from tqdm import tqdm

from src.core import priorshift, rates
from src.core.evaluate import kappa
from src.core.ladder import dataset_folds
from src.core.rates import RateError
from src.core.verdicts import ABSTAIN
from src.io.files import DECIMALS
from src.studies import prevalence, simulate
from src.studies.estimate import ESTIMAND, em_rates

log = logging.getLogger("raim.rate")


STUDY_KEYS = (
    "level",
    "pool",
    "replicates",
    "prevalences",
    "labels",
    "seed",
    "tau",
    "threshold",
    "simulations",
    "real",
    "labeller",
    "crosscheck",
    "em",
)


STUDY_METHODS = ("classical", "naive", "em", "ppi", "active")


WALD = ("ppi_wald", "active_wald")  # the papers' normal intervals from the same estimates (RAIM's default: Wilson)


BAND = (0.93, 0.97)  # the coverage band a valid 95 % interval should land in at R = 500 (± 2 Monte Carlo s.e.)


@dataclass
class Source:
    """A regime's traffic: ``draw(R, N, π, rng)`` → (p, gold, training prevalence per item, cluster codes)."""

    name: str
    kind: str
    description: str
    draw: Callable
    info: dict


def check_study(s: Mapping) -> None:
    """Refuse settings the study cannot run with, in one line naming the ``rate.*`` key."""
    missing = [k for k in STUDY_KEYS if k not in s]
    if missing:
        raise RateError(
            f"rate: missing setting(s) {missing} (conf/rate/default.yaml has them; a params.yaml older "
            "than it: regenerate it with `python -m src.track params`)"
        )
    for k in ("pool", "replicates"):
        v = s[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 10:
            raise RateError(f"rate.{k}={v!r}: must be an integer ≥ 10")
    for q in s["prevalences"]:
        priorshift.check_prevalence(q, "rate.prevalences")
    for n in s["labels"]:
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n < s["pool"]:
            raise RateError(f"rate.labels: {n!r} must be an integer in [2, rate.pool)")
    rates.z_value(s["level"])
    if not 0.0 <= float(s["tau"]) <= 1.0:
        raise RateError(f"rate.tau={s['tau']!r}: must be a share in [0, 1]")


def _class_draw(p: np.ndarray, t: np.ndarray, y: np.ndarray) -> Callable:
    """i.i.d. traffic from a set's class-conditional posteriors: class ~ Bernoulli(π), then an item of that class
    with replacement (module docstring)."""
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)

    def draw(R: int, N: int, q: float, rng: np.random.Generator):
        gold = rng.random((R, N)) < q
        pick = np.where(gold, pos[rng.integers(0, len(pos), (R, N))], neg[rng.integers(0, len(neg), (R, N))])
        return p[pick], gold.astype(float), t[pick], None

    return draw


def real_sources(table, stacker, settings, labeller: tuple[str, str] | None) -> list[Source]:
    """Each dataset of ``table`` (its cross-fitted posteriors, :func:`src.studies.prevalence.posteriors`) and, with a
    ``labeller`` (name, how chosen), the same with that judge's verdicts as the labels and the other members as
    the panel (items where it abstained left out)."""
    out = []
    for name, t in table.by_dataset().items():
        folds = dataset_folds(t, settings)[name]
        p, tp = prevalence.posteriors(t, stacker, settings, folds)
        y = t.gold
        out.append(
            Source(
                name,
                "real",
                f"{name}: the committed verdicts' cross-fitted stacked p, gold labels",
                _class_draw(p, tp, y),
                {"n": int(len(y)), "members": list(t.members), "hallucinated_share": float(y.mean())},
            )
        )
        if labeller is None:
            continue
        judge, how = labeller
        if judge == t.frontier_name and t.has_frontier:
            verdict, cheap = t.frontier, list(t.members)
        elif judge in t.members:
            verdict, cheap = t.votes[:, t.members.index(judge)], [m for m in t.members if m != judge]
        else:
            continue
        keep = verdict != ABSTAIN
        sub = t.subset(keep, cheap)
        sub_folds = dataset_folds(sub, settings)[name]
        pc, tpc = prevalence.posteriors(sub, stacker, settings, sub_folds)
        yl = verdict[keep].astype(int)
        if yl.min() == yl.max():
            continue
        out.append(
            Source(
                f"{name}-{judge}",
                "labeller",
                f"{name}: {judge} ({how}) as the labeller, the other members' stacked p: estimates what "
                f"{judge} would say",
                _class_draw(pc, tpc, yl),
                {
                    "n": int(keep.sum()),
                    "labeller": judge,
                    "chosen_as": how,
                    "members": cheap,
                    "labeller_share": float(yl.mean()),
                },
            )
        )
    return out


def simulated_source(spec: Mapping, stacker) -> Source:
    """A simulated regime: a stacker fitted on a balanced calibration panel (:func:`src.studies.simulate.table`), traffic
    from the same Gaussian-copula panel (:func:`src.studies.simulate.copula_errors`) with its own accuracies when the
    spec has ``traffic_accuracies``, items in clusters of ``cluster_size`` sharing a latent hallucination
    (``icc_gold``) and difficulty (``icc_difficulty``) when given."""
    name = str(spec["name"])
    acc = list(spec["accuracies"])
    rho, ab = float(spec["rho"]), float(spec.get("abstain_rate", 0.0))
    calib = simulate.table(
        f"rate regime {name}",
        n_clusters=int(spec.get("n_clusters", 500)),
        per_cluster=2,
        accuracies=acc,
        rho=rho,
        abstain_rate=ab,
        dataset=name,
        seed=int(spec.get("seed", 0)),
    )
    fitted = clone(stacker).set_params(n_votes=len(acc)).fit(calib.votes, calib.gold)
    traffic = np.asarray(spec.get("traffic_accuracies") or acc, dtype=float)
    m = int(spec.get("cluster_size") or 1)
    icc_y, icc_z = float(spec.get("icc_gold", 0.0)), float(spec.get("icc_difficulty", 0.0))
    t0 = float(fitted.train_prevalence_)

    def shared(rng, R, N, icc):
        g = -(-N // m)
        return np.sqrt(icc) * np.repeat(rng.standard_normal((R, g)), m, axis=1)[:, :N] + np.sqrt(
            1 - icc
        ) * rng.standard_normal((R, N))

    def draw(R: int, N: int, q: float, rng: np.random.Generator):
        gold = (shared(rng, R, N, icc_y) > norm.ppf(1 - q)) if m > 1 else (rng.random((R, N)) < q)
        z = shared(rng, R, N, icc_z) if m > 1 else rng.standard_normal((R, N))
        eps = rng.standard_normal((R, N, len(traffic)))
        err = simulate.copula_errors(z[..., None], eps, traffic, rho)
        g = gold[..., None].astype(float)
        votes = np.where(err, 1 - g, g)
        votes[rng.random(votes.shape) < ab] = ABSTAIN
        p = fitted.predict_proba(votes.reshape(-1, len(traffic)))[:, 1].reshape(R, N)
        codes = np.arange(N) // m if m > 1 else None
        return p, gold.astype(float), np.full((R, N), t0), codes

    what = spec.get("description") or name
    return Source(
        name,
        "simulated",
        str(what),
        draw,
        {
            "accuracies": acc,
            "traffic_accuracies": list(traffic),
            "rho": rho,
            "abstain_rate": ab,
            "cluster_size": m,
            "icc_gold": icc_y,
            "icc_difficulty": icc_z,
            "calibration_kappa": float(kappa(calib.gold, fitted.predict(calib.votes).astype(float))),
        },
    )


def uniform_labels(R: int, N: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Exactly ``n`` items of each row labelled, a uniform draw without replacement (a mask)."""
    keys = rng.random((R, N))
    idx = np.argpartition(keys, n - 1, axis=1)[:, :n]
    mask = np.zeros((R, N), bool)
    np.put_along_axis(mask, idx, True, axis=1)
    return mask


def method_summary(r: rates.Rates, truth: float, share: np.ndarray, n: int, classical_width: float | None) -> dict:
    """A method's replicates in one cell: coverage of θ (and its Monte Carlo s.e.) and of the pool's own share,
    median width and its ratio to the classical median width, median effective labels and their multiplier over
    n, bias and RMSE of the point estimate, mean labels used."""
    cov = (r.lo <= truth) & (truth <= r.hi)
    c = float(cov.mean())
    width = float(np.median(r.width))
    eff = r.effective_labels
    n_eff = float(np.nanmedian(eff)) if np.isfinite(eff).any() else None
    return {
        "coverage": c,
        "coverage_se": float(np.sqrt(c * (1 - c) / len(cov))),
        "coverage_pool": float(((r.lo <= share) & (share <= r.hi)).mean()),
        "width": width,
        "width_rel": width / classical_width if classical_width else None,
        "effective_labels": n_eff,
        "multiplier": n_eff / n if n_eff is not None and n else None,
        "bias": float(np.mean(r.estimate - truth)),
        "rmse": float(np.sqrt(np.mean((r.estimate - truth) ** 2))),
        "labels_mean": float(np.mean(r.labels)),
        "valid_interval": r.valid,
    }


def _ppi_py_check(f, gold, lab, mine: rates.Rates, level: float, k: int, truth: float) -> dict | None:
    """``ppi_py.ppi_mean_ci`` on the first ``k`` replicates: the largest difference from
    RAIM's PPI++ (estimate, unclipped bounds) and its coverage there."""
    try:
        with warnings.catch_warnings():  # ppi_py switches every warning off when imported
            import ppi_py  # optional reference (the dev extra): imported only when the study cross-checks
    except ImportError:
        return None
    z = rates.z_value(level)
    diffs, cover = [], []
    for r in range(min(k, len(f))):
        L = lab[r]
        lo, hi = (float(v[0]) for v in ppi_py.ppi_mean_ci(gold[r, L], f[r, L], f[r, ~L], alpha=1 - level))
        est = float(mine.estimate[r])
        diffs.append(max(abs((lo + hi) / 2 - est), abs(lo - (est - z * mine.se[r])), abs(hi - (est + z * mine.se[r]))))
        cover.append(lo <= truth <= hi)
    return {"replicates": len(diffs), "max_abs_diff": float(max(diffs)), "coverage": float(np.mean(cover))}


def _cje_check(f, gold, lab, codes, level: float, k: int, truth: float, classical_width: float) -> dict | None:
    """``cje.calibrated_mean_ci`` (cluster-robust) on the first ``k`` replicates: coverage, median width."""
    try:
        from cje import calibrated_mean_ci  # optional reference (the dev extra): only when the study compares
    except ImportError:
        return None
    cover, width, est = [], [], []
    quiet = logging.getLogger("cje")
    level_before = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        for r in range(min(k, len(f))):
            labels = np.where(lab[r], gold[r], np.nan)
            with (
                warnings.catch_warnings(),
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                warnings.simplefilter("ignore")
                res = calibrated_mean_ci(
                    f[r], labels, cluster_ids=None if codes is None else codes, alpha=1 - level, seed=r
                )
            lo, hi = float(res.ci[0]), float(res.ci[1])
            cover.append(lo <= truth <= hi)
            width.append(hi - lo)
            est.append(float(res.estimate))
    finally:
        quiet.setLevel(level_before)
    w = float(np.median(width))
    return {
        "replicates": len(cover),
        "coverage": float(np.mean(cover)),
        "width": w,
        "width_rel": w / classical_width if classical_width else None,
        "bias": float(np.mean(np.asarray(est) - truth)),
    }


def study_cell(src: Source, q: float, s: Mapping, rng: np.random.Generator) -> dict:
    """One regime at one prevalence: ``replicates`` pools, their label-free estimates, then per label count the
    uniform and the active draws and every method's summary (:func:`method_summary`), with the references."""
    R, N, level = int(s["replicates"]), int(s["pool"]), float(s["level"])
    f, gold, T, codes = src.draw(R, N, q, rng)
    share = gold.mean(axis=1)
    free = {
        "naive": rates.naive(f, float(s["threshold"]), codes, level),
        "em": em_rates(f, T, level, float(s["em"]["tol"]), int(s["em"]["max_iter"])),
    }
    cc = s["crosscheck"]
    out = {}
    for n in s["labels"]:
        lab = uniform_labels(R, N, int(n), rng)
        res = {
            "classical": rates.classical(gold, lab, codes, level),
            **free,
            "ppi": rates.ppi(gold, f, lab, codes, level),
        }
        pi = rates.sampling_probabilities(f, int(n), float(s["tau"]))
        act = rates.draw(pi, rng)
        short = act.sum(axis=1) < 2  # a draw of fewer than two labels has no interval: draw that row again
        while short.any():
            act[short] = rates.draw(pi[short], rng)
            short = act.sum(axis=1) < 2
        res["active"] = rates.active(gold, f, act, pi, codes, level)
        res["ppi_wald"] = rates.ppi(gold, f, lab, codes, level, interval="wald")
        res["active_wald"] = rates.active(gold, f, act, pi, codes, level, interval="wald")
        cw = float(np.median(res["classical"].width))
        cell = {"methods": {m: method_summary(res[m], q, share, int(n), cw) for m in STUDY_METHODS + WALD}}
        if codes is not None:  # the same PPI++ with the item-level variance: what ignoring the clusters gives
            cell["ppi_ignoring_clusters"] = method_summary(rates.ppi(gold, f, lab, None, level), q, share, int(n), cw)
        check = _ppi_py_check(
            f,
            gold,
            lab,
            res["ppi"] if codes is None else rates.ppi(gold, f, lab, None, level),
            level,
            int(cc["ppi_py"]),
            q,
        )
        if check is not None:
            check["same_estimator"] = codes is None  # with clusters ppi_py's variance is the item-level one
            cell["ppi_py"] = check
        cj = cc.get("cje") or {}
        if (
            int(cj.get("replicates", 0))
            and int(n) in list(cj.get("labels") or [])
            and any(abs(q - float(x)) < 1e-12 for x in cj.get("prevalences") or [])
        ):
            k = int(cj["replicates"])
            got = _cje_check(f, gold, lab, codes, level, k, q, cw)
            if got is not None:
                sub = rates.Rates(
                    "ppi",
                    *(getattr(res["ppi"], a)[:k] for a in ("estimate", "se", "lo", "hi", "labels", "effective_labels")),
                )
                got["raim_ppi_same_replicates"] = method_summary(sub, q, share[:k], int(n), cw)
                cell["cje"] = got
        out[str(n)] = cell
    return {"prevalence": q, "share_mean": float(share.mean()), "labels": out}


def study(table, stacker, settings, s: Mapping, labeller: tuple[str, str] | None = None) -> dict:
    """The rate study (module docstring) on the simulated regimes of ``s['simulations']`` and, when ``s['real']``
    and a ``table`` is given, its datasets (and their labeller variants)."""
    check_study(s)
    sources = [simulated_source(spec, stacker) for spec in s["simulations"] or []]
    if s["real"] and table is not None:
        sources += real_sources(table, stacker, settings, labeller)
    rng = np.random.default_rng(int(s["seed"]))
    doc: dict[str, Any] = {}
    bar = tqdm(total=len(sources) * len(s["prevalences"]), desc="rate", unit="cell", mininterval=2.0)
    for src in sources:
        cells = {}
        for q in s["prevalences"]:
            cells[f"{float(q):g}"] = study_cell(src, float(q), s, np.random.default_rng(rng.integers(2**63)))
            bar.update()
        doc[src.name] = {"kind": src.kind, "description": src.description, "info": src.info, "cells": cells}
    bar.close()
    return {
        "settings": {k: v for k, v in s.items() if k not in ("output", "figure")},
        "estimand": ESTIMAND,
        "band": list(BAND),
        "regimes": doc,
        "summary": summary(doc),
        "crosscheck": crosscheck(doc),
    }


def _cells(reg: dict):
    for q, c in reg["cells"].items():
        for n, cell in c["labels"].items():
            yield q, n, cell


def summary(regimes: dict) -> dict:
    """Per regime and method over its (prevalence × labels) cells: mean, min and max coverage, the cells inside
    the band, median width, median width relative to classical, median effective labels and multiplier."""
    out = {}
    for name, reg in regimes.items():
        per = {}
        for m in STUDY_METHODS + WALD:
            got = [cell["methods"][m] for _, _, cell in _cells(reg)]
            cov = [g["coverage"] for g in got]
            rel = [g["width_rel"] for g in got if g["width_rel"] is not None]
            eff = [g["effective_labels"] for g in got if g["effective_labels"] is not None]
            mul = [g["multiplier"] for g in got if g["multiplier"] is not None]
            per[m] = {
                "coverage": float(np.mean(cov)),
                "coverage_min": float(min(cov)),
                "coverage_max": float(max(cov)),
                "cells": len(cov),
                "cells_in_band": int(sum(BAND[0] <= c <= BAND[1] for c in cov)),
                "cells_below": int(sum(c < BAND[0] for c in cov)),
                "width": float(np.median([g["width"] for g in got])),
                "width_rel": float(np.median(rel)) if rel else None,
                "effective_labels": float(np.median(eff)) if eff else None,
                "multiplier": float(np.median(mul)) if mul else None,
            }
        out[name] = per
    return out


def crosscheck(regimes: dict) -> dict:
    """The references over every cell: the largest |RAIM − ppi_py| where they are the same estimator, ppi_py's
    coverage where the items are clustered, and cje's coverage and width beside RAIM's PPI++ on the same
    replicates."""
    same = [
        cell["ppi_py"]["max_abs_diff"]
        for reg in regimes.values()
        for _, _, cell in _cells(reg)
        if cell.get("ppi_py", {}).get("same_estimator")
    ]
    clustered = {
        name: [cell["ppi_py"]["coverage"] for _, _, cell in _cells(reg) if "ppi_py" in cell]
        for name, reg in regimes.items()
        if any(not cell.get("ppi_py", {}).get("same_estimator", True) for _, _, cell in _cells(reg))
    }
    cje = {}
    for name, reg in regimes.items():
        for q, n, cell in _cells(reg):
            if "cje" in cell:
                c = cell["cje"]
                cje[f"{name}/p{q}/n{n}"] = {
                    "cje_coverage": c["coverage"],
                    "cje_width_rel": c["width_rel"],
                    "raim_ppi_coverage": c["raim_ppi_same_replicates"]["coverage"],
                    "raim_ppi_width_rel": c["raim_ppi_same_replicates"]["width_rel"],
                    "replicates": c["replicates"],
                }
    return {
        "ppi_py": {
            "cells": len(same),
            "max_abs_diff": max(same) if same else None,
            "clustered_coverage": {k: {"min": min(v), "mean": float(np.mean(v))} for k, v in clustered.items() if v},
        },
        "cje": cje,
    }


def statements(doc: dict) -> list[str]:
    """The study's plain conclusions, from its numbers (the log, the report, docs/rates.md)."""
    lines = []
    for name, per in doc["summary"].items():
        parts = []
        for m in STUDY_METHODS:
            d = per[m]
            w = "" if d["width_rel"] is None or m == "classical" else f", width {d['width_rel']:.2f}× classical"
            e = "" if d["multiplier"] is None or m == "classical" else f", {d['multiplier']:.2f}× the labels"
            parts.append(
                f"{m} coverage {d['coverage_min']:.3f}–{d['coverage_max']:.3f} ({d['cells_in_band']} of "
                f"{d['cells']} cells in {BAND[0]:.2f}–{BAND[1]:.2f}){w}{e}"
            )
        lines.append(f"{name}: " + "; ".join(parts))
    pp = doc["crosscheck"]["ppi_py"]
    if pp["max_abs_diff"] is not None:
        diff = f"{pp['max_abs_diff']:.1e}" if pp["max_abs_diff"] else f"below 1e-{DECIMALS} (rounding noise, written 0)"
        lines.append(f"ppi_py.ppi_mean_ci: largest difference from RAIM's PPI++ {diff} over {pp['cells']} cells")
    for name, c in pp["clustered_coverage"].items():
        lines.append(f"{name}: ppi_py (item-level variance) covers {c['mean']:.3f} on average (min {c['min']:.3f})")
    return lines
