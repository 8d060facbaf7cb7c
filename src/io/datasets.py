"""Real benchmarks -> balanced binary items (paper §2, Appendix J, Tables 18-20).

Every benchmark is reduced to items with the columns of ``ITEM_COLUMNS``; ``gold``
is 0 for a supported candidate and 1 for a hallucinated/unsupported one. Two
constructions (Table 18):

* matched pairs (MedHallu, RAGTruth, TruthfulQA, FActScore): one supported and one
  hallucinated candidate per source record, sharing question, evidence and cluster;
* pooled claims (WiCE, XSum, CNN/DM, ExpertQA, TRIVIA+): classes pooled across
  documents and the majority subsampled to the minority count (seed 0), the
  cluster being the shared document.

A dataset is a spec, ``conf/dataset/<name>.yaml`` (``name``, ``title``, ``frame``,
``paper_n`` and a ``builder`` node, instantiated only through an allow-list of RAIM's builders): either
:class:`Fields`, a field mapping over one JSON / JSON Lines / CSV / Parquet file, or
:class:`Registered`, a builder written in Python (ExpertQA, RAGTruth, FActScore).
Raw paths are relative to the raw roots, searched in order: the shipped snapshot
(``--raw-dir``, ``RAIM_RAW_DIR``) then the user's folder (``--own-dir``).

Output is deterministic: the same raw files and seed give the same bytes.
``python -m src.data --raw-dir DIR --own-dir DIR --out-dir OUT`` writes
``OUT/<name>.jsonl`` and ``OUT/summary/<name>.json`` (the Table 18 columns) per set.
"""
from __future__ import annotations

import ast
import contextlib
import csv
import hashlib
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from src.core.errors import ArgumentParser, RaimError, one_line
from src.io.config import Targets, check_keys, load_yaml, refuse_interpolation
from src.io.files import StrictJSONError, atomic_write_text, check_regular, loads_strict
from src.io.paths import conf_group

ITEM_COLUMNS: tuple[str, ...] = (
    "item_id", "cluster_id", "dataset", "frame", "question", "evidence", "candidate", "gold",
)
SUPPORTED, HALLUCINATED = 0, 1
_TAG = {SUPPORTED: "pos", HALLUCINATED: "neg"}  # Table 19: "0:pos and 0:neg"
CONF_DIR = conf_group("dataset")
SHIPPED_DIR, OWN_DIR = "data/shipped", "data/own"


class DatasetError(RaimError, ValueError):
    """A dataset spec or name that cannot be used (unknown name, bad builder node, bad source)."""


class RawFilesMissing(RaimError, FileNotFoundError):
    """A dataset's raw file is in none of the raw roots; the message names the folders searched."""


# --------------------------------------------------------------------------- raw records

class RawRecordError(RaimError, ValueError):
    """A raw record that cannot be used; the message names file, line/row and field."""

    def __init__(self, where: str, field: str | None, problem: str):
        self.where, self.field, self.problem = where, field, problem
        head = f"{where}: field '{field}'" if field else where
        super().__init__(f"{head}: {problem}")


@dataclass(frozen=True)
class Rec:
    """One raw record (or a nested object in it) that reports its location on error."""

    data: Mapping[str, Any]
    where: str
    prefix: str = ""

    def _fail(self, key: str, problem: str) -> RawRecordError:
        return RawRecordError(self.where, f"{self.prefix}{key}", problem)

    def at(self, path: str) -> tuple[Rec, str]:
        """The (nested) record holding dotted ``path``, and its last key (``meta.claim_title``)."""
        if path in self.data or "." not in path:
            return self, path
        head, rest = path.split(".", 1)
        return self.child(head).at(rest)

    def raw(self, key: str) -> Any:
        if key not in self.data:
            raise self._fail(key, "missing")
        return self.data[key]

    def text(self, key: str) -> str:
        """A non-empty string field."""
        value = self.raw(key)
        if not isinstance(value, str):
            raise self._fail(key, f"expected a string, got {type(value).__name__}")
        if not value.strip():
            raise self._fail(key, "empty")
        return value

    def scalar(self, key: str) -> str | int | float:
        """A non-empty string or a number (an id, a cluster key)."""
        value = _native(self.raw(key))
        if isinstance(value, str):
            return self.text(key)
        if isinstance(value, (int, float)) and value == value:  # not NaN
            return value
        raise self._fail(key, f"expected a string or a number, got {type(value).__name__}")

    def joined(self, key: str, sep: str) -> str:
        """A non-empty string, or a list of strings (or a string holding one, as WiCE
        publishes) joined with ``sep``."""
        value = self.raw(key)
        parts = _string_list(value)
        if parts is None:
            if isinstance(value, (list, tuple, np.ndarray)):
                raise self._fail(key, "expected a string or a list of strings")
            return self.text(key)
        if not _join(parts, sep):
            raise self._fail(key, "empty")
        return _join(parts, sep)

    def literal(self, key: str) -> Any:
        """A field that may be serialised as a Python literal string (WiCE)."""
        value = self.raw(key)
        if isinstance(value, str) and value.lstrip().startswith(("[", "{", "(")):
            try:
                return ast.literal_eval(value)
            except (ValueError, SyntaxError) as err:
                raise self._fail(key, f"unreadable literal ({err})") from None
        return value

    def texts(self, key: str) -> list[str]:
        """A list of strings (possibly empty)."""
        value = self.literal(key)
        if isinstance(value, np.ndarray):
            value = value.tolist()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._fail(key, "expected a list of strings")
        return value

    def child(self, key: str) -> Rec:
        value = self.literal(key)
        if not isinstance(value, Mapping):
            raise self._fail(key, f"expected an object, got {type(value).__name__}")
        return Rec(value, self.where, f"{self.prefix}{key}.")

    def children(self, key: str, *, allow_null: bool = False) -> list[Rec]:
        """A list of objects; ``None`` reads as empty when ``allow_null``."""
        value = self.literal(key)
        if value is None and allow_null:
            return []
        if not isinstance(value, list):
            raise self._fail(key, f"expected a list, got {type(value).__name__}")
        out = []
        for i, v in enumerate(value):
            if not isinstance(v, Mapping):
                raise self._fail(f"{key}[{i}]", "expected an object")
            out.append(Rec(v, self.where, f"{self.prefix}{key}[{i}]."))
        return out

    def label(self, key: str, mapping: Mapping[Any, int | None]) -> int | None:
        """Map a label through ``mapping`` (None = drop); unknown values are errors."""
        value = self.raw(key)
        norm = value.strip() if isinstance(value, str) else value
        try:
            return mapping[norm]
        except (KeyError, TypeError):
            known = ", ".join(repr(k) for k in mapping)
            raise self._fail(key, f"unknown value {_native(value)!r} (label map: {known})") from None


