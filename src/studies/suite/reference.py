"""Per-dataset reference quantities every analysis of the suite reads (computed once, engine functions only).

The reported stacker's out-of-fold predictions and the CV-best single judge come from
:func:`src.core.aggregate.crossfit` on :func:`src.core.aggregate.cluster_folds` with the ladder's settings (or the folds
the ladder already used, :func:`src.core.ladder.dataset_folds`), so they are the very predictions behind results.json
(Table 1); the admissibility coordinates come from :mod:`src.core.admissibility` (§3.3). Each dataset's paired cluster
bootstrap (§2) is drawn once per seed, at the most draws any analysis asks, and every analysis takes the first
draws it needs (:meth:`Reference.bootstrap`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
from sklearn.base import clone

from src.core import admissibility
from src.core.aggregate import BestSingle, MajorityVote, StackedLogit, crossfit
from src.core.evaluate import ClusterBootstrap
from src.core.ladderbase import LadderSettings, design_matrix
from src.core.verdicts import VerdictTable
from src.studies.suite import common


@dataclass
class Reference:
    """One dataset: its table, the stacker's design and folds, and the ladder's key predictions."""

    name: str
    table: VerdictTable
    design: common.Design
    stacked: np.ndarray  # out-of-fold stacked verdicts (0/1)
    best_cv: np.ndarray  # out-of-fold CV-best single verdicts (0/1/0.5)
    best_member: np.ndarray  # (n,) index of the member that is the CV-best single on each item's fold
    majority: np.ndarray  # label-free unweighted majority (0/1)
    member_kappa: np.ndarray  # (K,)
    phi: np.ndarray  # K × K pairwise error correlation
    admissibility: admissibility.Admissibility
    boots: dict[int, ClusterBootstrap] = field(default_factory=dict, repr=False)  # per seed, the longest drawn

    @property
    def gold(self) -> np.ndarray:
        return self.table.gold

    def bootstrap(self, n_boot: int, seed: int) -> ClusterBootstrap:
        """The dataset's ``n_boot``-draw paired cluster bootstrap: the first draws of the longest one drawn for
        ``seed`` (drawn here only when none is long enough)."""
        have = self.boots.get(seed)
        if have is None or have.n_boot < n_boot:
            have = self.boots[seed] = ClusterBootstrap(self.table.clusters, n_boot, seed)
        return have.head(n_boot)


def reference(
    name: str, table: VerdictTable, stacker: StackedLogit, s: LadderSettings, folds: list[tuple] | None = None
) -> Reference:
    """``folds``: the dataset's cluster folds when already computed (else :func:`src.core.aggregate.cluster_folds`)."""
    y, votes = table.gold, table.votes
    d = common.design(table, stacker, s.n_splits, s.seed, s.features, folds)
    X, _ = design_matrix(table, list(s.features))
    stk = crossfit(clone(stacker).set_params(n_votes=votes.shape[1]), X, y, d.folds)
    cv = crossfit(BestSingle(min_coverage=s.min_coverage), votes, y, d.folds)
    best_member = np.empty(len(y), int)
    for (_, te), est in zip(d.folds, cv.estimators):
        best_member[te] = est.best_
    return Reference(
        name=name,
        table=table,
        design=d,
        stacked=stk.pred,
        best_cv=cv.pred,
        best_member=best_member,
        majority=MajorityVote().fit(votes).predict(votes).astype(float),
        member_kappa=admissibility.member_kappas(y, votes),
        phi=admissibility.phi_matrix(y, votes),
        admissibility=admissibility.test(y, votes, s.kappa0, s.c, s.phi0),
    )


def references(
    table: VerdictTable, stacker: StackedLogit, s: LadderSettings, folds: dict[str, list[tuple]] | None = None
) -> dict[str, Reference]:
    return {
        name: reference(name, t, stacker, s, None if folds is None else folds[name])
        for name, t in table.by_dataset().items()
    }


def rng_for(seed: int, *keys: str | int) -> np.random.Generator:
    """A generator fixed by the suite seed and the analysis/dataset names (independent of run order)."""
    return np.random.default_rng([int(seed)] + [zlib.crc32(str(k).encode()) for k in keys])
