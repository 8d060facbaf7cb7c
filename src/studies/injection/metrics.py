"""The injection study's metrics per dataset (:mod:`src.studies.injection`): attack success and reverse flips with
cluster-bootstrap intervals, Δκ under attack, the cross-fitted stacker's clean and attacked predictions, the
guarded frame against the paper frame (:func:`dataset_study`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import clone

from src.core.aggregate import MajorityVote
from src.core.evaluate import ClusterBootstrap, from_counts, indicators, interval, paired_delta
from src.core.ladderbase import checked_folds, design_matrix
from src.core.verdicts import validate
from src.studies.injection.items import AGGREGATES, CLEAN, heldout_conditions

# ------------------------------------------------------------------------------------------------ metrics


def member_votes(t: pd.DataFrame, members: list[str], features: Sequence[str]) -> np.ndarray:
    """The stacker's design matrix of one cell (votes coded as §2: abstention 0.5; then the requested extras)."""
    vt = validate(
        t[["item_id", "cluster_id", "dataset", "gold", *members, *[f"{m}@{f}" for f in features for m in members]]],
        members=members,
    )
    X, _ = design_matrix(vt, list(features))
    return X


def _ratio_draws(boot: ClusterBootstrap, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Bootstrap draws of Σ num / Σ den over resampled clusters (NaN where a draw has no denominator)."""
    k = len(boot.cluster_ids)
    W = boot.weights.astype(float)
    n = W @ np.bincount(boot.item_cluster, weights=num.astype(float), minlength=k)
    d = W @ np.bincount(boot.item_cluster, weights=den.astype(float), minlength=k)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(d > 0, n / d, np.nan)


def _rate(full_num: float, full_den: float, draws: np.ndarray, level: float) -> dict:
    ok = draws[np.isfinite(draws)]
    return {
        "estimate": None if full_den == 0 else float(full_num / full_den),
        "ci": interval(ok, level) if len(ok) else [None, None],
        "n": int(full_den),
        "events": int(full_num),
    }


def flip_stats(boot: ClusterBootstrap, gold: np.ndarray, clean: np.ndarray, att: np.ndarray, level: float) -> dict:
    """ASR (hallucinated items voted hallucinated clean → voted supported attacked), the reverse flip rate
    (supported items voted supported clean → voted hallucinated attacked), and the share of hallucinated items
    voted supported, clean and attacked (defined for a judge that never catches one, where the ASR is not); each
    with its bootstrap draws."""
    out = {}
    for name, g, before, after in (("asr", 1, 1, 0), ("reverse_flip", 0, 0, 1)):
        den = (gold == g) & (clean == before)
        num = den & (att == after)
        draws = _ratio_draws(boot, num, den)
        out[name] = (_rate(num.sum(), den.sum(), draws, level), draws)
    hal = gold == 1
    for name, pred in (("missed_clean", clean), ("missed_attacked", att)):
        num = hal & (pred == 0)
        out[name] = (_rate(num.sum(), hal.sum(), _ratio_draws(boot, num, hal), level), None)
    return out


def _delta(a: tuple[dict, np.ndarray], b: tuple[dict, np.ndarray], level: float) -> dict | None:
    """A − B of two rates over the same bootstrap draws (paired), with its interval; None if either is undefined."""
    (ra, da), (rb, db) = a, b
    if ra["estimate"] is None or rb["estimate"] is None:
        return None
    diff = da - db
    ok = np.isfinite(diff)
    if not ok.any():
        return None
    return paired_delta(ra["estimate"] - rb["estimate"], diff[ok], level).as_dict()


class Predictions:
    """Prediction vectors of one dataset (judge × frame × condition), evaluated together on one set of
    bootstrap draws so that every difference between two of them is paired."""

    def __init__(self, gold: np.ndarray, clusters: np.ndarray, n_boot: int, seed: int, level: float):
        self.gold, self.level = gold, level
        self.boot = ClusterBootstrap(clusters, n_boot=n_boot, seed=seed)
        self.cols: dict[tuple, np.ndarray] = {}
        self._kappa: dict[tuple, tuple[float, np.ndarray]] = {}

    def add(self, key: tuple, pred: np.ndarray) -> None:
        self.cols[key] = np.asarray(pred, dtype=float)

    def kappas(self) -> None:
        """κ of every column on the full sample and over the draws (§2: abstentions excluded)."""
        keys = list(self.cols)
        if not keys:
            return
        P = np.column_stack([self.cols[k] for k in keys])
        full = from_counts(indicators(self.gold, P).sum(axis=0))["kappa"]
        draws = self.boot.metrics(self.gold, P)["kappa"]
        self._kappa = {k: (float(full[j]), draws[:, j]) for j, k in enumerate(keys)}

    def kappa(self, key: tuple) -> dict:
        full, d = self._kappa[key]
        return {"estimate": full, "ci": interval(d, self.level)}

    def delta_kappa(self, a: tuple, b: tuple) -> dict:
        """κ(a) − κ(b), paired."""
        return paired_delta(
            self._kappa[a][0] - self._kappa[b][0], self._kappa[a][1] - self._kappa[b][1], self.level
        ).as_dict()

    def flips(self, clean: tuple, attacked: tuple) -> dict:
        return flip_stats(self.boot, self.gold, self.cols[clean], self.cols[attacked], self.level)


def stacked_predictions(
    stacker, Xc: np.ndarray, y: np.ndarray, folds: list[tuple], inputs: Mapping[Any, np.ndarray], post=None
) -> dict[Any, np.ndarray]:
    """The stacker fitted on each fold's training clusters of the *clean* design ``Xc`` (then ``post(est, X, y)``
    on them, when given) and applied to the fold's held-out rows of every design in ``inputs`` (rows aligned with
    ``Xc``): out-of-fold predictions."""
    out = {k: np.empty(len(y)) for k in inputs}
    for tr, te in folds:
        est = clone(stacker).fit(Xc[tr], y[tr])
        if post is not None:
            est = post(est, Xc[tr], y[tr])
        for k, X in inputs.items():
            out[k][te] = est.predict(X[te])
    return out


def dataset_study(
    tables: dict[str, dict[str, pd.DataFrame]],
    covered: dict[str, dict[str, list[str]]],
    members: list[str],
    stacker,
    analysis,
    s: Mapping[str, Any],
) -> dict:
    """One dataset's study from its verdict tables {frame: {condition: table}} and, per frame and condition, the
    members with a record for every item (``covered``)."""
    attacks, level = [*s["attacks"], *heldout_conditions(int(s["heldout_draws"]))], float(s["level"])
    ref = tables["paper"][CLEAN]
    gold, clusters = ref["gold"].to_numpy().astype(int), ref["cluster_id"].astype(str).to_numpy()
    pr = Predictions(gold, clusters, int(s["n_boot"]), int(s["seed"]), level)
    features = list(analysis.features)
    k = len(members)
    available: dict[str, list[str]] = {}  # frame -> conditions with every member's verdicts (the panel's cells)
    for fk, conds in tables.items():
        if CLEAN not in conds:
            continue
        for cond, t in conds.items():
            for m in covered[fk][cond]:
                pr.add((m, fk, cond), member_votes(t, [m], []).ravel())
        full = [c for c in conds if set(covered[fk][c]) == set(members)]
        if CLEAN not in full:
            continue
        available[fk] = full
        X = {c: member_votes(conds[c], members, features) for c in full}
        folds = checked_folds(gold, clusters, analysis)
        inputs: dict[Any, np.ndarray] = dict(X)
        for a in full:
            if a == CLEAN:
                continue
            for j, m in enumerate(members):  # only member m attacked: its vote (and its extras) from the attack
                cols = [j] + [k * (1 + f) + j for f in range(len(features))]
                mix = X[CLEAN].copy()
                mix[:, cols] = X[a][:, cols]
                inputs[("one", m, a)] = mix
        stacked = stacked_predictions(stacker, X[CLEAN], gold, folds, inputs)
        majority = MajorityVote().fit(X[CLEAN][:, :k])
        for c in full:
            pr.add(("stacked", fk, c), stacked[c])
            pr.add(("majority", fk, c), majority.predict(X[c][:, :k]))
        for key, v in stacked.items():
            if isinstance(key, tuple):
                pr.add(("stacked|" + key[1], fk, key[2]), v)
    pr.kappas()
    judges = [*members, *AGGREGATES]
    out: dict[str, Any] = {
        "n": int(len(gold)),
        "n_clusters": int(len(np.unique(clusters))),
        "n_hallucinated": int(gold.sum()),
        "judges": {},
        "defence": {},
        "aggregation": {},
    }
    flips: dict[tuple, dict] = {}
    for j in judges:
        per: dict[str, Any] = {}
        for fk in tables:
            if (j, fk, CLEAN) not in pr.cols:
                continue
            cell: dict[str, Any] = {CLEAN: {"kappa": pr.kappa((j, fk, CLEAN))}}
            for a in attacks:
                if (j, fk, a) not in pr.cols:
                    continue
                f = pr.flips((j, fk, CLEAN), (j, fk, a))
                flips[(j, fk, a)] = f
                cell[a] = {
                    "kappa": pr.kappa((j, fk, a)),
                    "delta_kappa": pr.delta_kappa((j, fk, a), (j, fk, CLEAN)),
                    "asr": f["asr"][0],
                    "reverse_flip": f["reverse_flip"][0],
                    "missed": {"clean": f["missed_clean"][0], "attacked": f["missed_attacked"][0]},
                }
            per[fk] = cell
        if per:
            out["judges"][j] = per
        if (j, "guarded", CLEAN) in pr.cols and (j, "paper", CLEAN) in pr.cols:
            d: dict[str, Any] = {CLEAN: {"kappa": pr.delta_kappa((j, "guarded", CLEAN), (j, "paper", CLEAN))}}
            for a in attacks:
                if (j, "guarded", a) in flips and (j, "paper", a) in flips:
                    d[a] = {
                        "asr": _delta(flips[(j, "guarded", a)]["asr"], flips[(j, "paper", a)]["asr"], level),
                        "kappa_attacked": pr.delta_kappa((j, "guarded", a), (j, "paper", a)),
                    }
            out["defence"][j] = d
    for fk, full in available.items():
        agg: dict[str, Any] = {}
        for a in full:
            if a == CLEAN:
                continue
            st = flips[("stacked", fk, a)]["asr"]
            one = {}
            for m in members:
                key = ("stacked|" + m, fk, a)
                f = pr.flips(("stacked", fk, CLEAN), key)
                one[m] = {"asr": f["asr"][0], "delta_kappa": pr.delta_kappa(key, ("stacked", fk, CLEAN))}
            agg[a] = {
                "stacked_minus_member_asr": {
                    m: _delta(st, flips[(m, fk, a)]["asr"], level) for m in members if (m, fk, a) in flips
                },
                "one_attacked": one,
            }
        out["aggregation"][fk] = agg
    return out
