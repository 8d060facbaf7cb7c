"""The competence/correlation account (§3.3, Appendices B and C; Tables 4 and 5).

* :func:`recovery` (Table 4): on the items where the CV-best single judge returns a wrong verdict, the
  stacked panel's recovery probability against the number of members individually correct (only members
  that returned a verdict can be correct), pooled and per dataset; the item-level logistic regression of
  recovery on the share of the *other* voting members that are correct, with dataset fixed effects
  (statsmodels; the paper: +4.67), and the point-biserial r (scipy; the paper: +0.41), pooled and within each
  dataset.
* :func:`cross_dataset` (Table 5): Spearman ρ of the per-dataset (stacked − CV-best single) κ gap against φ̄,
  the members at κ ≥ κ₀ and (1 − φ̄) × members, on all datasets and dropping the held-back sets in turn.
* :func:`subpanels` and :func:`threshold_grid` (Appendix C): the admissibility rule over a grid of (κ₀, c, φ₀)
  and over (sub-)panels drawn from the roster (the paper checks 1,888): do admitted panels beat their own
  CV-best member and approach the frontier more often than rejected ones, and does any rejected panel show
  a clear gain over its CV-best single? :func:`invariance` gives Fig. 3a's invariance region.
"""

from __future__ import annotations

import warnings
from math import comb

import numpy as np
import pandas as pd
from scipy import stats

from src.core import admissibility
from src.core.aggregate import eligible
from src.core.evaluate import from_counts, interval, kappa
from src.core.verdicts import ABSTAIN
from src.studies.suite import common
from src.studies.suite.reference import Reference

# ------------------------------------------------------------------------------------------------ Table 4


def recovery_items(ref: Reference) -> pd.DataFrame:
    """One row per item where the CV-best single's verdict is wrong: members correct, share, recovered."""
    y, v = ref.gold, ref.table.votes
    n = len(y)
    best = ref.best_member
    wrong = (ref.best_cv != ABSTAIN) & (ref.best_cv != y)
    correct = v == y[:, None]  # an abstention (0.5) is never correct
    voted = v != ABSTAIN
    rows = np.arange(n)
    others_voted = voted.sum(1) - voted[rows, best]
    others_correct = correct.sum(1) - correct[rows, best]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(others_voted > 0, others_correct / np.maximum(others_voted, 1), 0.0)
    return pd.DataFrame(
        {
            "dataset": ref.name,
            "members_correct": correct.sum(1)[wrong],
            "share_correct": share[wrong],
            "recovered": (ref.stacked == y)[wrong].astype(int),
        }
    )


def _by_count(df: pd.DataFrame, K: int) -> list[dict]:
    g = df.groupby("members_correct")["recovered"].agg(["mean", "size"])
    return [
        {
            "members_correct": k,
            "p_recovers": float(g.loc[k, "mean"]) if k in g.index else None,
            "n": int(g.loc[k, "size"]) if k in g.index else 0,
        }
        for k in range(K + 1)
    ]


def _pointbiserial(df: pd.DataFrame) -> dict | None:
    if df["recovered"].nunique() < 2 or df["share_correct"].nunique() < 2:
        return None
    r, p = stats.pointbiserialr(df["recovered"], df["share_correct"])
    return {"r": float(r), "p": float(p), "n": int(len(df))}


def fixed_effects_logit(df: pd.DataFrame) -> dict | None:
    """recovered ~ share_correct + C(dataset) (statsmodels Logit). Datasets where recovery never or always
    happens carry no information under fixed effects (their effect diverges) and are left out."""
    import statsmodels.formula.api as smf  # imported here, not at start-up: statsmodels ~2 s

    var = df.groupby("dataset")["recovered"].transform("nunique") > 1
    used = df[var]
    if len(used) < 3 or used["share_correct"].nunique() < 2:
        return None
    datasets = list(dict.fromkeys(used["dataset"]))
    formula = "recovered ~ share_correct" + (" + C(dataset)" if len(datasets) > 1 else "")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = smf.logit(formula, used).fit(disp=0, maxiter=200)
    except Exception as e:  # perfect separation, singular design
        return {"error": f"{type(e).__name__}: {e}", "datasets": datasets}
    lo, hi = res.conf_int().loc["share_correct"]
    return {
        "coef": float(res.params["share_correct"]),
        "se": float(res.bse["share_correct"]),
        "z": float(res.tvalues["share_correct"]),
        "p": float(res.pvalues["share_correct"]),
        "ci": [float(lo), float(hi)],
        "n": int(len(used)),
        "datasets": datasets,
        "dropped": sorted(set(df["dataset"]) - set(datasets)),
        "converged": bool(res.mle_retvals["converged"]),
    }


