"""A scored pool and its gold labels, read from files for ``python -m src.rate``: a ``src.predict`` output or any
CSV / JSON Lines / Parquet file with ``item_id`` and ``p_hallucinated`` (optional ``cluster_id``, a segment column,
``ts``, ``train_prevalence``), or a served model's monitoring store (:mod:`src.studies.monitor`); gold for some of
its items (``item_id, gold`` with gold 0 / 1, from people or from a frontier judge).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from src.core import priorshift
from src.core.rates import RateError
from src.core.textfiles import normal_id
from src.io import votestore
from src.io.raw import RawRecordError, Rec, read_csv, read_jsonl, read_parquet

TABLE_SUFFIXES = (".csv", ".jsonl", ".parquet")


STORE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


P_COLUMN = "p_hallucinated"


IMPUTED_P = 0.5  # the predictor's value on an item the panel did not score (every member abstained)


@dataclass
class Pool:
    """The scored items: ids, p(hallucinated), cluster ids (None: one item per cluster), a segment per item (None:
    one segment), the stacker's training prevalence (None: unknown, no EM estimate)."""

    source: str
    item_ids: np.ndarray
    p: np.ndarray
    clusters: np.ndarray | None = None
    segments: np.ndarray | None = None
    segment_by: str | None = None
    train_prevalence: float | None = None
    imputed: int = 0

    def __post_init__(self) -> None:
        self.index = {str(k): i for i, k in enumerate(self.item_ids)}

    def __len__(self) -> int:
        return len(self.item_ids)

    def fingerprint(self) -> str:
        """sha256 of the sorted item ids (one per line): which pool a proposal was drawn from."""
        return hashlib.sha256("\n".join(sorted(map(str, self.item_ids))).encode()).hexdigest()


def _records(path: Path, required: tuple[str, ...]) -> list[Rec]:
    if path.suffix not in TABLE_SUFFIXES:
        raise RateError(f"{path}: a table is CSV, JSON Lines or Parquet ({', '.join(TABLE_SUFFIXES)})")
    if not path.exists():
        raise RateError(f"{path}: file not found")
    if path.suffix == ".csv":
        return read_csv(path, Path.cwd(), required)
    return read_jsonl(path, Path.cwd()) if path.suffix == ".jsonl" else read_parquet(path, Path.cwd())


def _blank(v: Any) -> bool:
    return (
        v is None
        or (isinstance(v, float) and v != v)
        or (isinstance(v, str) and v.strip().lower() in ("", "nan", "null", "none", "<na>"))
    )


def _prob(rec: Rec, key: str) -> float | None:
    v = rec.raw(key)
    if _blank(v):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise RawRecordError(rec.where, key, f"{v!r} is not a probability in [0, 1]") from None
    if not 0.0 <= x <= 1.0:
        raise RawRecordError(rec.where, key, f"{v!r} is not a probability in [0, 1]")
    return x


def _item_id(rec: Rec) -> str:
    return rec.ident("item_id")


def read_pool(
    path: str | Path,
    segment: str | None = None,
    window: float | None = None,
    train_prevalence: float | None = None,
    model: str | None = None,
) -> Pool:
    """A scored pool (module docstring): a table, or a monitoring store (``model``: one served model's rows).
    ``segment``: a column to report by; ``window``: seconds per time window over ``ts`` (the store's timestamps).
    A missing p (every member abstained) is imputed as 0.5 — a fixed predictor value, so every estimate stays
    valid — and counted."""
    path = Path(path)
    if path.suffix in STORE_SUFFIXES:
        ids, p, clusters, seg, ts, tp = _store_columns(path, model)
        if segment is not None:
            raise RateError(f"--segment {segment}: a monitoring store has no columns; segment it by --window")
    else:
        ids, p, clusters, seg, ts, tp = _table_columns(path, segment, window is not None)
    return pool_of(str(path), ids, p, clusters, seg, ts, tp, segment, window, train_prevalence)


