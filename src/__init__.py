"""RAIM: Robust Aggregation of Inexpensive Models — a panel of cheap judges of faithfulness, stacked by a
cross-fitted logistic regression (§2), with the admissibility test that says where the panel pays (§3.3).

The public API, without Hydra or MLflow::

    from src import load_verdicts, analyze, StackedLogit, LadderSettings, decide

    table = load_verdicts("my_verdicts.csv")                  # the verdict-table contract (src.core.verdicts)
    results = analyze(table, StackedLogit(), LadderSettings())  # the ladder of Table 1, per dataset
    for name, r in results.items():
        print(name, r.summary["admissibility"]["admissible"], decide(r.summary).label)

Names are resolved on first use (PEP 562), so ``import src`` — and every ``python -m src.<x> --help`` — does not
pay for scikit-learn and pandas until a name that needs them is used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

_API = {
    # the verdict table (§2: one binary vote per member and item, abstention 0.5)
    "VerdictTable": "src.core.verdicts",
    "VerdictError": "src.core.verdicts",
    "ABSTAIN": "src.core.verdicts",
    "load_verdicts": ("src.core.verdicts", "load"),
    "validate_verdicts": ("src.core.verdicts", "validate"),
    # aggregators (§2 and the ladder's comparators), scikit-learn estimators
    "StackedLogit": "src.core.aggregate",
    "NoiseRobustStackedLogit": "src.core.aggregate",
    "MajorityVote": "src.core.aggregate",
    "WeightedVote": "src.core.aggregate",
    "BestSingle": "src.core.aggregate",
    "DawidSkene": "src.core.aggregate",
    "crossfit": "src.core.aggregate",
    # the ladder (Table 1) and its settings
    "LadderSettings": "src.core.ladder",
    "analyze": "src.core.ladder",
    "results_document": ("src.core.ladder", "to_json"),
    # the admissibility test (§3.3) and the deployment decision
    "admissibility_test": ("src.core.admissibility", "test"),
    "phi_bar": "src.core.admissibility",
    "decide": "src.core.decide",
    # metrics and the paired cluster bootstrap
    "kappa": "src.core.evaluate",
    "ClusterBootstrap": "src.core.evaluate",
    "paired_delta": "src.core.evaluate",
    # prior shift (Saerens et al. 2002)
    "adjust_prevalence": ("src.core.priorshift", "adjust"),
    "estimate_prevalence": ("src.core.priorshift", "estimate"),
    # simulated panels with known competence and correlation
    "simulate_panel": ("src.studies.simulate", "panel"),
    "RaimError": "src.core.errors",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    """The public API's names, imported on first use."""
    where = _API.get(name)
    if where is None:
        raise AttributeError(f"module 'src' has no attribute {name!r}")
    module, attr = where if isinstance(where, tuple) else (where, name)
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
