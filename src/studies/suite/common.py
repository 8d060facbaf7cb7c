"""Vectorised building blocks of the analysis suite (:mod:`src.studies.suite`): the §2 stacker and the §3.3 coordinates,
fitted and scored for many weightings and panels at once.

* :func:`fit_logit_many` fits many L2-penalised logistic regressions at once (the stacker of §2, P(y=1|v) =
  σ(β₀ + Σ βᵢ vᵢ), penalty 1/(2C)·‖β‖², intercept unpenalised: scikit-learn's objective) by a batched damped
  Newton method. Each problem has its own item weights (a label-budget draw, a fold's training part) and its
  own feature mask (a sub-panel, a left-out member). Rows are first collapsed to the distinct (features, gold)
  patterns (:class:`Patterns`, once per design), so the work scales with the patterns, not the items; a masked
  problem's patterns that differ only in switched-off features are one; identical problems are fitted once.
* :func:`oof_many` cross-fits such problems on the reported stacker's folds and pools the out-of-fold
  predictions (Table 7, Fig. 5, Fig. 6, Appendix C sub-panels).
* the members' pairwise error correlation φ (§3.3) for many weightings of the items at once (Table 6 draws)
  comes from :func:`src.core.admissibility.pair_stats` / :func:`src.core.admissibility.phi_from_stats`.
* :func:`member_counts` / :func:`kappas` give each member's confusion counts and Cohen's κ through
  :func:`src.core.evaluate.from_counts`, for many weightings at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse
from sklearn.base import clone

from src.core.aggregate import StackedLogit, cluster_folds
from src.core.evaluate import from_counts, indicators
from src.core.ladderbase import design_matrix
from src.core.logitfit import sigmoid, softplus_sigmoid
from src.core.verdicts import ABSTAIN, VerdictTable

# --------------------------------------------------------------------------------------------- the stacker


@dataclass
class Design:
    """The stacker's feature map on one dataset: F (n × d), the member behind each column, the folds."""

    F: np.ndarray
    col_member: np.ndarray  # (d,) index into table.members
    y: np.ndarray
    clusters: np.ndarray
    folds: list
    C: float
    threshold: float
    _patterns: Patterns | None = None

    @property
    def patterns(self) -> Patterns:
        """The design's distinct (features, gold) rows, found once."""
        if self._patterns is None:
            self._patterns = Patterns.of(self.F, self.y)
        return self._patterns


def design(
    table: VerdictTable,
    stacker: StackedLogit,
    n_splits: int,
    seed: int,
    features: list[str] = (),
    folds: list[tuple] | None = None,
) -> Design:
    """The reported stacker's features (votes, abstention encoding, extras) and its cluster folds (§2; ``folds``
    when already computed)."""

    X, extra_names = design_matrix(table, list(features))
    K = len(table.members)
    st = clone(stacker).set_params(n_votes=K)
    F = st.features(X)
    names = st.feature_names(table.members, extra_names)
    col_member = np.array([_member_of(n, table.members) for n in names])
    folds = cluster_folds(table.gold, table.clusters, n_splits, seed) if folds is None else folds
    return Design(F, col_member, table.gold, table.clusters, folds, float(stacker.C), float(stacker.threshold))


def _member_of(name: str, members: list[str]) -> int:
    for suffix in ("=1", "=abstain"):
        if name.endswith(suffix) and name[: -len(suffix)] in members:
            return members.index(name[: -len(suffix)])
    base = name.split("@", 1)[0]
    return members.index(base if base in members else name)


def member_masks(d: Design, subsets: np.ndarray) -> np.ndarray:
    """Feature masks (M × d) from member masks (M × K): a column is on when its member is."""
    return np.asarray(subsets, bool)[:, d.col_member]


NEAR_THRESHOLD = 1e-9  # oof_many refits a fold unmerged when a probability lies this close to the threshold


@dataclass
class Patterns:
    """A design's distinct (features, gold) rows: Z (U × (1+d), intercept first), their gold, and the item →
    pattern map S (n × U, sparse). Problems are fitted on patterns, so the work scales with them, not the items."""

    Z: np.ndarray
    y: np.ndarray
    S: sparse.csr_matrix

    @classmethod
    def of(cls, F: np.ndarray, y: np.ndarray) -> Patterns:
        pat, inv = np.unique(np.column_stack([F, y]), axis=0, return_inverse=True)
        n = len(y)
        S = sparse.csr_matrix((np.ones(n), (np.arange(n), inv.ravel())), shape=(n, len(pat)))
        return cls(np.column_stack([np.ones(len(pat)), pat[:, :-1]]), pat[:, -1], S)