def pool_of(
    source: str,
    ids: Any,
    p: np.ndarray,
    clusters: np.ndarray | None,
    seg: np.ndarray | None,
    ts: np.ndarray,
    tp: float | None,
    segment: str | None = None,
    window: float | None = None,
    train_prevalence: float | None = None,
) -> Pool:
    """A pool from its columns (:func:`read_pool`'s, or the assessed traces of an MLflow experiment): the missing
    p imputed and counted, the segments by ``window`` seconds over ``ts`` when asked, ``train_prevalence`` over
    the recorded one."""
    if train_prevalence is not None:
        tp = priorshift.check_prevalence(train_prevalence, "--train-prevalence")
    missing = np.isnan(p)
    p = np.where(missing, IMPUTED_P, p)
    by = segment
    if window is not None:
        if not (window > 0):
            raise RateError(f"--window {window!r}: must be a positive number of seconds")
        start = np.floor((ts - np.nanmin(ts)) / window) * window + np.nanmin(ts)
        seg = np.array(
            [dt.datetime.fromtimestamp(s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") for s in start], dtype=object
        )
        by = f"window of {window:g} s"
    return Pool(source, np.asarray(ids, dtype=object), p, clusters, seg, by, tp, int(missing.sum()))


def _table_columns(path: Path, segment: str | None, need_ts: bool):
    recs = _records(path, ("item_id", P_COLUMN))
    head = recs[0].data
    ids, p, clusters, seg, ts, tps = [], [], [], [], [], []
    where: dict[str, str] = {}
    has_cluster, has_tp = "cluster_id" in head, "train_prevalence" in head
    if segment is not None and segment not in head:
        raise RateError(f"{path}: --segment {segment}: no such column (columns: {', '.join(map(str, head))})")
    if need_ts and "ts" not in head:
        raise RateError(f"{path}: --window needs a 'ts' column (seconds since the epoch)")
    for rec in recs:
        i = _item_id(rec)
        if where.setdefault(i, rec.where) != rec.where:
            raise RawRecordError(rec.where, "item_id", f"{i!r} repeats {where[i]} (item ids must be unique)")
        ids.append(i)
        v = _prob(rec, P_COLUMN)
        p.append(np.nan if v is None else v)
        if has_cluster:
            c = rec.raw("cluster_id")
            clusters.append(f"item:{i}" if _blank(c) else normal_id(str(c)))
        if segment is not None:
            s = rec.raw(segment)
            seg.append("(none)" if _blank(s) else str(s))
        if need_ts:
            try:
                ts.append(float(rec.raw("ts")))
            except (TypeError, ValueError):
                raise RawRecordError(rec.where, "ts", f"{rec.raw('ts')!r} is not a time in seconds") from None
        if has_tp:
            t = _prob(rec, "train_prevalence")
            if t is not None:
                tps.append(t)
    return (
        ids,
        np.asarray(p, dtype=float),
        np.asarray(clusters, dtype=object) if has_cluster else None,
        np.asarray(seg, dtype=object) if segment is not None else None,
        np.asarray(ts, dtype=float),
        one_prevalence(path, tps, "items", "pass the stacker's with --train-prevalence"),
    )


def one_prevalence(path: Path | str, recorded, what: str, hint: str) -> float | None:
    """The one training prevalence a pool's ``what`` (items, rows) recorded, ignoring the ones that recorded none
    (None when none did); values that disagree come from several stackers: an error with ``hint``."""
    known = [float(t) for t in recorded if t is not None and np.isfinite(t)]
    if not known:
        return None
    if max(known) - min(known) > 1e-9:
        raise RateError(
            f"{path}: field 'train_prevalence': the {what} disagree ({min(known):g}…{max(known):g}); {hint}"
        )
    return priorshift.check_prevalence(known[0], f"{path}: field 'train_prevalence'")


def _store_columns(path: Path, model: str | None):
    """The store's rows (:func:`src.studies.monitor.read_store`, members read off its first row): ids (``#<row>`` for a
    row recorded without one), p, timestamps."""
    if not path.is_file():
        raise RateError(f"{path}: no monitoring store there")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    try:
        first = con.execute(
            "SELECT votes FROM votes" + (" WHERE model = ?" if model else "") + " ORDER BY seq LIMIT 1",
            (model,) if model else (),
        ).fetchone()
    except sqlite3.DatabaseError as e:
        raise RateError(f"{path}: not a readable monitoring store ({e})") from None
    finally:
        con.close()
    if first is None:
        raise RateError(f"{path}: no recorded items" + (f" of model {model!r}" if model else ""))
    try:
        members = list(json.loads(first[0]))
    except (ValueError, TypeError):
        raise RateError(f"{path}: first row: field 'votes': not a JSON object") from None
    stream = votestore.read_store(path, members, model)
    ids = [f"#{k}" if i is None else normal_id(str(i)) for k, i in enumerate(stream.item_ids)]
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise RateError(f"{path}: item_id {i!r} was recorded twice (a rate counts each item once)")
        seen.add(i)
    tps = [] if stream.train_prevalence is None else stream.train_prevalence
    hint = "read one model's rows, or pass the stacker's with --train-prevalence"
    return ids, stream.p, None, None, stream.ts, one_prevalence(path, tps, "rows", hint)


def read_labels(path: str | Path, pool: Pool, column: str = "gold") -> tuple[np.ndarray, np.ndarray]:
    """(labelled mask, gold with NaN elsewhere) aligned with the pool; a label for an item the pool does not hold,
    a gold that is not 0 / 1, or two different golds for one item is an error naming the record and field."""
    path = Path(path)
    recs = _records(path, ("item_id", column))
    lab = np.zeros(len(pool), bool)
    y = np.full(len(pool), np.nan)
    for rec in recs:
        i = _item_id(rec)
        k = pool.index.get(i)
        if k is None:
            unknown = sum(_item_id(r) not in pool.index for r in recs)
            raise RawRecordError(
                rec.where,
                "item_id",
                f"{i!r} is not an item of the pool {pool.source} ({unknown} labelled item(s) are not in it)",
            )
        g = _gold(rec, column)
        if lab[k] and y[k] != g:
            raise RawRecordError(rec.where, column, f"{i!r} was labelled {int(y[k])} before, now {g}")
        lab[k], y[k] = True, g
    return lab, y


def _gold(rec: Rec, column: str) -> int:
    v = rec.raw(column)
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float, np.integer, np.floating)) and v in (0, 1):
        return int(v)
    if isinstance(v, str) and v.strip() in ("0", "1", "0.0", "1.0"):
        return int(float(v))
    raise RawRecordError(rec.where, column, f"{v!r} is not 0 (supported) or 1 (hallucinated)")
