"""Verdict tables: the bring-your-own-verdicts contract (paper §2, Appendix K).

A verdict table has one row per item: ``item_id, cluster_id, gold`` (0 = supported, 1 = hallucinated),
optionally ``dataset``, then one column per judge holding 1, 0 or empty (abstained). Columns named
``<member>@<feature>`` (e.g. ``qwen@logodds``) carry optional continuous scores; a named frontier column
(e.g. ``sonnet``) is read as the frontier judge, not as a panel member.

Inside RAIM a vote is coded 0 / 1, and an abstention as ``ABSTAIN = 0.5`` (the paper's scalar encoding).
"""

from __future__ import annotations

import csv
import io
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from src.core.errors import RaimError
from src.core.textfiles import UnreadableText, normal_id, read_text

ABSTAIN = 0.5

TIE_TOLERANCE = 1e-9
"""A probability within this distance of the decision threshold *is* the threshold (:func:`at_or_over`)."""


def at_or_over(p, threshold: float = 0.5) -> np.ndarray:
    """The decision rule of every aggregator and path (§2: hallucinated iff p ≥ threshold), with ties by rule: a p
    within :data:`TIE_TOLERANCE` of the threshold is decided as the threshold itself, hallucinated. A tie in exact
    arithmetic (a balanced panel of uninformative members refits to p = ½) is computed as ½ ± a few units in the
    last place, and which side it falls on follows the BLAS kernel, the thread count and the order of a fit's
    sums; the tolerance, far above that noise (~1e-16) and far below any probability a fit tells apart from the
    threshold, makes the verdict the same on every machine. Boolean array of p's shape."""
    return np.asarray(p, dtype=float) >= threshold - TIE_TOLERANCE


REQUIRED = ("item_id", "cluster_id", "gold")
META = ("item_id", "cluster_id", "gold", "dataset", "frame")
DEFAULT_DATASET = "all"
PARQUET_SUFFIXES = (".parquet", ".pq")
ROWS_ATTR = "verdict_rows"  # read_table: each record's row number in its file
MISSING_MARKERS = frozenset({"na", "n/a", "none", "null", "nan", "<na>"})  # never an id, a vote or a gold label
_BINARY = re.compile(r"[01](?:\.0*)?")  # 1, 0, and 1.0 / 0.0 as pandas writes a float column
# The range of each continuous feature a judge writes (``<member>@<feature>``): a log-odds log p(hal)/p(sup) of
# probabilities floored at 1e-30 (src.judges.scoring) lies within ±69.08; a verdict-word mass is a sum of two
# probabilities (a rounding slack above 1). A value outside is a damaged cell, never a score: one such cell of
# 1e300 would dominate the stacker's fit. Features without a range need only be finite.
LOGODDS_LIMIT = 70.0
FEATURE_RANGES = {"logodds": (-LOGODDS_LIMIT, LOGODDS_LIMIT), "mass": (0.0, 1.0 + 1e-6)}


class VerdictError(RaimError, ValueError):
    """A verdict table that breaks the contract; the message names the file, the row and the field."""


