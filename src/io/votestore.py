"""The vote store of a served panel: each scored item's member votes (never its text), the stacker's
p(hallucinated), a timestamp and the item id, appended to a sqlite file — stdlib, one file, readable by pandas,
safe under concurrent requests (WAL journal, a busy timeout, one transaction per request). Recording is on when
a store is named (a panel model's config ``monitor_store``, else ``$RAIM_MONITOR_STORE``)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from src.core.errors import MonitorError
from src.core.verdicts import ABSTAIN
from src.io.files import file_lock

STORE_ENV = "RAIM_MONITOR_STORE"


CONFIG_KEY = "monitor_store"
FAILURE_ENV, FAILURE_KEY = "RAIM_MONITOR_ON_FAILURE", "monitor_on_failure"
ON_FAILURE = ("answer", "refuse")
DEFAULT_ON_FAILURE = "answer"


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS votes (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, "
    "model TEXT NOT NULL, item_id TEXT, votes TEXT NOT NULL, p_hallucinated REAL, train_prevalence REAL)"
)
# A store written before rows carried the stacker's training prevalence gains the column (null in its old rows).
_TRAIN_PREVALENCE = "ALTER TABLE votes ADD COLUMN train_prevalence REAL"


def _columns(con: sqlite3.Connection) -> set[str]:
    return {row[1] for row in con.execute("PRAGMA table_info(votes)")}


def store_path(config: Mapping[str, Any] | None = None) -> Path | None:
    """The store a served model records to: ``config['monitor_store']`` (a panel model's config), else
    ``$RAIM_MONITOR_STORE``; None (recording off) when neither is set or it is empty."""
    value = (config or {}).get(CONFIG_KEY) or os.environ.get(STORE_ENV) or ""
    return Path(value).expanduser() if str(value).strip() else None


def on_failure(config: Mapping[str, Any] | None = None) -> str:
    """What a served model does with a request whose rows its store could not record: ``answer`` (the default:
    each row says ``monitor: not recorded …``, ``/health`` degrades and counts them) or ``refuse`` (HTTP 503:
    fail closed). From a panel model's config ``monitor_on_failure``, else ``$RAIM_MONITOR_ON_FAILURE``.

    Answering is the default because the verdict itself is sound when only its record is lost: a full log volume
    must not take the scoring service down with it, and the loss is counted where an operator looks. Refuse where
    an unrecorded verdict must not be given at all (an audit trail that is a requirement)."""
    value = (config or {}).get(FAILURE_KEY) or os.environ.get(FAILURE_ENV) or DEFAULT_ON_FAILURE
    value = str(value).strip().lower()
    if value not in ON_FAILURE:
        raise MonitorError(f"{FAILURE_KEY} / {FAILURE_ENV}: {value!r} is not one of {list(ON_FAILURE)}")
    return value


def connect(path: str | Path) -> sqlite3.Connection:
    """Open (creating) the store: WAL journal (readers never block the writers), 30 s busy timeout.

    Switching a new database to WAL needs it to itself, and SQLite answers "database is locked" at once instead of
    waiting (no busy handler for it): the processes that find it not yet in WAL take turns through an exclusive
    lock on ``<store>.lock``. The mode is persistent, so later connections skip this."""

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(path), timeout=30.0)
    con.execute("PRAGMA busy_timeout = 30000")
    if str(con.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
        with file_lock(f"{path}.lock", f"monitor store {path}", timeout_s=60.0):
            con.execute("PRAGMA journal_mode = WAL")
    con.execute(_SCHEMA)
    if "train_prevalence" not in _columns(con):
        try:
            con.execute(_TRAIN_PREVALENCE)
        except sqlite3.OperationalError as e:  # another process added it first
            if "duplicate column" not in str(e):
                raise
    return con


def _vote_json(row: np.ndarray, members: Sequence[str]) -> str:
    return json.dumps({m: (None if (np.isnan(v) or v == ABSTAIN) else int(v)) for m, v in zip(members, row)})


def record(
    path: str | Path,
    model: str,
    members: Sequence[str],
    votes: np.ndarray,
    p: Sequence | None = None,
    item_ids: Sequence | None = None,
    ts: float | None = None,
    train_prevalence: float | None = None,
) -> int:
    """Append one request's items to the store in one transaction; returns the rows written. ``votes`` is
    n × K (0 / 1; 0.5 or NaN = abstained), ``p`` the stacker's p(hallucinated) (null when every member
    abstained), ``train_prevalence`` the hallucinated share that p assumes (the stacker's training prevalence)."""
    votes = np.asarray(votes, dtype=float)
    n = len(votes)
    p = [None] * n if p is None else [None if pd.isna(x) else float(x) for x in p]
    ids = [None] * n if item_ids is None else [None if pd.isna(x) else str(x) for x in item_ids]
    now = time.time() if ts is None else ts
    tp = None if train_prevalence is None else float(train_prevalence)
    rows = [(now, model, ids[i], _vote_json(votes[i], members), p[i], tp) for i in range(n)]
    con = connect(path)
    try:
        with con:
            con.executemany(
                "INSERT INTO votes (ts, model, item_id, votes, p_hallucinated, train_prevalence) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
    finally:
        con.close()
    return n


def record_from(
    config: Mapping[str, Any] | None,
    model: str,
    members: Sequence[str],
    votes: np.ndarray,
    p: Sequence | None = None,
    item_ids: Sequence | None = None,
    train_prevalence: float | None = None,
) -> int:
    """:func:`record` to the configured store (:func:`store_path`); 0 when recording is off."""
    path = store_path(config)
    return 0 if path is None else record(path, model, members, votes, p, item_ids, None, train_prevalence)


@dataclass
class Stream:
    """Recorded items in arrival order: votes n × K (ABSTAIN for an abstention), p (NaN where none)."""

    members: list[str]
    votes: np.ndarray
    p: np.ndarray
    ts: np.ndarray
    item_ids: list
    train_prevalence: np.ndarray | None = None  # per row (NaN: recorded before rows carried it); None: no column


def _stream_vote(v: Any, where: str) -> float:
    if v is None:
        return ABSTAIN
    if isinstance(v, bool) or v not in (0, 1):
        raise MonitorError(f"{where}: {v!r} is not a vote (0, 1 or null)")
    return float(v)


def connect_readonly(path: str | Path) -> sqlite3.Connection:
    """A read-only connection to the store at ``path``. Read-only needs an sqlite URI: the path is percent-encoded
    in it, so a ``#`` or ``?`` in a folder or file name is part of the path, never a fragment or a query that cuts
    it (and opens another file)."""
    return sqlite3.connect(f"file:{urllib.parse.quote(str(Path(path).absolute()))}?mode=ro", uri=True, timeout=30.0)


def read_store(path: str | Path, members: Sequence[str], model: str | None = None) -> Stream:
    """The store's rows (optionally of one ``model``) as a :class:`Stream` over ``members``; a row without
    exactly those members, or with a bad vote, is an error naming the row (its ``seq``) and the field."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise MonitorError(f"{path}: not a file, so not a monitoring store")
    if not path.is_file():
        raise MonitorError(f"{path}: no monitoring store there (record with {STORE_ENV}=… on the served model)")
    con = connect_readonly(path)
    try:
        has_tp = "train_prevalence" in _columns(con)
        sql = (
            "SELECT seq, ts, item_id, votes, p_hallucinated" + (", train_prevalence" if has_tp else "") + " FROM votes"
        )
        rows = con.execute(
            sql + (" WHERE model = ?" if model else "") + " ORDER BY seq", (model,) if model else ()
        ).fetchall()
    except sqlite3.DatabaseError as e:
        raise MonitorError(f"{path}: not a readable monitoring store ({e})") from None
    finally:
        con.close()
    votes = np.empty((len(rows), len(members)))
    for r, (seq, _, _, text, *_) in enumerate(rows):
        where = f"{path}: row seq={seq}"
        try:
            doc = json.loads(text)
        except (ValueError, TypeError, RecursionError):  # not text, not JSON, nested too deeply
            raise MonitorError(f"{where}: field 'votes': not JSON") from None
        if not isinstance(doc, dict) or set(doc) != set(members):
            got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
            raise MonitorError(f"{where}: field 'votes': members {got}, the calibration set's are {list(members)}")
        votes[r] = [_stream_vote(doc[m], f"{where}: field 'votes.{m}'") for m in members]
    for seq, ts, _, _, p, *tp in rows:
        for name, v, nullable in (
            ("ts", ts, False),
            ("p_hallucinated", p, True),
            *(("train_prevalence", t, True) for t in tp),
        ):
            if not (v is None and nullable) and (
                isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v)
            ):
                raise MonitorError(
                    f"{path}: row seq={seq}: field {name!r}: {v!r} is not "
                    f"{'a number or null' if nullable else 'a number (seconds since the epoch)'}"
                )
    p = np.array([np.nan if r[4] is None else r[4] for r in rows], dtype=float)
    tps = np.array([np.nan if r[5] is None else r[5] for r in rows], dtype=float) if has_tp else None
    return Stream(list(members), votes, p, np.array([r[1] for r in rows], dtype=float), [r[2] for r in rows], tps)
