"""The stacker refitted on many bootstrap draws at once (:mod:`src.core.refit`): scikit-learn's
``LogisticRegression(C)`` objective, C·Σ wᵢ·logloss + ½‖β‖² with a free intercept, fitted by batched Newton for all
draws together (:func:`fit_logit`), the held-out probabilities it gives (:func:`stacked_proba`), and any other
stacker refitted draw by draw (:func:`loop_proba`).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import clone

from src.core.memory import PerArray

# a training part holding one gold class only is fitted as scikit-learn cannot: β = 0, intercept ±this
SINGLE_CLASS_LOGIT = 30.0


def softplus_sigmoid(eta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log(1 + eᶯ) = max(η, 0) + log1p(e^{−|η|}) and σ(η) = (η ≥ 0 ? 1 : e^{−|η|}) / (1 + e^{−|η|}), stable for any η;
    computed in place (the same operations on the same values: the same bits, fewer arrays of draws × rows)."""
    e = np.abs(eta)
    np.negative(e, out=e)
    np.exp(e, out=e)
    log1pexp = np.maximum(eta, 0.0)
    log1pexp += np.log1p(e)
    sigmoid = np.where(eta >= 0, 1.0, e)
    e += 1.0
    sigmoid /= e
    return log1pexp, sigmoid


def _outer(Z: np.ndarray) -> np.ndarray:
    return (Z[:, :, None] * Z[:, None, :]).reshape(len(Z), -1)


# V × p²: each row's zᵀz, flat; once per design matrix while it lives (a rung's fits, two per draw chunk and fold,
# share theirs)
_row_outer = PerArray(_outer)


def fit_logit(
    Z: np.ndarray,
    W1: np.ndarray,
    W0: np.ndarray,
    C: float = 1.0,
    start: np.ndarray | None = None,
    max_iter: int = 100,
    tol: float = 1e-8,
) -> np.ndarray:
    """M weighted L2 logistic regressions on shared rows; returns β (M × p), intercept first.

    ``Z`` (V × p) holds the distinct feature rows with the intercept's column of ones first; ``W1`` and ``W0``
    (M × V) each problem's weight of items with gold 1 and with gold 0 on each row (for unit items, their
    counts). Problem m minimises scikit-learn's ``LogisticRegression(C=C)`` objective on those items with
    ``sample_weight`` their weights: C·Σᵥ [(W1ₘᵥ + W0ₘᵥ)·log(1 + e^{zᵥβ}) − W1ₘᵥ·zᵥβ] + ½‖β₁:‖² (the
    intercept β₀ unpenalised), by Newton's method from ``start`` (p, or M × p; default 0) with step halving
    where the objective would rise, all problems at once, until no coefficient of a problem moves by ``tol``
    (the convergence is quadratic by then: the answer is far closer than ``tol``). The objective is strictly
    convex, so the start changes the number of steps, not the answer. A problem whose items hold one class only
    (or none) gets β₁: = 0 and β₀ = ±:data:`SINGLE_CLASS_LOGIT` (it predicts that class; scikit-learn refuses
    such a fit).
    """
    Z = np.asarray(Z, float)
    W1, W0 = np.atleast_2d(np.asarray(W1, float)), np.atleast_2d(np.asarray(W0, float))
    M, p = len(W1), Z.shape[1]
    pos, neg = W1.sum(axis=1), W0.sum(axis=1)
    single = (pos <= 0) | (neg <= 0)
    B = np.zeros((M, p)) if start is None else np.array(np.broadcast_to(start, (M, p)), dtype=float)
    B[single] = 0.0
    B[single, 0] = np.where(pos[single] > 0, SINGLE_CLASS_LOGIT, -SINGLE_CLASS_LOGIT)
    lam = np.full(p, 1.0 / C)
    lam[0] = 0.0
    outer = _row_outer(Z)

    def evaluate(w, w1, beta):
        """(σ(η), objective) of the problems with weights w (all items) and w1 (gold 1) at coefficients beta."""
        eta = beta @ Z.T
        sp, s = softplus_sigmoid(eta)
        return s, (w * sp - w1 * eta).sum(axis=1) + 0.5 * (beta**2 * lam).sum(axis=1)

    active = np.flatnonzero(~single)
    w1, w, b = W1[active], W1[active] + W0[active], B[active]
    s, f = evaluate(w, w1, b)
    for _ in range(max_iter):
        if not len(active):
            break
        ws = w * s
        g = (ws - w1) @ Z + b * lam
        H = ((ws * (1 - s)) @ outer).reshape(len(active), p, p) + np.diag(lam)
        step = np.linalg.solve(H, g[..., None])[..., 0]
        b_new = b - step
        s_new, f_new = evaluate(w, w1, b_new)
        t = np.ones(len(active))
        for _halving in range(40):  # halve the step of the problems whose objective went up
            bad = np.flatnonzero(f_new > f + 1e-13 * np.abs(f))
            if not len(bad):
                break
            t[bad] *= 0.5
            b_new[bad] = b[bad] - t[bad, None] * step[bad]
            s_new[bad], f_new[bad] = evaluate(w[bad], w1[bad], b_new[bad])
        b, s, f = b_new, s_new, f_new
        B[active] = b
        moving = np.abs(t[:, None] * step).max(axis=1) >= tol
        if not moving.all():
            active, w, w1, b, s, f = (a[moving] for a in (active, w, w1, b, s, f))
    return B


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def stacked_proba(Z: np.ndarray, t1: np.ndarray, t0: np.ndarray, C: float) -> np.ndarray:
    """draws × rows: p(hallucinated) of the stacker refitted per draw on rows ``Z`` (intercept column first) weighted
    by t1 / t0 (draws × rows: each row's weight of gold-1 / gold-0 items), by :func:`fit_logit` started from the fit
    to the draws' mean weights."""
    start = fit_logit(Z, t1.mean(axis=0), t0.mean(axis=0), C)
    return _sigmoid(fit_logit(Z, t1, t0, C, start) @ Z.T)


def loop_proba(stacker, rows: np.ndarray, t1: np.ndarray, t0: np.ndarray) -> np.ndarray:
    """draws × rows: p(hallucinated) of any stacker refitted per draw by its own ``fit`` on ``rows`` (its input, one
    item's columns a row) repeated by their weights t1 / t0 (draws × rows) with gold 1 / 0, row by row: one fit per
    draw. A training part of one gold class (or none) predicts that class (p = σ(±:data:`SINGLE_CLASS_LOGIT`), 0
    when empty), as :func:`fit_logit` does."""
    rows = np.asarray(rows, float)
    gold = np.tile([1, 0], len(rows))
    out = np.empty((len(t1), len(rows)))
    for b, w in enumerate(np.stack([t1, t0], axis=-1).reshape(len(t1), -1)):
        rep = np.repeat(np.arange(2 * len(rows)), w.astype(int))  # row by row: each row's gold-1 items, then gold-0
        y = gold[rep]
        if len(np.unique(y)) < 2:
            out[b] = _sigmoid(np.array(SINGLE_CLASS_LOGIT if len(y) and y[0] == 1 else -SINGLE_CLASS_LOGIT))
        else:
            out[b] = clone(stacker).fit(rows[rep // 2], y).predict_proba(rows)[:, 1]
    return out