def _string_list(value: Any) -> list[str] | None:
    """``value`` as a list of strings (a list, an array, or a string holding a list literal), else None."""
    if isinstance(value, str):
        text = value.strip()
        if not (text.startswith("[") and text.endswith("]")):
            return None
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _rel(path: Path, root: Path | None) -> str:
    """``path`` as named in messages: relative to its raw root (absolute when given so)."""
    if root is None:
        return str(path)
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _nonempty(records: list[Rec], name: str) -> list[Rec]:
    if not records:
        raise RawRecordError(name, None, "no records (empty file)")
    return records


def utf8_error(path: Path, name: str) -> RawRecordError | None:
    """Where a file stops being UTF-8 text (line and byte), or None when it is valid."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        return RawRecordError(f"{name} line {line}", None,
                              f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})")
    return None


@contextlib.contextmanager
def _readable(path: Path, name: str):
    """Turn a read failure (bytes that are not UTF-8, a file that is not Parquet) into one clear line."""
    check_regular(path, "a data file")
    try:
        yield
    except UnicodeDecodeError:
        raise (utf8_error(path, name) or RawRecordError(name, None, "not UTF-8 text")) from None
    except (ValueError, OSError) as e:
        if isinstance(e, (RawRecordError, FileNotFoundError, IsADirectoryError, PermissionError)):
            raise
        raise RawRecordError(name, None, f"unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def read_jsonl(path: Path, root: Path | None, bad: Duplicates | None = None) -> list[Rec]:
    """JSON Lines with 1-based line numbers in every error. ``bad`` (a dataset's ``on_bad_record: drop``): a line
    that is not a JSON object is added there and skipped instead (the file must still hold one record)."""
    name, out = _rel(path, root), []
    with _readable(path, name), open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{name} line {n}"
            try:
                obj = loads_strict(line)
                if not isinstance(obj, dict):
                    raise RawRecordError(where, None, "expected a JSON object")
            except json.JSONDecodeError as err:
                problem = RawRecordError(where, None, f"unreadable JSON ({err.msg}, column {err.colno})")
            except StrictJSONError as err:
                problem = RawRecordError(where, None, f"unreadable JSON ({err.msg})")
            except RawRecordError as err:
                problem = err
            else:
                out.append(Rec(obj, where))
                continue
            if bad is None:
                raise problem from None
            bad.add(str(problem))
    return _nonempty(out, name) if bad is None or not bad.count else out


def read_csv(path: Path, root: Path | None, required: Sequence[str]) -> list[Rec]:
    """CSV with a header; rows numbered from 1 after the header."""
    name = _rel(path, root)
    csv.field_size_limit(2**31 - 1)
    with _readable(path, name), open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        for col in required:  # a dotted path needs its first part
            if col not in header and col.split(".", 1)[0] not in header:
                raise RawRecordError(f"{name} header", col, "missing column")
        out = [Rec(row, f"{name} row {n}") for n, row in enumerate(reader, 1)]
    return _nonempty(out, name)


def read_parquet(path: Path, root: Path | None) -> list[Rec]:
    """Parquet rows numbered from 1."""
    name = _rel(path, root)
    with _readable(path, name):
        rows = pd.read_parquet(path).to_dict("records")
    return _nonempty([Rec(r, f"{name} row {n}") for n, r in enumerate(rows, 1)], name)


def _record_list(doc: Any, name: str, key: str | None) -> list:
    """The list of records in a JSON document: the document itself, the list at dotted
    ``key``, or the one list an object holds."""
    if key:
        for part in key.split("."):
            if not isinstance(doc, Mapping) or part not in doc:
                raise RawRecordError(name, key, "missing (the builder's `records` key)")
            doc = doc[part]
    elif isinstance(doc, Mapping):
        lists = [k for k, v in doc.items() if isinstance(v, list)]
        if len(lists) != 1:
            raise RawRecordError(name, None, f"a JSON object holding {len(lists)} lists: "
                                 "name the one with the records (the builder's `records` key)")
        doc = doc[lists[0]]
    if not isinstance(doc, list):
        raise RawRecordError(name, key, f"expected a list of records, got {type(doc).__name__}")
    return doc


def read_json(path: Path, root: Path | None, records: str | None = None) -> list[Rec]:
    """A JSON list of records, or an object holding one (``records``: its dotted key);
    records numbered from 1."""
    name = _rel(path, root)
    with _readable(path, name), open(path, encoding="utf-8") as fh:
        try:
            doc = loads_strict(fh.read())
        except json.JSONDecodeError as err:
            raise RawRecordError(f"{name} line {err.lineno}", None,
                                 f"unreadable JSON ({err.msg}, column {err.colno})") from None
        except StrictJSONError as err:
            raise RawRecordError(name, None, f"unreadable JSON ({err.msg})") from None
    out = []
    for n, obj in enumerate(_record_list(doc, name, records), 1):
        if not isinstance(obj, Mapping):
            raise RawRecordError(f"{name} record {n}", None, "expected a JSON object")
        out.append(Rec(obj, f"{name} record {n}"))
    return _nonempty(out, name)


FORMATS = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet",
           ".pq": "parquet"}


def _sniffed(path: Path, fmt: str | None) -> str | None:
    """A ``.json`` file whose first non-blank line is a whole JSON object with more content after it holds JSON
    Lines (one record a line), whatever its name says: a JSON document would end with that object. Any other
    file keeps the format of its suffix (a pretty-printed or one-line JSON document stays JSON)."""
    if fmt != "json" or not path.is_file():
        return fmt
    try:
        with open(path, encoding="utf-8") as fh:
            lines = (ln.strip() for ln in fh)
            first = next((ln for ln in lines if ln), "")
            more = next((ln for ln in lines if ln), "")
        if not (first.startswith("{") and more.startswith("{")):
            return fmt
        return "jsonl" if isinstance(json.loads(first), dict) else fmt
    except (ValueError, OSError):  # not one object on its first line (or unreadable): read_json says why
        return fmt


def read_records(path: Path, root: Path | None, fmt: str | None = None, records: str | None = None,
                 required: Sequence[str] = (), bad: Duplicates | None = None) -> list[Rec]:
    """Records of a JSON, JSON Lines, CSV or Parquet file (``fmt``, else from the suffix); ``bad``: see
    :func:`read_jsonl`."""
    fmt = fmt or _sniffed(path, FORMATS.get(path.suffix.lower()))
    if fmt == "json":
        return read_json(path, root, records)
    if fmt == "jsonl":
        return read_jsonl(path, root, bad)
    if fmt == "csv":
        return read_csv(path, root, required)
    if fmt == "parquet":
        return read_parquet(path, root)
    raise RawRecordError(_rel(path, root), None, f"unknown format (suffix {path.suffix!r}): give the builder "
                         f"`format` ({', '.join(sorted(set(FORMATS.values())))})")


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
    return hashlib.sha1(str(key).encode("utf-8")).hexdigest()[:12]


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


def _join(parts: Iterable[str], sep: str = "\n\n") -> str:
    return sep.join(p.strip() for p in parts if p.strip())


MakeItem = Callable[..., dict]


def _maker(name: str, frame: str) -> MakeItem:
    """``make(key, gold, cluster, question, evidence, candidate, **extra)``: one item of
    dataset ``name``; ids ``<name>-<key>-pos|neg`` and ``<name>-<cluster>`` (Table 19)."""
    def make(key: Any, gold: int, cluster: Any, question: str, evidence: str,
             candidate: str, **extra: Any) -> dict:
        return {"item_id": f"{name}-{_ident(key)}-{_TAG[gold]}", "cluster_id": f"{name}-{_ident(cluster)}",
                "dataset": name, "frame": frame, "question": question, "evidence": evidence,
                "candidate": candidate, "gold": gold, **extra}
    return make


def _native(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def pair(make: MakeItem, key: Any, seed: int, question: str, evidence: str,
         supported: Sequence[str], hallucinated: Sequence[str], cluster: Any = None) -> list[dict]:
    """A matched pair (Table 19): one supported, one hallucinated candidate, same cluster.

    Returns [] when either side has no candidate; each side is ``pick``-ed with the seed.
    """
    if not supported or not hallucinated:
        return []
    cluster = key if cluster is None else cluster
    return [make(key, gold, cluster, question, evidence, pick(options, seed, (key, gold)))
            for gold, options in ((SUPPORTED, supported), (HALLUCINATED, hallucinated))]


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


# --------------------------------------------------------------------------- raw roots

def raw_roots(raw_dir: str | Path | Sequence[str | Path], own_dir: str | Path | None = None) -> list[Path]:
    """The raw roots, searched in order: ``raw_dir`` (one folder or several), then ``own_dir``."""
    roots = [Path(raw_dir)] if isinstance(raw_dir, (str, Path)) else [Path(r) for r in raw_dir]
    return roots + ([Path(own_dir)] if own_dir else [])


def _found(roots: Sequence[Path], pattern: str) -> tuple[Path | None, list[Path]] | None:
    """The files matching ``pattern`` (sorted) in the first root holding any, and that root;
    an absolute pattern is used as is (root None)."""
    path = Path(pattern)
    if path.is_absolute():
        anchor = Path(path.anchor)
        files = sorted(p for p in anchor.glob(str(path.relative_to(anchor))) if p.is_file())
        return (None, files) if files else None
    for root in roots:
        files = sorted(p for p in root.glob(pattern) if p.is_file())
        if files:
            return root, files
    return None


def _file(roots: Sequence[Path], pattern: str) -> tuple[Path, Path | None]:
    """(path, root) of the raw file matching ``pattern`` (the last in sorted order for a glob)."""
    found = _found(roots, pattern)
    if found is None:
        raise RawFilesMissing(f"expected raw file {pattern} is absent from {_searched(roots)}")
    return found[1][-1], found[0]


def _searched(roots: Sequence[Path]) -> str:
    return ", ".join(f"{r}{'' if r.is_dir() else ' (absent)'}" for r in roots) + " (searched in order)"


# --------------------------------------------------------------------------- builders: the spec's `builder` node

@dataclass
class Duplicates:
    """Records dropped: duplicates (same ``id``, or identical records), or bad records under ``on_bad_record:
    drop``; the count and the first few."""

    count: int = 0
    first: list[str] = field(default_factory=list)

    def add(self, label: str) -> None:
        self.count += 1
        if len(self.first) < 5:
            self.first.append(label)


BAD_RECORD_POLICIES = ("error", "drop")


class Builder:
    """What a dataset spec's ``builder`` node instantiates: raw file patterns, provenance, items."""

    files: tuple[str, ...] = ()
    public: str | None = None
    hub: str | None = None
    construction: str = "pooled"  # or "pairs" (Table 18)

    def items(self, name: str, frame: str, roots: Sequence[Path],
              seed: int) -> tuple[list[dict], Duplicates | None]:
        raise NotImplementedError


@dataclass(frozen=True)
class Code:
    """A builder written in Python: ``fn(roots, seed, make) -> items`` and its raw files."""

    fn: Callable[[Sequence[Path], int, MakeItem], list[dict]]
    files: tuple[str, ...]
    public: str
    construction: str


BUILDERS: dict[str, Code] = {}


def register(name: str, *, files: Sequence[str], public: str, construction: str):
    """Register ``fn(roots, seed, make) -> items`` as the Python builder ``name``."""
    def deco(fn: Callable[[Sequence[Path], int, MakeItem], list[dict]]):
        BUILDERS[name] = Code(fn, tuple(files), public, construction)
        return fn
    return deco


class Registered(Builder):
    """A builder that needs code (``{_target_: src.io.datasets.Registered, name: expertqa}``)."""

    def __init__(self, name: str):
        if name not in BUILDERS:
            raise DatasetError(f"no registered builder {name!r}; registered: {', '.join(sorted(BUILDERS))}")
        self.code = BUILDERS[name]
        self.files, self.public, self.construction = self.code.files, self.code.public, self.code.construction

    def items(self, name: str, frame: str, roots: Sequence[Path], seed: int) -> tuple[list[dict], None]:
        return self.code.fn(roots, seed, _maker(name, frame)), None


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
        raise DatasetError(f"`{what}`: " + "; ".join(
            ([f"missing {lacking}"] if lacking else []) + ([f"unknown keys {unknown}"] if unknown else [])))
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
        raise DatasetError(f"`gold.labels` maps each raw label to 0 (supported), 1 (hallucinated) or null "
                           f"(drop the record); got {bad or 'nothing'}")
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

    def __init__(self, path: str, question: str, candidate: str | None = None, evidence: str | None = None,
                 gold: Mapping[str, Any] | None = None, pairs: Mapping[str, Any] | None = None,
                 cluster: str | Sequence[str] | None = None, id: str | None = None,  # noqa: A002
                 filter: Mapping[str, Any] | None = None, extras: Mapping[str, Any] | None = None,  # noqa: A002
                 join: str = "\n\n", balance: bool = True, format: str | None = None,  # noqa: A002
                 records: str | None = None, glob: str = "all", public: str | None = None, hub: str | None = None,
                 on_bad_record: str = "error"):
        for what, value, optional in (("path", path, False), ("question", question, False),
                                      ("candidate", candidate, True), ("evidence", evidence, True), ("id", id, True),
                                      ("join", join, False), ("records", records, True)):
            if not (value is None and optional) and not (isinstance(value, str) and (value or what == "join")):
                raise DatasetError(f"`{what}` is {'a field name' if what not in ('path', 'join', 'records') else 'a text'}"
                                   f"{' or absent' if optional else ''}, not {value!r}")
        if cluster is not None and not (isinstance(cluster, str) and cluster) and not (
                isinstance(cluster, (list, tuple)) and cluster and all(isinstance(c, str) and c for c in cluster)):
            raise DatasetError(f"`cluster` is a field name or a list of them, not {cluster!r}")
        if (gold is None) == (pairs is None):
            raise DatasetError("give `gold` (a label per record: pooled claims) or `pairs` (a supported and a "
                               "hallucinated candidate per record: matched pairs), not both or neither")
        if (gold is None) != (candidate is None) or (pairs is not None and extras):
            raise DatasetError("`gold` needs `candidate`; with `pairs` the candidates are its two sides and "
                               "there are no `extras`")
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
        self.sides = None if pairs is None else {g: _side(_keys(pairs, "pairs", ("supported", "hallucinated")), s)
                                                 for g, s in ((SUPPORTED, "supported"), (HALLUCINATED, "hallucinated"))}
        self.cluster, self.id, self.balanced = _fields(cluster), id, bool(balance)
        self.filter = {f: {_label_text(v) for v in (want if isinstance(want, list) else [want])}
                       for f, want in (filter or {}).items()}
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
        return [rec for p in (paths[-1:] if self.glob == "last" else paths)
                for rec in read_records(p, root, self.format, self.records, self.required(), bad=bad)]

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
        values = {c: _label(rec, f, labels) if labels is not None else _value(rec, f)
                  for c, (f, labels, _) in extras.items()}
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
            raise r._fail(k, "an empty list: no candidate" if split is None
                          else f"no candidate (splits on {split!r} to nothing)")
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


# --------------------------------------------------------------------------- Hugging Face hub

def _load_hub(path: str, config: str | None, split: str, revision: str | None = None):
    try:
        import datasets  # lazy: optional, network only
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "source='hub' needs the optional `datasets` package (pip install datasets) "
            "and access to huggingface.co; otherwise use source='local'") from None
    try:
        return datasets.load_dataset(path, config, split=split, revision=revision)
    except Exception as err:  # offline, gated, renamed ...
        raise RuntimeError(f"could not load {path!r} from the Hugging Face hub: {err}") from err


