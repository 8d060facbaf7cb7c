"""The stacker refitted on many bootstrap draws at once (:mod:`src.core.refit`): scikit-learn's
``LogisticRegression(C)`` objective, C·Σ wᵢ·logloss + ½‖β‖² with a free intercept, fitted by batched Newton for all
draws together (:func:`fit_logit`), the probabilities it gives per draw and fold (:class:`FoldFits`), and any other
stacker refitted draw by draw (:func:`loop_proba`).
"""

from __future__ import annotations

import functools

import numpy as np
from sklearn.base import clone

from src.core import compiled
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


def sigmoid(z: np.ndarray) -> np.ndarray:
    """σ(z) = ½(1 + tanh(z/2)), in place on a new array: stable for any z, one transcendental per element."""
    s = np.tanh(0.5 * z)
    s += 1.0
    s *= 0.5
    return s


def _pairs(Z: np.ndarray) -> np.ndarray:
    """V × p(p+1)/2: each row's products z_i·z_j for i ≤ j (the upper triangle of zᵀz, row by row), in
    float32: the Hessian only steers Newton's steps (its rounding moves how fast they converge, not where to)."""
    iu, ju = _triangle(Z.shape[1])
    return (Z[:, iu] * Z[:, ju]).astype(np.float32)


# once per design matrix while it lives (a rung's fits, two per draw chunk and fold, share theirs)
_row_pairs = PerArray(_pairs)


