"""Prevalence (prior) shift of the stacker's posteriors (beyond the paper; issue 11 §2).

The stacker is fitted on balanced sets (train prevalence 0.5), while deployment traffic is hallucinated at
5–30 %. Under a pure prior shift (p(x | y) unchanged), the posterior under a new prior follows from Bayes'
rule (Saerens, Latinne & Decaestecker 2002, "Adjusting the outputs of a classifier to new a priori
probabilities: a simple procedure", Neural Computation 14(1):21–41, eq. 2.4), and the new prior itself can be
estimated without labels by EM on the posteriors (their §2.2; "EMQ" in the quantification literature, e.g. R's
``mclust::classPriorProbs`` and ``mlquantify``'s EMQ).
"""

from __future__ import annotations

import numpy as np

from src.errors import RaimError


class PrevalenceError(RaimError):
    """Bad input to the prior-shift correction (a posterior outside [0, 1], a prevalence outside (0, 1))."""


def check_prevalence(value: float, name: str) -> float:
    """``value`` as a float strictly inside (0, 1); otherwise a :class:`PrevalenceError` naming ``name``."""
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
        raise PrevalenceError(f"{name}[{where}]: {arr[idx]!r} is not a probability in [0, 1]")
    return arr


def _shift(p: np.ndarray, train_prevalence: float, prevalence: float) -> np.ndarray:
    """Eq. 2.4 on checked inputs: reweight each class's posterior by new prior / old prior, renormalise."""
    w1 = prevalence / train_prevalence
    w0 = (1.0 - prevalence) / (1.0 - train_prevalence)
    num = w1 * p
    return num / (num + w0 * (1.0 - p))


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


def estimate(p: np.ndarray, train_prevalence: float, tol: float = 1e-6, max_iter: int = 1000) -> float:
    """label-free EM estimate of the deployment prevalence from the posteriors p (EMQ).

    Saerens et al. 2002, §2.2 (eqs. 2.9–2.10): start from the training prior, adjust the posteriors to the
    current prior (eq. 2.4), take their mean as the next prior; stop when the prior moves by less than
    ``tol`` (or after ``max_iter`` steps). The fixed point is the maximum-likelihood mixing proportion, which
    lies on the boundary (0 or 1) when every posterior is on one side of the training prior.
    """
    arr = check_posteriors(p).ravel()
    if arr.size == 0:
        raise PrevalenceError("p: no posteriors to estimate a prevalence from (empty)")
    t = check_prevalence(train_prevalence, "train_prevalence")
    if not (np.isfinite(tol) and tol > 0):
        raise PrevalenceError(f"tol: {tol!r} must be a positive number")
    if int(max_iter) < 1:
        raise PrevalenceError(f"max_iter: {max_iter!r} must be at least 1")
    prior = t
    for _ in range(int(max_iter)):
        new = float(np.mean(_shift(arr, t, prior)))
        if abs(new - prior) < tol:
            return new
        prior = new
    return prior
