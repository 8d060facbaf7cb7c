"""The intervals the ladder reads off its refit bootstrap (§2's paired cluster bootstrap, refitted per draw:
:mod:`src.core.refit`): the corrected variance of a statistic (its refit draws' variance less the own term,
:class:`src.core.refit.RefitDraws`), the normal interval around the estimate, κ's on Fisher's scale, and the
variance a paired Δ adds for the discordant items a sample cannot rule out (docs/intervals.md has the derivations
and the measured coverage)."""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from src.core.evaluate import indicators
from src.core.refit import gradients


def corrected_variance(draws: np.ndarray, fixed_draws: np.ndarray, correction: float) -> float:
    """A statistic's variance from its refit draws: Var*(S) − ``correction`` (:class:`RefitDraws`), never under the
    fixed-prediction draws' variance (the sampling variance with the fit held, which the fit's variation can only
    add to)."""
    return max(float(np.var(draws)) - correction, float(np.var(fixed_draws)))


def normal_interval(estimate: float, var: float, level: float = 0.95) -> tuple[list[float], float, float]:
    """(interval, standard error, one-sided p of S ≤ 0) of a normal interval of variance ``var`` around the
    estimate."""
    se = float(np.sqrt(var))
    z = float(norm.ppf(0.5 + level / 2))
    if se > 0:
        p = float(norm.sf(estimate / se))
    else:
        p = 0.0 if estimate > 0 else 1.0
    return [float(estimate - z * se), float(estimate + z * se)], se, p


def fisher_interval(kappa: float, se: float, level: float = 0.95) -> list[float]:
    """A κ's interval of standard error ``se``, normal on Fisher's scale: tanh(atanh κ̂ ± z·se / (1 − κ̂²)). κ of two
    binary ratings with equal margins is their Pearson correlation, whose estimate is skewed toward 0 near ±1; on the
    atanh scale it is about normal, so the interval reaches further toward 0 than away from it. Where the normal
    interval κ̂ ± z·se reaches ±1 the slope 1 / (1 − κ̂²) outgrows what the variance says (at κ̂ = 1 any se > 0 would
    give [−1, 1]): there it is the normal interval, cut to [−1, 1]."""
    z = float(norm.ppf(0.5 + level / 2))
    k = float(kappa)
    if abs(k) + z * se >= 1:
        return [max(k - z * se, -1.0), min(k + z * se, 1.0)]
    centre, spread = np.arctanh(k), z * se / (1 - k * k)
    return [float(np.tanh(centre - spread)), float(np.tanh(centre + spread))]


def corrected_interval(
    estimate: float, draws: np.ndarray, fixed_draws: np.ndarray, correction: float, level: float = 0.95
) -> tuple[list[float], float, float]:
    """(interval, standard error, one-sided p of S ≤ 0) of a statistic from its refit draws: the
    :func:`corrected_variance`; a normal interval around the estimate (:func:`normal_interval`)."""
    return normal_interval(estimate, corrected_variance(draws, fixed_draws, correction), level)


def unseen_discordance(gold: np.ndarray, a: np.ndarray, b: np.ndarray, level: float = 0.95) -> dict[str, float]:
    """Per metric, the variance z²·h² that a paired Δ between two arms' verdicts ``a`` and ``b`` (n-vectors in
    {0, 1, ½}) adds to its fixed-prediction variance for the discordant items a sample cannot rule out
    (docs/intervals.md, "Sparse evidence"): z² items more on which the arms differ — the count Wilson's interval
    for a rate allows when it saw none ([0, z² / (n + z²)] for 0 of n) — each moving the Δ by h, the most one item
    can: the widest spread, in either arm, of the metric's gradient (:func:`gradients`, at the arm's full-sample
    counts) over the three cells of one gold class. Where the arms never differ, the interval around the estimate
    then reaches z²·h either way, as far as that count moves the Δ."""
    z2 = float(norm.ppf(0.5 + level / 2)) ** 2
    grads = [gradients(indicators(gold, p).sum(axis=0)) for p in (a, b)]
    out = {}
    for m in grads[0]:
        g = np.stack([gr[m].reshape(2, 3) for gr in grads])  # arms × gold × cells
        h = float(np.ptp(g, axis=2).max())
        out[m] = z2 * h * h
    return out
