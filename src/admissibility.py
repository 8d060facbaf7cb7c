"""The admissibility test (§3.3, Appendix C): competence spread and error correlation, read off the members.

A task is admissible at (κ₀, c, φ₀) when at least a share ``c`` of the members reach Cohen's κ ≥ κ₀ and the
members' mean pairwise error correlation φ̄ ≤ φ₀. The operating point is (0.30, 1/2, 0.40).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import combinations

import numpy as np

from .evaluate import kappa
from .verdicts import ABSTAIN


def phi_matrix(gold: np.ndarray, votes: np.ndarray) -> np.ndarray:
    """Pairwise φ (Pearson correlation of the error indicators 1[vᵢ ≠ y]) on items where both members voted.

    Undefined pairs (no common item, or a constant error indicator) are NaN; the diagonal is 1.
    """
    gold = np.asarray(gold)
    K = votes.shape[1]
    err = (votes != gold[:, None]).astype(float)
    voted = votes != ABSTAIN
    out = np.eye(K)
    for i, j in combinations(range(K), 2):
        m = voted[:, i] & voted[:, j]
        out[i, j] = out[j, i] = _pearson(err[m, i], err[m, j])
    return out


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


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
    K = votes.shape[1]
    voted = votes != ABSTAIN
    out = np.eye(K)
    for i, j in combinations(range(K), 2):
        m = voted[:, i] & voted[:, j]
        out[i, j] = out[j, i] = float((votes[m, i] == votes[m, j]).mean()) if m.any() else np.nan
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


def decide(member_k: np.ndarray, phibar: float | None, kappa0: float, c: float, phi0: float) -> tuple[bool, str]:
    """The rule itself, on already-estimated coordinates."""
    n_ok, K = int(np.sum(member_k >= kappa0)), len(member_k)
    competent = n_ok >= c * K
    if phibar is None:
        return False, "φ̄ undefined (no member pair with a defined error correlation)"
    decorrelated = phibar <= phi0
    if competent and decorrelated:
        return True, f"{n_ok}/{K} members at κ≥{kappa0} (≥ {c:g} share) and φ̄={phibar:.3f} ≤ {phi0}"
    why = []
    if not competent:
        why.append(f"only {n_ok}/{K} members at κ≥{kappa0} (< {c:g} share)")
    if not decorrelated:
        why.append(f"φ̄={phibar:.3f} > {phi0}")
    return False, "; ".join(why)


def test(gold: np.ndarray, votes: np.ndarray, kappa0: float = 0.30, c: float = 0.5,
         phi0: float = 0.40) -> Admissibility:
    """Both coordinates from a labelled calibration set, and the call."""
    mk = member_kappas(gold, votes)
    pb = phi_bar(gold, votes)
    agree = _upper(agreement_matrix(votes))
    agree = agree[~np.isnan(agree)]
    ok, reason = decide(mk, pb, kappa0, c, phi0)
    return Admissibility(pb, float(agree.mean()) if len(agree) else None, int(np.sum(mk >= kappa0)),
                         len(mk), kappa0, c, phi0, ok, reason)
