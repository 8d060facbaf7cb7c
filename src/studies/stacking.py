"""The stacking study of §2 / Table 1: the composed config → the verdict table, the ladder on every dataset
(:func:`src.core.ladder.analyze`) and the results document (``results.json``)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from src.core import ladder
from src.core.verdicts import VerdictTable
from src.judges.tables import load_table
from src.studies.checked import configured


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
