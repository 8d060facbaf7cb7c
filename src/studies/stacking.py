"""The stacking study of §2 / Table 1: the composed config → the verdict table, the ladder on every dataset
(:func:`src.core.ladder.analyze`) and the results document (``results.json``)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from src.core import ladder
from src.core.aggregate import NoiseRobustStackedLogit, StackedLogit
from src.core.ladder import LadderSettings
from src.core.verdicts import VerdictTable
from src.io.config import Targets, node_source
from src.judges.tables import load_table

STACKERS = Targets("stacker", StackedLogit, NoiseRobustStackedLogit)
"""The stackers a config may name (conf/stacker): RAIM's estimators of src.core.aggregate that the ladder fits."""
ANALYSIS = Targets("analysis settings", LadderSettings)
"""The analysis settings (conf/analysis)."""


def stacker_from(node, where: str | None = None) -> StackedLogit:
    """A stacker node instantiated through :data:`STACKERS` (target and keys checked before anything is called)."""
    return STACKERS.instantiate(node, where or node_source("stacker", node))


def configured(cfg: DictConfig) -> tuple[LadderSettings, StackedLogit]:
    """The composed config's analysis settings and stacker, each through its allow-list; an unknown key or a
    value of the wrong type is one line naming its file (conf/analysis/<option>.yaml, conf/stacker/<option>.yaml)."""
    return ANALYSIS.instantiate(cfg.analysis, node_source("analysis", cfg.analysis)), stacker_from(cfg.stacker)


def analyse(cfg: DictConfig) -> tuple[VerdictTable, dict, dict]:
    """Pure part of the entry: config in, (table, fitted results, results document) out."""
    settings, stacker = configured(cfg)
    table = load_table(cfg)
    results = ladder.analyze(table, stacker, settings)
    meta = {
        "verdicts": table.source,
        "members": table.members,
        "frontier": table.frontier_name,
        "roster": cfg.roster.name if cfg.get("roster") and not cfg.verdicts else None,
        "stacker": OmegaConf.to_container(cfg.stacker),
        "frame": cfg.frame.name,
    }
    doc = ladder.to_json(results, settings, meta)
    if table.provenance.get("skipped"):
        doc["skipped"] = table.provenance["skipped"]
    return table, results, doc
