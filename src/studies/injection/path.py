"""The injection study's decision path (:mod:`src.studies.injection`): per path (:data:`PATHS`: the panel alone,
the defaults of ``src.predict`` and the served panel, the immune members, an aggregation-level disagreement rule, a
stacker whose members' weights are bounded) and per attack class, the attack success with cluster-bootstrap
intervals; each path's clean κ and share escalated; the inherited flips with one LLM member attacked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import clone

from src.core import detector
from src.core import injection as inj
from src.core.evaluate import ClusterBootstrap
from src.core.ladderbase import checked_folds
from src.core.verdicts import ABSTAIN
from src.studies.injection.items import CLEAN, HELDOUT
from src.studies.injection.metrics import Predictions, flip_stats, member_votes, stacked_predictions

# ------------------------------------------------------------------------------------------------ the decision path

PATHS = ("panel", "escalate", "immune", "disagreement", "escalate+disagreement", "bounded")
"""The decision paths measured under attack: the stacked panel alone (no defence), the panel with a flagged item
escalated (the default of src.predict and the served panel) or decided by the immune members, the panel with a
"supported" verdict escalated where every immune member that answered says hallucinated (an aggregation-level
rule that reads no text), both, and a stacker whose members' weights are bounded."""


ONE_ATTACKED_PATHS = ("panel", "disagreement", "bounded")  # the aggregation-level checks, one LLM member attacked


