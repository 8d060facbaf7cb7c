"""Drift maths of live admissibility monitoring: the class-conditional vote, abstention and pairwise-agreement
shares of a window tested against the calibration set's at the window's estimated prevalence (two-sample
z-tests, Holm 1979), the prevalence flag from the EM estimate's observed information (Saerens et al. 2002
§2.2), and the k-in-a-row alarm rule (Montgomery, *Introduction to Statistical Quality Control*, §5.3).
:class:`DriftMonitor` is fitted on labelled calibration votes and reads windows of a served stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator

from src.core.admissibility import agreement_proxy as proxy
from src.core.admissibility import pair_index
from src.core.errors import MonitorError
from src.core.evaluate import holm
from src.core.priorshift import estimate
from src.core.verdicts import ABSTAIN


def pair_names(members: Sequence[str]) -> list[str]:

    i, j = pair_index(len(members))
    return [f"{members[a]}~{members[b]}" for a, b in zip(i, j)]


def indicators(votes: np.ndarray) -> np.ndarray:
    """Per item, the 0/1 events the drift test counts: member votes 1 (K), member abstains (K), both members of
    a pair vote and agree (K(K−1)/2, in :func:`src.core.admissibility.pair_index` order)."""

    voted = votes != ABSTAIN
    i, j = pair_index(votes.shape[1])
    agree = voted[:, i] & voted[:, j] & (votes[:, i] == votes[:, j])
    return np.column_stack([voted & (votes == 1), ~voted, agree]).astype(float)


def test_names(members: Sequence[str]) -> list[str]:
    return (
        [f"vote/{m}" for m in members] + [f"abstain/{m}" for m in members] + [f"agree/{p}" for p in pair_names(members)]
    )


def agreement_proxy(votes: np.ndarray) -> float:
    """The label-free agreement proxy of a window (:func:`src.core.admissibility.agreement_proxy`, §3.3); NaN when
    no pair of members voted on a common item (a window's metric is a number)."""

    value = proxy(votes)
    return float("nan") if value is None else value


def holm_min(pvalues: np.ndarray) -> tuple[float, np.ndarray]:
    """(smallest Holm-adjusted p, all adjusted p) of one window's family (:func:`src.core.evaluate.holm`)."""

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

    def __init__(
        self,
        window: int = 200,
        step: int = 50,
        alpha: float = 0.01,
        consecutive: int = 2,
        tolerance: float = 0.1,
        reference_prevalence: float | None = None,
        reference_items: int = 500,
        members: Sequence[str] = (),
    ):
        self.window = window
        self.step = step
        self.alpha = alpha
        self.consecutive = consecutive
        self.tolerance = tolerance
        self.reference_prevalence = reference_prevalence
        self.reference_items = reference_items
        self.members = members

    def fit(self, votes: np.ndarray, gold: np.ndarray) -> DriftMonitor:
        votes, gold = np.asarray(votes, dtype=float), np.asarray(gold, dtype=int)
        if not ({0, 1} <= set(np.unique(gold).tolist())):
            raise MonitorError(
                "calibration set: field 'gold': both classes are needed (0 = supported, 1 = hallucinated)"
            )
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
        from scipy.stats import norm  # imported here, not at start-up: scipy

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

    def prevalence_flag(self, est: float, se: float, ref: tuple[float, float], alpha: float | None = None) -> bool:
        """Moved by more than the tolerance and significantly (two-sided z-test at α, or at ``alpha``)."""
        from scipy.stats import norm  # imported here, not at start-up: scipy

        diff = abs(est - ref[0])
        z = diff / max(np.hypot(se, ref[1]), 1e-12)
        return bool(diff > self.tolerance + 1e-12 and z > norm.isf((self.alpha if alpha is None else alpha) / 2))

    def windows(self, votes: np.ndarray, p: np.ndarray) -> pd.DataFrame:
        """One row per window (``start``, ``end`` exclusive): prevalence estimate, agreement proxy, vote and
        abstention rates, the smallest Holm-adjusted p, the strongest departures, and the two flags."""
        votes, p = np.asarray(votes, dtype=float), np.asarray(p, dtype=float)
        n, W = len(votes), int(self.window)
        if n < W:
            raise MonitorError(f"stream: {n} items, fewer than one window (monitor.window={W})")
        ref = self.reference(p)
        rows = [
            self._window(votes[s : s + W], p[s : s + W], s, s + W, ref) for s in range(0, n - W + 1, int(self.step))
        ]
        frame = pd.DataFrame(rows)
        frame.attrs["reference_prevalence"], frame.attrs["reference_se"] = ref
        return frame

    def _window(self, votes: np.ndarray, p: np.ndarray, start: int, end: int, ref: tuple[float, float]) -> dict:
        prev, se = self._estimate(p)
        obs, pv = self.pvalues(votes, prev if np.isfinite(prev) else self.prevalence_)
        p_min, adj = holm_min(pv)
        K = len(self.members_)
        voted = votes != ABSTAIN
        row: dict[str, Any] = {
            "start": start,
            "end": end,
            "prevalence": prev,
            "prevalence_se": se,
            "agreement_proxy": agreement_proxy(votes),
            "p_holm_min": p_min,
            "flag_panel": bool(p_min < self.alpha),
            "flag_prevalence": self.prevalence_flag(prev, se, ref),
        }
        for j, m in enumerate(self.members_):
            row[f"vote_rate/{m}"] = float(obs[j] / max(voted[:, j].mean(), 1e-12)) if voted[:, j].any() else np.nan
            row[f"abstention/{m}"] = float(obs[K + j])
        worst = np.argsort(adj)[:3]
        row["departures"] = [
            f"{self.tests_[t]} {obs[t]:.3f} (p_holm {adj[t]:.2g})" for t in worst if adj[t] < self.alpha
        ]
        return row

    def alarms(self, frame: pd.DataFrame) -> dict[str, list[int]]:
        """Per kind, the item positions (window ends) where the alarm rule fires."""
        return {
            kind: [int(frame["end"].iloc[w]) for w in runs_alarm(frame[f"flag_{kind}"].tolist(), int(self.consecutive))]
            for kind in ("panel", "prevalence")
        }
