"""Simulated verdict tables with known competence and error correlation (for tests and benchmarks).

A Gaussian-copula panel: on item i, member j errs when ρ·zᵢ + √(1−ρ²)·εᵢⱼ exceeds Φ⁻¹(1 − errⱼ), with zᵢ
a difficulty shared by every member; ρ sets the error correlation, errⱼ = 1 − accuracyⱼ the competence.
These are fake judges: they exercise the aggregation logic, never the LLM plumbing.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import norm

from src.core.verdicts import ABSTAIN, validate


def copula_errors(z: np.ndarray, eps: np.ndarray, accuracies, rho: float) -> np.ndarray:
    """Which votes are errors under the module's copula: ρ·z + √(1−ρ²)·ε > Φ⁻¹(accuracy), broadcasting the shared
    difficulty ``z`` against the members' own draws ``eps`` (last axis: the members)."""
    return rho * z + np.sqrt(1 - rho**2) * eps > norm.ppf(np.asarray(accuracies, dtype=float))


def panel(
    n_clusters: int = 500,
    per_cluster: int = 2,
    accuracies: list[float] | np.ndarray = (0.8,) * 10,
    rho: float = 0.3,
    abstain_rate: float | list[float] = 0.0,
    dataset: str = "sim",
    seed: int = 0,
    frontier_accuracy: float | None = None,
) -> pd.DataFrame:
    """A balanced verdict table in the on-disk contract (abstentions as empty cells, i.e. pandas NA)."""
    rng = np.random.default_rng(seed)
    acc = np.asarray(accuracies, dtype=float)
    n = n_clusters * per_cluster
    gold, votes = draw(rng, n_clusters, per_cluster, acc, rho, abstain_rate)
    df = frame(gold, votes, np.arange(n) // per_cluster, dataset)
    if frontier_accuracy is not None:
        wrong = rng.random(n) > frontier_accuracy
        df["frontier"] = np.where(wrong, 1 - gold, gold)
    return df


def frame(gold: np.ndarray, votes: np.ndarray, clusters: np.ndarray, dataset: str = "sim") -> pd.DataFrame:
    """Gold, votes (abstentions as :data:`src.core.verdicts.ABSTAIN`; members ``m00``, ``m01``, …) and cluster
    numbers as a verdict table in the on-disk contract (abstentions as empty cells, i.e. pandas NA)."""
    votes = np.where(votes == ABSTAIN, np.nan, votes)
    df = pd.DataFrame(
        {
            "item_id": [f"{dataset}-{i:06d}" for i in range(len(gold))],
            "cluster_id": [f"{dataset}-c{c:05d}" for c in clusters],
            "dataset": dataset,
            "gold": gold,
        }
    )
    for j in range(votes.shape[1]):
        df[f"m{j:02d}"] = pd.array(votes[:, j], dtype="Float64").astype("Int64")
    return df


def draw(
    rng: np.random.Generator,
    n_clusters: int,
    per_cluster: int,
    accuracies: np.ndarray,
    rho: float,
    abstain_rate: float | list[float] = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """The panel's gold (n,) and votes (n × K, abstentions as :data:`src.core.verdicts.ABSTAIN`) as arrays, drawn from
    ``rng`` in :func:`panel`'s order (its tables, without the item and cluster ids)."""
    acc = np.asarray(accuracies, dtype=float)
    n = n_clusters * per_cluster
    gold = np.tile(np.arange(per_cluster) % 2, n_clusters)
    z = rng.standard_normal(n)[:, None]
    eps = rng.standard_normal((n, len(acc)))
    err = copula_errors(z, eps, acc, rho)
    votes = np.where(err, 1 - gold[:, None], gold[:, None]).astype(float)
    votes[rng.random(votes.shape) < np.asarray(abstain_rate, float)] = ABSTAIN  # one rate, or one per member
    return gold, votes


def draw_clustered(
    rng: np.random.Generator,
    n_items: int,
    accuracies,
    rho: float,
    abstain_rate: float | list[float] = 0.0,
    sizes: tuple[int, int] = (2, 5),
    prevalence: float = 0.5,
    gold_icc: float = 0.0,
    difficulty_icc: float = 0.0,
    copies: list[float] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A panel of ``n_items`` in clusters of ``sizes`` items (uniform, the last one cut to fit), as (gold, votes,
    each item's cluster number). Gold is 1 where √g·u_c + √(1−g)·e_i > Φ⁻¹(1 − ``prevalence``), with u_c shared by
    the items of a cluster (g = ``gold_icc``: gold correlated within a cluster); the shared difficulty of
    :func:`copula_errors` is √d·w_c + √(1−d)·ζ_i (d = ``difficulty_icc``: errors concentrate on hard clusters).
    With ``copies`` (flip probabilities), member 0 alone follows the copula (``accuracies[0]``) and member j ≥ 1
    is its copy with each verdict flipped with probability ``copies[j − 1]``. Each member abstains at its own
    ``abstain_rate`` (one rate for all, or one per member)."""
    sizes_drawn = rng.integers(sizes[0], sizes[1] + 1, size=n_items)
    k = sizes_drawn[: int(np.searchsorted(np.cumsum(sizes_drawn), n_items)) + 1]
    k[-1] -= int(k.sum()) - n_items
    clusters = np.repeat(np.arange(len(k)), k)
    u, e = rng.standard_normal(len(k))[clusters], rng.standard_normal(n_items)
    gold = (np.sqrt(gold_icc) * u + np.sqrt(1 - gold_icc) * e > norm.ppf(1 - prevalence)).astype(int)
    w, zeta = rng.standard_normal(len(k))[clusters], rng.standard_normal(n_items)
    z = (np.sqrt(difficulty_icc) * w + np.sqrt(1 - difficulty_icc) * zeta)[:, None]
    acc = np.asarray(accuracies, dtype=float)
    if copies is None:
        err = copula_errors(z, rng.standard_normal((n_items, len(acc))), acc, rho)
    else:
        base = copula_errors(z, rng.standard_normal((n_items, 1)), acc[:1], rho)
        err = base ^ (rng.random((n_items, len(copies) + 1)) < np.r_[0.0, copies])
    votes = np.where(err, 1 - gold[:, None], gold[:, None]).astype(float)
    votes[rng.random(votes.shape) < np.broadcast_to(np.asarray(abstain_rate, float), votes.shape[1:])] = ABSTAIN
    return gold, votes, clusters


def table(source: str, **panel_args):
    """:func:`panel` validated as a verdict table named ``source``, its ``frontier`` column declared when the panel
    has one (``frontier_accuracy``)."""

    frontier = "frontier" if panel_args.get("frontier_accuracy") is not None else None
    return validate(panel(**panel_args), source=source, frontier=frontier)


def suite(n_datasets: int = 8, n_items: int = 2000, n_members: int = 10, seed: int = 0) -> pd.DataFrame:
    """Several simulated datasets of varied competence/correlation in one table (benchmarks)."""
    rng = np.random.default_rng(seed)
    parts = []
    for d in range(n_datasets):
        acc = rng.uniform(0.55, 0.9, n_members)
        parts.append(
            panel(
                n_items // 2,
                2,
                acc,
                rho=rng.uniform(0.1, 0.7),
                abstain_rate=0.02,
                dataset=f"sim{d}",
                seed=seed + d,
                frontier_accuracy=0.85,
            )
        )
    return pd.concat(parts, ignore_index=True)
