"""Verdict tables: the bring-your-own-verdicts contract (paper §2, Appendix K).

A verdict table has one row per item: ``item_id, cluster_id, gold`` (0 = supported, 1 = hallucinated),
optionally ``dataset``, then one column per judge holding 1, 0 or empty (abstained). Columns named
``<member>@<feature>`` (e.g. ``qwen@logodds``) carry optional continuous scores; a named frontier column
(e.g. ``sonnet``) is read as the frontier judge, not as a panel member.

Inside RAIM a vote is coded 0 / 1, and an abstention as ``ABSTAIN = 0.5`` (the paper's scalar encoding).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import RaimError

ABSTAIN = 0.5
REQUIRED = ("item_id", "cluster_id", "gold")
META = ("item_id", "cluster_id", "gold", "dataset", "frame")
DEFAULT_DATASET = "all"


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
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(self.items["dataset"]))

    def subset(self, mask: np.ndarray, members: list[str] | None = None) -> "VerdictTable":
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

    def by_dataset(self) -> dict[str, "VerdictTable"]:
        ds = self.items["dataset"].to_numpy()
        return {name: self.subset(ds == name) for name in self.datasets}

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
    """Read a CSV or Parquet verdict table as strings-preserving raw frame."""
    path = Path(path)
    if not path.exists():
        raise VerdictError(f"{path}: file not found")
    if path.stat().st_size == 0:
        raise VerdictError(f"{path}: empty file (expected a header with {', '.join(REQUIRED)})")
    if path.suffix in (".parquet", ".pq"):
        df = pd.read_parquet(path)
    else:
        try:
            df = pd.read_csv(path, dtype=str, keep_default_na=False)
        except pd.errors.EmptyDataError as e:
            raise VerdictError(f"{path}: empty file ({e})") from e
    if df.empty:
        raise VerdictError(f"{path}: no rows")
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
    """Check the contract and code the votes; every error names the source, the row and the field.

    Rows are numbered as in the file (header = row 1, first record = row 2).
    """
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise VerdictError(f"{source}: missing required column(s) {missing}; found {list(df.columns)}")
    if frontier is not None and frontier not in df.columns:
        frontier = None  # a configured frontier that this table does not carry is simply absent
    judge_cols = [c for c in df.columns if c not in META and "@" not in c and c != frontier]
    if members is not None:
        absent = [m for m in members if m not in judge_cols]
        if absent:
            raise VerdictError(f"{source}: roster member column(s) {absent} not in table; have {judge_cols}")
        judge_cols = list(members)
    if not judge_cols:
        raise VerdictError(f"{source}: no judge columns (any column besides {list(META)})")
    items = pd.DataFrame(
        {
            "item_id": _text_col(df, "item_id", source),
            "cluster_id": _text_col(df, "cluster_id", source),
            "dataset": _text_col(df, "dataset", source) if "dataset" in df else DEFAULT_DATASET,
            "gold": _gold(df, source),
        }
    )
    dup = items["item_id"].duplicated(keep="first")
    if dup.any():
        r = int(np.flatnonzero(dup.to_numpy())[0])
        raise VerdictError(f"{source}: row {r + 2}: field 'item_id': duplicate item_id {items['item_id'][r]!r}")
    votes = np.column_stack([_vote_col(df, c, source) for c in judge_cols])
    feats = {c: _float_col(df, c, source) for c in df.columns if "@" in c and c.split("@")[0] in judge_cols}
    front = _vote_col(df, frontier, source) if frontier else None
    return VerdictTable(items, judge_cols, votes, frontier, front, feats, source)


def _text_col(df: pd.DataFrame, col: str, source: str) -> pd.Series:
    s = df[col].astype(str).str.strip()
    bad = (s == "") | (s.str.lower() == "nan") | df[col].isna().to_numpy()
    if bad.any():
        r = int(np.flatnonzero(bad.to_numpy())[0])
        raise VerdictError(f"{source}: row {r + 2}: field '{col}': empty value")
    return s.reset_index(drop=True)


def _parse_binary(df: pd.DataFrame, col: str, source: str, allow_empty: bool) -> np.ndarray:
    raw = df[col].to_numpy(dtype=object)
    out = np.empty(len(raw), dtype=float)
    for r, v in enumerate(raw):
        x = _coerce(v)
        if x is None and allow_empty:
            out[r] = ABSTAIN
        elif x in (0, 1):
            out[r] = float(x)
        else:
            allowed = "{0, 1, empty}" if allow_empty else "{0, 1}"
            raise VerdictError(f"{source}: row {r + 2} (item_id={df['item_id'].iloc[r]!r}): "
                               f"field '{col}': value {v!r} not in {allowed}")
    return out


def _coerce(v: object) -> int | None | str:
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
        return None
    s = str(v).strip()
    if s == "" or s.lower() in ("nan", "na", "<na>", "none"):
        return None
    try:
        f = float(s)
    except ValueError:
        return s
    return int(f) if f in (0.0, 1.0) else s


def _gold(df: pd.DataFrame, source: str) -> np.ndarray:
    return _parse_binary(df, "gold", source, allow_empty=False).astype(int)


def _vote_col(df: pd.DataFrame, col: str, source: str) -> np.ndarray:
    return _parse_binary(df, col, source, allow_empty=True)


def _float_col(df: pd.DataFrame, col: str, source: str) -> np.ndarray:
    vals = pd.to_numeric(df[col].replace("", np.nan), errors="coerce").to_numpy(dtype=float)
    bad = np.isnan(vals) & ~pd.Series(df[col]).replace("", np.nan).isna().to_numpy()
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise VerdictError(f"{source}: row {r + 2}: field '{col}': not a number: {df[col].iloc[r]!r}")
    return np.nan_to_num(vals, nan=0.0)
