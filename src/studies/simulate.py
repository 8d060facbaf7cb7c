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
    abstain_rate: float = 0.0,
    dataset: str = "sim",
    seed: int = 0,
    frontier_accuracy: float | None = None,
) -> pd.DataFrame:
    """A balanced verdict table in the on-disk contract (abstentions as empty cells, i.e. pandas NA)."""
    rng = np.random.default_rng(seed)
    acc = np.asarray(accuracies, dtype=float)
    n = n_clusters * per_cluster
    gold, votes = draw(rng, n_clusters, per_cluster, acc, rho, abstain_rate)
    votes[votes == ABSTAIN] = np.nan
    df = pd.DataFrame(
        {
            "item_id": [f"{dataset}-{i:06d}" for i in range(n)],
            "cluster_id": [f"{dataset}-c{i // per_cluster:05d}" for i in range(n)],
            "dataset": dataset,
            "gold": gold,
        }
    )
    for j in range(len(acc)):
        df[f"m{j:02d}"] = pd.array(votes[:, j], dtype="Float64").astype("Int64")
    if frontier_accuracy is not None:
        wrong = rng.random(n) > frontier_accuracy
        df["frontier"] = np.where(wrong, 1 - gold, gold)
    return df


def draw(
    rng: np.random.Generator,
    n_clusters: int,
    per_cluster: int,
    accuracies: np.ndarray,
    rho: float,
    abstain_rate: float = 0.0,
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
    votes[rng.random(votes.shape) < abstain_rate] = ABSTAIN
    return gold, votes


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
