"""Every reader reads the same file the same way (src/core/textfiles.py): one table of encodings — a UTF-8 BOM, CRLF
line ends, UTF-16 (either byte order, with its mark), gzip under a ``.csv`` / ``.jsonl`` name, and all at once —
run against every reader of CSV and JSON Lines: the verdict table (``src.run verdicts=…``), raw records
(``src.data``), items (``src.predict``), a pool and its labels (``src.rate``), a dataset's items (``src.judges``).
Each must read exactly what it reads from the plain UTF-8 file. A bare ``NaN`` / ``Infinity`` in JSON Lines is
refused by every JSON Lines reader as the server refuses it; ids written in NFD are the NFC ids everywhere; UTF-16
without its mark is one line, not a header of NUL characters."""

from __future__ import annotations

import gzip
import json
import unicodedata
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from src import predict
from src.core import verdicts
from src.core.errors import RaimError
from src.io import datasets
from src.studies.pool import Pool, read_labels, read_pool

CAFE = "caf\u00e9-1"  # é precomposed (NFC); its NFD spelling is "cafe" + U+0301

TEXTS: dict[str, dict[str, str]] = {  # reader -> format -> the plain UTF-8 text (LF)
    "verdict table": {"csv": f"item_id,cluster_id,gold,a,b\n{CAFE},k1,1,1,0\ni2,k1,0,0,\ni3,k2,1,1,1\n"},
    "raw records": {
        "csv": f'id,q,c,g\n{CAFE},"Où est-ce ?","Ici, là",1\ni2,q,"deux",0\n',
        "jsonl": json.dumps({"id": CAFE, "q": "Où est-ce ?", "c": "Ici, là", "g": "1"}, ensure_ascii=False)
        + "\n"
        + json.dumps({"id": "i2", "q": "q", "c": "two\nlines\u2028still one", "g": "0"})
        + "\n",
        "json": json.dumps(
            [{"id": CAFE, "q": "Où ?", "c": "Ici", "g": "1"}, {"id": "i2", "q": "q", "c": "deux", "g": "0"}],
            ensure_ascii=False,
            indent=1,
        ),
    },
    "items": {
        "csv": f'item_id,candidate,evidence,cluster_id\n{CAFE},"Paris, France",é,c1\ni2,"two",,c1\n',
        "jsonl": json.dumps(
            {"item_id": CAFE, "candidate": "Paris, France", "evidence": "é", "cluster_id": "c1"}, ensure_ascii=False
        )
        + "\n"
        + json.dumps({"item_id": "i2", "candidate": "two\nlines", "cluster_id": "c1"})
        + "\n",
    },
    "pool": {
        "csv": f"item_id,p_hallucinated,cluster_id\n{CAFE},0.9,k\ni2,0.2,k\ni3,,l\n",
        "jsonl": "".join(
            json.dumps(r, ensure_ascii=False) + "\n"
            for r in (
                {"item_id": CAFE, "p_hallucinated": 0.9, "cluster_id": "k"},
                {"item_id": "i2", "p_hallucinated": 0.2, "cluster_id": "k"},
                {"item_id": "i3", "p_hallucinated": None, "cluster_id": "l"},
            )
        ),
    },
    "labels": {
        "csv": f"item_id,gold\n{CAFE},1\ni3,0\n",
        "jsonl": json.dumps({"item_id": CAFE, "gold": 1}, ensure_ascii=False) + "\n" + '{"item_id": "i3", "gold": 0}\n',
    },
    "dataset items": {
        "jsonl": "".join(
            json.dumps(
                {
                    "item_id": i,
                    "cluster_id": "wice-k",
                    "dataset": "wice",
                    "frame": "claim",
                    "question": "",
                    "evidence": "Évidence",
                    "candidate": "Ça va",
                    "gold": g,
                },
                ensure_ascii=False,
            )
            + "\n"
            for i, g in ((CAFE, 1), ("i2", 0))
        )
    },
}
POOL = TEXTS["pool"]["csv"]


def _pool(tmp: Path) -> Pool:
    path = tmp / "the-pool.csv"
    path.write_text(POOL, encoding="utf-8")
    return read_pool(path)


def _built(path: Path) -> dict:
    """Dataset ``bench`` built by src.data's builder from the raw file at ``path`` (ids from field ``id``)."""
    from malformed import raw_dataset

    fmt = path.suffix[1:]
    root, specs = raw_dataset(path.parent / f"{path.stem}-build", fmt=fmt, text="", id="id", **POOLED)
    (root / "bench" / f"b.{fmt}").write_bytes(path.read_bytes())
    return datasets.build_dataset("bench", [root], spec_dir=specs).items.to_dict("list")


