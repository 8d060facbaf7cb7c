"""The append-only, crash-safe verdict cache.

A cache root holds one folder per dataset, and in it one JSONL file per judge identity
(``<root>/<dataset>/<member>/<identity-hash[:16]>.jsonl``, beside it ``….identity.json`` naming the identity),
one record a line, keyed by sha256(judge identity, frame name + prompt hash, item id + item content hash). A
dataset's verdicts live apart from every other dataset's, so judging a new set never touches the files the
shipped sets' verdict tables were read from (each DVC ``verdicts`` stage depends on its own dataset's folder).
:class:`VerdictCache` is one such file (its ``cache_dir`` is the dataset's folder); :func:`dataset_folder` names
the folder of an item's dataset, :func:`check_layout` refuses a root in the earlier one-file-per-judge layout
(``<root>/<member>/<hash>.jsonl``) and :func:`split_by_dataset` converts one, record for record.

Crash safety:
* every record is written with a single ``write`` of one whole line under an exclusive ``flock``, then
  flushed and fsynced, so a record is either on disk whole or not at all (except a torn last line when the
  process dies inside the write);
* on open, a torn last line (no trailing newline / not JSON) is cut off (the file is truncated to the last
  complete record), so a resumed run recomputes exactly that one item;
* before appending, the writer reads whatever other processes appended since it last looked, and skips
  keys that are already present: no duplicates, even with two writers on one file.

A line that is not a valid record (garbage, a JSON value that is not an object, a vote other than 0 / 1 / null, a
``logodds`` or ``mass`` that is not finite or outside its range) is never read as a verdict: its item counts as not
cached, and the line is reported by file and line number (``VerdictCache.bad``, ``stats()["bad"]``), so a reader can
say exactly what to repair.

Two records with one key and different verdicts (vote, log-odds or mass) are a damaged cache, not a choice: which
one is right cannot be told. Both lines are reported (``VerdictCache.conflicts``, :meth:`VerdictCache.problems`),
and reading that key's verdict raises :class:`CacheConflict` naming the file and the lines; a second copy of the
same verdict is harmless and ignored.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from src.core.errors import RaimError
from src.core.textfiles import StrictJSONError, loads_strict
from src.core.verdicts import feature_problem
from src.io.files import atomic_path, atomic_write_text, check_regular, writing
from src.io.paths import dataset_folder
from src.judges.frames import canonical_hash


def item_content_hash(item: Mapping[str, Any]) -> str:
    parts = []
    for k in ("question", "evidence", "candidate"):
        v = item.get(k)
        parts.append(v if isinstance(v, str) else "")
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def verdict_key(identity_hash: str, frame_name: str, frame_hash: str, item_id: str, content_hash: str) -> str:
    return hashlib.sha256(
        "|".join([identity_hash, frame_name, frame_hash, str(item_id), content_hash]).encode()
    ).hexdigest()


def identity_hash(identity: Mapping[str, Any]) -> str:
    return canonical_hash(dict(identity))


VOTES = (0, 1, None)  # hallucinated = 1, supported = 0, abstained = null
VERDICT_FIELDS = ("vote", "logodds", "mass")  # what an analysis reads of a record: two copies must agree on these
MAX_REPORTED = 20  # bad lines listed per file (all are counted)


class CacheConflict(RaimError, ValueError):
    """Two records of one item with different verdicts in a cache file; the message names the file and lines."""


# What this process has parsed of each cache file, by content: one judge's file is read once per dataset (src.run,
# the suite), so its first load reuses the records parsed from the same bytes and parses only what was appended
# since. A snapshot is used only when the file's prefix has the same digest (an edited or rewritten file is parsed
# again); files over MEMO_MAX_BYTES are not kept. path → (bytes parsed, their digest, the parse state of
# VerdictCache._STATE)
MEMO_MAX_BYTES = 64 << 20
_PARSED: dict[str, tuple[int, bytes, dict]] = {}


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def parse_record(line: bytes) -> tuple[dict | None, str | None]:
    """One cache line → (record, None) or (None, why it is not a valid record)."""
    try:
        rec = loads_strict(line)
    except StrictJSONError as e:  # a field given twice, nesting too deep
        return None, f"not JSON ({e.msg})"
    except ValueError as e:
        return None, f"not JSON ({e.msg} at column {e.colno})" if hasattr(e, "msg") else "not JSON"
    if not isinstance(rec, dict):
        return None, f"not a JSON object ({type(rec).__name__} {str(rec)[:40]!r})"
    if not isinstance(rec.get("key"), str) or not rec["key"]:
        return None, "no 'key' string"
    if "vote" not in rec:
        return None, "no 'vote' field"
    vote = rec["vote"]
    if isinstance(vote, bool) or vote not in VOTES:
        return None, f"field 'vote': {vote!r} not in {{0, 1, null}}"
    for k in ("logodds", "mass"):
        v = rec.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return None, f"field {k!r}: {v!r} is not a number or null"
        # json reads a bare NaN / Infinity as a float, and an integer of any size (too large for a float: inf)
        why = (
            None if v is None else feature_problem(k, float(v) if isinstance(v, float) or abs(v) < 1e308 else math.inf)
        )
        if why:
            return None, f"field {k!r}: {why}"
    return rec, None


class VerdictCache:
    """Records of one judge identity.  ``get``/``put`` by key; ``hits``/``misses``/``writes`` counters."""

    def __init__(self, cache_dir: Path | str, member: str, identity: Mapping[str, Any]):
        self.identity = dict(identity)
        self.identity_hash = identity_hash(self.identity)
        self.dir = Path(cache_dir) / member
        self.path = self.dir / f"{self.identity_hash[:16]}.jsonl"
        self.member = member
        self.records: dict[str, dict] = {}
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.repaired_bytes = 0
        self.bad: list[tuple[int, str]] = []  # (line number, why) of lines that are not valid records
        self.bad_lines = 0
        self.torn_tail = 0  # bytes after the last newline (an interrupted write), not read as a record
        self.line_of: dict[str, int] = {}  # key → the line number of its (first) record
        self.conflicts: dict[str, list[int]] = {}  # key → the lines of records that disagree with the first
        self._offset = 0
        self._lines = 0
        self._load(repair=False)

    # -- reading -----------------------------------------------------------------------------------
    def _ingest(self, data: bytes, final: bool) -> int:
        """Parse complete lines of ``data``; return the number of bytes consumed (complete lines only)."""
        consumed = 0
        while True:
            nl = data.find(b"\n", consumed)
            if nl < 0:
                break
            line = data[consumed:nl]
            consumed = nl + 1
            self._lines += 1
            if not line.strip():
                continue
            rec, why = parse_record(line)
            if rec is None:
                self.bad_lines += 1
                if len(self.bad) < MAX_REPORTED:
                    self.bad.append((self._lines, why))
                continue
            key = rec["key"]
            first = self.records.get(key)
            if first is None:
                self.records[key] = rec
                self.line_of[key] = self._lines
            elif any(first.get(k) != rec.get(k) for k in VERDICT_FIELDS):
                self.conflicts.setdefault(key, []).append(self._lines)
        return consumed

    _STATE = ("records", "line_of", "conflicts", "bad", "bad_lines", "_lines")

    def _state(self) -> dict:
        """A copy of what parsing has found (:data:`_PARSED` keeps it per file)."""
        return {k: (v.copy() if isinstance(v := getattr(self, k), (dict, list)) else v) for k in self._STATE}

    def _resume(self, data: bytes) -> int:
        """Take this process's earlier parse of ``data``'s prefix (:data:`_PARSED`) if the bytes are the same;
        returns the number of bytes it covers (0: none)."""
        memo = _PARSED.get(str(self.path))
        if memo is None or memo[0] > len(data) or _digest(data[: memo[0]]) != memo[1]:
            return 0
        n, _, state = memo
        for k, v in state.items():
            setattr(self, k, v.copy() if isinstance(v, (dict, list)) else v)
        return n

    def _load(self, repair: bool) -> None:
        if not self.path.exists():
            return
        check_regular(self.path, "a verdict cache file (JSON Lines)")
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        first = self._offset == 0
        used = self._resume(data) if first else 0
        used += self._ingest(data[used:], final=True)
        if first and used <= MEMO_MAX_BYTES:
            _PARSED[str(self.path)] = (used, _digest(data[:used]), self._state())
        self._offset += used
        self.torn_tail = len(data) - used
        if repair and used < len(data):
            # a torn last record (a write interrupted mid-line): cut it off
            with open(self.path, "r+b") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    size = os.fstat(f.fileno()).st_size
                    if size > self._offset:
                        f.seek(self._offset)
                        tail = f.read()
                        if b"\n" not in tail:  # still torn (no writer completed it meanwhile)
                            f.truncate(self._offset)
                            os.fsync(f.fileno())
                            self.repaired_bytes += len(tail)
                            self.torn_tail = 0
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)

    def key(self, frame_name: str, frame_hash: str, item: Mapping[str, Any]) -> str:
        return verdict_key(self.identity_hash, frame_name, frame_hash, str(item["item_id"]), item_content_hash(item))

    def get(self, key: str) -> dict | None:
        """The record of ``key`` (None: not cached); raises :class:`CacheConflict` when the file holds records of
        that key with different verdicts."""
        if key in self.conflicts:
            raise CacheConflict(
                self._conflict(key) + ": refusing to read either as a verdict (delete the wrong "
                "line, or both to recompute the item)"
            )
        rec = self.records.get(key)
        if rec is None:
            self.misses += 1
        else:
            self.hits += 1
        return rec

    def __contains__(self, key: str) -> bool:
        return key in self.records

    def __len__(self) -> int:
        return len(self.records)

    # -- writing -----------------------------------------------------------------------------------
    def put(self, rec: dict) -> bool:
        """Append one record (must hold ``key``).  Returns False when the key was already cached."""
        key = rec["key"]
        if key in self.records:
            return False
        self.dir.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(rec, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()
        with writing(self.path, "; the verdicts written before are kept (a torn last line is cut at the next run)"):
            return self._append(rec, key, line)

    def _append(self, rec: dict, key: str, line: bytes) -> bool:
        """Append ``line`` (``rec``, the record of ``key``) under the file's lock, after reading what other writers
        added; False when one of them had written ``key``."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(fd).st_size
                if size > self._offset:  # another writer appended (or a torn tail is there)
                    os.lseek(fd, self._offset, os.SEEK_SET)
                    data = b""
                    while len(data) < size - self._offset:
                        chunk = os.read(fd, size - self._offset - len(data))
                        if not chunk:
                            break
                        data += chunk
                    used = self._ingest(data, final=False)
                    self._offset += used
                    if used < len(data):  # torn tail left by a killed writer: cut it before appending
                        os.ftruncate(fd, self._offset)
                        self.repaired_bytes += len(data) - used
                        self.torn_tail = 0
                    if key in self.records:
                        return False
                view = memoryview(line)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                os.fsync(fd)
                self._offset += len(line)
                self._lines += 1
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        self.records[key] = rec
        self.line_of[key] = self._lines
        self.writes += 1
        return True

    def open_for_append(self) -> None:
        """Call before a compute run: pick up new records and repair a torn tail."""
        self._load(repair=True)

    def stats(self) -> dict:
        return {
            "member": self.member,
            "path": str(self.path),
            "records": len(self.records),
            "hits": self.hits,
            "misses": self.misses,
            "writes": self.writes,
            "repaired_bytes": self.repaired_bytes,
            "bad_lines": self.bad_lines,
            "bad": [{"line": n, "reason": why} for n, why in self.bad],
            "torn_tail_bytes": self.torn_tail,
        }

    def _conflict(self, key: str) -> str:
        lines = [self.line_of[key], *self.conflicts[key]]
        first = self.records[key]
        shown = ", ".join(f"{k}={first.get(k)!r}" for k in VERDICT_FIELDS)
        return (
            f"{self.path}: lines {', '.join(map(str, lines))}: records of one item (key {key[:12]}…) with "
            f"different verdicts (line {lines[0]}: {shown}; a damaged cache)"
        )

    def problems(self) -> list[str]:
        """One line per bad line (and a torn last line, and each item whose records conflict), naming the file
        and the line numbers."""
        out = [f"{self.path}: line {n}: {why}; not read as a verdict" for n, why in self.bad]
        keys = sorted(self.conflicts, key=self.line_of.get)
        out += [self._conflict(k) + "; not read as a verdict" for k in keys[:MAX_REPORTED]]
        if len(keys) > MAX_REPORTED:
            out.append(f"{self.path}: {len(keys) - MAX_REPORTED} more items with conflicting records")
        if self.bad_lines > len(self.bad):
            out.append(f"{self.path}: {self.bad_lines - len(self.bad)} more bad lines")
        if self.torn_tail:
            out.append(
                f"{self.path}: line {self._lines + 1}: torn last record ({self.torn_tail} bytes without a "
                f"newline: an interrupted write); not read as a verdict, recomputed by the next --compute run"
            )
        return out


