"""Prior-shift maths (Saerens, Latinne & Decaestecker 2002, "Adjusting the outputs of a classifier to new a
priori probabilities: a simple procedure", Neural Computation 14(1):21–41): the posterior under a new prior
(:func:`adjust`, eq. 2.4), the label-free EM estimate of that prior (:func:`estimate`, their §2.2; "EMQ" in the
quantification literature) and the served models' ``prevalence`` setting (:func:`served`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from src.core.errors import RaimError

ESTIMATE = "estimate"


_EDGE = 1e-12  # a served EM estimate at the boundary is kept this far inside (0, 1)


# "estimate" over fewer answered rows is refused: EM on a handful of posteriors runs to 0 or 1 (one item at p = 0.7
# gives π̂ ≈ 1.0) and would push every verdict with it; a window of a few hundred is what the study measures.
MIN_ESTIMATE_ROWS = 50


class PrevalenceError(RaimError):
    """Bad input to the prior-shift correction (a posterior outside [0, 1], a prevalence outside (0, 1))."""


def check_prevalence(value: float, name: str) -> float:
    """``value`` as a float strictly inside (0, 1); otherwise a :class:`PrevalenceError` naming ``name``."""
    if isinstance(value, bool):
        raise PrevalenceError(f"{name}: {value!r} is not a prevalence in (0, 1)")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise PrevalenceError(f"{name}: {value!r} is not a number (a prevalence in (0, 1))") from None
    if not 0.0 < v < 1.0:  # also refuses NaN
        raise PrevalenceError(f"{name}: {value!r} is not a prevalence in (0, 1) (open interval)")
    return v


def check_posteriors(p: np.ndarray, name: str = "p") -> np.ndarray:
    """``p`` as a float array of probabilities in [0, 1]; otherwise an error naming the first bad item."""
    try:
        arr = np.asarray(p, dtype=float)
    except (TypeError, ValueError):
        raise PrevalenceError(f"{name}: not an array of numbers") from None
    bad = ~((arr >= 0.0) & (arr <= 1.0))  # NaN is bad too
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        where = idx[0] if len(idx) == 1 else idx
        raise PrevalenceError(f"{name}[{where}]: {float(arr[idx])!r} is not a probability in [0, 1]")
    return arr


def _shift(p: np.ndarray, t, q) -> np.ndarray:
    """Eq. 2.4 on checked inputs (broadcasting): reweight each class's posterior by new / old prior, renormalise."""
    num = q / t * p
    return num / (num + (1.0 - q) / (1.0 - t) * (1.0 - p))


def adjust(p: np.ndarray, train_prevalence: float, prevalence: float) -> np.ndarray:
    """posterior p(hallucinated) under a new prior (Saerens et al. 2002, eq. 2.4).

    ``p`` are posteriors of a model calibrated where the hallucinated share was ``train_prevalence``; the
    result is the posterior where it is ``prevalence`` (equivalently, the log-odds shift by
    logit(prevalence) − logit(train_prevalence)). 0 and 1 stay 0 and 1.
    """
    arr = check_posteriors(p)
    t = check_prevalence(train_prevalence, "train_prevalence")
    q = check_prevalence(prevalence, "prevalence")
    return _shift(arr, t, q)


def _ml_rows(P: np.ndarray, T, tol: float, max_iter: int) -> np.ndarray:
    """The maximum-likelihood prior of each row of ``P`` (windows × items; ``T`` the training prior, a scalar or
    per item), rows bisected together: row by row the same numbers as :func:`estimate`.

    With aᵢ = pᵢ/tᵢ and bᵢ = (1 − pᵢ)/(1 − tᵢ), the log-likelihood of the prior π is Σᵢ log(π·aᵢ + (1 − π)·bᵢ)
    (Saerens et al. 2002, §2.2), concave in π: its maximum is π = 0 where the derivative Σ (aᵢ − bᵢ)/bᵢ at 0 is
    ≤ 0, π = 1 where the derivative at 1 is ≥ 0, and otherwise the one root of the derivative in (0, 1), which
    bisection brackets to a width under ``tol`` (at most ``max_iter`` halvings); the bracket's midpoint is
    returned, within ``tol``/2 of the maximiser."""
    P = np.atleast_2d(np.asarray(P, dtype=float))
    T = np.broadcast_to(np.asarray(T, dtype=float), P.shape)
    a, b = P / T, (1.0 - P) / (1.0 - T)
    d = a - b
    with np.errstate(divide="ignore", invalid="ignore"):
        at0 = np.where(d == 0, 0.0, d / b).sum(axis=1)  # +inf where an item has p = 1
        at1 = np.where(d == 0, 0.0, d / a).sum(axis=1)  # −inf where an item has p = 0
    prior = np.where(at0 <= 0, 0.0, 1.0)
    inner = np.flatnonzero((at0 > 0) & (at1 < 0))
    lo, hi = np.zeros(len(inner)), np.ones(len(inner))
    for _ in range(int(max_iter)):
        if not len(inner) or (hi - lo).max() < tol:
            break
        mid = 0.5 * (lo + hi)
        slope = (d[inner] / (mid[:, None] * a[inner] + (1.0 - mid[:, None]) * b[inner])).sum(axis=1)
        lo, hi = np.where(slope > 0, mid, lo), np.where(slope > 0, hi, mid)
    prior[inner] = 0.5 * (lo + hi)
    return prior


