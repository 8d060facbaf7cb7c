"""One way to read a text file of records, for every command: verdict tables (:mod:`src.core.verdicts`), raw
benchmark files, items and pools (:mod:`src.io.raw`: ``src.data``, ``src.predict``, ``src.rate``, ``src.judges``),
the verdict cache's lines and the server's JSON (:func:`loads_strict`).

* **Bytes to text** (:func:`decoded`): a gzip file is decompressed whatever its name (``.csv``, ``.jsonl``); a UTF-8
  byte-order mark is dropped; a UTF-16 or UTF-32 file (named by its byte-order mark) is decoded as such; anything
  else must be UTF-8, and the first byte that is not is named by line and offset. Line ends may be LF or CRLF.
* **JSON** (:func:`loads_strict`): what :func:`json.loads` would misread silently is refused — a key given twice in
  one object (json keeps the last value), a bare ``NaN`` / ``Infinity`` / ``-Infinity`` (not JSON: an absent value
  is null), nesting deeper than the interpreter can parse.
* **Ids** (:func:`normal_id`): item and cluster ids are compared in Unicode normal form C, so ``café`` typed with a
  combining accent (NFD) and with the precomposed letter (NFC), which print alike, are one id everywhere.
"""

from __future__ import annotations

import codecs
import json
import unicodedata
import zlib
from collections.abc import Iterator
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"
MAX_INFLATED = 4 << 30  # a gzip file that inflates past this (4 GiB) is refused: no benchmark file is that large
_BOMS = (  # longest first: UTF-32's LE mark begins with UTF-16's
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


class UnreadableText(ValueError):
    """Bytes that are no text this module reads: ``line`` (1-based, None when the whole file) and ``problem``;
    each reader words the location its own way."""

    def __init__(self, line: int | None, problem: str):
        super().__init__(problem if line is None else f"line {line}: {problem}")
        self.line, self.problem = line, problem


class StrictJSONError(ValueError):
    """A JSON text that :func:`loads_strict` refuses although :func:`json.loads` reads it; ``msg`` says why."""

    def __init__(self, msg: str):
        super().__init__(msg)
        self.msg = msg


def inflated(data: bytes) -> bytes:
    """``data`` decompressed when it is gzip (by its first bytes, not its name), else as it is."""
    if not data.startswith(GZIP_MAGIC):
        return data
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, MAX_INFLATED)
    except zlib.error as e:
        raise UnreadableText(None, f"a gzip file that cannot be decompressed ({e})") from None
    if d.unconsumed_tail:
        raise UnreadableText(None, f"a gzip file that inflates past {MAX_INFLATED >> 30} GiB")
    return out


def decoded(data: bytes) -> str:
    """The text of a file's bytes (module docstring): gzip inflated, a byte-order mark read and dropped, else UTF-8."""
    data = inflated(data)
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), None)
    if encoding is not None:
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as e:
            raise UnreadableText(
                None, f"not {encoding.upper()} text at byte {e.start} (its byte-order mark says it is)"
            ) from None
    nul = data.find(b"\x00")
    if nul >= 0 and data[:4] != b"PAR1":  # no text file holds NUL: UTF-16 without its mark has one in every pair
        raise UnreadableText(
            _line(data, nul), f"a NUL byte at offset {nul}: UTF-16 without a byte-order mark? save it as UTF-8"
        )
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = bom + e.start
        hint = "it looks like a Parquet file: name it .parquet" if data[:4] == b"PAR1" else "save it as UTF-8"
        raise UnreadableText(_line(data, at), f"byte 0x{data[at]:02x} at offset {at} is not UTF-8 ({hint})") from None


def _line(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def read_text(path: str | Path) -> str:
    """The text of the file at ``path`` (:func:`decoded`); an operating-system error is raised as it is."""
    return decoded(Path(path).read_bytes())


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """An ``object_pairs_hook`` for :func:`json.loads`: the object, or :class:`StrictJSONError` for a key given twice."""
    obj: dict = {}
    for k, v in pairs:
        if k in obj:
            raise StrictJSONError(f"key {k!r} appears twice in one object")
        obj[k] = v
    return obj


def _no_constant(name: str):
    raise StrictJSONError(f"a bare {name}, which is not JSON; an absent value is null")


def loads_strict(text: str | bytes):
    """:func:`json.loads`, refusing what it would misread silently (module docstring) as :class:`StrictJSONError`;
    a text that is not JSON raises :class:`json.JSONDecodeError` as before."""
    try:
        return json.loads(text, object_pairs_hook=unique_keys, parse_constant=_no_constant)
    except RecursionError:
        raise StrictJSONError("nested too deeply to read") from None


def json_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of each line of a JSON Lines text that holds anything (LF or CRLF ends; a
    U+2028 inside a JSON string is no line end)."""
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            yield n, line


def normal_id(value: str) -> str:
    """An id in Unicode normal form C (module docstring)."""
    return unicodedata.normalize("NFC", value)
