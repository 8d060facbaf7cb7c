"""Hallucination rates with valid intervals: a cheap panel's p on every item, gold labels on a few (beyond the paper).

The estimand is θ = P(hallucinated) of the traffic a pool of N scored items was drawn from; f(x) is any fixed
predictor of the label — in RAIM the stacked panel's p(hallucinated) (§2), cross-fitted or fitted on a separate
calibration set, never on the labels used here. Every estimator below is a mean of per-item terms, so one
variance rule serves them all: the CR0 cluster-robust sandwich Σ_c (Σ_{i∈c} ψ_i)² over each item's influence ψ_i
(Liang & Zeger 1986), which for one item per cluster is the plain variance of the papers below. Items that share
a cluster (a conversation, a document) are summed together, so the interval holds under within-cluster
dependence as long as clusters are independent.

* :func:`classical` — labels only: the labelled share with the Wilson score interval (Wilson 1927) at Kish's
  effective sample size n / deff (deff = the cluster-robust over the binomial variance), or the Wald interval
  (``interval="wald"``: ``ppi_py.classical_mean_ci``'s).
* :func:`naive` — the panel's flagged share (p ≥ threshold) over all N items, with the interval that treats the
  flags as labels. It estimates the panel's flag rate, not θ: biased by the panel's errors, never a valid
  interval for θ (``valid=False``); reported to show that.
* :func:`ppi` — PPI++ (Angelopoulos, Bates, Fannjiang, Jordan & Zrnic 2023, *Science* 382; Angelopoulos, Duchi &
  Zrnic 2023, arXiv 2311.01453): labelled items L (a uniform random sample) and the unlabelled U,
  θ̂_λ = λ·mean_U f + mean_L (Y − λ f), λ power-tuned as ``ppi_py.ppi_mean_ci`` tunes it (the plug-in
  Cov_L(Y, f) / ((1 + n/N_U)·Var_{L∪U}(f)), clipped to [0, 1]); variance λ²Var_U(f)/N_U + Var_L(Y − λf)/n. With
  one item per cluster the estimate and the Wald interval are ``ppi_py.ppi_mean_ci``'s to rounding.
* :func:`active` — active inference (Zrnic & Candès 2024, ICML, arXiv 2403.03208): every pool item i labelled
  independently with a known probability π_i (:func:`sampling_probabilities`), θ̂ = mean_i [λ f_i +
  (Y_i − λ f_i)·ξ_i/π_i] (ξ_i = 1 when labelled), unbiased for any λ and any π; λ tuned to the plug-in minimiser
  of its variance, E[Y f (1−π)/π] / E[f² (1−π)/π] (inverse-probability weighted over the labelled items), clipped
  to [0, 1]; the interval from the CLT on the N terms.

Intervals. The papers' intervals are normal (Wald): est ± z·se. At small labelled counts of a rare class they
undercover as the binomial Wald interval does (the study measures it), so RAIM's default for classical, PPI++ and
active is the Wilson score interval at the estimator's effective sample size, degrees-of-freedom adjusted where
the variance is estimated (survey practice for proportions, Korn & Graubard 1998); ``interval="wald"`` gives the
papers' interval (for PPI++ ``ppi_py``'s to rounding). The point estimate and the standard error are the same
either way.

Each result carries the **effective number of labels**: θ̂(1 − θ̂)/Var̂(θ̂), the number of independent plain
labels whose share would be as precise (n/deff for :func:`classical`); none for :func:`naive`, which has no valid
interval. :func:`plan` inverts the variances: the labels a target half-width needs on a given pool.

Everything is vectorised over rows (a study's replicates): arrays are rows × items, 1-D inputs are one row.
Intervals are intersected with [0, 1] (``lo``, ``hi``); ``estimate`` and ``se`` are the unclipped normal
quantities.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

from src.core.errors import RaimError
from src.core.verdicts import at_or_over

METHODS = ("classical", "naive", "ppi", "active")
INTERVALS = ("wilson", "wald")
_MAX_CAPPING_ROUNDS = 100  # water-filling rounds of the sampling design; each caps at least one more item


class RateError(RaimError, ValueError):
    """Inputs a rate estimate cannot be computed from (too few labels, a probability outside (0, 1], …)."""


@dataclass
class Rates:
    """One method's answer per row: point estimate, standard error, interval (∩ [0, 1]), labels used, effective
    labels (NaN where the method has no valid interval), the tuned λ (PPI++ / active) and the method's validity
    (``valid=False``: an interval for something other than θ)."""

    method: str
    estimate: np.ndarray
    se: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    labels: np.ndarray
    effective_labels: np.ndarray
    lam: np.ndarray | None = None
    valid: bool = True
    level: float = 0.95
    notes: list[str] = field(default_factory=list)

    @property
    def width(self) -> np.ndarray:
        return self.hi - self.lo

    def row(self, i: int = 0) -> dict:
        """Row ``i`` as plain numbers (JSON)."""

        def num(a):
            v = float(np.asarray(a)[i])
            return v if np.isfinite(v) else None

        out = {
            "method": self.method,
            "estimate": num(self.estimate),
            "se": num(self.se),
            "ci": [num(self.lo), num(self.hi)],
            "labels": int(np.asarray(self.labels)[i]),
            "effective_labels": num(self.effective_labels),
            "valid_interval": self.valid,
        }
        if self.lam is not None:
            out["lambda"] = num(self.lam)
        if self.notes:
            out["notes"] = list(self.notes)
        return out


# ---------------------------------------------------------------------------------------------- helpers


def z_value(level: float) -> float:
    """The two-sided normal quantile of a (``level``) interval."""
    if not 0.0 < float(level) < 1.0:
        raise RateError(f"level: {level!r} is not a confidence level in (0, 1)")
    return float(norm.ppf(0.5 + float(level) / 2))


def _rows(a, name: str) -> np.ndarray:
    arr = np.atleast_2d(np.asarray(a, dtype=float))
    if arr.ndim != 2:
        raise RateError(f"{name}: expected items or rows × items, got shape {np.shape(a)}")
    return arr


def _mask(labelled, shape: tuple[int, int]) -> np.ndarray:
    lab = np.atleast_2d(np.asarray(labelled, dtype=bool))
    if lab.shape != shape:
        lab = np.broadcast_to(lab, shape)
    return lab


def _labels(y: np.ndarray, lab: np.ndarray) -> np.ndarray:
    """The labelled items' 0/1 labels (unlabelled cells → 0); a labelled cell that is not 0 or 1 is an error."""
    bad = lab & ~((y == 0) | (y == 1))
    if bad.any():
        r, i = (int(v) for v in np.argwhere(bad)[0])
        raise RateError(f"gold of item {i} (row {r}): {y[r, i]!r} is not 0 or 1")
    return np.where(lab, y, 0.0)


