"""What the comparator ladder (:mod:`src.core.ladder`, Table 1) is built from: its comparators, its settings
(conf/analysis) and their checks, a dataset's result, the members' design matrix, the single judges eligible
(``min_coverage``) and the best on average, and the checked cluster folds (§2's 5-fold cluster cross-fitting).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from src.core import admissibility
from src.core.aggregate import (
    StackedLogit,
    cluster_folds,
    eligible,
)
from src.core.decide import check_floor
from src.core.errors import RaimError
from src.core.evaluate import (
    coverage,
)
from src.core.verdicts import VerdictError, VerdictTable

COMPARATORS = (
    "avg_member",
    "majority",
    "dawid_skene",
    "acc_weighted",
    "logodds_weighted",
    "best_avg",
    "best_cv",
    "best_cv_deployed",
    "oracle",
    "stacked",
    "frontier",
)


DELTA_METRICS = ("kappa", "bacc")


# Which datasets Holm adjusts together (analysis.holm): ``core`` — §2's family, the configured core datasets present
# (every dataset when none is), the others left unadjusted; ``separate`` — that family, and the other datasets (a
# user's own sets) as a second family; ``all`` — every dataset analysed in one family.
HOLM_FAMILIES = ("core", "separate", "all")


class AnalysisError(RaimError, ValueError):
    """A dataset the ladder cannot analyse (one gold class, too few clusters, no eligible single judge)."""


@dataclass
class LadderSettings:
    """Analysis settings (conf/analysis): folds, bootstrap and the admissibility operating point."""

    n_splits: int = 5
    seed: int = 0
    n_boot: int = 2000
    level: float = 0.95
    kappa0: float = 0.30
    c: float = 0.5
    phi0: float = 0.40
    core: list[str] = field(default_factory=list)
    features: list[str] = field(default_factory=list)  # continuous extras per member, e.g. ["logodds"]
    abstention_contrast: bool = True  # Table 23: categorical vs scalar abstention encoding
    min_coverage: float = 0.5  # a single-judge comparator (best_avg, best_cv, oracle) must answer this share
    kappa_floor: float = 0.40  # the κ a deployed panel or single judge must reach (src.decide); not κ₀
    holm: str = "core"  # Holm's families (HOLM_FAMILIES): the core sets (§2), + the other sets apart, or all
    floor_rule: str = "estimate"  # what must reach kappa_floor: the κ estimate or its lower bound (src.decide)


def _in(value, lo: float, hi: float, lo_open: bool, hi_open: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (lo < value if lo_open else lo <= value) and (value < hi if hi_open else value <= hi)


def check_settings(s: LadderSettings, stacker: StackedLogit) -> None:
    """Refuse settings the analysis cannot run with, in one line naming the config key."""
    inf = float("inf")
    rules = [
        ("analysis.n_splits", s.n_splits, 2, inf, False, False),
        ("analysis.n_boot", s.n_boot, 1, inf, False, False),
        ("analysis.level", s.level, 0, 1, True, True),
        ("analysis.kappa0", s.kappa0, -1, 1, False, False),
        ("analysis.c", s.c, 0, 1, True, False),
        ("analysis.phi0", s.phi0, -1, 1, False, False),
        ("analysis.min_coverage", s.min_coverage, 0, 1, False, False),
        ("stacker.C", stacker.C, 0, inf, True, True),
        ("stacker.threshold", stacker.threshold, 0, 1, True, True),
    ]
    for key, value, lo, hi, lo_open, hi_open in rules:
        whole = key in ("analysis.n_splits", "analysis.n_boot")
        if not _in(value, lo, hi, lo_open, hi_open) or (whole and not isinstance(value, int)):
            want = (
                f"an integer ≥ {lo}"
                if whole
                else f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
            )
            raise AnalysisError(f"{key}={value!r}: must be {want}")
    check_floor(s.kappa_floor, s.floor_rule)  # the deployment floor's own rules (src.decide), before any work
    if s.holm not in HOLM_FAMILIES:
        raise AnalysisError(f"analysis.holm={s.holm!r}: must be one of {', '.join(HOLM_FAMILIES)}")
    if stacker.abstention not in ("scalar", "category"):
        raise AnalysisError(f"stacker.abstention={stacker.abstention!r}: must be 'scalar' or 'category'")


@dataclass
class DatasetResult:
    """Everything computed for one dataset: the JSON-able summary and the fitted objects."""

    summary: dict
    stacker: StackedLogit  # refitted on all items of the dataset (the deployable meta-learner)
    oof_proba: np.ndarray
    predictions: dict[str, np.ndarray]
    feature_names: list[str]
    members: list[str]  # the stacker's vote columns, in order: the members that voted on this dataset


def cluster_numbers(table: VerdictTable) -> np.ndarray:
    """Each item's cluster as its number among the table's sorted cluster ids (``np.unique(table.clusters,
    return_inverse=True)``'s inverse): the folds and the bootstrap read the clusters only through their order and
    equality, and whole numbers sort in a fraction of the time of 250,000 id strings (never built as Python
    objects here)."""
    codes, _ = pd.factorize(table.items["cluster_id"], sort=True)
    return codes


def design_matrix(table: VerdictTable, features: list[str]) -> tuple[np.ndarray, list[str]]:
    """Votes, then the requested continuous extras of each member (missing ones are an error)."""
    extras, names = [], []
    for feat in features:
        for m in table.members:
            key = f"{m}@{feat}"
            if key not in table.features:
                have = [k.split("@")[0] for k in table.features if k.endswith(f"@{feat}")]
                raise VerdictError(
                    f"{table.source}: stacker feature '{key}' requested (analysis.features) but the "
                    f"table has no such column (members with '@{feat}': {have or 'none'})"
                )
            extras.append(table.features[key])
            names.append(key)
    X = np.column_stack([table.votes] + extras) if extras else table.votes
    return X, names


def best_on_average(table: VerdictTable, min_coverage: float = 0.5) -> tuple[str | None, dict[str, str]]:
    """The member with the highest mean κ across the table's datasets (Table 15 'best-on-average': one judge
    deployed everywhere), among the members that answer at least ``min_coverage`` of the items of *every*
    dataset. Returns (its name or None when no member qualifies, {ineligible member: why})."""
    names: list[str] = []
    rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for name, t in table.each_dataset():  # one subset at a time
        names.append(name)
        rows.append((admissibility.member_kappas(t.gold, t.votes), coverage(t.votes), eligible(t.votes, min_coverage)))
    kappas, covs = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    ok = np.all([r[2] for r in rows], axis=0)
    why = {}
    for j in np.flatnonzero(~ok):
        d = int(np.argmin(covs[:, j]))
        why[table.members[j]] = f"coverage {covs[d, j]:.3f} < {min_coverage:g} on {names[d]}"
    if not ok.any():
        return None, why
    return table.members[int(np.argmax(np.where(ok, kappas.mean(axis=0), -np.inf)))], why


def active_members(table: VerdictTable) -> tuple[VerdictTable, list[str]]:
    """Drop members with no verdict at all on this dataset (never run, or unable to judge it, e.g. an evidence
    judge on an ungrounded set): they carry no information, and the admissibility share counts judges that
    judged. Returns the reduced table and the excluded names."""
    voted = coverage(table.votes) > 0
    excluded = [m for m, v in zip(table.members, voted) if not v]
    if voted.all():
        return table, []
    if not voted.any():
        raise AnalysisError("no member returned a single verdict on this dataset")
    return table.subset(np.ones(len(table.gold), bool), [m for m, v in zip(table.members, voted) if v]), excluded


def single_judge_eligibility(table: VerdictTable, min_coverage: float) -> tuple[np.ndarray, dict[str, str]]:
    """Which members may be a single-judge comparator on this dataset (best_cv, oracle), and why not."""
    ok = eligible(table.votes, min_coverage)
    cov = coverage(table.votes)
    why = {m: f"coverage {c:.3f} < {min_coverage:g}" for m, c, e in zip(table.members, cov, ok) if not e}
    if not ok.any():
        raise AnalysisError(
            f"no member answers at least {min_coverage:g} of the items (coverage: "
            + ", ".join(f"{m} {c:.2f}" for m, c in zip(table.members, cov))
            + "); no single judge can be compared (analysis.min_coverage sets the share)"
        )
    return ok, why


def checked_folds(y: np.ndarray, clusters: np.ndarray, s: LadderSettings) -> list[tuple]:
    """The cluster folds (§2), refusing a split whose training part misses a gold class."""
    try:
        folds = cluster_folds(y, clusters, s.n_splits, s.seed)
    except ValueError as e:
        raise AnalysisError(str(e)) from None
    for k, (tr, _) in enumerate(folds):
        if len(np.unique(y[tr])) < 2:
            per = {c: len(np.unique(clusters[y == c])) for c in (0, 1)}
            raise AnalysisError(
                f"fold {k}'s training clusters hold a single gold class; {s.n_splits}-fold "
                f"cross-fitting needs more clusters of each class (supported: {per[0]}, "
                f"hallucinated: {per[1]})"
            )
    return folds