def write_identity(cache: VerdictCache) -> None:
    """A readable sidecar naming the identity behind a cache file (written once)."""
    side = cache.path.with_suffix(".identity.json")
    if not side.exists():
        atomic_write_text(side, json.dumps(cache.identity, indent=2, sort_keys=True, default=str) + "\n")


def other_identities(cache_dir: Path | str, member: str, identity: Mapping[str, Any]) -> list[tuple[dict, int]]:
    """The other judge identities with records in ``member``'s folder of one dataset's cache (``cache_dir``), each
    with its line count: verdicts that a judge of this name but another identity wrote (another roster's member of
    the same name, or a backend node edited since), which ``identity`` never reads."""
    own = identity_hash(identity)[:16]
    out = []
    for side in sorted((Path(cache_dir) / member).glob("*.identity.json")):
        stem = side.name.removesuffix(".identity.json")
        data = side.with_name(f"{stem}.jsonl")
        if stem == own or not data.is_file():
            continue
        try:
            theirs = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # an unreadable sidecar names nothing: left out of a hint
            continue
        lines = data.read_bytes().count(b"\n")
        if isinstance(theirs, dict) and lines:
            out.append((theirs, lines))
    return out


def identity_difference(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> str:
    """``n_ctx 2048 there, 1024 here`` for every key where two judge identities differ."""
    keys = sorted(set(theirs) | set(ours))
    return ", ".join(
        f"{k} {theirs.get(k, 'unset')} there, {ours.get(k, 'unset')} here" for k in keys if theirs.get(k) != ours.get(k)
    )


def iter_records(paths: Iterable[Path]) -> Iterable[dict]:
    """Valid records of cache files (bad lines are skipped here; :class:`VerdictCache` reports them)."""
    for p in paths:
        check_regular(p, "a verdict cache file (JSON Lines)")
        with open(p, "rb") as f:
            for line in f:
                if line.endswith(b"\n"):
                    rec, _ = parse_record(line)
                    if rec is not None:
                        yield rec


# -- the layout: one folder per dataset under a cache root -----------------------------------------------------
class CacheLayoutError(RaimError):
    """A cache root in the one-file-per-judge layout; the message gives the command that splits it."""


def item_folder(item: Mapping[str, Any]) -> str:
    """The folder of an item's verdicts: its ``dataset`` as :func:`src.judges.runner.finish_record` stores it."""
    return dataset_folder(str(item.get("dataset", "")))


def split_command(root: Path | str) -> str:
    return f"python -m src.judges --split-cache --cache-dir {root}"


def legacy_files(root: Path | str) -> list[Path]:
    """Cache files of the one-file-per-judge layout directly under ``root`` (``<root>/<member>/<hash>.jsonl``)."""
    return sorted(Path(root).glob("*/*.jsonl"))


def check_layout(root: Path | str) -> None:
    """Refuse a cache root that still holds files of the one-file-per-judge layout: their verdicts would be
    neither read nor extended, so every item would look unjudged."""
    old = legacy_files(root)
    if old:
        raise CacheLayoutError(
            f"{old[0]}: a verdict cache file in the one-file-per-judge layout ({len(old)} such files under "
            f"{root}); this version keeps one folder per dataset: split it once with `{split_command(root)}`"
        )


def _split_lines(path: Path) -> dict[str, list[bytes]]:
    """A legacy file's lines grouped by the folder of their record's dataset, in file order; a line that is not
    a valid record, or a torn last line, stops the split (nothing is written) naming the file and line."""
    check_regular(path, "a verdict cache file (JSON Lines)")
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        raise RaimError(
            f"{path}: a torn last record (no trailing newline): delete that line (its item is recomputed), then "
            f"split again"
        )
    groups: dict[str, list[bytes]] = {}
    for n, line in enumerate(data.split(b"\n")[:-1], 1):
        if not line.strip():
            continue
        rec, why = parse_record(line)
        if rec is None:
            raise RaimError(f"{path}: line {n}: {why}: repair or delete the line, then split again")
        groups.setdefault(dataset_folder(rec.get("dataset")), []).append(line)
    return groups


def split_by_dataset(root: Path | str) -> dict[str, dict[str, int]]:
    """Convert a cache root from one file per judge to one folder per dataset: each record moves, byte for
    byte and in order, to ``<root>/<dataset>/<member>/<hash>.jsonl`` (the identity sidecar is copied beside each
    part), then the old file goes. Returns records moved per old file and dataset. Refuses (before writing) a
    part that exists already, so a split never merges into or overwrites verdicts."""
    root = Path(root)
    moved: dict[str, dict[str, int]] = {}
    for path in legacy_files(root):
        groups = _split_lines(path)
        side = path.with_suffix(".identity.json")
        targets = {f: root / f / path.parent.name / path.name for f in groups}
        clash = [t for t in targets.values() if t.exists()]
        if clash:
            raise RaimError(f"{clash[0]}: exists already; move it away before splitting {path}")
        for folder, lines in groups.items():
            with atomic_path(targets[folder]) as tmp:
                Path(tmp).write_bytes(b"\n".join(lines) + b"\n")
            if side.exists():
                atomic_write_text(targets[folder].with_suffix(".identity.json"), side.read_text())
        path.unlink()
        side.unlink(missing_ok=True)
        if not any(path.parent.iterdir()):
            path.parent.rmdir()
        moved[str(path)] = {f: len(lines) for f, lines in groups.items()}
    return moved


def dataset_caches(
    root: Path | str, member: str, identity: Mapping[str, Any], folders: Iterable[str]
) -> dict[str, VerdictCache]:
    """One judge identity's cache file in each of ``folders`` (dataset folders) under ``root``."""
    check_layout(root)
    return {f: VerdictCache(Path(root) / f, member, identity) for f in dict.fromkeys(folders)}


def merged_stats(caches: Mapping[str, VerdictCache]) -> dict:
    """:meth:`VerdictCache.stats` of one judge over the dataset folders of a call: one file's own, or the
    counts summed (``path``: the files, comma-separated; ``bad``: each with its file)."""
    if len(caches) == 1:
        return next(iter(caches.values())).stats()
    parts = [c.stats() for c in caches.values()]
    out: dict[str, Any] = {"member": parts[0]["member"] if parts else None}
    out["path"] = ", ".join(p["path"] for p in parts)
    for k in ("records", "hits", "misses", "writes", "repaired_bytes", "bad_lines", "torn_tail_bytes"):
        out[k] = sum(p[k] for p in parts)
    out["bad"] = [{"file": p["path"], **b} for p in parts for b in p["bad"]]
    return {
        k: out[k]
        for k in (
            "member",
            "path",
            "records",
            "hits",
            "misses",
            "writes",
            "repaired_bytes",
            "bad_lines",
            "bad",
            "torn_tail_bytes",
        )
    }