def cluster_codes(ids) -> np.ndarray | None:
    """Integer codes 0..G−1 of cluster ids (one per item); None (each item its own cluster) for None."""
    if ids is None:
        return None
    return np.unique(np.asarray(ids), return_inverse=True)[1].reshape(np.shape(ids))


def cluster_variance(psi: np.ndarray, codes: np.ndarray | None) -> np.ndarray:
    """CR0 sandwich variance of a sum of per-item influences, per row: Σ_c (Σ_{i∈c} ψ_i)² (``codes``: cluster
    codes 0..G−1, shared by the rows or one row each; None: one item per cluster, Σ ψ_i²)."""
    psi = np.atleast_2d(psi)
    if codes is None:
        return np.einsum("ri,ri->r", psi, psi)
    codes = np.broadcast_to(np.asarray(codes, dtype=np.intp), psi.shape)
    g = int(codes.max()) + 1 if codes.size else 1
    idx = codes + g * np.arange(psi.shape[0])[:, None]
    sums = np.bincount(idx.ravel(), weights=psi.ravel(), minlength=g * psi.shape[0]).reshape(-1, g)
    return np.einsum("rg,rg->r", sums, sums)


def effective_labels(theta: np.ndarray, var: np.ndarray) -> np.ndarray:
    """θ(1 − θ)/Var: how many independent plain labels give a share this precise (NaN where Var is 0)."""
    t = np.clip(theta, 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(var > 0, t * (1 - t) / var, np.nan)


def wilson(p: np.ndarray, n_star: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray]:
    """The Wilson score interval of a share ``p`` at (effective) sample size ``n_star``."""
    p = np.clip(p, 0.0, 1.0)
    c = z * z / n_star
    centre = (p + c / 2) / (1 + c)
    half = z / (1 + c) * np.sqrt(p * (1 - p) / n_star + c / (4 * n_star))
    return np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)


