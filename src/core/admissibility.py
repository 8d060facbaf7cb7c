"""The admissibility test (§3.3, Appendix C): competence spread and error correlation, read off the members.

A task is admissible at (κ₀, c, φ₀) when at least a share ``c`` of the members reach Cohen's κ ≥ κ₀ and the
members' mean pairwise error correlation φ̄ ≤ φ₀. The operating point is (0.30, 1/2, 0.40).

Tiny panels. The share is read on the paper's ten members, where c = ½ asks for five competent judges. On a panel
of two it would ask for one: one good judge beside one that is not, the regime §3.3 calls "one dominates", where
the stacker at best recovers the leader and aggregation does not pay. A panel is therefore admissible only with at
least :data:`MIN_COMPETENT` members at κ₀ — the fewest whose errors can offset one another — besides the share
(the same rule wherever c·K ≥ 2: from four members at c = ½).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike

from src.core.evaluate import distinct_rows, kappa
from src.core.verdicts import ABSTAIN

# Thresholds are compared with this tolerance: a κ of exactly 0.30 computed as 0.2999999999999999 reaches κ₀.
TOL = 1e-9
# the fewest competent members an admissible panel holds, whatever its size (the module's "Tiny panels")
MIN_COMPETENT = 2


def reaches(member_k: np.ndarray, kappa0: float) -> np.ndarray:
    """Members whose κ reaches the competence threshold κ₀ (within :data:`TOL`; NaN never does)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(member_k, dtype=float) >= kappa0 - TOL


def needed(c: float, size: ArrayLike) -> np.ndarray:
    """How many members at κ₀ a panel of ``size`` needs: the share ``c`` of them, and at least
    :data:`MIN_COMPETENT`."""
    return np.maximum(c * np.asarray(size, dtype=float), MIN_COMPETENT)


def competent(n_ok: ArrayLike, c: float, size: ArrayLike) -> np.ndarray:
    """At least the share ``c`` of a panel of ``size`` members, and at least :data:`MIN_COMPETENT`, reach κ₀
    (within :data:`TOL`: c·K can land a hair above a whole number, e.g. 0.3 × 10)."""
    return np.asarray(n_ok) >= needed(c, size) - TOL


def within(phibar: ArrayLike, phi0: float) -> np.ndarray:
    """φ̄ at or under the correlation threshold φ₀ (within :data:`TOL`; NaN = undefined never is)."""
    phibar = np.asarray(phibar, dtype=float)
    with np.errstate(invalid="ignore"):
        return np.isfinite(phibar) & (phibar <= phi0 + TOL)


def pair_index(K: int) -> tuple[np.ndarray, np.ndarray]:
    """Member pairs (i < j), in the order every pair vector here uses."""
    return np.triu_indices(K, k=1)


def pair_stats(gold: np.ndarray, votes: np.ndarray) -> np.ndarray:
    """Per item and member pair (i < j): [both voted, eᵢ, eⱼ, eᵢeⱼ] on jointly voted items → n × P × 4,
    with eᵢ = 1[vᵢ ≠ y].  Summed over items (or any item weighting, e.g. a bootstrap or label-budget draw)
    they give φ through :func:`phi_from_stats`."""
    gold = np.asarray(gold)
    voted = (votes != ABSTAIN).astype(float)
    err = (votes != gold[:, None]).astype(float) * voted
    i, j = pair_index(votes.shape[1])
    both = voted[:, i] * voted[:, j]
    return np.stack([both, err[:, i] * voted[:, j], err[:, j] * voted[:, i], err[:, i] * err[:, j]], axis=-1)


def pair_sums(gold: np.ndarray, votes: np.ndarray) -> np.ndarray:
    """:func:`pair_stats` summed over the items (P × 4), from four K × K products of the voted and error
    indicators instead of the n × P × 4 array (sums of 0/1 terms: the same numbers in any order)."""
    gold = np.asarray(gold)
    voted = (votes != ABSTAIN).astype(float)
    err = (votes != gold[:, None]).astype(float) * voted
    i, j = pair_index(votes.shape[1])
    both, ev, ee = voted.T @ voted, err.T @ voted, err.T @ err
    return np.stack([both[i, j], ev[i, j], ev[j, i], ee[i, j]], axis=-1)