def fit_logit_many(
    F: np.ndarray,
    y: np.ndarray,
    W: np.ndarray,
    mask: np.ndarray | None = None,
    C: float = 1.0,
    max_iter: int = 100,
    tol: float = 1e-9,
    merge: bool = True,
    patterns: Patterns | None = None,
) -> np.ndarray:
    """M weighted L2 logistic regressions on one design; returns B (M × (1+d)), intercept first.

    ``W`` (M × n) weights the items of each problem (0 = left out); ``mask`` (M × d) switches features on.
    The objective is scikit-learn's ``LogisticRegression(C)``: C·Σ wᵢ·logloss + ½‖β‖², intercept free.
    A problem whose weighted items hold one class only gets β = 0 and an intercept of ±30 (it predicts that
    class; scikit-learn would refuse to fit it). Masked coefficients are exactly 0. Identical problems (same
    weights and mask, e.g. every draw of a budget that takes all training clusters) are fitted once. With
    ``merge``, a masked problem's patterns that differ only in switched-off features are one pattern (the same
    optimum, summed in another order: coefficients equal to rounding, see :func:`oof_many`). ``patterns``: those
    of (F, y) when the caller has them.
    """
    F = np.asarray(F, float)
    W = np.atleast_2d(np.asarray(W, float))
    M, d = len(W), F.shape[1]
    mask = np.ones((M, d), bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), (M, d))
    first, back = unique_rows(W, mask)
    if len(first) < M:
        return fit_logit_many(F, y, W[first], mask[first], C, max_iter, tol, merge, patterns)[back]
    pt = Patterns.of(F, np.asarray(y, float)) if patterns is None else patterns
    Z, yu = pt.Z, pt.y
    Wu = np.asarray((pt.S.T @ W.T).T)  # M × U
    on = np.column_stack([np.ones(M, bool), mask])  # M × (1+d)
    pos, tot = Wu @ yu, Wu.sum(axis=1)
    single = (pos <= 0) | (pos >= tot)
    B = np.zeros((M, d + 1))
    B[single, 0] = np.where(pos[single] > 0, 30.0, -30.0)
    live = np.flatnonzero(~single)
    if len(live):
        Wl = Wu[live]
        r, c = np.nonzero(Wl)
        w = Wl[r, c]
        r, c, w = _merge_masked(Z, yu, r, c, w, on[live]) if merge else (r, c, w)
        B[live] = _newton(Z, yu, r, c, w, on[live], 1.0 / C, max_iter, tol)
    return B


def _merge_masked(Z, y, r, c, w, on):
    """The (problem r, pattern c, weight w) entries with, within each problem that switches features off, the
    patterns that agree on its features that are on (and on gold) merged into one entry: the first of them, with
    the weights summed (its switched-off features meet zero coefficients). Problems with every feature on keep
    their entries as they are."""
    sel = ~on.all(axis=1)[r]
    if not sel.any():
        return r, c, w
    codes = np.column_stack(
        [np.unique(Z[:, j], return_inverse=True)[1].ravel() for j in range(Z.shape[1])] + [(y > 0.5).astype(int)]
    )
    radix = codes.max(axis=0) + 1
    if np.sum(np.log2(radix)) > 60:  # keys would not fit in int64: no merging
        return r, c, w
    scale = np.cumprod(np.r_[1, radix[:-1]])
    keys = codes @ (np.column_stack([on, np.ones(len(on), bool)]) * scale).T  # U × problems: the on-part
    key = keys[c[sel], r[sel]]
    if np.log2(len(on)) + np.log2(key.max() + 1) > 62:
        key = np.unique(key, return_inverse=True)[1].ravel()
    groups, rep, gid = np.unique(r[sel] * (int(key.max()) + 1) + key, return_index=True, return_inverse=True)
    rr, cc = np.r_[r[~sel], r[sel][rep]], np.r_[c[~sel], c[sel][rep]]
    ww = np.r_[w[~sel], np.bincount(gid.ravel(), weights=w[sel], minlength=len(groups))]
    order = np.argsort(rr, kind="stable")  # each problem's entries together
    return rr[order], cc[order], ww[order]