def bounded_stacker(est, X: np.ndarray, y: np.ndarray, share: float):
    """``est`` (a fitted :class:`src.core.aggregate.StackedLogit`) with each member's weight — the sum of |β| over
    its columns — cut to at most ``share`` of the total (water-filling: the members above the cap scaled down to
    it, the cap recomputed on the new total), then the intercept refitted by maximum likelihood on (X, y): a
    stacker that cannot lean on one member beyond a bound."""
    k = est.n_votes or X.shape[1]
    F = est.features(X)
    per_vote = 2 if est.abstention == "category" else 1
    owner = np.r_[np.tile(np.arange(k), per_vote), np.tile(np.arange(k), (F.shape[1] - per_vote * k) // k)]
    beta = est.coef_.copy()
    w = np.bincount(owner, weights=np.abs(beta), minlength=k)
    capped = np.zeros(k, bool)
    for _ in range(k):
        free = w[~capped].sum()
        if share * capped.sum() >= 1:
            break
        cap = share * free / (1 - share * capped.sum())
        over = (w > cap) & ~capped
        if not over.any():
            break
        capped |= over
    if capped.any() and share * capped.sum() < 1:
        cap = share * w[~capped].sum() / (1 - share * capped.sum())
        scale = np.where(capped & (w > 0), cap / np.where(w > 0, w, 1), 1.0)
        beta = beta * scale[owner]
    out = clone(est)
    out.__dict__.update({k_: v for k_, v in est.__dict__.items() if k_.endswith("_")})
    offset = F @ beta
    b = float(est.intercept_)
    for _ in range(50):  # Newton on the intercept alone
        p = 1 / (1 + np.exp(-(b + offset)))
        step = (y - p).sum() / max((p * (1 - p)).sum(), 1e-12)
        b += step
        if abs(step) < 1e-10:
            break
    out.coef_, out.intercept_ = beta, b
    out.lr_ = est.logistic_regression()
    out.lr_.classes_ = np.array([0, 1])
    out.lr_.coef_, out.lr_.intercept_, out.lr_.n_features_in_ = beta[None, :], np.array([b]), beta.size
    return out


def disagreement(verdict: np.ndarray, X: np.ndarray, immune: Sequence[bool]) -> np.ndarray:
    """``verdict`` with NaN (escalated) where it says supported (0) while every immune member that answered votes
    hallucinated and at least one answered."""
    iv = X[:, : len(immune)][:, np.asarray(immune, bool)]
    answered = iv != ABSTAIN
    against = answered.any(axis=1) & np.all(np.where(answered, iv == 1, True), axis=1)
    return np.where((verdict == 0) & against, np.nan, verdict)


def path_decisions(
    X: dict[str, np.ndarray],
    gold: np.ndarray,
    folds: list,
    stacker,
    immune: Sequence[bool],
    flags: dict[str, np.ndarray],
    share: float,
) -> dict[str, dict[str, np.ndarray]]:
    """{path: {condition: the decision path's verdicts, NaN = escalated}} for every condition of ``X`` (the clean
    design under "clean"), the stackers cross-fitted on the clean design's training clusters."""
    k = len(immune)
    inputs: dict[Any, np.ndarray] = dict(X)
    if any(immune):
        inputs.update({("immune", c): inj.immune_design(x, immune, k) for c, x in X.items()})
    st = stacked_predictions(stacker, X[CLEAN], gold, folds, inputs)
    bd = stacked_predictions(
        stacker, X[CLEAN], gold, folds, X, post=lambda e, Xt, yt: bounded_stacker(e, Xt, yt, share)
    )
    out: dict[str, dict[str, np.ndarray]] = {p: {} for p in PATHS}
    for c, x in X.items():
        alt = st.get(("immune", c))
        out["panel"][c] = st[c].astype(float)
        out["escalate"][c] = inj.defended(st[c], flags[c], "escalate")[0]
        out["immune"][c] = inj.defended(st[c], flags[c], "immune", alt)[0]
        out["disagreement"][c] = disagreement(st[c].astype(float), x, immune)
        out["escalate+disagreement"][c] = disagreement(out["escalate"][c], x, immune)
        out["bounded"][c] = bd[c].astype(float)
    return out


def _class_rows(cond_items: dict[str, pd.DataFrame]) -> dict[str, np.ndarray]:
    """Each condition's attack class per row: the generator's class, or each planted attack's class."""
    return {
        c: (np.asarray(t["attack"], dtype=object) if "attack" in t else np.full(len(t), c, dtype=object))
        for c, t in cond_items.items()
        if c != CLEAN
    }


def decision_asr(
    decisions: dict[str, dict[str, np.ndarray]],
    gold: np.ndarray,
    clusters: np.ndarray,
    kinds: dict[str, np.ndarray],
    s: Mapping[str, Any],
) -> dict:
    """Per decision path and attack class (the generator's classes, each held-out class pooled over its draws, and
    the two sets pooled): the attack success on the decision path — of the hallucinated items its clean decision
    calls hallucinated, the share its attacked decision calls supported (escalated is not a success) — with a
    cluster-bootstrap interval (every row of a class drawn with its item's cluster)."""
    level = float(s["level"])
    generator = [c for c in kinds if not c.startswith(HELDOUT)]
    held = [c for c in kinds if c.startswith(HELDOUT)]
    groups: dict[str, list[tuple[str, np.ndarray]]] = {}
    for c in generator:
        groups.setdefault(c, []).append((c, np.ones(len(gold), bool)))
        groups.setdefault("generator (all)", []).append((c, np.ones(len(gold), bool)))
    for c in held:
        for kind in sorted(set(kinds[c])):
            groups.setdefault(f"{HELDOUT}:{kind}", []).append((c, kinds[c] == kind))
        groups.setdefault(f"{HELDOUT} (all)", []).append((c, np.ones(len(gold), bool)))
    out: dict[str, dict] = {}
    for path, per in decisions.items():
        clean = np.nan_to_num(per[CLEAN], nan=ABSTAIN)
        block = {}
        for name, parts in groups.items():
            rows = [(np.flatnonzero(m), np.nan_to_num(per[c], nan=ABSTAIN)) for c, m in parts if c in per]
            if not rows:
                continue
            idx = np.concatenate([r for r, _ in rows])
            att = np.concatenate([a[r] for r, a in rows])
            boot = ClusterBootstrap(clusters[idx], n_boot=int(s["n_boot"]), seed=int(s["seed"]))
            f = flip_stats(boot, gold[idx], clean[idx], att, level)
            block[name] = f["asr"][0]
        out[path] = block
    return out


def decision_clean(decisions: dict[str, dict[str, np.ndarray]], pr: Predictions) -> dict:
    """Per decision path on the clean items: κ on the items it decides (escalated ones left out), the paired Δκ
    against the panel alone, and the share of clean items it escalates."""
    for path, per in decisions.items():
        pr.add((path, CLEAN), np.nan_to_num(per[CLEAN], nan=ABSTAIN))
    pr.kappas()
    out = {}
    for path, per in decisions.items():
        out[path] = {
            "kappa": pr.kappa((path, CLEAN)),
            "delta_kappa": pr.delta_kappa((path, CLEAN), ("panel", CLEAN)),
            "escalated": float(np.mean(np.isnan(per[CLEAN]))),
        }
    return out


def decision_study(
    tables: dict[str, pd.DataFrame],
    cond_items: dict[str, pd.DataFrame],
    members: list[str],
    immune: list[bool],
    stacker,
    analysis,
    s: Mapping[str, Any],
) -> dict:
    """One dataset and frame's decision-path block: the attack success of every path (:data:`PATHS`) per attack
    class, generator and held-out, and each path's clean κ and share escalated; from the cells where every member
    voted on every item (``tables``: {condition: verdict table})."""
    ref = tables[CLEAN]
    gold, clusters = ref["gold"].to_numpy().astype(int), ref["cluster_id"].astype(str).to_numpy()
    X = {c: member_votes(t, members, list(analysis.features)) for c, t in tables.items()}
    flags = {c: np.array([detector.scan(r).flagged for r in cond_items[c].to_dict("records")]) for c in tables}
    folds = checked_folds(gold, clusters, analysis)
    dec = path_decisions(X, gold, folds, stacker, immune, flags, float(s["max_weight_share"]))
    kinds = _class_rows({c: cond_items[c] for c in tables})
    pr = Predictions(gold, clusters, int(s["n_boot"]), int(s["seed"]), float(s["level"]))
    one: dict[str, dict] = {}
    k = len(members)
    for j, m in enumerate(members):  # only member m attacked (its vote and extras from the attack): inherited flips
        if immune[j]:
            continue
        cols = [j] + [k * (1 + f) + j for f in range(len(analysis.features))]
        mix = {c: X[CLEAN].copy() for c in X}
        for c in X:
            mix[c][:, cols] = X[c][:, cols]
        part = path_decisions(mix, gold, folds, stacker, immune, flags, float(s["max_weight_share"]))
        asr = decision_asr({p: part[p] for p in ONE_ATTACKED_PATHS}, gold, clusters, kinds, s)
        one[m] = {p: {g: v for g, v in blk.items() if g.endswith("(all)")} for p, blk in asr.items()}
    return {
        "conditions": [c for c in tables if c != CLEAN],
        "flagged": {c: int(f.sum()) for c, f in flags.items()},
        "asr": decision_asr(dec, gold, clusters, kinds, s),
        "one_attacked": one,
        "clean": decision_clean(dec, pr),
    }
