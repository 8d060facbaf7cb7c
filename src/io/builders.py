"""The builder framework of a dataset spec's ``builder`` node (paper §2, Appendix J, Tables 18-20).

A builder turns raw records (:mod:`src.io.raw`) into balanced binary items with the columns of
:data:`ITEM_COLUMNS` (``gold`` 0 = supported, 1 = hallucinated), by one of the two constructions of
Table 18: matched pairs (:func:`pair`) or pooled claims (:func:`balance`). :class:`Fields` is a builder
written as a field mapping in the spec itself; builders written in Python are in :mod:`src.io.benchmarks`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from src.core.errors import RaimError
from src.core.textfiles import normal_id
from src.io.hub import HUB
from src.io.raw import (
    FORMATS,
    Duplicates,
    RawFilesMissing,
    RawRecordError,
    Rec,
    _found,
    _native,
    _searched,
    _string_list,
    read_records,
)

ITEM_COLUMNS: tuple[str, ...] = (
    "item_id",
    "cluster_id",
    "dataset",
    "frame",
    "question",
    "evidence",
    "candidate",
    "gold",
)
SUPPORTED, HALLUCINATED = 0, 1
_TAG = {SUPPORTED: "pos", HALLUCINATED: "neg"}  # Table 19: "0:pos and 0:neg"


class DatasetError(RaimError, ValueError):
    """A dataset spec or name that cannot be used (unknown name, bad builder node, bad source)."""


# --------------------------------------------------------------------------- shared helpers


def _stable_int(key: Any) -> int:
    return int.from_bytes(hashlib.sha1(str(key).encode("utf-8")).digest()[:8], "big")


def _ident(key: Any) -> str:
    """A short, stable, sortable token for an id: an integer (or its canonical decimal text) zero-padded, any
    other id a hash of its text: ``"1"``, ``"01"`` and ``"001"`` are three ids (only ``1`` and ``"1"`` are one)."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        return f"{int(key):05d}"
    if isinstance(key, str) and key.isascii() and key.isdigit() and str(int(key)) == key:
        return f"{int(key):05d}"
    return hashlib.sha1(normal_id(str(key)).encode("utf-8")).hexdigest()[:12]  # one id however accents compose


def pick(options: Sequence[Any], seed: int, key: Any) -> Any:
    """One of ``options``, chosen by an RNG seeded with (seed, key): stable per record."""
    rng = np.random.default_rng([seed, _stable_int(key)])
    return options[int(rng.integers(len(options)))]


def balance(items: list[dict], seed: int) -> list[dict]:
    """Pool both classes; subsample the majority to the minority count (seed; Appendix J)."""
    by_gold = {g: [it for it in items if it["gold"] == g] for g in (SUPPORTED, HALLUCINATED)}
    minority, majority = sorted(by_gold.values(), key=len)
    if not minority:
        raise ValueError("cannot balance: one class is empty")
    keep = np.sort(np.random.default_rng(seed).choice(len(majority), len(minority), replace=False))
    return minority + [majority[i] for i in keep]


MakeItem = Callable[..., dict]


def _maker(name: str, frame: str) -> MakeItem:
    """``make(key, gold, cluster, question, evidence, candidate, **extra)``: one item of
    dataset ``name``; ids ``<name>-<key>-pos|neg`` and ``<name>-<cluster>`` (Table 19)."""

    def make(key: Any, gold: int, cluster: Any, question: str, evidence: str, candidate: str, **extra: Any) -> dict:
        return {
            "item_id": f"{name}-{_ident(key)}-{_TAG[gold]}",
            "cluster_id": f"{name}-{_ident(cluster)}",
            "dataset": name,
            "frame": frame,
            "question": question,
            "evidence": evidence,
            "candidate": candidate,
            "gold": gold,
            **extra,
        }

    return make


def pair(
    make: MakeItem,
    key: Any,
    seed: int,
    question: str,
    evidence: str,
    supported: Sequence[str],
    hallucinated: Sequence[str],
    cluster: Any = None,
) -> list[dict]:
    """A matched pair (Table 19): one supported, one hallucinated candidate, same cluster.

    Returns [] when either side has no candidate; each side is ``pick``-ed with the seed.
    """
    if not supported or not hallucinated:
        return []
    cluster = key if cluster is None else cluster
    return [
        make(key, gold, cluster, question, evidence, pick(options, seed, (key, gold)))
        for gold, options in ((SUPPORTED, supported), (HALLUCINATED, hallucinated))
    ]


