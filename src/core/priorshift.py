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


def _em_rows(P: np.ndarray, T, tol: float, max_iter: int) -> np.ndarray:
    """EM prior of each row of ``P`` (windows × items; ``T`` the training prior, a scalar or per item), rows
    iterated together and each frozen once it has converged: row by row the same numbers as :func:`estimate`."""
    P = np.atleast_2d(P)
    T = np.broadcast_to(np.asarray(T, dtype=float), P.shape)
    prior = T.mean(axis=1).copy()
    active = np.arange(len(P))
    for _ in range(int(max_iter)):
        new = _shift(P[active], T[active], prior[active, None]).mean(axis=1)
        done = np.abs(new - prior[active]) < tol
        prior[active] = new
        active = active[~done]
        if not active.size:
            break
    return prior


def estimate(p: np.ndarray, train_prevalence: float, tol: float = 1e-6, max_iter: int = 1000) -> float:
    """label-free EM estimate of the deployment prevalence from the posteriors p (EMQ).

    Saerens et al. 2002, §2.2 (eqs. 2.9–2.10): start from the training prior, adjust the posteriors to the
    current prior (eq. 2.4), take their mean as the next prior; stop when the prior moves by less than
    ``tol`` (or after ``max_iter`` steps; mlquantify's EMQ defaults). The fixed point maximises the likelihood
    of the mixing proportion; it lies on the boundary (0 or 1) when the posteriors all sit on one side of the
    training prior, so a handful of items gives a poor estimate (the study measures it at 200).
    """
    arr = check_posteriors(p).ravel()
    if arr.size == 0:
        raise PrevalenceError("p: no posteriors to estimate a prevalence from (empty)")
    t = check_prevalence(train_prevalence, "train_prevalence")
    if not (np.isfinite(tol) and tol > 0):
        raise PrevalenceError(f"tol: {tol!r} must be a positive number")
    if isinstance(max_iter, bool) or int(max_iter) != max_iter or max_iter < 1:
        raise PrevalenceError(f"max_iter: {max_iter!r} must be an integer ≥ 1")
    return float(_em_rows(arr[None, :], t, tol, int(max_iter))[0])


def train_prevalence(stacker) -> float:
    """The hallucinated share of the items a fitted stacker was fitted on (``train_prevalence_``)."""
    value = getattr(stacker, "train_prevalence_", None)
    if value is None:
        raise PrevalenceError("this model's stacker was fitted before RAIM recorded its training prevalence "
                              "(train_prevalence_); log it again (python -m src.run) to use the prevalence parameter")
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
        raise PrevalenceError(f"parameter 'prevalence': {value!r} is neither a prevalence in (0, 1) nor "
                              f"'{ESTIMATE}'") from None


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
        raise PrevalenceError(f"parameter 'prevalence': '{ESTIMATE}' needs at least {MIN_ESTIMATE_ROWS} answered rows "
                              f"in the request, got {arr.size} (the EM estimate of a few posteriors runs to 0 or 1): "
                              "send a window of items, or pass the deployment prevalence itself")
    q = min(max(estimate(arr, t), _EDGE), 1 - _EDGE) if value == ESTIMATE else value
    return _shift(arr, t, q), float(q)
