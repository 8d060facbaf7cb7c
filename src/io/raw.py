"""Raw benchmark files as records that name their location on error (paper Appendix J's inputs).

:func:`read_records` reads one JSON / JSON Lines / CSV / Parquet file (the format from the suffix, or sniffed
from the content) into :class:`Rec` objects; a field that is missing or of the wrong type raises
:class:`RawRecordError` naming the file, the line or row and the field. The raw roots are the folders searched in
order for a dataset's files (the shipped snapshot, then the user's own folder)."""

from __future__ import annotations

import ast
import contextlib
import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from src.core.errors import RaimError
from src.core.textfiles import StrictJSONError, UnreadableText, json_lines, loads_strict, normal_id, read_text
from src.io.files import check_regular


class RawFilesMissing(RaimError, FileNotFoundError):
    """A dataset's raw file is in none of the raw roots; the message names the folders searched."""


# --------------------------------------------------------------------------- raw records


def _native(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _join(parts: Iterable[str], sep: str = "\n\n") -> str:
    return sep.join(p.strip() for p in parts if p.strip())


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

    def ident(self, key: str) -> str:
        """An id (:meth:`scalar`) as its text in Unicode normal form C (:func:`src.core.textfiles.normal_id`)."""
        return normal_id(str(self.scalar(key)).strip())

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


@contextlib.contextmanager
def _readable(path: Path, name: str):
    """Turn a read failure (bytes that are no text :mod:`src.core.textfiles` reads, a file that is not Parquet)
    into one clear line."""
    check_regular(path, "a data file")
    try:
        yield
    except UnreadableText as e:
        raise RawRecordError(name if e.line is None else f"{name} line {e.line}", None, e.problem) from None
    except (ValueError, OSError) as e:
        if isinstance(e, (RawRecordError, FileNotFoundError, IsADirectoryError, PermissionError)):
            raise
        raise RawRecordError(name, None, f"unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def read_jsonl(path: Path, root: Path | None, bad: Duplicates | None = None) -> list[Rec]:
    """JSON Lines with 1-based line numbers in every error. ``bad`` (a dataset's ``on_bad_record: drop``): a line
    that is not a JSON object is added there and skipped instead (the file must still hold one record)."""
    name, out = _rel(path, root), []
    with _readable(path, name):
        text = read_text(path)
    for n, line in json_lines(text):
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
    with _readable(path, name):
        reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
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
            raise RawRecordError(
                name,
                None,
                f"a JSON object holding {len(lists)} lists: "
                "name the one with the records (the builder's `records` key)",
            )
        doc = doc[lists[0]]
    if not isinstance(doc, list):
        raise RawRecordError(name, key, f"expected a list of records, got {type(doc).__name__}")
    return doc


def read_json(path: Path, root: Path | None, records: str | None = None) -> list[Rec]:
    """A JSON list of records, or an object holding one (``records``: its dotted key);
    records numbered from 1."""
    name = _rel(path, root)
    with _readable(path, name):
        try:
            doc = loads_strict(read_text(path))
        except json.JSONDecodeError as err:
            raise RawRecordError(
                f"{name} line {err.lineno}", None, f"unreadable JSON ({err.msg}, column {err.colno})"
            ) from None
        except StrictJSONError as err:
            raise RawRecordError(name, None, f"unreadable JSON ({err.msg})") from None
    out = []
    for n, obj in enumerate(_record_list(doc, name, records), 1):
        if not isinstance(obj, Mapping):
            raise RawRecordError(f"{name} record {n}", None, "expected a JSON object")
        out.append(Rec(obj, f"{name} record {n}"))
    return _nonempty(out, name)


FORMATS = {
    ".json": "json",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


def _sniffed(path: Path, fmt: str | None) -> str | None:
    """A ``.json`` file whose first non-blank line is a whole JSON object with more content after it holds JSON
    Lines (one record a line), whatever its name says: a JSON document would end with that object. Any other
    file keeps the format of its suffix (a pretty-printed or one-line JSON document stays JSON)."""
    if fmt != "json" or not path.is_file():
        return fmt
    try:
        lines = (ln.strip() for _, ln in json_lines(read_text(path)))
        first = next(lines, "")
        more = next(lines, "")
        if not (first.startswith("{") and more.startswith("{")):
            return fmt
        return "jsonl" if isinstance(json.loads(first), dict) else fmt
    except (ValueError, OSError):  # not one object on its first line (or unreadable): read_json says why
        return fmt


def read_records(
    path: Path,
    root: Path | None,
    fmt: str | None = None,
    records: str | None = None,
    required: Sequence[str] = (),
    bad: Duplicates | None = None,
) -> list[Rec]:
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
    raise RawRecordError(
        _rel(path, root),
        None,
        f"unknown format (suffix {path.suffix!r}): give the builder "
        f"`format` ({', '.join(sorted(set(FORMATS.values())))})",
    )


# --------------------------------------------------------------------------- raw roots


def raw_roots(raw_dir: str | Path | Sequence[str | Path], own_dir: str | Path | None = None) -> list[Path]:
    """The raw roots, searched in order: ``raw_dir`` (one folder or several), then ``own_dir``."""
    roots = [Path(raw_dir)] if isinstance(raw_dir, (str, Path)) else [Path(r) for r in raw_dir]
    return roots + ([Path(own_dir)] if own_dir else [])


def _entry(path: Path) -> bool:
    """A raw file found: anything there but a folder or a dangling link, so that a named pipe or a device is
    reported as what it is when it is read (:func:`src.io.files.check_regular`), not as absent."""
    return path.exists() and not path.is_dir()


def _found(roots: Sequence[Path], pattern: str) -> tuple[Path | None, list[Path]] | None:
    """The files matching ``pattern`` (sorted) in the first root holding any, and that root;
    an absolute pattern is used as is (root None)."""
    path = Path(pattern)
    if path.is_absolute():
        anchor = Path(path.anchor)
        files = sorted(p for p in anchor.glob(str(path.relative_to(anchor))) if _entry(p))
        return (None, files) if files else None
    for root in roots:
        files = sorted(p for p in root.glob(pattern) if _entry(p))
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