def labelled_clusters(lab: np.ndarray, codes: np.ndarray | None) -> np.ndarray:
    """How many clusters hold a labelled item, per row (the labels themselves without clusters)."""
    if codes is None:
        return lab.sum(axis=1)
    codes = np.broadcast_to(np.asarray(codes, dtype=np.intp), lab.shape)
    g = int(codes.max()) + 1 if codes.size else 1
    idx = (codes + g * np.arange(lab.shape[0])[:, None])[lab]
    return (np.bincount(idx, minlength=g * lab.shape[0]).reshape(-1, g) > 0).sum(axis=1)


def _interval(
    method, est, var, z, labels, n_eff, level, lam=None, valid=True, notes=(), interval="wald", df=None
) -> Rates:
    """Normal (Wald) bounds est ± z·se, or (``interval="wilson"``) the Wilson score interval at the effective
    sample size θ̂(1 − θ̂)/Var̂ — the labels used where that is undefined (θ̂ at 0 or 1, Var̂ = 0) — scaled by
    (z / t_df)² when the variance is estimated with ``df`` degrees of freedom: the small-count interval of survey
    estimators of proportions (Korn & Graubard 1998, Survey Methodology 24:193–201: Kish's effective sample size,
    degrees-of-freedom adjusted), which keeps the Wald interval's centre and width at large counts and widens its
    upper side where the labelled hallucinations are few."""
    if interval not in INTERVALS:
        raise RateError(f"interval: {interval!r} is not one of {INTERVALS}")
    se = np.sqrt(np.maximum(var, 0.0))
    out = Rates(
        method,
        est,
        se,
        np.clip(est - z * se, 0.0, 1.0),
        np.clip(est + z * se, 0.0, 1.0),
        labels,
        n_eff,
        lam,
        valid,
        float(level),
        list(notes),
    )
    if interval == "wilson":
        t = np.clip(est, 0.0, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            n_star = np.where((var > 0) & (t > 0) & (t < 1), t * (1 - t) / var, np.maximum(labels, 1))
        if df is not None:
            n_star = n_star * (z / student_t.ppf(0.5 + level / 2, np.maximum(df, 1))) ** 2
        out.lo, out.hi = wilson(t, n_star, z)
    return out


def _need_labels(n: np.ndarray, least: int, what: str) -> None:
    if np.any(n < least):
        r = int(np.argmax(n < least))
        raise RateError(
            f"{what}: {int(n[r])} labelled item(s){f' in row {r}' if len(n) > 1 else ''}; an interval "
            f"needs at least {least}"
        )


# ---------------------------------------------------------------------------------------------- estimators


def classical(y, labelled, clusters=None, level: float = 0.95, interval: str = "wilson") -> Rates:
    """Labels only: the labelled share; Wilson score interval at n/deff (default) or Wald (module docstring)."""
    y = _rows(y, "y")
    lab = _mask(labelled, y.shape)
    y = _labels(y, lab)
    n = lab.sum(axis=1)
    _need_labels(n, 2, "classical")
    m = y.sum(axis=1) / n
    var = cluster_variance(np.where(lab, (y - m[:, None]) / n[:, None], 0.0), clusters)
    p = m * (1 - m)
    with np.errstate(divide="ignore", invalid="ignore"):
        deff = np.where((p > 0) & (var > 0), var * n / p, 1.0)
    df = None if clusters is None else labelled_clusters(lab, clusters) - 1  # binomial without clusters: no df
    return _interval("classical", m, var, z_value(level), n, n / deff, level, interval=interval, df=df)


def naive(f, threshold: float = 0.5, clusters=None, level: float = 0.95) -> Rates:
    """The panel's flagged share mean(f ≥ threshold) over every item, with the interval that treats the flags as
    labels: an interval for the panel's flag rate, not for θ (``valid=False``)."""
    f = _rows(f, "p")
    g = at_or_over(f, threshold).astype(float)
    N = g.shape[1]
    s = g.mean(axis=1)
    var = cluster_variance((g - s[:, None]) / N, clusters)
    return _interval(
        "naive",
        s,
        var,
        z_value(level),
        np.zeros(len(s), int),
        np.full(len(s), np.nan),
        level,
        valid=False,
        notes=["the panel's flag rate: biased by its errors, no valid interval for θ"],
    )


def ppi_lambda(y: np.ndarray, f: np.ndarray, lab: np.ndarray) -> np.ndarray:
    """PPI++'s power-tuned λ for a mean, as ``ppi_py`` computes it: Cov_L(Y, f) (1/n) over
    (1 + n/N_U)·Var_{L∪U}(f) (1/(N − 1)), clipped to [0, 1]; 0 where f is constant or nothing is unlabelled."""
    n, nu = lab.sum(axis=1), (~lab).sum(axis=1)
    yl = y.sum(axis=1) / n
    fl = np.where(lab, f, 0.0).sum(axis=1) / n
    cov = np.where(lab, (y - yl[:, None]) * (f - fl[:, None]), 0.0).sum(axis=1) / n
    varf = f.var(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        lam = np.where((varf > 0) & (nu > 0), cov / ((1 + n / np.maximum(nu, 1)) * varf), 0.0)
    return np.clip(lam, 0.0, 1.0)


def ppi(y, f, labelled, clusters=None, level: float = 0.95, lam=None, interval: str = "wilson") -> Rates:
    """PPI++ rate from a uniform random labelled sample (module docstring); ``lam`` None = power-tuned, 1 = PPI,
    0 = the labels only. ``interval="wald"``: the papers' normal interval (``ppi_py.ppi_mean_ci``'s);
    ``"wilson"``: Wilson at the effective sample size (:func:`_interval`), from the same estimate and s.e."""
    f = _rows(f, "p")
    y = _rows(np.broadcast_to(y, f.shape), "y")
    lab = _mask(labelled, f.shape)
    y = _labels(y, lab)
    n, nu = lab.sum(axis=1), (~lab).sum(axis=1)
    _need_labels(n, 2, "ppi")
    lam = ppi_lambda(y, f, lab) if lam is None else np.broadcast_to(np.asarray(lam, dtype=float), n.shape).copy()
    lam = np.where(nu > 0, lam, 0.0)
    fl = np.where(lab, f, 0.0).sum(axis=1) / n
    fu = np.where(~lab, f, 0.0).sum(axis=1) / np.maximum(nu, 1)
    yl = y.sum(axis=1) / n
    est = lam * fu + yl - lam * fl
    r, rbar = y - lam[:, None] * f, (yl - lam * fl)[:, None]
    psi = np.where(lab, (r - rbar) / n[:, None], lam[:, None] * (f - fu[:, None]) / np.maximum(nu, 1)[:, None])
    var = cluster_variance(psi, clusters)
    return _interval(
        "ppi",
        est,
        var,
        z_value(level),
        n,
        effective_labels(est, var),
        level,
        lam,
        interval=interval,
        df=labelled_clusters(lab, clusters) - 1,
    )


def active(y, f, labelled, pi, clusters=None, level: float = 0.95, lam=None, interval: str = "wilson") -> Rates:
    """Active-inference rate (Zrnic & Candès 2024; module docstring): item i was labelled with the known
    probability ``pi[i]`` (1 for an item labelled for certain), independently of the others. ``interval`` as
    :func:`ppi` (``"wald"``: the paper's)."""
    f = _rows(f, "p")
    y = _rows(np.broadcast_to(y, f.shape), "y")
    lab = _mask(labelled, f.shape)
    y = _labels(y, lab)
    pi = np.broadcast_to(np.asarray(pi, dtype=float), f.shape)
    bad = ~((pi > 0) & (pi <= 1))
    if bad.any():
        r, i = (int(v) for v in np.argwhere(bad)[0])
        raise RateError(f"sampling probability of item {i} (row {r}): {pi[r, i]!r} is not in (0, 1]")
    n = lab.sum(axis=1)
    _need_labels(n, 2, "active")
    N = f.shape[1]
    q = (1 - pi) / pi
    if lam is None:
        a = np.where(lab, y * f * q / pi, 0.0).sum(axis=1)
        b = (f * f * q).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            lam = np.clip(np.where(b > 0, a / b, 0.0), 0.0, 1.0)
    else:
        lam = np.broadcast_to(np.asarray(lam, dtype=float), n.shape).copy()
    lf = lam[:, None] * f
    z = lf + np.where(lab, (y - lf) / pi, 0.0)
    est = z.mean(axis=1)
    var = cluster_variance((z - est[:, None]) / N, clusters)
    return _interval(
        "active",
        est,
        var,
        z_value(level),
        n,
        effective_labels(est, var),
        level,
        lam,
        interval=interval,
        df=labelled_clusters(lab, clusters) - 1,
    )


# ---------------------------------------------------------------------------------------------- the design


def uncertainty(f) -> np.ndarray:
    """√(f(1 − f)): the conditional standard deviation of a 0/1 label under a calibrated p = f — the sampling
    weight that minimises the active estimator's variance (Zrnic & Candès 2024: π ∝ √E[(Y − f(X))² | X])."""
    f = np.clip(np.asarray(f, dtype=float), 0.0, 1.0)
    return np.sqrt(f * (1 - f))


def sampling_probabilities(f, budget, tau: float = 0.5, eligible=None) -> np.ndarray:
    """Each eligible item's probability of being labelled: ∝ (1 − τ)·u_i/ū + τ (u = :func:`uncertainty`, ū its
    mean over the eligible items: τ = 1 is uniform sampling, τ = 0 pure uncertainty sampling; the uniform share
    keeps every π_i ≥ τ·budget/N, bounding the inverse-probability weights), scaled so that the expected number
    labelled is ``budget``, capped at 1 with the excess spread over the uncapped items. Items not eligible (already
    labelled) get π = 1: they are in the sample for certain."""
    f = _rows(f, "p")
    elig = np.ones(f.shape, bool) if eligible is None else _mask(eligible, f.shape)
    if not 0.0 <= float(tau) <= 1.0:
        raise RateError(f"tau: {tau!r} is not a share in [0, 1]")
    k = np.broadcast_to(np.asarray(budget, dtype=float), (f.shape[0],))
    avail = elig.sum(axis=1)
    if np.any(k <= 0) or np.any(k > avail):
        r = int(np.argmax((k <= 0) | (k > avail)))
        raise RateError(
            f"budget: {k[r]:g} items to label, but the pool has {int(avail[r])} unlabelled item(s)"
            " (need 0 < budget ≤ that)"
        )
    u = np.where(elig, uncertainty(f), 0.0)
    ubar = u.sum(axis=1) / avail
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(ubar[:, None] > 0, u / ubar[:, None], 1.0)
    w = np.where(elig, (1 - tau) * rel + tau, 0.0)
    capped = np.zeros(f.shape, bool)
    for _ in range(_MAX_CAPPING_ROUNDS):
        free = elig & ~capped
        c = (k - capped.sum(axis=1)) / np.where(free, w, 0.0).sum(axis=1)
        pi = np.where(capped, 1.0, c[:, None] * w)
        now = elig & (pi >= 1.0)
        if (now == capped).all():
            break
        capped = now
    return np.where(elig, np.minimum(pi, 1.0), 1.0)


def draw(pi, rng: np.random.Generator, eligible=None) -> np.ndarray:
    """Poisson sampling: each eligible item labelled independently with its probability (a mask)."""
    pi = _rows(pi, "pi")
    elig = np.ones(pi.shape, bool) if eligible is None else _mask(eligible, pi.shape)
    return elig & (rng.random(pi.shape) < pi)


# ---------------------------------------------------------------------------------------------- the planner


@dataclass
class Plan:
    """Labels a target half-width needs per method (None: not reachable on this pool), and the half-width the
    planner expects at that count; where it is not reachable, the narrowest half-width this pool allows (every
    item labelled) and about how many items a pool of the same traffic would need to reach the target."""

    halfwidth: float
    level: float
    labels: dict[str, int | None]
    expected_halfwidth: dict[str, float | None]
    prevalence: float
    narrowest: dict[str, float | None] = field(default_factory=dict)
    pool_needed: dict[str, int | None] = field(default_factory=dict)


def _moments(f_rows: np.ndarray, m: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    w = w / w.sum()
    mu = float(w @ m)
    return mu, float(w @ (m * f_rows)) - mu * float(w @ f_rows), float(w @ f_rows)


def planned_variance(method: str, n: int, f, rows, m, weights=None, tau: float = 0.5) -> float:
    """Var(θ̂) expected with ``n`` labels on the pool ``f`` (N items) for ``method``, from the label model over
    reference rows: pool indices ``rows`` with E[Y | item] = ``m`` and weights (the traffic they stand for: 1 for
    a uniform labelled sample, 1/π for an active one, 1 for every pool item under a model of E[Y | p])."""
    f = np.asarray(f, dtype=float)
    rows = np.asarray(rows, dtype=np.intp)
    m = np.asarray(m, dtype=float)
    w = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype=float)
    N = len(f)
    fr = f[rows]
    mu, cov, _ = _moments(fr, m, w)
    var_y = mu * (1 - mu)
    if method == "classical":
        return var_y / n
    if method == "ppi":
        nu = N - n
        var_f = float(f.var())
        lam = 0.0 if var_f <= 0 or nu <= 0 else float(np.clip(cov / ((1 + n / nu) * var_f), 0.0, 1.0))
        return (var_y - 2 * lam * cov + lam * lam * var_f) / n + (lam * lam * var_f / nu if nu > 0 else 0.0)
    if method == "active":
        pi = sampling_probabilities(f, n, tau)[0]
        q = (1 - pi) / pi
        wn = w / w.sum()
        b = float(np.mean(f * f * q))
        lam = float(np.clip(wn @ (m * fr * q[rows]) / b, 0.0, 1.0)) if b > 0 else 0.0
        sq = m * (1 - 2 * lam * fr) + lam * lam * fr * fr  # E[(Y − λf)² | item]
        return (var_y + float(wn @ (sq * q[rows]))) / N
    raise RateError(f"method: {method!r} is not one of classical, ppi, active")


def plan(
    f,
    rows,
    m,
    halfwidth: float,
    level: float = 0.95,
    weights=None,
    tau: float = 0.5,
    methods=("classical", "ppi", "active"),
) -> Plan:
    """The fewest labels whose expected half-width z·√Var (:func:`planned_variance`) is at most ``halfwidth``, per
    method (bisection on the label count: the variances fall with it); None when even labelling all but one item
    would not reach it (the pool's own variation bounds PPI++ and active). Then ``narrowest`` is that floor and
    ``pool_needed`` the pool size of the same traffic whose floor is the target: every variance here falls as
    1/N once (nearly) every item is labelled, so N·(floor / target)², rounded up."""
    if not 0.0 < float(halfwidth) < 0.5:
        raise RateError(f"halfwidth: {halfwidth!r} is not a half-width in (0, 0.5)")
    z = z_value(level)
    N = len(np.asarray(f))
    if N < 3:
        raise RateError(f"pool: {N} item(s); planning needs at least 3")
    w = np.ones(len(np.asarray(rows))) if weights is None else np.asarray(weights, dtype=float)
    labels: dict[str, int | None] = {}
    expected: dict[str, float | None] = {}
    narrowest: dict[str, float | None] = {}
    needed: dict[str, int | None] = {}
    for method in methods:

        def hw(k: int, method: str = method) -> float:
            return z * float(np.sqrt(max(planned_variance(method, k, f, rows, m, w, tau), 0.0)))

        top = N if method == "classical" else N - 1
        floor = hw(top)
        narrowest[method], needed[method] = None, None
        if floor > halfwidth:
            labels[method], expected[method] = None, None
            narrowest[method], needed[method] = floor, int(np.ceil(N * (floor / halfwidth) ** 2))
            continue
        lo, hi = 2, top
        if hw(lo) <= halfwidth:
            hi = lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if hw(mid) <= halfwidth:
                hi = mid
            else:
                lo = mid
        labels[method], expected[method] = int(hi), hw(int(hi))
    mu = _moments(np.asarray(f, float)[np.asarray(rows, np.intp)], np.asarray(m, float), w)[0]
    return Plan(float(halfwidth), float(level), labels, expected, mu, narrowest, needed)