def _hessians(a: np.ndarray, pairs: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """M × p × p: Zᵀ diag(aₘ) Z + diag(λ), each from its upper triangle (``pairs``: :func:`_pairs`), the weights a
    (M × V) summed in float32."""
    p = len(lam)
    iu, ju = _triangle(p)
    h = (a.astype(np.float32) @ pairs).astype(float)
    H = np.empty((len(a), p, p))
    H[:, iu, ju] = h
    H[:, ju, iu] = h
    H += np.diag(lam)
    return H


_triangle = functools.cache(np.triu_indices)

# a step that shrinks the one before by this much or more is in Newton's quadratic range: the next step keeps its
# Hessian (a chord step)
CHORD = 1 / 50
# while every problem's last step is at least this, σ and the gradients are computed in float32 (_Newton)
LOW = 1e-3


def _penalty(p: int, C: float) -> np.ndarray:
    """The L2 penalty's diagonal of C·Σ wᵢ·logloss + ½‖β‖² divided by C: 1/C on each coefficient, 0 on the intercept."""
    lam = np.full(p, 1.0 / C)
    lam[0] = 0.0
    return lam


def _factor(H: np.ndarray, L: np.ndarray) -> None:
    """Each H (M × p × p, symmetric) factored as L·Lᵀ into ``L`` (lower; Cholesky); a problem whose H is not
    numerically positive definite gets L[m, 0, 0] = 0 (:func:`_newton_steps` then solves it by LU). Written to
    compile (:func:`src.core.compiled.njit`)."""
    M, p = H.shape[0], H.shape[1]
    for m in range(M):
        for j in range(p):
            d = H[m, j, j]
            for k in range(j):
                d -= L[m, j, k] * L[m, j, k]
            if not d > 0.0:
                L[m, 0, 0] = 0.0
                break
            d = np.sqrt(d)
            L[m, j, j] = d
            for i in range(j + 1, p):
                t = H[m, i, j]
                for k in range(j):
                    t -= L[m, i, k] * L[m, j, k]
                L[m, i, j] = t / d


def _solve(L: np.ndarray, g: np.ndarray, out: np.ndarray) -> None:
    """out[m] = (L·Lᵀ)⁻¹ g[m] by the two triangular solves, for every problem whose factor holds (L[m, 0, 0] > 0).
    Written to compile (:func:`src.core.compiled.njit`)."""
    M, p = L.shape[0], L.shape[1]
    for m in range(M):
        if not L[m, 0, 0] > 0.0:
            continue
        for i in range(p):
            t = g[m, i]
            for k in range(i):
                t -= L[m, i, k] * out[m, k]
            out[m, i] = t / L[m, i, i]
        for i in range(p - 1, -1, -1):
            t = out[m, i]
            for k in range(i + 1, p):
                t -= L[m, k, i] * out[m, k]
            out[m, i] = t / L[m, i, i]


def _factors(H: np.ndarray) -> np.ndarray:
    """The Cholesky factors of H (M × p × p) by :func:`_factor`, compiled: only where numba is (:class:`_Newton`'s
    ``L`` is None without it)."""
    factor = compiled.njit(_factor)
    if factor is None:
        raise RuntimeError("the Cholesky factors are compiled by numba, which is not installed")
    L = np.zeros_like(H)
    factor(np.ascontiguousarray(H), L)
    return L


def _newton_steps(H: np.ndarray, L: np.ndarray | None, g: np.ndarray) -> np.ndarray:
    """H⁻¹g per problem (M × p): from the factors L (:func:`_factors`) where they hold, by LU otherwise (no numba,
    or an H not numerically positive definite)."""
    solve = compiled.njit(_solve)
    if L is None or solve is None:
        return np.linalg.solve(H, g[..., None])[..., 0]
    step = np.zeros_like(g)
    solve(L, np.ascontiguousarray(g), step)
    bad = np.flatnonzero(~(L[:, 0, 0] > 0.0))
    if len(bad):
        step[bad] = np.linalg.solve(H[bad], g[bad, :, None])[..., 0]
    return step


def fit_logit(
    Z: np.ndarray,
    W1: np.ndarray,
    W0: np.ndarray,
    C: float = 1.0,
    start: np.ndarray | None = None,
    max_iter: int = 100,
    tol: float = 1e-10,
    hessian: np.ndarray | None = None,
) -> np.ndarray:
    """M weighted L2 logistic regressions on shared rows; returns β (M × p), intercept first.

    ``Z`` (V × p) holds the distinct feature rows with the intercept's column of ones first; ``W1`` and ``W0``
    (M × V) each problem's weight of items with gold 1 and with gold 0 on each row (for unit items, their
    counts). Problem m minimises scikit-learn's ``LogisticRegression(C=C)`` objective on those items with
    ``sample_weight`` their weights: C·Σᵥ [(W1ₘᵥ + W0ₘᵥ)·log(1 + e^{zᵥβ}) − W1ₘᵥ·zᵥβ] + ½‖β₁:‖² (the
    intercept β₀ unpenalised), i.e. solves its gradient g(β) = Σᵥ (Wₘᵥ·σ(zᵥβ) − W1ₘᵥ)·zᵥ + β₁:/C = 0, all
    problems at once, from ``start`` (p, or M × p; default 0).

    The steps are Newton's, β ← β − H⁻¹g (a solve), with H = Σᵥ Wₘᵥ·σ(1 − σ)·zᵥzᵥᵀ + I/C from its upper triangle on
    the distinct rows that some problem weights; a problem whose last step shrank the one before by 50× or more (it
    is in Newton's quadratic range) keeps its H for the next step (a chord step: no Hessian product) and gets a new
    one as soon as a step shrinks less. A step that would enlarge ‖g‖ is halved (a Newton step) or retried with a
    new Hessian (a chord step). A problem stops when its coefficients are within ``tol`` of the answer: when a step
    moves none by ``tol``, or when the steps shrink by 50× or more and their rate (r = this step / the one before:
    the next is r² of this one after a Newton step, r after a chord step; four times that) says what is left is
    under ``tol``. With ``hessian`` (p × p, or M × p × p: e.g. :func:`start_hessian`, the Hessian of a fit near
    every problem's at the start) the first step is a chord step with it: no Hessian product for it. The objective
    is strictly convex, so the start (and the first step's Hessian) changes the number of steps, not the answer. A
    problem whose items hold one class only (or none) gets β₁: = 0 and β₀ = ±:data:`SINGLE_CLASS_LOGIT` (it predicts
    that class; scikit-learn refuses such a fit).
    """
    Z = np.asarray(Z, float)
    W1, W0 = np.atleast_2d(np.asarray(W1, float)), np.atleast_2d(np.asarray(W0, float))
    M, p = len(W1), Z.shape[1]
    pos, neg = W1.sum(axis=1), W0.sum(axis=1)
    single = (pos <= 0) | (neg <= 0)
    B = np.zeros((M, p)) if start is None else np.array(np.broadcast_to(start, (M, p)), dtype=float)
    B[single] = 0.0
    B[single, 0] = np.where(pos[single] > 0, SINGLE_CLASS_LOGIT, -SINGLE_CLASS_LOGIT)
    lam = _penalty(p, C)
    pairs = _row_pairs(Z)
    used = (W1 != 0).any(axis=0) | (W0 != 0).any(axis=0)  # a row no problem weights moves no fit
    if not used.all():
        Z, pairs, W1, W0 = Z[used], pairs[used], W1[:, used], W0[:, used]
    active = np.flatnonzero(~single)
    state = _Newton(Z, lam, W1[active], W1[active] + W0[active], B[active])
    if hessian is not None:
        state.H[:] = np.broadcast_to(hessian, (M, p, p))[active]
        if state.L is not None:  # factored once when every problem shares it
            state.L[:] = np.broadcast_to(_factors(np.asarray(hessian, float).reshape(-1, p, p)), (M, p, p))[active]
        state.fresh[:] = False
    for _ in range(max_iter):
        if not len(active):
            break
        left = state.step(pairs, tol)
        B[active] = state.b
        moving = left >= tol
        if not moving.all():
            active = active[moving]
            state.keep(moving)
    return B


class _Newton:
    """The state of :func:`fit_logit`'s unfinished problems: coefficients ``b``, σ(Zβ) ``s``, gradients ``g`` and their
    squared norms ``gn``, each problem's Hessian H and whether its next step needs a new one (``fresh``), and the size
    of its last step (``last``).

    While every problem's steps are larger than :data:`LOW` (``low``), σ and the gradients are computed in float32
    (a gradient's rounding, ~10⁻⁷ of its terms, moves such a step by far less than the step: the next steps mend
    it); from then on in doubles, the gradient at the current β computed again, and no problem stops before."""

    def __init__(self, Z: np.ndarray, lam: np.ndarray, w1: np.ndarray, w: np.ndarray, b: np.ndarray):
        self.Z, self.lam, self.w1, self.w, self.b = Z, lam, w1, w, b
        self.low = True
        self.Z32, self.w132, self.w32 = Z.astype(np.float32), w1.astype(np.float32), w.astype(np.float32)
        self.s, self.g, self.gn = self.gradient(self.w32, self.w132, b)
        self.H = np.empty((len(b), len(lam), len(lam)))
        # H's Cholesky factors (:func:`_factors`); None without numba (every step then solved by LU)
        self.L = None if compiled.njit(_factor) is None else np.zeros_like(self.H)
        self.fresh = np.ones(len(b), bool)
        self.last = np.full(len(b), np.inf)

    def gradient(self, w: np.ndarray, w1: np.ndarray, b: np.ndarray):
        """(σ(Zβ), g, ‖g‖²) of the problems with weights w (all items) and w1 (gold 1) at coefficients b, in w's
        precision (g and ‖g‖² in doubles)."""
        if w.dtype == np.float32:
            s = sigmoid(b.astype(np.float32) @ self.Z32.T)
            g = ((w * s - w1) @ self.Z32).astype(float) + b * self.lam
        else:
            s = sigmoid(b @ self.Z.T)
            g = (w * s - w1) @ self.Z + b * self.lam
        return s, g, np.einsum("mi,mi->m", g, g)

    def _weights(self) -> tuple[np.ndarray, np.ndarray]:
        """(w, w1) in the precision of the steps: float32 while ``low``."""
        return (self.w32, self.w132) if self.low else (self.w, self.w1)

    def _doubles(self) -> None:
        """Leave the float32 steps: σ, g and ‖g‖² at the current β computed again in doubles."""
        self.low = False
        del self.Z32, self.w32, self.w132
        self.s, self.g, self.gn = self.gradient(self.w, self.w1, self.b)

    def step(self, pairs: np.ndarray, tol: float) -> np.ndarray:
        """One step of every problem; returns a bound on how far each still is from its answer (its largest
        coefficient's): the step's size, or where the steps shrink by 50× or more, what their rate leaves."""
        if self.low and (self.last < LOW).any():
            self._doubles()
        w, w1 = self._weights()
        r = np.flatnonzero(self.fresh)
        if len(r):
            s = self.s[r]
            self.H[r] = H = _hessians(w[r] * s * (1 - s), pairs, self.lam)
            if self.L is not None:
                self.L[r] = _factors(H)
        step = _newton_steps(self.H, self.L, self.g)
        size = np.abs(step).max(axis=1)
        t = np.ones(len(step))
        b = self.b - step
        s, g, gn = self.gradient(w, w1, b)
        for _halving in range(60):
            bad = np.flatnonzero((gn > self.gn) & (t * size >= tol))
            if not len(bad):
                break
            t[bad] = np.where(self.fresh[bad], 0.5 * t[bad], 0.0)  # a chord step is retried with a new Hessian
            b[bad] = self.b[bad] - t[bad, None] * step[bad]
            s[bad], g[bad], gn[bad] = self.gradient(w[bad], w1[bad], b[bad])
        moved = t * size
        retry = t == 0
        # how much this step shrank the one before (1 after none, or after a float32 step of size 0: no rate yet)
        r = np.divide(moved, self.last, out=np.ones_like(moved), where=np.isfinite(self.last) & (self.last > 0))
        # what is left after this step, with a margin of 4: a Newton step's next is r² of it (quadratic; the float32
        # Hessian adds 10⁻⁴ of it at most), a chord step's r of it (linear)
        left = moved * np.where(self.fresh & (t == 1), 4 * r * r + 1e-4, 4 * r)
        self.fresh = retry | (r > CHORD)
        self.last = np.where(retry, self.last, moved)
        self.b, self.s, self.g, self.gn = b, s, g, gn
        out = np.where(retry, np.inf, np.where(r <= CHORD, np.minimum(left, moved), moved))
        return np.maximum(out, tol) if self.low else out  # a float32 step stops nothing

    def keep(self, which: np.ndarray) -> None:
        """Drop the problems not in ``which`` (a mask)."""
        names = ("w1", "w", "b", "s", "g", "gn", "H", "fresh", "last") + (("w132", "w32") if self.low else ())
        for name in names:
            setattr(self, name, getattr(self, name)[which])
        if self.L is not None:
            self.L = self.L[which]


def start_hessian(Z: np.ndarray, w1: np.ndarray, w0: np.ndarray, C: float, beta: np.ndarray) -> np.ndarray:
    """p × p (or M × p × p for M rows of weights and of β): :func:`fit_logit`'s Hessian at β of the problem weighted
    w1 / w0 (rows' weights of gold-1 / gold-0 items): for the mean fit (:func:`mean_fit`) a Hessian near every
    draw's, their common first step (``hessian`` of :func:`fit_logit`)."""
    w = np.atleast_2d(w1) + np.atleast_2d(w0)
    s = sigmoid(np.atleast_2d(beta) @ np.asarray(Z, float).T)
    H = _hessians(w * s * (1 - s), _row_pairs(Z), _penalty(Z.shape[1], C))
    return H if np.ndim(beta) > 1 else H[0]


def mean_fit(Z: np.ndarray, t1: np.ndarray, t0: np.ndarray, C: float) -> np.ndarray:
    """β (p) of the stacker fitted to the mean of the draws' weights t1 / t0 (draws × rows): near every draw's fit,
    a start for them (:class:`FoldFits`)."""
    return fit_logit(Z, t1.mean(axis=0), t0.mean(axis=0), C)[0]


class FoldFits:
    """The stacker on rows ``Z`` (intercept column first) refitted per draw and fold (:func:`fit_logit`), a chunk of
    draws in one batch (:mod:`src.core.refit`'s stacker, the cascade's). Each fold's fits start from the fit to its
    first chunk's mean weights (:func:`mean_fit`) and take their first step with that fit's Hessian
    (:func:`start_hessian`: a chord step, no Hessian product)."""

    def __init__(self, Z: np.ndarray, C: float):
        self.Z, self.C = Z, C
        self.starts: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # fold → (β, its Hessian)

    def proba(self, t1: np.ndarray, t0: np.ndarray, k: int) -> np.ndarray:
        """draws × rows: p(hallucinated) of fold k's fits weighted t1 / t0 (draws × rows: each row's weight of
        training items of gold 1 / gold 0)."""
        if k not in self.starts:
            b = mean_fit(self.Z, t1, t0, self.C)
            self.starts[k] = b, start_hessian(self.Z, t1.mean(axis=0), t0.mean(axis=0), self.C, b)
        b, H = self.starts[k]
        return sigmoid(fit_logit(self.Z, t1, t0, self.C, b, hessian=H) @ self.Z.T)


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
            out[b] = sigmoid(np.array(SINGLE_CLASS_LOGIT if len(y) and y[0] == 1 else -SINGLE_CLASS_LOGIT))
        else:
            out[b] = clone(stacker).fit(rows[rep // 2], y).predict_proba(rows)[:, 1]
    return out