def _to_frame(items: list[dict]) -> pd.DataFrame:
    if not items:
        raise ValueError("builder produced no items")
    df = pd.DataFrame(items)
    extra = [c for c in df.columns if c not in ITEM_COLUMNS]
    df = df[list(ITEM_COLUMNS) + extra].sort_values("item_id", kind="stable").reset_index(drop=True)
    dup = df["item_id"][df["item_id"].duplicated()]
    if len(dup):
        raise ValueError(f"duplicate item_id {dup.iloc[0]!r}")
    return df.astype({"gold": "int64"})


BAD_RECORD_POLICIES = ("error", "drop")


class Builder:
    """What a dataset spec's ``builder`` node instantiates: raw file patterns, provenance, items."""

    files: tuple[str, ...] = ()
    public: str | None = None
    hub: str | None = None
    construction: str = "pooled"  # or "pairs" (Table 18)

    def items(self, name: str, frame: str, roots: Sequence[Path], seed: int) -> tuple[list[dict], Duplicates | None]:
        raise NotImplementedError


def _label_text(value: Any) -> str:
    """A label as text, so YAML ``1`` matches CSV "1", JSON 1 and 1.0; null reads "null"."""
    value = _native(value)
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer():  # 1.0 from a column with nulls reads as 1
        value = int(value)
    return str(value).lower() if isinstance(value, bool) else str(value).strip()


class LabelMap(dict):
    """A label map compared as text (``_label_text``): ``{"yes": 1, "no": 0, "n/a": null}``."""

    def __init__(self, labels: Mapping[Any, Any]):
        super().__init__({_label_text(k): v for k, v in labels.items()})

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(_label_text(key))


def _keys(node: Any, what: str, required: Sequence[str], optional: Sequence[str] = ()) -> Mapping:
    """``node`` as a mapping with ``required`` keys and no others than ``optional``."""
    if not isinstance(node, Mapping):
        raise DatasetError(f"`{what}` must be a mapping with {', '.join(required)}")
    lacking = [k for k in required if k not in node]
    unknown = [k for k in node if k not in (*required, *optional)]
    if lacking or unknown:
        raise DatasetError(
            f"`{what}`: "
            + "; ".join(([f"missing {lacking}"] if lacking else []) + ([f"unknown keys {unknown}"] if unknown else []))
        )
    return node


def _field(value: Any, what: str) -> str:
    """A field name of a builder node: a non-empty text (a null or a list would fail later, unnamed)."""
    if not isinstance(value, str) or not value:
        raise DatasetError(f"`{what}` is a field name, not {value!r}")
    return value


def _gold_map(node: Any) -> tuple[str, LabelMap]:
    gold = _keys(node, "gold", ("field", "labels"))
    _field(gold["field"], "gold.field")
    labels = gold["labels"] if isinstance(gold["labels"], Mapping) else {}
    bad = {k: v for k, v in labels.items() if not (v is None or (type(v) is int and v in (0, 1)))}
    if bad or not labels:
        raise DatasetError(
            f"`gold.labels` maps each raw label to 0 (supported), 1 (hallucinated) or null "
            f"(drop the record); got {bad or 'nothing'}"
        )
    return gold["field"], LabelMap(labels)


def _side(pairs: Mapping, side: str) -> tuple[str, str | None]:
    node = pairs[side]
    if isinstance(node, str):
        return _field(node, f"pairs.{side}"), None
    node = _keys(node, f"pairs.{side}", ("field",), ("split",))
    split = node.get("split")
    if split is not None and (not isinstance(split, str) or not split):
        raise DatasetError(f"`pairs.{side}.split` is a separator text, not {split!r}")
    return _field(node["field"], f"pairs.{side}.field"), split


def _extra(col: str, node: Any) -> tuple[str, LabelMap | None, bool]:
    if isinstance(node, str):
        return _field(node, f"extras.{col}"), None, False
    node = _keys(node, f"extras.{col}", ("field",), ("labels", "optional"))
    _field(node["field"], f"extras.{col}.field")
    labels = node.get("labels")
    return node["field"], None if labels is None else LabelMap(labels), bool(node.get("optional", False))


def _fields(node: str | Sequence[str] | None) -> tuple[str, ...]:
    return () if node is None else (node,) if isinstance(node, str) else tuple(node)


def _jsonable(value: Any) -> Any:
    return value.tolist() if isinstance(value, (np.ndarray, np.generic)) else str(value)