POOLED = {"candidate": "c", "gold": {"field": "g", "labels": {"0": 0, "1": 1}}, "balance": False}
READERS: dict[str, Callable[[Path], object]] = {  # reader -> what it read, comparable across encodings
    "verdict table": lambda p: (lambda t: (t.items.to_dict("list"), t.votes.tolist()))(verdicts.load(p)),
    "raw records": _built,
    "items": lambda p: (lambda i: (i.frame.to_dict("list"), i.passed.to_dict("list")))(predict.read_items(p)),
    "pool": lambda p: (lambda q: (q.item_ids.tolist(), np.round(q.p, 6).tolist(), q.clusters.tolist()))(read_pool(p)),
    "labels": lambda p: (lambda lab: (lab[0].tolist(), np.nan_to_num(lab[1], nan=-1).tolist()))(
        read_labels(p, _pool(p.parent))
    ),
    "dataset items": lambda p: datasets.read_items(p).to_dict("list"),
}


def _bom(b: bytes) -> bytes:
    return b"\xef\xbb\xbf" + b


ENCODINGS: dict[str, Callable[[str], bytes]] = {
    "UTF-8 BOM": lambda t: _bom(t.encode()),
    "CRLF": lambda t: t.replace("\n", "\r\n").encode(),
    "UTF-16 LE": lambda t: b"\xff\xfe" + t.encode("utf-16-le"),
    "UTF-16 BE": lambda t: b"\xfe\xff" + t.encode("utf-16-be"),
    "gzip": lambda t: gzip.compress(t.encode(), mtime=0),
    "gzip of a UTF-8 BOM and CRLF": lambda t: gzip.compress(_bom(t.replace("\n", "\r\n").encode()), mtime=0),
}
CASES = [(r, f) for r, formats in TEXTS.items() for f in formats]


def _read(tmp: Path, reader: str, fmt: str, data: bytes, name: str = "f"):
    path = tmp / f"{name}.{fmt}"
    path.write_bytes(data)
    return READERS[reader](path)


@pytest.mark.parametrize("encoding", list(ENCODINGS))
@pytest.mark.parametrize("reader, fmt", CASES)
def test_every_reader_reads_every_encoding_as_the_plain_file(tmp_path, reader, fmt, encoding):
    text = TEXTS[reader][fmt]
    want = _read(tmp_path, reader, fmt, text.encode(), "plain")
    assert _read(tmp_path, reader, fmt, ENCODINGS[encoding](text), "encoded") == want


@pytest.mark.parametrize("reader, fmt", CASES)
def test_ids_written_in_nfd_are_the_nfc_ids(tmp_path, reader, fmt):
    text = TEXTS[reader][fmt]
    nfd = text.replace(CAFE, unicodedata.normalize("NFD", CAFE))
    assert nfd != text
    assert _read(tmp_path, reader, fmt, nfd.encode(), "nfd") == _read(tmp_path, reader, fmt, text.encode(), "nfc")


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("reader", [r for r, formats in TEXTS.items() if "jsonl" in formats])
def test_every_json_lines_reader_refuses_a_bare_nan_naming_the_line(tmp_path, reader, token):
    lines = TEXTS[reader]["jsonl"].splitlines(keepends=True)
    last = json.loads(lines[-1])
    key = next(k for k in ("p_hallucinated", "gold", "g", "candidate") if k in last)
    lines[-1] = lines[-1].replace(json.dumps({key: last[key]})[1:-1], f'"{key}": {token}')
    assert token in lines[-1]
    with pytest.raises(RaimError, match=f"line {len(lines)}: unreadable JSON \\(a bare {token}, which is not JSON"):
        _read(tmp_path, reader, "jsonl", "".join(lines).encode())


@pytest.mark.parametrize("reader, fmt", CASES)
def test_utf16_without_its_mark_is_one_line_naming_the_file(tmp_path, reader, fmt):
    name = "b" if reader == "raw records" else "f"  # the raw file as src.data names it: under its raw root
    with pytest.raises(
        RaimError, match=f"{name}\\.{fmt}:? line 1: a NUL byte at offset 1: UTF-16 without a byte-order"
    ):
        _read(tmp_path, reader, fmt, TEXTS[reader][fmt].encode("utf-16-le"))