def recovery(refs: dict[str, Reference]) -> dict:
    """Table 4 (a) pooled and (b) per dataset, with the fixed-effects logit and point-biserial r."""
    if not refs:
        return {}
    K = max(len(r.table.members) for r in refs.values())
    df = pd.concat([recovery_items(r) for r in refs.values()], ignore_index=True)
    per = {}
    for name, part in df.groupby("dataset", sort=False):
        slope = _pointbiserial(part)
        per[name] = {
            "n": int(len(part)),
            "p_recovers": float(part["recovered"].mean()),
            "by_members_correct": _by_count(part, K),
            "pointbiserial": slope,
        }
    return {
        "n_items": int(len(df)),
        "p_recovers": float(df["recovered"].mean()) if len(df) else None,
        "by_members_correct": _by_count(df, K),
        "logit_fe": fixed_effects_logit(df),
        "pointbiserial": _pointbiserial(df),
        "per_dataset": per,
        "positive_within": sorted(n for n, v in per.items() if v["pointbiserial"] and v["pointbiserial"]["r"] > 0),
    }


# ------------------------------------------------------------------------------------------------ Table 5


def cross_dataset(refs: dict[str, Reference], kappa0: float, held_back: list[str]) -> dict:
    """Table 5: Spearman ρ (two-sided p) of the stacked − best-single κ gap against each coordinate."""
    rows = {}
    for name, r in refs.items():
        pb = r.admissibility.phi_bar
        n_ok = int(np.sum(admissibility.reaches(r.member_kappa, kappa0)))
        rows[name] = {
            "gap": kappa(r.gold, r.stacked) - kappa(r.gold, r.best_cv),
            "phi_bar": pb,
            "members_at_kappa0": n_ok,
            "composite": None if pb is None else (1 - pb) * n_ok,
        }
    subsets = [("all", list(rows))]
    dropped = []
    for h in held_back:
        if h in rows:
            dropped.append(h)
            subsets.append((f"without {', '.join(dropped)}", [n for n in rows if n not in dropped]))
    out = []
    for label, names in subsets:
        entry = {"subset": label, "n": len(names), "datasets": names}
        gap = np.array([rows[n]["gap"] for n in names])
        for coord in ("phi_bar", "members_at_kappa0", "composite"):
            x = np.array([np.nan if rows[n][coord] is None else rows[n][coord] for n in names], float)
            ok = np.isfinite(x)
            if ok.sum() >= 3 and np.ptp(x[ok]) > 0 and np.ptp(gap[ok]) > 0:
                rho, p = stats.spearmanr(x[ok], gap[ok])
                entry[coord] = {"rho": float(rho), "p": float(p)}
            else:
                entry[coord] = None
        out.append(entry)
    return {"datasets": rows, "rows": out}


# ------------------------------------------------------------------------------------------- Appendix C


def draw_subpanels(K: int, n: int, min_size: int, rng: np.random.Generator) -> np.ndarray:
    """The full panel and up to ``n`` distinct sub-panels of ≥ ``min_size`` members (all when there are
    fewer), uniformly among such subsets → S × K boolean, full panel first."""
    min_size = max(1, min(min_size, K))
    total = sum(comb(K, k) for k in range(min_size, K))  # proper sub-panels
    if total <= n:
        codes = [c for c in range(2**K - 1) if bin(c).count("1") >= min_size]
    else:
        seen: set[int] = set()
        while len(seen) < n:
            bits = rng.random((4 * n, K)) < 0.5
            for row in bits:
                if min_size <= row.sum() < K:
                    seen.add(int(row @ (1 << np.arange(K))))
                    if len(seen) == n:
                        break
        codes = sorted(seen)
    subs = [np.ones(K, bool)] + [((c >> np.arange(K)) & 1).astype(bool) for c in codes]
    return np.array(subs)


def subpanels(
    ref: Reference, subsets: np.ndarray, n_boot: int, seed: int, level: float, min_coverage: float = 0.5
) -> dict:
    """Per (sub-)panel on one dataset: coordinates, stacked and CV-best κ, paired Δ interval, frontier κ.
    The CV-best member is taken among those answering ``min_coverage`` of the fold's training items (as
    :class:`src.core.aggregate.BestSingle`), falling back to the others only for a sub-panel that has none."""
    t, d = ref.table, ref.design
    y, votes = d.y, t.votes
    S, n = len(subsets), len(y)
    stacked = common.oof_many(d, mask=common.member_masks(d, subsets))
    ind = common.member_counts(y, votes)
    best = np.empty((S, n))
    for tr, te in d.folds:  # the CV-best member of each sub-panel, chosen on the fold's training part
        mk_tr = from_counts(ind[tr].sum(axis=0))["kappa"]
        mk_tr = np.where(eligible(votes[tr], min_coverage), mk_tr, mk_tr - 10.0)  # κ ≥ -1: eligible first
        j = np.argmax(np.where(subsets, mk_tr[None, :], -np.inf), axis=1)
        best[:, te] = votes[te][:, j].T
    ks, kb = common.kappas(y, stacked), common.kappas(y, best)
    draws = ref.bootstrap(n_boot, seed).metrics(y, np.vstack([stacked, best]).T)["kappa"]
    ci = np.array([interval(draws[:, s] - draws[:, S + s], level) for s in range(S)])
    iu = admissibility.pair_index(len(t.members))
    pairs_on = subsets[:, iu[0]] & subsets[:, iu[1]]
    phi_pairs = np.where(pairs_on, ref.phi[iu][None, :], np.nan)
    has_front = t.has_frontier
    return {
        "size": subsets.sum(1),
        "member_kappa": np.where(subsets, ref.member_kappa[None, :], np.nan),
        "phi_bar": admissibility.phi_bar_from(phi_pairs),
        "stacked": ks,
        "best_cv": kb,
        "delta_ci": ci,
        "frontier": kappa(y, t.frontier) if has_front else None,
    }