def _content(rec: Rec) -> str:
    """A digest of a whole raw record: identical records have the same one."""
    text = json.dumps(rec.data, sort_keys=True, ensure_ascii=False, default=_jsonable)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class Fields(Builder):
    """A dataset as a field mapping over raw records (Appendix J's constructions, from config).

    ``path`` (a glob: every match in sorted order, or the last with ``glob: last``) is read as
    ``format`` (json, jsonl, csv, parquet; default from the suffix; ``records``: the dotted key of
    a JSON object's record list). Fields are dotted paths (``meta.claim_title``); a list of strings
    is joined with ``join``. ``evidence`` absent: ungrounded (evidence ""). Either ``gold:
    {field, labels}`` (labels compared as text: 0, 1, or null = drop the record) with classes
    pooled and, with ``balance``, the majority subsampled with the seed (Table 20); or ``pairs:
    {supported: side, hallucinated: side}`` (a side: a field, or ``{field, split}`` for several
    candidates, one picked with the seed) giving matched pairs (Table 19). ``cluster``: a field
    (or several), else the record; ``id``: a field, else the record's position; ``filter``:
    {field: value or [values]}; ``extras`` (pooled only): {column: field or {field, labels,
    optional}}, an optional one left out when the first record lacks it.
    A record repeating an earlier ``id`` (without ``id``: an identical record) is dropped and
    reported; the first is kept. ``on_bad_record``: ``error`` (the default) stops the build at the
    first record that cannot be used (a missing or empty field, an unknown label, a pair side with
    no candidate, an unreadable JSON Lines line), naming its file, line and field; ``drop`` leaves
    such records out, counts them and names the first few (the summary's ``bad_records``).
    """

    def __init__(
        self,
        path: str,
        question: str,
        candidate: str | None = None,
        evidence: str | None = None,
        gold: Mapping[str, Any] | None = None,
        pairs: Mapping[str, Any] | None = None,
        cluster: str | Sequence[str] | None = None,
        id: str | None = None,  # noqa: A002
        filter: Mapping[str, Any] | None = None,
        extras: Mapping[str, Any] | None = None,  # noqa: A002
        join: str = "\n\n",
        balance: bool = True,
        format: str | None = None,  # noqa: A002
        records: str | None = None,
        glob: str = "all",
        public: str | None = None,
        hub: str | None = None,
        on_bad_record: str = "error",
    ):
        for what, value, optional in (
            ("path", path, False),
            ("question", question, False),
            ("candidate", candidate, True),
            ("evidence", evidence, True),
            ("id", id, True),
            ("join", join, False),
            ("records", records, True),
        ):
            if not (value is None and optional) and not (isinstance(value, str) and (value or what == "join")):
                raise DatasetError(
                    f"`{what}` is {'a field name' if what not in ('path', 'join', 'records') else 'a text'}"
                    f"{' or absent' if optional else ''}, not {value!r}"
                )
        if (
            cluster is not None
            and not (isinstance(cluster, str) and cluster)
            and not (isinstance(cluster, (list, tuple)) and cluster and all(isinstance(c, str) and c for c in cluster))
        ):
            raise DatasetError(f"`cluster` is a field name or a list of them, not {cluster!r}")
        if (gold is None) == (pairs is None):
            raise DatasetError(
                "give `gold` (a label per record: pooled claims) or `pairs` (a supported and a "
                "hallucinated candidate per record: matched pairs), not both or neither"
            )
        if (gold is None) != (candidate is None) or (pairs is not None and extras):
            raise DatasetError(
                "`gold` needs `candidate`; with `pairs` the candidates are its two sides and there are no `extras`"
            )
        if format not in (None, *FORMATS.values()) or glob not in ("all", "last"):
            raise DatasetError(f"`format` is one of {sorted(set(FORMATS.values()))}; `glob` is all or last")
        if hub is not None and hub not in HUB:
            raise DatasetError(f"`hub` is one of {sorted(HUB)}, not {hub!r}")
        if on_bad_record not in BAD_RECORD_POLICIES:
            raise DatasetError(f"`on_bad_record` is one of {list(BAD_RECORD_POLICIES)}, not {on_bad_record!r}")
        self.on_bad_record, self.dropped = on_bad_record, Duplicates()
        self.path, self.format, self.records, self.glob = path, format, records, glob
        self.question, self.candidate, self.evidence, self.join = question, candidate, evidence, join
        self.gold = None if gold is None else _gold_map(gold)
        self.sides = (
            None
            if pairs is None
            else {
                g: _side(_keys(pairs, "pairs", ("supported", "hallucinated")), s)
                for g, s in ((SUPPORTED, "supported"), (HALLUCINATED, "hallucinated"))
            }
        )
        self.cluster, self.id, self.balanced = _fields(cluster), id, bool(balance)
        self.filter = {
            f: {_label_text(v) for v in (want if isinstance(want, list) else [want])}
            for f, want in (filter or {}).items()
        }
        self.extras = {col: _extra(col, node) for col, node in (extras or {}).items()}
        self.files, self.public, self.hub = (path,), public, hub
        self.construction = "pooled" if pairs is None else "pairs"

    def required(self) -> list[str]:
        """Fields every record needs (a CSV header is checked for them)."""
        sides = [f for f, _ in self.sides.values()] if self.sides else [self.gold[0], self.candidate]
        extras = [f for f, _, optional in self.extras.values() if not optional]
        return [f for f in (*self.filter, self.question, *sides, self.evidence, *self.cluster, self.id, *extras) if f]

    def items(self, name: str, frame: str, roots: Sequence[Path], seed: int) -> tuple[list[dict], Duplicates]:
        self.dropped = Duplicates()
        records = self._read(roots)
        if not records:
            raise RawRecordError(self.path, None, f"no usable record ({self.dropped.count} dropped as bad)")
        extras = {c: e for c, e in self.extras.items() if not e[2] or _has(records[0], e[0])}
        make, out, dups, seen = _maker(name, frame), [], Duplicates(), {}
        for index, rec in enumerate(records):
            try:
                if not self._selected(rec):
                    continue
                key = _scalar(rec, self.id) if self.id else index
                ident = _ident(key) if self.id else _content(rec)
                if ident in seen:
                    dups.add(str(key) if self.id else f"{rec.where} (= {seen[ident]})")
                    continue
                new = self._items(make, key, rec, seed, extras)
            except RawRecordError as err:
                if self.on_bad_record == "error":
                    raise
                self.dropped.add(str(err))
                continue
            seen[ident] = rec.where
            out += new
        return (balance(out, seed) if self.gold is not None and self.balanced else out), dups

    def _read(self, roots: Sequence[Path]) -> list[Rec]:
        found = _found(roots, self.path)
        if found is None:
            raise RawFilesMissing(f"expected raw file {self.path} is absent from {_searched(roots)}")
        root, paths = found
        bad = self.dropped if self.on_bad_record == "drop" else None
        return [
            rec
            for p in (paths[-1:] if self.glob == "last" else paths)
            for rec in read_records(p, root, self.format, self.records, self.required(), bad=bad)
        ]

    def _selected(self, rec: Rec) -> bool:
        return all(_label_text(_raw(rec, f)) in wanted for f, wanted in self.filter.items())

    def _items(self, make: MakeItem, key: Any, rec: Rec, seed: int, extras: Mapping) -> list[dict]:
        if self.gold is not None:
            gold = _label(rec, *self.gold)
            if gold is None:
                return []
        question, evidence = self._text(rec, self.question), self._text(rec, self.evidence) if self.evidence else ""
        cluster = self._cluster(rec, key)
        if self.sides is not None:
            sup, hal = (self._options(rec, *self.sides[g]) for g in (SUPPORTED, HALLUCINATED))
            return pair(make, key, seed, question, evidence, sup, hal, cluster=cluster)
        values = {
            c: _label(rec, f, labels) if labels is not None else _value(rec, f) for c, (f, labels, _) in extras.items()
        }
        return [make(key, gold, cluster, question, evidence, self._text(rec, self.candidate), **values)]

    def _cluster(self, rec: Rec, key: Any) -> Any:
        """The cluster key: the ``cluster`` field's value (a tuple for several), else the record's key."""
        values = tuple(_scalar(rec, f) for f in self.cluster)
        return key if not values else values[0] if len(values) == 1 else values

    def _text(self, rec: Rec, path: str) -> str:
        r, k = rec.at(path)
        return r.joined(k, self.join)

    def _options(self, rec: Rec, path: str, split: str | None) -> list[str]:
        """A pair side's candidates: one text, a list, or a text split on ``split``."""
        r, k = rec.at(path)
        parts = _string_list(r.raw(k)) if split is None else r.text(k).split(split)
        options = [r.text(k)] if parts is None else [p.strip() for p in parts if p.strip()]
        if not options:  # a record without a candidate on one side makes no pair: never dropped unsaid
            raise r._fail(
                k, "an empty list: no candidate" if split is None else f"no candidate (splits on {split!r} to nothing)"
            )
        return options


def _raw(rec: Rec, path: str) -> Any:
    r, k = rec.at(path)
    return r.raw(k)


def _scalar(rec: Rec, path: str) -> str | int | float:
    r, k = rec.at(path)
    return r.scalar(k)


def _label(rec: Rec, path: str, labels: Mapping) -> Any:
    r, k = rec.at(path)
    return r.label(k, labels)


def _value(rec: Rec, path: str) -> Any:
    """An extra column's value as JSON can hold it: a NaN (a Parquet / pandas null) is null, ±inf an error."""
    value = _native(_raw(rec, path))
    if isinstance(value, float) and not np.isfinite(value):
        if np.isnan(value):
            return None
        r, k = rec.at(path)
        raise r._fail(k, f"{value!r} is not a finite number (JSON has no infinity)")
    return value.tolist() if isinstance(value, np.ndarray) else value


def _has(rec: Rec, path: str) -> bool:
    try:
        _raw(rec, path)
    except RawRecordError:
        return False
    return True


BINARY = {0: 0, 1: 1}