@dataclass
class VerdictTable:
    """Validated verdicts: items, member votes (n × K, values 0/1/0.5) and optional extras."""

    items: pd.DataFrame  # item_id, cluster_id, dataset, gold
    members: list[str]
    votes: np.ndarray  # float, ABSTAIN for abstentions
    frontier_name: str | None = None
    frontier: np.ndarray | None = None
    features: dict[str, np.ndarray] = field(default_factory=dict)  # "member@feat" -> (n,)
    source: str = "<memory>"
    provenance: dict = field(default_factory=dict)  # how the table was read (e.g. the verdict cache's report)

    @property
    def gold(self) -> np.ndarray:
        return self.items["gold"].to_numpy(dtype=int)

    @property
    def clusters(self) -> np.ndarray:
        return self.items["cluster_id"].to_numpy()

    @property
    def has_frontier(self) -> bool:
        """Whether the frontier column holds a verdict: a roster's frontier that nobody scored (every item
        abstaining) is no comparator and no judge to escalate to."""
        return self.frontier is not None and bool((self.frontier != ABSTAIN).any())

    @property
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(self.items["dataset"]))

    def subset(self, mask: np.ndarray, members: list[str] | None = None) -> VerdictTable:
        """Rows where ``mask`` is true, optionally restricted to some members (order kept as given)."""
        members = list(self.members if members is None else members)
        cols = [self.members.index(m) for m in members]
        feats = {k: v[mask] for k, v in self.features.items() if k.split("@")[0] in members}
        return VerdictTable(
            items=self.items.loc[mask].reset_index(drop=True),
            members=members,
            votes=self.votes[mask][:, cols],
            frontier_name=self.frontier_name,
            frontier=None if self.frontier is None else self.frontier[mask],
            features=feats,
            source=self.source,
            provenance=self.provenance,
        )

    def by_dataset(self) -> dict[str, VerdictTable]:
        return dict(self.each_dataset())

    def each_dataset(self) -> Iterator[tuple[str, VerdictTable]]:
        """(name, its rows) per dataset, one subset at a time (a large table's subsets are not all held at once)."""
        ds = self.items["dataset"].to_numpy()
        for name in self.datasets:
            yield name, self.subset(ds == name)

    def to_frame(self) -> pd.DataFrame:
        """Back to the on-disk contract (abstentions as empty cells)."""
        out = self.items.copy()
        for j, m in enumerate(self.members):
            out[m] = _to_nullable(self.votes[:, j])
        if self.frontier is not None:
            out[self.frontier_name] = _to_nullable(self.frontier)
        for k, v in self.features.items():
            out[k] = v
        return out


