"""Benchmark: the whole ladder analysis on 8 datasets × 2000 items × 10 judges (simulated verdicts).

Prints the wall time of ``ladder.analyze`` (target < 60 s on two cores) and the speed-up of the vectorised
paired cluster bootstrap against a straightforward loop (resample item indices per draw, call scikit-learn
metrics per comparator), both measured in this run. The loop is timed on ``--loop-draws`` draws and scaled
linearly to B (its cost is linear in the draws); the vectorised side runs the full B.

    python bench/bench_engine.py [--datasets 8 --items 2000 --members 10 --boot 2000 --loop-draws 40]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.metrics import balanced_accuracy_score, cohen_kappa_score, f1_score

from src import ladder, simulate, verdicts
from src.aggregate import StackedLogit
from src.evaluate import ClusterBootstrap
from src.verdicts import ABSTAIN


def loop_bootstrap(gold: np.ndarray, clusters: np.ndarray, preds: np.ndarray, n_draws: int, seed: int = 0):
    """The obvious implementation: per draw, gather the items of the drawn clusters, score each comparator."""
    rng = np.random.default_rng(seed)
    ids = np.unique(clusters)
    members_of = {c: np.flatnonzero(clusters == c) for c in ids}
    out = np.empty((n_draws, preds.shape[1], 3))
    for b in range(n_draws):
        idx = np.concatenate([members_of[c] for c in rng.choice(ids, len(ids), replace=True)])
        g = gold[idx]
        for p in range(preds.shape[1]):
            v = preds[idx, p]
            voted = v != ABSTAIN
            out[b, p, 0] = cohen_kappa_score(g[voted], v[voted].astype(int)) if voted.any() else 0.0
            out[b, p, 1] = balanced_accuracy_score(g, np.where(voted, v, 1 - g).astype(int))
            out[b, p, 2] = f1_score(g, (v == 1).astype(int), zero_division=0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=8)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--boot", type=int, default=2000)
    ap.add_argument("--loop-draws", type=int, default=40)
    a = ap.parse_args()

    table = verdicts.validate(simulate.suite(a.datasets, a.items, a.members), frontier="frontier")
    settings = ladder.LadderSettings(n_boot=a.boot, core=[f"sim{i}" for i in range(4)])
    t0 = time.perf_counter()
    ladder.analyze(table, StackedLogit(), settings)
    full = time.perf_counter() - t0
    print(f"whole analysis: {a.datasets} datasets × {a.items} items × {a.members} judges, B={a.boot}: "
          f"{full:.1f} s (target < 60 s)")

    # Like for like: bootstrap every ladder prediction + every member (what the ladder scores) per dataset.
    vec = loop = 0.0
    for t in table.by_dataset().values():
        preds = np.column_stack([t.votes] + [t.votes.mean(1) >= 0.5] * 7 + [t.frontier]).astype(float)
        t0 = time.perf_counter()
        boot = ClusterBootstrap(t.clusters, a.boot, 0)
        boot.metrics(t.gold, preds)
        vec += time.perf_counter() - t0
        t0 = time.perf_counter()
        loop_bootstrap(t.gold, t.clusters, preds, a.loop_draws)
        loop += (time.perf_counter() - t0) * a.boot / a.loop_draws
    print(f"paired cluster bootstrap, {preds.shape[1]} prediction vectors per dataset, B={a.boot}:")
    print(f"  vectorised (index matrices over clusters): {vec:.2f} s")
    print(f"  straightforward loop (timed on {a.loop_draws} draws, scaled to B): {loop:.1f} s")
    print(f"  speed-up: {loop / vec:.0f}x (target >= 20x)")


if __name__ == "__main__":
    main()