def _write_jsonl_rows(rows: Iterable[Mapping], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in rows))


def _write_csv_rows(rows: list[Mapping], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def _hub_medhallu(raw_dir: Path) -> None:
    ds = _load_hub("UTAustin-AIHealth/MedHallu", "pqa_labeled", "train",
                   revision="515060458a945c633debc6fd5baac7764416b724")
    _write_jsonl_rows(ds, raw_dir / "medhallu" / "medhallu_pqa_labeled.jsonl")


def _hub_truthfulqa(raw_dir: Path) -> None:
    ds = _load_hub("truthfulqa/truthful_qa", "generation", "validation")
    rows = [{"Type": r["type"], "Category": r["category"], "Question": r["question"],
             "Best Answer": r["best_answer"], "Correct Answers": "; ".join(r["correct_answers"]),
             "Incorrect Answers": "; ".join(r["incorrect_answers"]), "Source": r["source"]} for r in ds]
    _write_csv_rows(rows, raw_dir / "truthfulqa" / "TruthfulQA.csv")


def _hub_aggrefact(raw_dir: Path) -> None:
    """LLM-AggreFact's AggreFact-XSum/-CNN test rows, written in the AggreFact SOTA layout."""
    ds = _load_hub("lytang/LLM-AggreFact", None, "test")
    origin = {"AggreFact-XSum": "xsum", "AggreFact-CNN": "cnndm"}
    rows = [{"dataset": r["dataset"], "origin": origin[r["dataset"]], "doc": r["doc"], "summary": r["claim"],
             "label": r["label"], "cut": "test", "model_name": ""} for r in ds if r["dataset"] in origin]
    _write_csv_rows(rows, raw_dir / AGGREFACT_CSV)


AGGREFACT_CSV = "aggrefact/aggre_fact_sota.csv"
HUB: dict[str, Callable[[Path], None]] = {"medhallu": _hub_medhallu, "truthfulqa": _hub_truthfulqa,
                                          "aggrefact": _hub_aggrefact}


# --------------------------------------------------------------------------- builders that need code

EXPERTQA_LABELS = {"Complete": SUPPORTED, "Partial": HALLUCINATED, "Incomplete": HALLUCINATED,
                   "Missing": None, "N/A": None, None: None}


@register("expertqa", construction="pooled",
          files=[f"expertqa/lfqa/{s}.jsonl" for s in ("rand_test", "rand_val", "domain_test", "domain_val")],
          public="https://github.com/chaitanyamalaviya/ExpertQA (data/lfqa/*.jsonl)")
def build_expertqa(roots: Sequence[Path], seed: int, make: MakeItem) -> list[dict]:
    """ExpertQA claims (Appendix J): union of ``lfqa/*.jsonl``, deduplicated on
    (question, answer system, claim_string), first occurrence kept.

    Label mapping: ``support`` Complete -> gold 0; Partial / Incomplete -> gold 1;
    Missing, N/A and null dropped, as are claims with empty evidence. Claim frame:
    question = candidate = claim, evidence = the evidence passages joined. Classes
    pooled, supported subsampled with the seed; cluster = the ExpertQA question.
    The paper's n = 1462 drew on the train split, absent here: the val+test files
    give 590 unsupported claims and so 1180 items (more if train files are added).
    """
    seen: set[tuple[str, str, str]] = set()
    items: list[dict] = []
    root, paths = _found(roots, "expertqa/lfqa/*.jsonl") or (None, [])
    for path in paths:
        for r in read_jsonl(path, root):
            question, answers = r.text("question"), r.child("answers")
            for system in sorted(answers.data):
                for c in answers.child(system).children("claims", allow_null=True):
                    key = (question, system, c.text("claim_string"))
                    if key in seen:
                        continue
                    seen.add(key)
                    gold, evidence = c.label("support", EXPERTQA_LABELS), c.texts("evidence")
                    if gold is not None and evidence:
                        items.append(make(len(items), gold, question, key[2], _join(evidence), key[2]))
    return balance(items, seed)


RAGTRUTH_QUALITY = {"good": True, "incorrect_refusal": False, "truncated": False}


@register("ragtruth", construction="pairs", files=["ragtruth/response.jsonl", "ragtruth/source_info.jsonl"],
          public="https://github.com/ParticleMedia/RAGTruth (dataset/response.jsonl, dataset/source_info.jsonl)")
def build_ragtruth(roots: Sequence[Path], seed: int, make: MakeItem) -> list[dict]:
    """RAGTruth QA subtask as matched pairs (Appendix J, Table 18: 839 q -> 681 pairs).

    Label mapping: a response with no annotated span (``labels`` empty) -> gold 0;
    with at least one span (any ``label_type``) -> gold 1. Only ``quality == 'good'``
    responses are used (as in the RAGTruth baseline). Per QA source, one response of
    each class is picked with the seed; sources lacking either class are dropped.
    Question and evidence (``passages``) from ``source_info``; cluster = source_id.
    """
    sources = {}
    for r in read_jsonl(*_file(roots, "ragtruth/source_info.jsonl")):
        if r.text("task_type") == "QA":
            info = r.child("source_info")
            sources[str(r.raw("source_id"))] = (info.text("question"), info.text("passages"), {0: [], 1: []})
    for r in read_jsonl(*_file(roots, "ragtruth/response.jsonl")):
        sid = str(r.raw("source_id"))
        if sid in sources and r.label("quality", RAGTRUTH_QUALITY):
            gold = HALLUCINATED if r.children("labels") else SUPPORTED
            sources[sid][2][gold].append((str(r.raw("id")), r.text("response")))
    items = []
    for sid in sorted(sources, key=_ident):
        question, passages, by_gold = sources[sid]
        sup, hal = ([text for _, text in sorted(by_gold[g])] for g in (SUPPORTED, HALLUCINATED))
        items += pair(make, sid, seed, question, passages, sup, hal)
    return items


FACTSCORE_LABELS = {"S": SUPPORTED, "NS": HALLUCINATED, "IR": None}


@register("factscore", construction="pairs", files=["factscore/InstructGPT.jsonl"],
          public="https://github.com/shmsw25/FActScore (labeled data: data/labeled/InstructGPT.jsonl)")
def build_factscore(roots: Sequence[Path], seed: int, make: MakeItem) -> list[dict]:
    """FActScore InstructGPT biographies as matched pairs (Table 18: 183 bios -> 165 pairs).

    Label mapping over ``annotations[].human-atomic-facts[].label``: S -> gold 0,
    NS -> gold 1, IR dropped. Per biography one S and one NS fact are picked with
    the seed; bios without both (or abstained, ``annotations`` null) are dropped.
    Question = "Tell me a bio of <topic>."; ungrounded (evidence ""); cluster = topic.
    """
    items = []
    for i, r in enumerate(read_jsonl(*_file(roots, "factscore/InstructGPT.jsonl"))):
        facts: dict[int, list[str]] = {SUPPORTED: [], HALLUCINATED: []}
        for sent in r.children("annotations", allow_null=True):
            for fact in sent.children("human-atomic-facts", allow_null=True):
                gold = fact.label("label", FACTSCORE_LABELS)
                if gold is not None:
                    facts[gold].append(fact.text("text"))
        topic = r.text("topic")
        items += pair(make, i, seed, f"Tell me a bio of {topic}.", "", facts[SUPPORTED],
                      facts[HALLUCINATED], cluster=topic)
    return items


BINARY = {0: 0, 1: 1}

BUILDERS_ALLOWED = Targets("dataset builder", Fields, Registered)
"""The builders a dataset spec may name: a field mapping (:class:`Fields`) or a registered Python builder."""


# --------------------------------------------------------------------------- dataset specs

def _spec_dir(spec_dir: str | Path | None) -> Path:
    return CONF_DIR if spec_dir is None else Path(spec_dir)


@dataclass(frozen=True)
class DatasetSpec:
    """The keys of a dataset spec: a builder spec (``name``, ``title``, ``frame``, ``paper_n``, ``builder``) or a
    list spec (``name`` and ``datasets``, a list of names or a mapping name → raw folder)."""

    name: str | None = None
    title: str | None = None
    frame: str | None = None
    paper_n: int | None = None
    builder: dict | None = None
    datasets: list[str] | dict[str, str] | None = None


# The one interpolation a list spec's raw folders may hold: another path of the composed config (no resolver).
_PATH_REF = re.compile(r"\$\{paths\.[A-Za-z_]+\}")


def check_spec(spec: Any, where: str) -> dict:
    """A dataset spec checked before anything is built: its keys (:class:`DatasetSpec`), no interpolation or
    resolver anywhere (``${oc.env:…}`` would read the environment), except ``${paths.<key>}`` in a list spec's
    raw folders; the builder node's target and keys (:data:`BUILDERS_ALLOWED`) are checked when it is built."""
    if not isinstance(spec, Mapping):
        raise DatasetError(f"{where}: a dataset spec is a mapping (name, title, frame, paper_n, builder)")
    check_keys(DatasetSpec, spec, where)
    folders = spec.get("datasets")
    rest = {k: v for k, v in spec.items() if k != "datasets"}
    refuse_interpolation(rest, where)
    if isinstance(folders, Mapping):
        for k, v in folders.items():
            refuse_interpolation(_PATH_REF.sub("", v) if isinstance(v, str) else v, where, f"datasets.{k}")
    else:
        refuse_interpolation(folders, where, "datasets")
    return dict(spec)


def _load_spec(path: Path) -> dict:
    """``path`` as a checked dataset spec: bounded (size, depth, aliases) before OmegaConf reads it, read without
    resolving anything, then :func:`check_spec`."""
    try:
        spec = OmegaConf.to_container(load_yaml(path), resolve=False)
    except RaimError as err:
        raise DatasetError(str(err)) from None
    except Exception as err:  # YAML syntax, a key OmegaConf refuses (null)
        raise DatasetError(f"{path}: unreadable dataset spec ({' '.join(str(err).split())[:300]})") from None
    try:
        return check_spec(spec, str(path))
    except RaimError as err:
        raise DatasetError(str(err)) from None


def dataset_names(spec_dir: str | Path | None = None) -> list[str]:
    """The buildable datasets: specs in ``spec_dir`` with a ``builder`` (a list such as ``all`` has none)."""
    return sorted(p.stem for p in _spec_dir(spec_dir).glob("*.yaml") if "builder" in _load_spec(p))


def dataset_spec(name: str, spec_dir: str | Path | None = None) -> dict:
    """``<spec_dir>/<name>.yaml`` (default conf/dataset) as a dict."""
    path = _spec_dir(spec_dir) / f"{name}.yaml"
    if not name or Path(name).name != name or not path.is_file():
        raise DatasetError(f"unknown dataset {name!r}: no spec {path}; "
                           f"datasets: {', '.join(dataset_names(spec_dir)) or 'none'}")
    spec = _load_spec(path)
    if spec.get("name", name) != name:
        raise DatasetError(f"{path}: name {spec['name']!r} differs from the file name {name!r}")
    return spec


def _builder(spec: Mapping, path: Path) -> Builder:
    """The spec's ``builder`` node instantiated through :data:`BUILDERS_ALLOWED`: its ``_target_`` is compared with
    RAIM's builders as a string and every key with the builder's signature before anything is imported or called;
    nested nodes are data; no interpolation is resolved."""

    node = spec.get("builder")
    if not isinstance(node, Mapping) or "_target_" not in node:
        raise DatasetError(f"{path}: no `builder` node with a `_target_` ({', '.join(BUILDERS_ALLOWED.classes)})")
    try:
        return BUILDERS_ALLOWED.instantiate(node, f"{path}: builder", interpolation=False)
    except RawRecordError:
        raise
    except RaimError as err:
        msg = " ".join(str(err).split())
        raise DatasetError(msg if msg.startswith(f"{path}: builder") else f"{path}: builder: {msg}") from None


def builder_for(name: str, spec_dir: str | Path | None = None) -> Builder:
    """The builder of dataset ``name``, from its spec."""
    return _builder(dataset_spec(name, spec_dir), _spec_dir(spec_dir) / f"{name}.yaml")


def _absent(builder: Builder, roots: Sequence[Path]) -> list[str]:
    return [p for p in builder.files if _found(roots, p) is None]


def missing_files(name: str, raw_dir: str | Path | Sequence[str | Path],
                  spec_dir: str | Path | None = None) -> list[str]:
    """The raw file patterns of ``name`` found in none of the raw roots ``raw_dir``."""
    return _absent(builder_for(name, spec_dir), raw_roots(raw_dir))


def _missing(name: str, builder: Builder, pattern: str, roots: Sequence[Path]) -> RawFilesMissing:
    return RawFilesMissing(f"{name}: expected raw file {pattern} is absent from {_searched(roots)}; "
                           f"public source: {builder.public or 'not stated'}")


def fetch_hub(name: str, raw_dir: str | Path, spec_dir: str | Path | None = None) -> None:
    """Materialise ``name``'s raw files under ``raw_dir`` from the Hugging Face hub."""
    builder = builder_for(name, spec_dir)
    if builder.hub is None:
        raise DatasetError(f"{name}: no Hugging Face copy of the published raw files is known; "
                           f"download them from {builder.public} into {Path(raw_dir)} and use source='local'")
    HUB[builder.hub](Path(raw_dir))


# --------------------------------------------------------------------------- public API

@dataclass(frozen=True)
class Built:
    """One dataset's items with its spec, builder and duplicate report."""

    items: pd.DataFrame
    spec: Mapping[str, Any]
    builder: Builder
    duplicates: Duplicates | None

    def summary(self) -> dict[str, Any]:
        """Table 18 columns, the spec's title and paper n, and the duplicates dropped (null: not checked,
        a Python builder)."""
        dups = self.duplicates
        out = {**summarize(self.items), "title": self.spec.get("title"), "frame": self.spec["frame"],
               "construction": self.builder.construction, "paper_n": self.spec.get("paper_n"),
               "duplicates": None if dups is None else {"count": dups.count, "first": dups.first}}
        if getattr(self.builder, "on_bad_record", "error") == "drop":  # (with `error` there is none: it stops)
            bad = self.builder.dropped
            out["bad_records"] = {"policy": "drop", "count": bad.count, "first": bad.first}
        return out


def build_dataset(name: str, raw_dir: str | Path | Sequence[str | Path], seed: int = 0,
                  source: str = "local", spec_dir: str | Path | None = None) -> Built:
    """Balanced binary items for dataset ``name`` from the raw roots ``raw_dir`` (searched in order).

    ``source='hub'`` first downloads the published files from the Hugging Face hub into the
    last root (the user's folder; needs ``datasets`` and network).
    """
    spec, roots = dataset_spec(name, spec_dir), raw_roots(raw_dir)
    path = _spec_dir(spec_dir) / f"{name}.yaml"
    builder = _builder(spec, path)
    if source == "hub":
        fetch_hub(name, roots[-1], spec_dir)
    elif source != "local":
        raise DatasetError(f"source must be 'local' or 'hub', not {source!r}")
    if "frame" not in spec:
        raise DatasetError(f"{path}: no `frame` (the frame its items are judged in, conf/frame/)")
    absent = _absent(builder, roots)
    if absent:
        raise _missing(name, builder, absent[0], roots)
    try:
        items, dups = builder.items(name, spec["frame"], roots, seed)
        df = _to_frame(items)
    except RawRecordError:
        raise
    except ValueError as err:  # one class empty, no items
        raise DatasetError(f"{name}: {err}") from None
    if dups is not None and dups.count:
        print(f"{name}: {dups.count} duplicate record(s) dropped, the first kept: {'; '.join(dups.first)}"
              + (" …" if dups.count > len(dups.first) else ""), file=sys.stderr)
    bad = getattr(builder, "dropped", None)
    if bad is not None and bad.count:
        print(f"{name}: {bad.count} bad record(s) dropped (on_bad_record: drop): {'; '.join(bad.first)}"
              + (" …" if bad.count > len(bad.first) else ""), file=sys.stderr)
    return Built(df, spec, builder, dups)


def build(name: str, raw_dir: str | Path | Sequence[str | Path], seed: int = 0, source: str = "local",
          spec_dir: str | Path | None = None) -> pd.DataFrame:
    """Balanced binary items for ``name`` (columns ``ITEM_COLUMNS`` [+ extras]); see :func:`build_dataset`."""
    return build_dataset(name, raw_dir, seed, source, spec_dir).items


def _json_cell(value: Any) -> Any:
    """A cell as JSON holds it: a NaN (how pandas holds a missing number) is null."""
    value = _native(value)
    return None if isinstance(value, float) and np.isnan(value) else value


def write_items(df: pd.DataFrame, path: str | Path) -> None:
    """JSON Lines, keys in column order, rows sorted by item_id: byte-identical per input."""
    if tuple(df.columns[: len(ITEM_COLUMNS)]) != ITEM_COLUMNS:
        raise ValueError(f"columns must start with {ITEM_COLUMNS}, got {tuple(df.columns)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = df.sort_values("item_id", kind="stable").to_dict("records")
    try:
        text = "".join(json.dumps({k: _json_cell(v) for k, v in row.items()}, ensure_ascii=False, allow_nan=False)
                       + "\n" for row in rows)
    except ValueError as err:  # an infinity: JSON has none (json would write a bare Infinity token)
        raise DatasetError(f"{path}: an item holds a value JSON cannot represent ({err})") from None
    atomic_write_text(path, text)


def read_items(path: str | Path) -> pd.DataFrame:
    """Read ``write_items`` output; a bad line raises RawRecordError (file, line, field)."""
    path = Path(path)
    recs = read_jsonl(path, path.parent)
    first: dict[str, str] = {}
    for r in recs:
        for col in ITEM_COLUMNS:
            r.raw(col)
        r.label("gold", BINARY)
        item_id = r.text("item_id")
        if item_id in first:
            raise RawRecordError(r.where, "item_id", f"duplicate value {item_id!r} (first at {first[item_id]})")
        first[item_id] = r.where
    return _to_frame([dict(r.data) for r in recs])


def summarize(df: pd.DataFrame) -> dict[str, Any]:
    """Table 18 columns: items, clusters, items per cluster, class balance."""
    sizes = df.groupby("cluster_id").size()
    n_hal = int(df["gold"].sum())
    return {"n": len(df), "n_clusters": int(len(sizes)),
            "items_per_cluster": round(float(sizes.mean()), 4),
            "max_cluster": int(sizes.max()),
            "n_supported": len(df) - n_hal, "n_hallucinated": n_hal,
            "hallucinated_share": round(n_hal / len(df), 4)}


def _selection(names: Sequence[str] | None, spec_dir: str | Path | None) -> list[tuple[str, bool]]:
    """(name, strict) per dataset to build: every spec by default; a list spec (``all``) gives
    its members; a dataset named itself is strict (absent raw files are an error, not a skip)."""
    if not names:
        return [(n, False) for n in dataset_names(spec_dir)]
    unknown = [n for n in names if not n or Path(n).name != n or not (_spec_dir(spec_dir) / f"{n}.yaml").is_file()]
    if unknown:
        raise DatasetError(f"unknown dataset(s) {unknown}; dataset specs in {_spec_dir(spec_dir)}: "
                           f"{', '.join(dataset_names(spec_dir)) or 'none'}")
    out: dict[str, bool] = {}
    for n in names:
        spec = dataset_spec(n, spec_dir)
        members = [(m, False) for m in spec.get("datasets") or []] if "builder" not in spec else [(n, True)]
        if not members:
            raise DatasetError(f"{_spec_dir(spec_dir) / f'{n}.yaml'}: neither a `builder` nor a `datasets` list")
        for m, strict in members:
            out[m] = out.get(m, False) or strict
    return list(out.items())


def build_all(raw_dir: str | Path | Sequence[str | Path], out_dir: str | Path, names: Sequence[str] | None = None,
              seed: int = 0, source: str = "local", own_dir: str | Path | None = None,
              spec_dir: str | Path | None = None) -> dict[str, dict]:
    """Write ``<out_dir>/<name>.jsonl`` and ``<out_dir>/summary/<name>.json`` per dataset.

    Raw roots: ``raw_dir`` then ``own_dir``; at least one must exist (your own set builds before the shipped
    snapshot is imported). Without ``names`` every spec is built and those whose raw files are absent are
    skipped with a line; a dataset named itself must be present.
    """
    roots, wanted = raw_roots(raw_dir, own_dir), _selection(names, spec_dir)
    if source == "local" and not any(r.is_dir() for r in roots):
        raise RaimError(f"raw data folder {', '.join(map(str, roots))} not found (--raw-dir, or RAIM_RAW_DIR; "
                        f"--own-dir)")
    todo = []
    for name, strict in wanted:
        builder = builder_for(name, spec_dir)
        absent = _absent(builder, roots) if source == "local" else []
        if absent and strict:
            raise _missing(name, builder, absent[0], roots)
        if absent:
            print(f"skip {name}: raw files absent ({', '.join(absent)} in {_searched(roots)}); "
                  f"public source: {builder.public or 'not stated'}", file=sys.stderr)
        else:
            todo.append(name)
    if not todo:
        raise RaimError(f"no dataset could be built from {_searched(roots)}: every raw file is absent "
                        "(see the lines above)")
    out, summary = Path(out_dir), {}
    for name in todo:
        built = build_dataset(name, roots, seed, source, spec_dir)
        write_items(built.items, out / f"{name}.jsonl")
        summary[name] = built.summary()
        atomic_write_text(out / "summary" / f"{name}.json", json.dumps(summary[name], indent=2, sort_keys=True) + "\n")
    return summary


@one_line
def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m src.data", description="Build balanced binary items (Appendix J, Table 18).")
    ap.add_argument("--raw-dir", default=os.environ.get("RAIM_RAW_DIR", SHIPPED_DIR),
                    help=f"the shipped raw snapshot, searched first (default: RAIM_RAW_DIR or {SHIPPED_DIR})")
    ap.add_argument("--own-dir", default=OWN_DIR, help=f"your own raw files, searched second (default {OWN_DIR})")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--datasets", default="",
                    help="comma-separated names or list specs such as `all` (default: every spec, absent ones skipped)")
    ap.add_argument("--spec-dir", default=str(CONF_DIR), help="where <name>.yaml dataset specs are read")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", choices=("local", "hub"), default="local")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()] or None
    summary = build_all(args.raw_dir, args.out_dir, names, args.seed, args.source, args.own_dir, args.spec_dir)
    for name, s in summary.items():
        dups = f" duplicates={s['duplicates']['count']}" if s["duplicates"] else ""
        dups += f" bad_records_dropped={s['bad_records']['count']}" if "bad_records" in s else ""
        print(f"{name:11s} n={s['n']:5d} clusters={s['n_clusters']:5d} per_cluster={s['items_per_cluster']:.2f} "
              f"balance={s['n_supported']}/{s['n_hallucinated']}{dups}")
    return 0


def read_dataset(items_dir: Path, name: str) -> pd.DataFrame:
    """The balanced items of dataset ``name`` (``<items_dir>/<name>.jsonl``, written by ``python -m src.data``)."""
    path = items_dir / f"{name}.jsonl"
    if not path.exists():
        raise DatasetError(
            f"{path} not found: build the items first (python -m src.data --raw-dir <raw> --out-dir {items_dir})"
        )
    return read_items(path)