def _to_nullable(v: np.ndarray) -> pd.Series:
    s = pd.Series(v, dtype="float").where(v != ABSTAIN)
    return s.astype("Int64")


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a CSV or Parquet verdict table into a raw frame (CSV cells as strings, Parquet cells as typed).

    The frame remembers each record's row number in the file (``attrs["verdict_rows"]``): a CSV's line number
    where the record starts (header = row 1, first record = row 2; blank lines are skipped, not renumbered), a
    Parquet file's record number from 1. Every problem reading the file is one :class:`VerdictError` line.
    """
    path = Path(path)
    if not path.exists():
        raise VerdictError(f"{path}: file not found")
    if path.is_dir():
        raise VerdictError(f"{path}: is a directory, not a verdict table (a CSV or Parquet file)")
    if path.stat().st_size == 0:
        raise VerdictError(f"{path}: empty file (expected a header with {', '.join(REQUIRED)})")
    df = _read_parquet(path) if path.suffix.lower() in PARQUET_SUFFIXES else _read_csv(path)
    if df.empty:
        raise VerdictError(f"{path}: no rows")
    return df


def _read_csv(path: Path) -> pd.DataFrame:
    """Parse with the csv module: every cell a string (no missing-value guessing), the header as written."""
    try:
        text = read_text(path)
    except OSError as e:
        raise VerdictError(f"{path}: cannot read ({e.strerror})") from None
    except UnreadableText as e:
        raise VerdictError(f"{path}: {e}") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] | None = None
    records, rows, end = [], [], 0
    try:
        for rec in reader:
            start, end = end + 1, reader.line_num
            if not any(f.strip() for f in rec):
                continue  # a blank line (or one of commas only) carries nothing
            if header is None:
                header = [f.strip() for f in rec]
            elif len(rec) != len(header):
                _ragged(path, start, rec, header)
            else:
                records.append(rec)
                rows.append(start)
    except csv.Error as e:
        raise VerdictError(f"{path}: line {reader.line_num}: {e}") from None
    if header is None:
        raise VerdictError(f"{path}: empty file (expected a header with {', '.join(REQUIRED)})")
    df = pd.DataFrame(records, columns=header, dtype=object)
    df.attrs[ROWS_ATTR] = rows
    return df


def _ragged(path: Path, row: int, rec: list[str], header: list[str]) -> None:
    i = header.index("item_id") if "item_id" in header else None
    ident = f" (item_id={rec[i].strip()!r})" if i is not None and i < len(rec) else ""
    if len(rec) < len(header):
        raise VerdictError(
            f"{path}: row {row}{ident}: field {header[len(rec)]!r}: missing (the row has "
            f"{len(rec)} fields, the header {len(header)})"
        )
    raise VerdictError(f"{path}: row {row}{ident}: {len(rec)} fields, the header has {len(header)}")


def _read_parquet(path: Path) -> pd.DataFrame:
    import pyarrow as pa  # imported here, not at start-up: pyarrow
    import pyarrow.parquet as pq  # imported here, not at start-up: pyarrow

    try:
        pf = pq.ParquetFile(path)
        index = {c for c in (pf.schema_arrow.pandas_metadata or {}).get("index_columns", []) if isinstance(c, str)}
        _check_header([c for c in pf.schema_arrow.names if c not in index], str(path))
        df = pf.read().to_pandas()
    except (pa.ArrowException, OSError) as e:
        reason = re.sub(r"^Could not open Parquet input source '.*?':\s*", "", " ".join(str(e).split()))
        raise VerdictError(f"{path}: not a readable Parquet file ({_clip(reason, 120)})") from None
    df.attrs[ROWS_ATTR] = list(range(1, len(df) + 1))
    return df


def load(path: str | Path, frontier: str | None = None, members: list[str] | None = None) -> VerdictTable:
    """Read and validate a verdict table file (CSV or Parquet)."""
    return validate(read_table(path), source=str(path), frontier=frontier, members=members)


def validate(
    df: pd.DataFrame,
    source: str = "<memory>",
    frontier: str | None = None,
    members: list[str] | None = None,
) -> VerdictTable:
    """Check the contract and code the votes; every error is one line naming the source, the row and the field.

    Rows are numbered as :func:`read_table` recorded them; a frame built in memory is numbered as the CSV it
    would write (header = row 1, first record = row 2). Real nulls (``None``, ``pd.NA``, a float ``NaN``) are
    empty cells: an abstention in a vote column, 0.0 in a feature column, an error elsewhere. Strings are read
    as a CSV's cells: ``1``, ``0`` (or ``1.0``, ``0.0``), empty or blank; any other token, ``NaN``, ``NA`` and
    ``None`` included, is an error.
    """
    _check_header(list(df.columns), source)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise VerdictError(f"{source}: missing required column(s) {missing}; found {_names(df.columns)}")
    if frontier is not None and frontier not in df.columns:
        frontier = None  # a configured frontier that this table does not carry is simply absent
    judge_cols = [c for c in df.columns if c not in META and "@" not in str(c) and c != frontier]
    if members is not None:
        absent = [m for m in members if m not in judge_cols]
        if absent:
            raise VerdictError(f"{source}: roster member column(s) {absent} not in table; have {_names(judge_cols)}")
        judge_cols = list(members)
    if not judge_cols:
        raise VerdictError(f"{source}: no judge columns (any column besides {list(META)})")
    rows = df.attrs.get(ROWS_ATTR)
    where = _Where(source, rows if rows is not None and len(rows) == len(df) else range(2, len(df) + 2))
    ids = _text_col(df, "item_id", where).map(normal_id)  # one id however its accents are composed
    dup = ids.duplicated(keep="first").to_numpy()
    if dup.any():
        r = int(np.flatnonzero(dup)[0])
        first = int(np.flatnonzero((ids == ids[r]).to_numpy())[0])
        raise VerdictError(f"{where(r, 'item_id')}: duplicate item_id {ids[r]!r} (first at row {where.rows[first]})")
    where.ids = ids
    items = pd.DataFrame(
        {
            "item_id": ids,
            "cluster_id": _text_col(df, "cluster_id", where).map(normal_id),
            "dataset": _text_col(df, "dataset", where) if "dataset" in df else DEFAULT_DATASET,
            "gold": _binary_col(df, "gold", where, allow_empty=False).astype(int),
        }
    )
    votes = np.column_stack([_binary_col(df, c, where, allow_empty=True) for c in judge_cols])
    feats = {
        c: _feature_col(df, c, where)
        for c in df.columns
        if isinstance(c, str) and "@" in c and c.split("@")[0] in judge_cols
    }
    front = _binary_col(df, frontier, where, allow_empty=True) if frontier else None
    return VerdictTable(items, judge_cols, votes, frontier, front, feats, source)


@dataclass
class _Where:
    """The one-line prefix of a cell's error: ``<source>: row <r> (item_id=<id>): field '<col>'``."""

    source: str
    rows: Sequence[int]
    ids: pd.Series | None = None  # the validated item ids, once known

    def __call__(self, r: int, col: str) -> str:
        ident = "" if self.ids is None or col == "item_id" else f" (item_id={self.ids[r]!r})"
        return f"{self.source}: row {self.rows[r]}{ident}: field {col!r}"