def phi_from_stats(s: np.ndarray) -> np.ndarray:
    """φ per pair (the Pearson correlation of the two error indicators) from summed :func:`pair_stats`
    (… × P × 4) → … × P; NaN where undefined: fewer than two common items, or a constant error indicator."""
    n, a, b, ab = np.moveaxis(s, -1, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ma, mb = a / n, b / n
        va, vb = ma - ma**2, mb - mb**2
        r = (ab / n - ma * mb) / np.sqrt(va * vb)
    ok = (n >= 2) & (va > 1e-12) & (vb > 1e-12)
    return np.where(ok, np.clip(r, -1.0, 1.0), np.nan)


def phi_bar_from(phi_pairs: np.ndarray) -> np.ndarray:
    """Mean φ over the defined pairs (last axis), NaN when none is."""
    ok = np.isfinite(phi_pairs)
    n = ok.sum(axis=-1)
    return np.where(n > 0, np.where(ok, phi_pairs, 0.0).sum(axis=-1) / np.maximum(n, 1), np.nan)


def as_matrix(phi_pairs: np.ndarray, K: int) -> np.ndarray:
    """Pair vector → symmetric K × K with unit diagonal."""
    out = np.eye(K)
    i, j = pair_index(K)
    out[i, j] = out[j, i] = phi_pairs
    return out


def phi_matrix(gold: np.ndarray, votes: np.ndarray) -> np.ndarray:
    """Pairwise φ (Pearson correlation of the error indicators 1[vᵢ ≠ y]) on items where both members voted.

    Undefined pairs (fewer than two common items, or a constant error indicator) are NaN; the diagonal is 1.
    """
    return as_matrix(phi_from_stats(pair_sums(gold, votes)), votes.shape[1])


def _upper(m: np.ndarray) -> np.ndarray:
    return m[np.triu_indices_from(m, k=1)]


def phi_bar(gold: np.ndarray, votes: np.ndarray) -> float | None:
    """Mean φ over the member pairs where it is defined (None when no pair is)."""
    vals = _upper(phi_matrix(gold, votes))
    vals = vals[~np.isnan(vals)]
    return float(vals.mean()) if len(vals) else None


def agreement_matrix(votes: np.ndarray) -> np.ndarray:
    """Pairwise agreement rate on items both members voted on: label-free, and equal to the agreement of the
    two error indicators, so it carries the correlation coordinate before normalisation (Appendix C)."""
    voted = votes != ABSTAIN
    v1, v0 = (voted & (votes == 1)).astype(float), (voted & (votes == 0)).astype(float)
    both = voted.astype(float).T @ voted.astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(both > 0, (v1.T @ v1 + v0.T @ v0) / both, np.nan)
    np.fill_diagonal(out, 1.0)
    return out


@dataclass
class Admissibility:
    phi_bar: float | None
    agreement_proxy: float | None
    members_at_kappa0: int
    n_members: int
    kappa0: float
    c: float
    phi0: float
    admissible: bool
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def member_kappas(gold: np.ndarray, votes: np.ndarray) -> np.ndarray:
    return np.array([kappa(gold, votes[:, j]) for j in range(votes.shape[1])])


def admits(
    member_k: np.ndarray, phibar: ArrayLike, kappa0: float, c: float, phi0: float, size: ArrayLike | None = None
) -> np.ndarray:
    """The rule, vectorised over panels: ``member_k`` is … × K (NaN = not in the panel), ``phibar`` … (NaN =
    undefined, never admissible), ``size`` the panel sizes (default: the non-NaN members)."""
    member_k = np.asarray(member_k, dtype=float)
    phibar = np.asarray(phibar, dtype=float)
    n_ok = np.sum(reaches(member_k, kappa0), axis=-1)
    size = np.sum(~np.isnan(member_k), axis=-1) if size is None else np.asarray(size)
    return competent(n_ok, c, size) & within(phibar, phi0)


def decide(member_k: np.ndarray, phibar: float | None, kappa0: float, c: float, phi0: float) -> tuple[bool, str]:
    """The rule on already-estimated coordinates (one panel), and why."""
    n_ok, K = int(np.sum(reaches(member_k, kappa0))), len(member_k)
    has_share = bool(competent(n_ok, c, K))
    if phibar is None:
        return False, "φ̄ undefined (no member pair with a defined error correlation)"
    decorrelated = bool(within(phibar, phi0))
    if bool(admits(member_k, phibar, kappa0, c, phi0, K)):
        return True, f"{n_ok}/{K} members at κ≥{kappa0} (≥ {c:g} share) and φ̄={phibar:.3f} ≤ {phi0}"
    why = []
    if not has_share and n_ok >= c * K - TOL:
        why.append(f"only {n_ok}/{K} members at κ≥{kappa0} (a {c:g} share, but fewer than {MIN_COMPETENT})")
    elif not has_share:
        why.append(f"only {n_ok}/{K} members at κ≥{kappa0} (< {c:g} share)")
    if not decorrelated:
        why.append(f"φ̄={phibar:.3f} > {phi0}")
    return False, "; ".join(why)


def admitted_share(
    boot, gold: np.ndarray, votes: np.ndarray, member_kappa_draws: np.ndarray, kappa0: float, c: float, phi0: float
) -> float:
    """How often the rule admits the panel when both coordinates are estimated again on each draw of §2's cluster
    bootstrap (``boot``, a :class:`src.core.evaluate.ClusterBootstrap`; ``member_kappa_draws`` its B × K member κ):
    the verdict's own uncertainty, near 0 or 1 when it is firm, near ½ when a member's κ or φ̄ sits at its
    threshold."""
    stats = boot.sweep([cluster_pair_stats(boot, gold, votes)])[0]
    return share_admitted(stats, member_kappa_draws, kappa0, c, phi0)


def cluster_pair_stats(boot, gold: np.ndarray, votes: np.ndarray):
    """The sums of :func:`pair_stats` (4P per item) as :meth:`ClusterBootstrap.sweep` reads them, from the stats of
    the distinct (votes, gold) rows (:meth:`ClusterBootstrap.row_table`: through the rows where that is cheaper, else
    each cluster's sums, n_clusters × 4P)."""
    rows, inv = distinct_rows(np.column_stack([votes, gold]))
    stats = pair_stats(rows[:, -1], rows[:, :-1])
    return boot.row_table(stats.reshape(len(rows), -1), inv)


def share_admitted(stats: np.ndarray, member_kappa_draws: np.ndarray, kappa0: float, c: float, phi0: float) -> float:
    """:func:`admitted_share` from the draws' sums of :func:`cluster_pair_stats` (B × 4P)."""
    K = member_kappa_draws.shape[1]
    phibar = phi_bar_from(phi_from_stats(stats.reshape(len(stats), -1, 4)))
    return float(np.mean(admits(member_kappa_draws, phibar, kappa0, c, phi0, np.full(len(phibar), K))))


def agreement_proxy(votes: np.ndarray) -> float | None:
    """The label-free agreement proxy (§3.3): the members' mean pairwise agreement on jointly voted items; None
    when no pair of members voted on a common item."""
    agree = _upper(agreement_matrix(votes))
    agree = agree[~np.isnan(agree)]
    return float(agree.mean()) if len(agree) else None


def test(
    gold: np.ndarray, votes: np.ndarray, kappa0: float = 0.30, c: float = 0.5, phi0: float = 0.40
) -> Admissibility:
    """Both coordinates from a labelled calibration set, and the call."""
    mk = member_kappas(gold, votes)
    pb = phi_bar(gold, votes)
    ok, reason = decide(mk, pb, kappa0, c, phi0)
    return Admissibility(
        pb, agreement_proxy(votes), int(np.sum(reaches(mk, kappa0))), len(mk), kappa0, c, phi0, ok, reason
    )
