"""Per-dataset reference quantities every analysis of the suite reads (computed once, engine functions only).

The reported stacker's out-of-fold predictions and the CV-best single judge come from
:func:`src.aggregate.crossfit` on :func:`src.aggregate.cluster_folds` with the ladder's settings, so they are
the very predictions behind results.json (Table 1); the admissibility coordinates come from
:mod:`src.admissibility` (§3.3).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
from sklearn.base import clone

from .. import admissibility
from ..aggregate import BestSingle, MajorityVote, StackedLogit, crossfit
from ..ladder import LadderSettings, design_matrix
from ..verdicts import VerdictTable
from . import common


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

    @property
    def gold(self) -> np.ndarray:
        return self.table.gold


def reference(name: str, table: VerdictTable, stacker: StackedLogit, s: LadderSettings) -> Reference:
    y, votes = table.gold, table.votes
    d = common.design(table, stacker, s.n_splits, s.seed, s.features)
    X, _ = design_matrix(table, list(s.features))
    stk = crossfit(clone(stacker).set_params(n_votes=votes.shape[1]), X, y, d.folds)
    cv = crossfit(BestSingle(min_coverage=s.min_coverage), votes, y, d.folds)
    best_member = np.empty(len(y), int)
    for (_, te), est in zip(d.folds, cv.estimators):
        best_member[te] = est.best_
    return Reference(
        name=name, table=table, design=d, stacked=stk.pred, best_cv=cv.pred, best_member=best_member,
        majority=MajorityVote().fit(votes).predict(votes).astype(float),
        member_kappa=admissibility.member_kappas(y, votes),
        phi=admissibility.phi_matrix(y, votes),
        admissibility=admissibility.test(y, votes, s.kappa0, s.c, s.phi0),
    )


def references(table: VerdictTable, stacker: StackedLogit, s: LadderSettings) -> dict[str, Reference]:
    return {name: reference(name, t, stacker, s) for name, t in table.by_dataset().items()}


def rng_for(seed: int, *keys: str | int) -> np.random.Generator:
    """A generator fixed by the suite seed and the analysis/dataset names (independent of run order)."""
    return np.random.default_rng([int(seed)] + [zlib.crc32(str(k).encode()) for k in keys])