def _admits(sp: dict, kappa0: float, c: float, phi0: float) -> np.ndarray:
    return admissibility.admits(sp["member_kappa"], sp["phi_bar"], kappa0, c, phi0, sp["size"])


def _outcomes(entries: list[dict], calls: list[np.ndarray], near: float) -> dict:
    out = {}
    for side, want in (("admitted", True), ("rejected", False)):
        above, clear, near_f, d_best, d_front, count = [], [], [], [], [], 0
        for sp, call in zip(entries, calls):
            m = call == want
            count += int(m.sum())
            gap = sp["stacked"][m] - sp["best_cv"][m]
            above.append(gap > 0)
            clear.append(sp["delta_ci"][m, 0] > 0)
            d_best.append(gap)
            if sp["frontier"] is not None:
                near_f.append(sp["stacked"][m] >= sp["frontier"] - near)
                d_front.append(sp["stacked"][m] - sp["frontier"])

        def cat(xs):
            return np.concatenate(xs) if xs else np.array([])

        a, cl, nf, db, dfr = map(cat, (above, clear, near_f, d_best, d_front))
        out[side] = {
            "n": count,
            "share_above_best": float(a.mean()) if a.size else None,
            "clear_gains": int(cl.sum()),
            "share_near_frontier": float(nf.mean()) if nf.size else None,
            "mean_delta_best": float(db.mean()) if db.size else None,
            "mean_delta_frontier": float(dfr.mean()) if dfr.size else None,
        }
    a, r = out["admitted"], out["rejected"]
    out["direction_holds"] = bool(
        a["n"] > 0
        and r["n"] > 0
        and (a["share_above_best"] >= r["share_above_best"])
        and (
            a["share_near_frontier"] is None
            or r["share_near_frontier"] is None
            or a["share_near_frontier"] >= r["share_near_frontier"]
        )
    )
    out["rejected_with_clear_gain"] = r["clear_gains"]
    return out


def threshold_grid(sps: dict[str, dict], grid: dict, near: float, operating: tuple[float, float, float]) -> dict:
    """Appendix C: the rule at every grid point, on the full panels and on all (sub-)panels."""
    names = list(sps)
    points = []
    for k0 in grid["kappa0"]:
        for c in grid["c"]:
            for p0 in grid["phi0"]:
                calls = [_admits(sps[n], k0, c, p0) for n in names]
                full = [n for n, cl in zip(names, calls) if cl[0]]
                points.append(
                    {
                        "kappa0": k0,
                        "c": c,
                        "phi0": p0,
                        "admitted_full": full,
                        "subpanels": _outcomes([sps[n] for n in names], calls, near),
                    }
                )
    k0, c, p0 = operating
    op_calls = [_admits(sps[n], k0, c, p0) for n in names]
    op = _outcomes([sps[n] for n in names], op_calls, near)
    holds = [
        p["subpanels"]["direction_holds"]
        for p in points
        if p["subpanels"]["admitted"]["n"] and p["subpanels"]["rejected"]["n"]
    ]
    return {
        "operating": {
            "kappa0": k0,
            "c": c,
            "phi0": p0,
            **op,
            "admitted_full": [n for n, cl in zip(names, op_calls) if cl[0]],
        },
        "n_panels": int(sum(len(sp["stacked"]) for sp in sps.values())),
        "points": points,
        "share_points_direction_holds": float(np.mean(holds)) if holds else None,
    }


def invariance(refs: dict[str, Reference], kappa0: float, c: float, phi0: float, step: float = 0.01) -> dict:
    """Fig. 3a: the positions (φ₀, c) of the gold point at which no dataset changes side (the rule of
    :func:`src.core.admissibility.admits` on the whole grid at once)."""
    if not refs:
        return {}
    K = max(len(r.table.members) for r in refs.values())
    phis = np.round(np.arange(-0.2, 1.0 + step / 2, step), 6)
    cs = np.arange(K + 1) / K

    def admitted(cc, pp):  # per dataset, over the grid of (c, φ₀) given
        return np.stack(
            [
                admissibility.admits(
                    r.member_kappa,
                    np.nan if r.admissibility.phi_bar is None else r.admissibility.phi_bar,
                    kappa0,
                    cc,
                    pp,
                    len(r.member_kappa),
                )
                for r in refs.values()
            ]
        )

    base = admitted(np.array(c), np.array(phi0))
    same = (admitted(cs[:, None], phis[None, :]) == base[:, None, None]).all(axis=0)
    return {"phi0": phis.tolist(), "c": cs.tolist(), "same": same.tolist()}
