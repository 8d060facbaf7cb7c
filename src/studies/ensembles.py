"""The stacked panel against MLflow's own judge ensembles (beyond the paper): §2's central comparison — the
cross-fitted stacker against the naive aggregation of the same cheap members — with the naive side computed by
MLflow's ``make_scorer_ensemble`` (its built-in ``majority_vote`` and ``mean``) over RAIM's members as MLflow
scorers, as a user of ``mlflow.genai.evaluate`` would build it (:mod:`src.mlops.scorers`).

Per dataset of the configured verdict tables, on the members that voted on it (the stacker's inputs,
:func:`src.core.ladderbase.active_members`):

* ``stacked``: the stacker's out-of-fold predictions on §2's cluster folds (the ladder's own);
* ``mlflow_<fn>``: MLflow's aggregation of the member scorers. MLflow's built-ins refuse an item on which any
  member returned no value — RAIM's abstentions — so such an item is an abstention of that aggregation (κ leaves it
  out, balanced accuracy counts it as an error, §2), and the count is reported; ``mean`` flags an item when the
  share of its members voting hallucinated reaches ``traces.mean_threshold``; ``majority_vote`` breaks a tie by
  MLflow's rule (the lexicographically first value: ``False``, supported);
* ``raim_majority``: the ladder's own majority (an abstention counts 0.5, a tie is hallucinated), for reference.

Each is scored with κ, balanced accuracy and F1 (§2), and Δ = stacked − each aggregation on κ and balanced
accuracy with RAIM's paired cluster-bootstrap interval: the stacker refitted in every draw, the refit noise taken
out (:mod:`src.core.refit`, as the ladder's intervals; the aggregations are label-free, so only the stacker is
refitted). The member votes the scorers returned are checked against the verdict table item by item.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from sklearn.base import clone

from src.core import ladder, ladderbase
from src.core.aggregate import MajorityVote, StackedLogit, crossfit
from src.core.errors import RaimError
from src.core.evaluate import METRICS, ClusterBootstrap, from_counts, indicators, interval
from src.core.names import metric_name
from src.core.refit import DrawReader, RefitBootstrap
from src.core.verdicts import ABSTAIN, VerdictTable

MLFLOW_PREFIX = "mlflow_"
REFERENCE = "raim_majority"

Ensembles = Callable[[str, Sequence[str]], tuple[dict[str, np.ndarray], dict[str, int], np.ndarray]]
"""``(dataset, members) → (each aggregation's predictions, items each refused, the votes the scorers returned)``:
:func:`src.mlops.scorers.ensemble_predictions` on the dataset's items, handed in by the entry point."""


class EnsembleStudyError(RaimError, ValueError):
    """The MLflow scorers and the verdict table disagree, or a dataset cannot be compared."""


def check_votes(name: str, table: VerdictTable, seen: np.ndarray) -> None:
    """The votes the member scorers returned are the table's, item by item (else one line naming the first)."""
    if seen.shape != table.votes.shape:
        raise EnsembleStudyError(f"{name}: the scorers returned {seen.shape} votes for a table of {table.votes.shape}")
    bad = np.argwhere(seen != table.votes)
    if len(bad):
        i, j = bad[0]
        raise EnsembleStudyError(
            f"{name}: item {table.items['item_id'].iloc[i]!r}: member {table.members[j]!r} scored "
            f"{seen[i, j]:g} through MLflow but {table.votes[i, j]:g} in {table.source} ({len(bad)} such cells)"
        )


def dataset_study(
    name: str, table: VerdictTable, stacker: StackedLogit, s: ladderbase.LadderSettings, ensembles: Ensembles
) -> dict:
    """One dataset's comparison (module doc)."""
    table, excluded = ladderbase.active_members(table)
    y, clusters, votes = table.gold, table.clusters, table.votes
    preds_ml, refused, seen = ensembles(name, list(table.members))
    check_votes(name, table, seen)
    X, _ = ladderbase.design_matrix(table, s.features)
    st = clone(stacker).set_params(n_votes=votes.shape[1])
    folds = ladderbase.checked_folds(y, clusters, s)
    preds = {
        "stacked": crossfit(st, X, y, folds).pred,
        **{f"{MLFLOW_PREFIX}{n}": p for n, p in preds_ml.items()},
        REFERENCE: MajorityVote().fit(votes).predict(votes).astype(float),
    }
    named = list(preds)
    P = np.column_stack([preds[k] for k in named])
    cells = np.stack([indicators(y, P[:, j]).sum(0) for j in range(len(named))])
    full = from_counts(cells)
    boot = ClusterBootstrap(clusters, s.n_boot, s.seed)
    rb = RefitBootstrap(y, folds, boot)
    reader = DrawReader(rb, {"stacked": ladder.stacked_rung(rb, st, X)}, {"stacked": cells[0]})
    (raw,) = boot.sweep([boot.per_cluster(y, P)], (reader.add,))
    fixed = from_counts(ClusterBootstrap.unpack(raw))
    rd = reader.result()
    refit = from_counts(rd.counts["stacked"])
    methods: dict[str, Any] = {}
    for j, k in enumerate(named):
        methods[k] = {"coverage": float(np.mean(P[:, j] != ABSTAIN))}
        for m in METRICS:
            ci = (
                ladder.refit_ci(m, full[m][j], refit[m], fixed[m][:, j], rd.correction({("stacked", m): 1.0}), s.level)
                if k == "stacked"
                else interval(fixed[m][:, j], s.level)
            )
            methods[k][m] = {"estimate": float(full[m][j]), "ci": ci}
    for n, c in refused.items():
        methods[f"{MLFLOW_PREFIX}{n}"]["refused"] = int(c)
    deltas = {
        k: {
            m: ladder.refit_delta(
                float(full[m][0] - full[m][j]),
                refit[m] - fixed[m][:, j],
                fixed[m][:, 0] - fixed[m][:, j],
                rd.correction({("stacked", m): 1.0}),
                s.level,
            ).as_dict()
            for m in ladderbase.DELTA_METRICS
        }
        for j, k in enumerate(named)
        if k != "stacked"
    }
    return {
        "n": int(len(y)),
        "n_clusters": int(len(np.unique(clusters))),
        "members": list(table.members),
        "excluded_members": excluded,
        "items_with_an_abstention": int(np.any(votes == ABSTAIN, axis=1).sum()),
        "methods": methods,
        "deltas": deltas,
    }


def study(table: VerdictTable, stacker: StackedLogit, s: ladderbase.LadderSettings, ensembles: Ensembles) -> dict:
    """Every dataset of the table (:func:`dataset_study`), with a summary of the calls per aggregation."""
    ladderbase.check_settings(s, stacker)
    out = {}
    for name, t in table.each_dataset():
        try:
            out[name] = dataset_study(name, t, stacker, s, ensembles)
        except ladderbase.AnalysisError as e:
            raise EnsembleStudyError(f"{table.source}: dataset {name!r}: {e}") from e
    return {"datasets": out, "summary": summary(out)}


def summary(datasets: Mapping[str, dict]) -> dict:
    """Per aggregation: the datasets where stacked − it on κ is a clear improvement, unresolved, a clear worsening,
    and the items MLflow's aggregation refused over all datasets."""
    out: dict[str, dict] = {}
    for d in datasets.values():
        for k, per in d["deltas"].items():
            row = out.setdefault(k, {"clear improvement": 0, "unresolved": 0, "clear worsening": 0, "refused": 0})
            row[per["kappa"]["call"]] += 1
            row["refused"] += d["methods"][k].get("refused", 0)
    return out


def statements(doc: dict) -> list[str]:
    """One line per dataset and aggregation: Δκ with its interval and call."""
    lines = []
    for name, d in doc["datasets"].items():
        for k, per in d["deltas"].items():
            dk = per["kappa"]
            refused = d["methods"][k].get("refused")
            lines.append(
                f"{name}: κ stacked {d['methods']['stacked']['kappa']['estimate']:.3f} vs {k} "
                f"{d['methods'][k]['kappa']['estimate']:.3f}: Δκ {dk['estimate']:+.3f} "
                f"[{dk['ci'][0]:+.3f}, {dk['ci'][1]:+.3f}] ({dk['call']})"
                + (f"; MLflow refused {refused} of {d['n']} items (a member abstained)" if refused else "")
            )
    return lines


def flat_metrics(doc: dict) -> dict[str, float]:
    """The study as MLflow metrics: ``<dataset>/<method>/<metric>`` and ``<dataset>/delta_<method>/<metric>``."""
    out: dict[str, float] = {}
    for name, d in doc["datasets"].items():
        for k, per in d["methods"].items():
            out[metric_name(name, k, "coverage")] = per["coverage"]
            for m in METRICS:
                out[metric_name(name, k, m)] = per[m]["estimate"]
            if "refused" in per:
                out[metric_name(name, k, "refused")] = float(per["refused"])
        for k, per in d["deltas"].items():
            for m, dd in per.items():
                out[metric_name(name, f"delta_{k}", m)] = dd["estimate"]
                out[metric_name(name, f"delta_{k}", f"{m}_lo")], out[metric_name(name, f"delta_{k}", f"{m}_hi")] = dd[
                    "ci"
                ]
    return out
