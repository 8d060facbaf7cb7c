"""Injection flags of served items, beside the vote store (:mod:`src.io.votestore`, same sqlite file, its own
table): per scored item, whether :func:`src.core.detector.scan` flagged its text and why — never the text. The
monitor joins them to the recorded votes by item id and reports the flagged share per window."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from src.core.errors import MonitorError
from src.io.votestore import connect, connect_readonly, store_path

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS injection_flags (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, "
    "model TEXT NOT NULL, item_id TEXT, flagged INTEGER NOT NULL, reasons TEXT)"
)


def record_flags(
    path: str | Path,
    model: str,
    item_ids: Sequence,
    flags: Sequence[bool],
    reasons: Sequence[str] | None = None,
    ts: float | None = None,
) -> int:
    """Append one request's flags in one transaction; returns the rows written."""
    now = time.time() if ts is None else ts
    reasons = list(reasons) if reasons is not None else [""] * len(flags)
    rows = [(now, model, None if i is None else str(i), int(bool(f)), r) for i, f, r in zip(item_ids, flags, reasons)]
    con = connect(path)
    try:
        with con:
            con.execute(_SCHEMA)
            con.executemany(
                "INSERT INTO injection_flags (ts, model, item_id, flagged, reasons) VALUES (?, ?, ?, ?, ?)", rows
            )
    finally:
        con.close()
    return len(rows)


def record_flags_from(
    config: Mapping[str, Any] | None,
    model: str,
    item_ids: Sequence,
    flags: Sequence[bool],
    reasons: Sequence[str] | None = None,
) -> int:
    """:func:`record_flags` to the configured store (:func:`src.io.votestore.store_path`); 0 when recording is off."""
    path = store_path(config)
    return 0 if path is None else record_flags(path, model, item_ids, flags, reasons)


def read_flags(path: str | Path, model: str | None = None) -> dict[str, bool]:
    """{item id: flagged} of the store (the latest row per item id; ``model``'s rows only when given); {} for a
    store that recorded none."""
    con = connect_readonly(path)
    try:
        if not con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='injection_flags'").fetchone():
            return {}
        sql = "SELECT item_id, flagged FROM injection_flags" + (" WHERE model = ?" if model else "") + " ORDER BY seq"
        rows = con.execute(sql, (model,) if model else ()).fetchall()
    except sqlite3.DatabaseError as e:
        raise MonitorError(f"{path}: not a readable monitoring store ({e})") from None
    finally:
        con.close()
    return {str(i): bool(f) for i, f in rows if i is not None}