def _check_header(names: list, source: str) -> None:
    """Every column named, and named once (pandas would rename a second ``llama`` to ``llama.1``, a judge)."""
    at: dict = {}
    for i, c in enumerate(names, 1):
        if not str(c).strip():
            raise VerdictError(f"{source}: header: column {i} has no name")
        hidden = invisible(str(c))
        if hidden:
            raise VerdictError(
                f"{source}: header: column {i} {str(c)!r} holds {hidden} (a judge named so would be "
                f"a member of its own, distinct from the one it looks like)"
            )
        at.setdefault(c, []).append(i)
    for c, cols in at.items():
        if len(cols) > 1:
            times = "twice" if len(cols) == 2 else f"{len(cols)} times"
            listed = ", ".join(map(str, cols[:-1])) + f" and {cols[-1]}"
            raise VerdictError(f"{source}: header: column {c!r} appears {times} (columns {listed})")


def invisible(name: str) -> str | None:
    """The first character of ``name`` that does not print (a zero-width space, a control or format character, a
    non-breaking or other unusual space), described (``'U+200B ZERO WIDTH SPACE'``); None when every one prints."""
    for ch in name:
        if not ch.isprintable():
            return f"an invisible character U+{ord(ch):04X} {unicodedata.name(ch, '')}".rstrip()
    return None


def _cells(df: pd.DataFrame, col: str, where: _Where, what: str) -> tuple[pd.Series, bool]:
    """The column and whether it is numeric; a column type that cannot hold ``what`` is an error."""
    s = df[col]
    if isinstance(s.dtype, pd.CategoricalDtype):
        s = s.astype(object)
    numeric = pd.api.types.is_numeric_dtype(s.dtype) and not pd.api.types.is_bool_dtype(s.dtype)
    if not numeric and not (pd.api.types.is_object_dtype(s.dtype) or pd.api.types.is_string_dtype(s.dtype)):
        raise VerdictError(f"{where.source}: field {col!r}: column type {s.dtype} cannot hold {what}")
    return s, numeric


def _is_null(v: object) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    return isinstance(v, (float, np.floating)) and bool(np.isnan(v))


def _text_col(df: pd.DataFrame, col: str, where: _Where) -> pd.Series:
    out = []
    for r, v in enumerate(df[col].to_numpy(dtype=object)):
        s = "" if _is_null(v) else str(v).strip()
        if not s:
            raise VerdictError(f"{where(r, col)}: empty value")
        if s.lower() in MISSING_MARKERS:
            raise VerdictError(f"{where(r, col)}: {s!r} is a missing-value marker, not a value")
        out.append(s)
    return pd.Series(out, dtype=object)