def estimate(p: np.ndarray, train_prevalence: float, tol: float = 1e-6, max_iter: int = 1000) -> float:
    """label-free maximum-likelihood estimate of the deployment prevalence from the posteriors p (EMQ's answer).

    Saerens et al. 2002, §2.2 (eqs. 2.9–2.10) reach it by EM: start from the training prior, adjust the posteriors
    to the current prior (eq. 2.4), take their mean as the next prior. EM's steps shrink long before it arrives
    where the likelihood is flat (posteriors near the training prior), so a rule that stops on a small step can
    end far from the maximum; here the maximiser itself is bracketed on the likelihood (:func:`_ml_rows`) and the
    estimate is within ``tol`` of it (after at most ``max_iter`` halvings of the bracket). It lies on the boundary
    (0 or 1) when the posteriors all sit on one side of the training prior, so a handful of items gives a poor
    estimate (the study measures it at 200).
    """
    arr = check_posteriors(p).ravel()
    if arr.size == 0:
        raise PrevalenceError("p: no posteriors to estimate a prevalence from (empty)")
    t = check_prevalence(train_prevalence, "train_prevalence")
    if not (np.isfinite(tol) and tol > 0):
        raise PrevalenceError(f"tol: {tol!r} must be a positive number")
    if isinstance(max_iter, bool) or int(max_iter) != max_iter or max_iter < 1:
        raise PrevalenceError(f"max_iter: {max_iter!r} must be an integer ≥ 1")
    return float(_ml_rows(arr[None, :], t, tol, int(max_iter))[0])


def estimate_rows(P: np.ndarray, train_prevalence, tol: float = 1e-6, max_iter: int = 1000) -> np.ndarray:
    """:func:`estimate` of every row of ``P`` (windows × items) at once, ``train_prevalence`` a scalar or one per
    item: row by row the same numbers, the rows bisected together (a study's many windows)."""
    P = np.atleast_2d(check_posteriors(P))
    t = np.asarray(train_prevalence, dtype=float)
    if not np.all((t > 0) & (t < 1)):
        raise PrevalenceError(f"train_prevalence: {train_prevalence!r} is not a prevalence in (0, 1) (open interval)")
    if not (np.isfinite(tol) and tol > 0):
        raise PrevalenceError(f"tol: {tol!r} must be a positive number")
    if isinstance(max_iter, bool) or int(max_iter) != max_iter or max_iter < 1:
        raise PrevalenceError(f"max_iter: {max_iter!r} must be an integer ≥ 1")
    return _ml_rows(P, t, tol, int(max_iter))


def train_prevalence(stacker) -> float:
    """The hallucinated share of the items a fitted stacker was fitted on (``train_prevalence_``)."""
    value = getattr(stacker, "train_prevalence_", None)
    if value is None:
        raise PrevalenceError(
            "this model's stacker was fitted before RAIM recorded its training prevalence "
            "(train_prevalence_); log it again (python -m src.run) to use the prevalence parameter"
        )
    return check_prevalence(value, "train_prevalence_")


def parse_setting(value: Any) -> float | str | None:
    """The ``prevalence`` inference parameter: None (or empty) = as fitted, ``"estimate"``, or a prevalence
    in (0, 1) given as a number or as text (MLflow passes the parameter as a string)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    if isinstance(value, str) and value.strip().lower() == ESTIMATE:
        return ESTIMATE
    try:
        return check_prevalence(value, "prevalence")
    except PrevalenceError:
        raise PrevalenceError(
            f"parameter 'prevalence': {value!r} is neither a prevalence in (0, 1) nor '{ESTIMATE}'"
        ) from None


def served(p: np.ndarray, stacker, setting: Any) -> tuple[np.ndarray, float | None]:
    """(posteriors, the prevalence used) for a served batch: unchanged without a setting; corrected to a given
    prevalence; or to the EM estimate over the batch (``"estimate"``: needs a window of many items)."""
    value = parse_setting(setting)
    if value is None:
        return np.asarray(p, dtype=float), None
    t = train_prevalence(stacker)
    arr = check_posteriors(p)
    if arr.size == 0:
        return arr, None
    if value == ESTIMATE and arr.size < MIN_ESTIMATE_ROWS:
        raise PrevalenceError(
            f"parameter 'prevalence': '{ESTIMATE}' needs at least {MIN_ESTIMATE_ROWS} answered rows "
            f"in the request, got {arr.size} (the EM estimate of a few posteriors runs to 0 or 1): "
            "send a window of items, or pass the deployment prevalence itself"
        )
    q = min(max(estimate(arr, t), _EDGE), 1 - _EDGE) if value == ESTIMATE else value
    return _shift(arr, t, q), float(q)
