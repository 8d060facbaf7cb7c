"""The stacking study of §2 / Table 1: the composed config → the verdict table, the ladder on every dataset
(:func:`src.core.ladder.analyze`) and the results document (``results.json``)."""

from __future__ import annotations

from src.core import ladder
from src.core.verdicts import VerdictTable
from src.io.settings import Settings
from src.judges.tables import load_table
from src.studies.checked import configured


def analyse(s: Settings) -> tuple[VerdictTable, dict, dict]:
    """Pure part of the entry: settings in, (table, fitted results, results document) out."""
    settings, stacker = configured(s)
    table = load_table(s)
    results = ladder.analyze(table, stacker, settings)
    meta = {
        "verdicts": table.source,
        "members": table.members,
        "frontier": table.frontier_name,
        "roster": s.roster["name"] if s.roster and not s.verdicts else None,
        "stacker": s.node("stacker"),
        "frame": s.frame["name"],
    }
    doc = ladder.to_json(results, settings, meta)
    if table.provenance.get("skipped"):
        doc["skipped"] = table.provenance["skipped"]
    return table, results, doc
