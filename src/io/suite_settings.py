"""The analysis suite's settings (conf/suite): typed, every key checked, one source for each value.

The values live in conf/suite/default.yaml (and the options that extend it, ``fast``): the dataclasses below hold
no defaults, so nothing is repeated in code. :func:`suite_settings` builds them from the composed ``suite`` node
(or a plain mapping) through :func:`src.io.config.build`: an unknown key (with the nearest known one), a missing
key or a value of the wrong type is one line naming the file and the key. The field order is the YAML's: the
suite document records the settings as :func:`dataclasses.asdict` gives them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from src.io.config import build, composed_option, conf_file, node_source


@dataclass(frozen=True)
class BudgetSettings:
    """Table 6 (regime-call recovery from a label budget) and Table 7 / Fig. 6b (the stacker's learning curve)."""

    budgets: list[int]
    draws: int
    curve_budgets: list[int]
    curve_draws: int


@dataclass(frozen=True)
class PanelSettings:
    """Fig. 8's transfer targets (null: analysis.core) and Fig. 5's leave-one-member-out bootstrap draws."""

    transfer: list[str] | None
    n_boot: int


@dataclass(frozen=True)
class GridSettings:
    """Appendix C's threshold family."""

    kappa0: list[float]
    c: list[float]
    phi0: list[float]


@dataclass(frozen=True)
class MechanismSettings:
    """Table 5's held-back datasets and Appendix C's grid and (sub-)panels."""

    held_back: list[str]
    grid: GridSettings
    subpanels: int
    subpanel_min_size: int
    subpanel_boot: int
    near_frontier: float


@dataclass(frozen=True)
class InOut:
    """A pair of input / output quantities (prices per million tokens, tokens per item)."""

    input: float
    output: float


@dataclass(frozen=True)
class FrontierCost:
    """The frontier judge's list prices and tokens per item (Table 2, Appendix H)."""

    price_per_mtok: InOut
    tokens_per_item: InOut


@dataclass(frozen=True)
class LabellingCost:
    """What calibration labels cost: per label, labels per record (null: each dataset's mean cluster size)."""

    price_per_label: float
    labels_per_record: float | None
    records: list[int]


@dataclass(frozen=True)
class CostSettings:
    """The cost model (Table 2, Appendix H): GPU price, throughput per member (``default`` for any other),
    measured seconds per verdict when ``use_measured``, the paper's panel size, frontier and labelling costs."""

    price_per_gpu_hour: float
    throughput: dict[str, float]
    use_measured: bool
    paper_panel_size: int
    frontier: FrontierCost
    labelling: LabellingCost


@dataclass(frozen=True)
class CascadeSettings:
    """The escalation cascade (beyond the paper; :mod:`src.studies.suite.cascade`)."""

    enabled: bool
    expensive: str | None
    operating_points: list[float]
    budgets: list[float]
    grid_step: float
    margin: float
    random_draws: int
    injection_defence: str


@dataclass(frozen=True)
class SuiteSettings:
    """The whole ``suite`` group: outputs, the suite's seed, and each analysis's settings."""

    output: str
    figures_dir: str
    report: str
    seed: int
    budget: BudgetSettings
    panel: PanelSettings
    mechanism: MechanismSettings
    cost: CostSettings
    cascade: CascadeSettings


def settings_of(cls: type, node: Any, where: str) -> Any:
    """``node`` as ``cls`` (already one: as it is; a mapping or a config node: built and checked)."""
    return node if isinstance(node, cls) else build(cls, node, where)


def suite_settings(node: Any, where: str | None = None) -> SuiteSettings:
    """The suite's settings from the composed ``suite`` node, a plain mapping, or a :class:`SuiteSettings`."""
    return settings_of(SuiteSettings, node, where or f"{node_source('suite', node)}: suite")


def load_option(name: str = "default") -> SuiteSettings:
    """conf/suite/<name>.yaml with its defaults list merged (:func:`src.io.config.composed_option`), as settings:
    the suite's values without Hydra."""
    return suite_settings(composed_option("suite", name), f"{conf_file('suite', name)}: suite")


def as_dict(settings: Any) -> dict:
    """The settings as the suite document records them (the YAML's keys, in its order)."""
    return dataclasses.asdict(settings)