def _binary_col(df: pd.DataFrame, col: str, where: _Where, allow_empty: bool) -> np.ndarray:
    """0/1 as floats, an empty cell as ABSTAIN (only where ``allow_empty``: a vote, not gold)."""
    s, numeric = _cells(df, col, where, "votes (0, 1 or null)" if allow_empty else "0 or 1")
    if numeric:
        out = s.to_numpy(dtype=float, na_value=np.nan)
    else:
        out = np.array([_binary_cell(v) for v in s.to_numpy(dtype=object)], dtype=float)
    empty = np.isnan(out)  # _binary_cell codes a bad cell as inf
    bad = (out != 0) & (out != 1) & ~empty | (empty & (not allow_empty))
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        v = s.iloc[r]
        if empty[r]:
            raise VerdictError(f"{where(r, col)}: empty value (must be 0 or 1)")
        hint = " (an abstention is an empty cell)" if allow_empty and str(v).strip().lower() in MISSING_MARKERS else ""
        allowed = "{0, 1, empty}" if allow_empty else "{0, 1}"
        raise VerdictError(f"{where(r, col)}: value {_show(v)} not in {allowed}{hint}")
    return np.where(empty, ABSTAIN, out)


def _binary_cell(v: object) -> float:
    """0.0 / 1.0, NaN for an empty cell, inf for anything else."""
    if _is_null(v):
        return np.nan
    if isinstance(v, str):
        t = v.strip()
        return np.nan if not t else float(t) if _BINARY.fullmatch(t) else np.inf
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        return np.inf
    return float(v) if v in (0, 1) else np.inf


def feature_problem(feature: str, x: float) -> str | None:
    """Why ``x`` cannot be a value of the continuous ``feature`` (``logodds``, ``mass``, …; see
    :data:`FEATURE_RANGES`), or None when it can: it must be finite, and inside the feature's range."""
    if not np.isfinite(x):
        return f"not a finite number: {_show(x)}"
    lo, hi = FEATURE_RANGES.get(feature, (-np.inf, np.inf))
    if not lo <= x <= hi:
        return f"{_show(x)} is outside [{lo:g}, {hi:g}], the range of a {feature} (a damaged value, not a score)"
    return None


def _feature_col(df: pd.DataFrame, col: str, where: _Where) -> np.ndarray:
    """A continuous score; an empty cell is 0.0 (neutral log-odds); a non-finite one, or one outside the
    feature's range (:func:`feature_problem`), is an error."""
    s, numeric = _cells(df, col, where, "numbers")
    feature = col.split("@", 1)[1]
    if numeric:
        vals = s.to_numpy(dtype=float, na_value=np.nan)
        lo, hi = FEATURE_RANGES.get(feature, (-np.inf, np.inf))
        with np.errstate(invalid="ignore"):
            bad = np.isinf(vals) | (vals < lo) | (vals > hi)
        for r in np.flatnonzero(bad)[:1]:
            raise VerdictError(f"{where(int(r), col)}: {feature_problem(feature, vals[r])}")
        return np.nan_to_num(vals, nan=0.0)
    out = np.zeros(len(s))
    for r, v in enumerate(s.to_numpy(dtype=object)):
        if _is_null(v) or (isinstance(v, str) and not v.strip()):
            continue
        try:
            x = float(v.strip() if isinstance(v, str) else v) if not isinstance(v, (bool, np.bool_)) else None
        except (TypeError, ValueError):
            x = None
        if x is None:
            raise VerdictError(f"{where(r, col)}: not a number: {_show(v)}")
        why = feature_problem(feature, x) if np.isfinite(x) else f"not a finite number: {_show(v)}"
        if why:
            raise VerdictError(f"{where(r, col)}: {why}")
        out[r] = x
    return out


def _show(v: object) -> str:
    """A cell's value for a one-line message: Python's repr, clipped; other objects by type."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, str):
        return repr(_clip(v, 40))
    if isinstance(v, (int, float)):
        return repr(v)
    return f"<{type(v).__name__}>"


def _clip(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def _names(cols, most: int = 10) -> str:
    """A column list for a message, shortened past ``most``."""
    cols = [str(c) for c in cols]
    return str(cols) if len(cols) <= most else f"{cols[:most]} (+{len(cols) - most} more)"