def unique_rows(*arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows that are identical across ``arrays`` (each M × …): (index of one row of each distinct kind, for
    every row the position of its kind in that list). Rows are told apart by a random projection (each row
    summed on its own, so equal rows project alike) and rows sharing one are compared in full (where two
    different rows share one, every row is compared in full)."""
    flat = [np.ascontiguousarray(a, dtype=float).reshape(len(a), -1) for a in arrays]
    rng = np.random.default_rng(0)
    fp = sum((a * rng.random(a.shape[1])).sum(axis=1) for a in flat)
    _, first, back = np.unique(fp, return_index=True, return_inverse=True)
    back = back.ravel()
    shared = np.flatnonzero(np.bincount(back)[back] > 1)
    if all(np.array_equal(a[shared], a[first[back[shared]]]) for a in flat):
        return first, back
    seen: dict[bytes, int] = {}
    back = np.array([seen.setdefault(b"".join(a[i].tobytes() for a in flat), len(seen)) for i in range(len(fp))])
    return np.unique(back, return_index=True)[1], back


def _newton(Z, y, r, c, w, on, lam, max_iter, tol):
    """Batched damped Newton on Σ w·logloss + λ/2‖β₁:‖² (λ = 1/C), over the nonzero (problem r, pattern c)
    weights w only (sorted by problem), so a small label budget costs in proportion to its records."""
    M, p = on.shape
    U = len(Z)
    yy, Zc = y[c], Z[c]
    indptr = np.searchsorted(r, np.arange(M + 1))
    iu = np.triu_indices(p)  # H is symmetric: its upper triangle is summed, then mirrored
    outer = np.ascontiguousarray(Z[:, iu[0]] * Z[:, iu[1]])  # C order: the sparse products read it as is

    A = sparse.csr_matrix((w, c, indptr), shape=(M, U))  # built once; each sum swaps in its values

    def by_problem(vals: np.ndarray, dense: np.ndarray) -> np.ndarray:
        """Σ over each problem's (pattern) entries of vals · dense[pattern] → M × dense.shape[1]."""
        A.data = vals
        return A @ dense

    ones = np.ones((U, 1))
    pen = np.full(p, lam)
    pen[0] = 0.0
    onf = on.astype(float)
    pair_on = onf[:, :, None] * onf[:, None, :]
    fix = np.eye(p)[None] * (1.0 - onf)[:, None, :] + np.diag(pen)[None]
    B = np.zeros((M, p))
    eta = np.zeros(len(r))
    sp, sg = softplus_sigmoid(eta)
    f = by_problem(w * (sp - yy * eta), ones)[:, 0]
    for _ in range(max_iter):
        g = (by_problem(w * (sg - yy), Z) + B * pen) * onf
        H = np.empty((M, p, p))
        H[:, iu[0], iu[1]] = H[:, iu[1], iu[0]] = by_problem(w * sg * (1 - sg), outer)
        H = H * pair_on + fix
        step = np.linalg.solve(H, g[..., None])[..., 0]
        d_eta = np.einsum("ij,ij->i", Zc, step[r])
        t = np.ones(M)
        for trial in range(30):  # halve the step where the objective went up
            eta_c = eta - (t[r] * d_eta if trial else d_eta)  # a full step first (t = 1: the same numbers)
            sp, sg = softplus_sigmoid(eta_c)
            Bc = B - (t[:, None] * step if trial else step)
            fc = by_problem(w * (sp - yy * eta_c), ones)[:, 0] + 0.5 * (Bc**2 * pen).sum(1)
            bad = fc > f + 1e-12 * np.abs(f)
            if not bad.any():
                break
            t[bad] *= 0.5
        B, eta, f = Bc, eta_c, fc
        if np.abs(t[:, None] * step).max() < tol:
            break
    return B


def predict_proba(B: np.ndarray, F: np.ndarray) -> np.ndarray:
    """P(hallucinated) of each fitted problem (rows of B) on items F → M × n."""
    return sigmoid(B[:, :1] + B[:, 1:] @ np.asarray(F, float).T)


def oof_many(
    d: Design, W: np.ndarray | None = None, mask: np.ndarray | None = None, draws: list[np.ndarray] | None = None
) -> np.ndarray:
    """Out-of-fold stacked predictions (M × n, values 0/1) of M problems, pooled over the design's folds.

    Per fold the problems are fitted on its training clusters, weighted by ``W`` (M × n, default 1), or by
    ``draws[f]`` (M × n) when each fold has its own weights (a budget drawn within that fold's training
    clusters); features are switched by ``mask`` (M × d). Prediction: hallucinated iff p ≥ threshold.

    Masked problems are fitted with merged patterns (:func:`fit_logit_many`): their coefficients differ from an
    unmerged fit by rounding only (~1e-15), which moves no prediction unless a probability lies that close to the
    threshold; a fold where any lies within :data:`NEAR_THRESHOLD` of it is fitted again unmerged, so the
    predictions are those of the unmerged fit.
    """
    n = len(d.y)
    M = (
        len(draws[0])
        if draws is not None
        else (1 if W is None and mask is None else len(W) if W is not None else len(mask))
    )
    pred = np.empty((M, n))
    for f, (tr, te) in enumerate(d.folds):
        train = np.zeros(n, bool)
        train[tr] = True
        weights = draws[f] if draws is not None else (1.0 if W is None else W)
        w = np.broadcast_to(np.where(train, weights, 0.0), (M, n))
        p = predict_proba(fit_logit_many(d.F, d.y, w, mask, d.C, patterns=d.patterns), d.F[te])
        if mask is not None and (np.abs(p - d.threshold) < NEAR_THRESHOLD).any():
            p = predict_proba(fit_logit_many(d.F, d.y, w, mask, d.C, merge=False, patterns=d.patterns), d.F[te])
        pred[:, te] = p >= d.threshold
    return pred


# ----------------------------------------------------------------------------------------------- metrics


def counts(gold: np.ndarray, preds: np.ndarray) -> np.ndarray:
    """Confusion counts (the six cells of :func:`src.core.evaluate.indicators`) of P prediction vectors → P × 6.

    ``preds`` is P × n; values 0, 1 or ABSTAIN.
    """
    P = np.atleast_2d(np.asarray(preds, float))
    g1 = (np.asarray(gold) == 1).astype(float)
    g0 = 1.0 - g1
    ab = P == ABSTAIN
    p1 = ((P == 1) & ~ab).astype(float)
    p0 = ((P == 0) & ~ab).astype(float)
    ab = ab.astype(float)
    return np.stack([p1 @ g1, p0 @ g1, ab @ g1, p1 @ g0, p0 @ g0, ab @ g0], axis=-1)


def kappas(gold: np.ndarray, preds: np.ndarray) -> np.ndarray:
    """Cohen's κ (abstentions excluded, §2) of each row of ``preds`` (P × n) → (P,)."""
    return from_counts(counts(gold, preds))["kappa"]


def member_counts(gold: np.ndarray, votes: np.ndarray) -> np.ndarray:
    """Per-item confusion indicators of every member: n × K × 6."""
    return indicators(gold, votes)


def cluster_sums(clusters: np.ndarray, per_item: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum per-item arrays (n × …) within clusters → (cluster ids, nc × …)."""
    ids, inv = np.unique(np.asarray(clusters), return_inverse=True)
    out = np.zeros((len(ids),) + per_item.shape[1:])
    np.add.at(out, inv.ravel(), per_item)
    return ids, out


# --------------------------------------------------------------------------------------------------- φ


# ------------------------------------------------------------------------------------------------- draws


def draw_clusters(
    n_clusters: int, size: int, n_draws: int, rng: np.random.Generator, pool: np.ndarray | None = None
) -> np.ndarray:
    """0/1 selection matrix (n_draws × n_clusters): ``size`` whole clusters without replacement per draw,
    from ``pool`` (cluster indices; default all)."""
    pool = np.arange(n_clusters) if pool is None else np.asarray(pool)
    pick = smallest(rng.random((n_draws, len(pool))), size)
    sel = np.zeros((n_draws, n_clusters))
    np.put_along_axis(sel, pool[pick], 1.0, axis=1)
    return sel


def smallest(r: np.ndarray, size: int) -> np.ndarray:
    """Per row, the columns of the ``size`` smallest values of ``r``: the set ``np.argsort(r, axis=1)[:, :size]``
    picks, in any order (a partition; argsort itself when some row ties across the boundary)."""
    if 0 < size < r.shape[1]:
        part = np.argpartition(r, size, axis=1)
        inside = np.take_along_axis(r, part[:, :size], axis=1).max(axis=1)
        if not (inside == np.take_along_axis(r, part[:, size : size + 1], axis=1)[:, 0]).any():
            return part[:, :size]
    return np.argsort(r, axis=1)[:, :size]


def cluster_index(clusters: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cluster ids, item → cluster index)."""
    ids, inv = np.unique(np.asarray(clusters), return_inverse=True)
    return ids, inv.ravel()
