"""Catalogues of malformed inputs, shared by the tests and by ``bench/reliability.py`` (the README's reliability
table): verdict-table files, and scoring requests to a served stacker. Each entry names what is wrong."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd

HEADER = "item_id,cluster_id,dataset,gold,a,b,c"


def _rows(n: int = 24) -> list[str]:
    """A small valid table body: two datasets' worth of items, three judges."""
    out = []
    for i in range(n):
        g = i % 2
        out.append(f"i{i},c{i // 2},sim,{g},{g},{1 - g if i % 5 == 0 else g},{'' if i % 7 == 0 else g}")
    return out


def valid_csv() -> str:
    return "\n".join([HEADER, *_rows()]) + "\n"


def _with(row: int, cell: int, value: str) -> str:
    """The valid table with one cell (0-based row of the body, column index) replaced."""
    rows = _rows()
    parts = rows[row].split(",")
    parts[cell] = value
    rows[row] = ",".join(parts)
    return "\n".join([HEADER, *rows]) + "\n"


def _feature(value: str, column: str = "a@logodds", fill: str = "0.1") -> str:
    """The valid table with a feature ``column`` (``fill`` in every row), ``value`` in its fourth row."""
    rows = [r + "," + fill for r in _rows()]
    rows[3] = rows[3].rsplit(",", 1)[0] + "," + value
    return "\n".join([HEADER + "," + column, *rows]) + "\n"


def _parquet(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def _valid_frame() -> pd.DataFrame:
    return pd.read_csv(io.StringIO(valid_csv()), dtype=str, keep_default_na=False)


# name -> (file name, bytes); every one must be rejected with one line naming the file (and row / field)
BAD_TABLES: dict[str, tuple[str, Callable[[], bytes]]] = {
    "vote NaN": ("t.csv", lambda: _with(3, 4, "NaN").encode()),
    "vote nan": ("t.csv", lambda: _with(3, 4, "nan").encode()),
    "vote NA": ("t.csv", lambda: _with(3, 4, "NA").encode()),
    "vote None": ("t.csv", lambda: _with(3, 4, "None").encode()),
    "vote null": ("t.csv", lambda: _with(3, 4, "null").encode()),
    "vote N/A": ("t.csv", lambda: _with(3, 4, "N/A").encode()),
    "vote <NA>": ("t.csv", lambda: _with(3, 4, "<NA>").encode()),
    "vote 2": ("t.csv", lambda: _with(3, 4, "2").encode()),
    "vote 0.5": ("t.csv", lambda: _with(3, 4, "0.5").encode()),
    "vote -1": ("t.csv", lambda: _with(3, 4, "-1").encode()),
    "vote yes": ("t.csv", lambda: _with(3, 4, "yes").encode()),
    "vote true": ("t.csv", lambda: _with(3, 4, "true").encode()),
    "gold empty": ("t.csv", lambda: _with(5, 3, "").encode()),
    "gold 2": ("t.csv", lambda: _with(5, 3, "2").encode()),
    "gold yes": ("t.csv", lambda: _with(5, 3, "yes").encode()),
    "gold NaN": ("t.csv", lambda: _with(5, 3, "NaN").encode()),
    "item_id empty": ("t.csv", lambda: _with(2, 0, "").encode()),
    "item_id NA": ("t.csv", lambda: _with(2, 0, "NA").encode()),
    "item_id duplicated": ("t.csv", lambda: _with(2, 0, "i1").encode()),
    "cluster_id NA": ("t.csv", lambda: _with(2, 1, "NA").encode()),
    "cluster_id None": ("t.csv", lambda: _with(2, 1, "None").encode()),
    "cluster_id empty": ("t.csv", lambda: _with(2, 1, "").encode()),
    "dataset empty": ("t.csv", lambda: _with(2, 2, "").encode()),
    "dataset null": ("t.csv", lambda: _with(2, 2, "null").encode()),
    "duplicated judge header": ("t.csv", lambda: valid_csv().replace(HEADER, HEADER[:-1] + "a", 1).encode()),
    "empty column name": ("t.csv", lambda: valid_csv().replace(",c\n", ",\n", 1).encode()),
    "missing gold column": ("t.csv", lambda: valid_csv().replace(",gold,", ",label,", 1).encode()),
    "no judge column": ("t.csv", lambda: b"item_id,cluster_id,gold\ni1,c1,0\ni2,c2,1\n"),
    "too many fields": ("t.csv", lambda: valid_csv().replace("\ni3,", "\ni3,x,", 1).encode()),
    "too few fields": ("t.csv", lambda: (valid_csv() + "i99,c99,sim\n").encode()),
    "non-UTF-8 bytes": ("t.csv", lambda: valid_csv().encode().replace(b"\ni4,", b"\ni\xff4,", 1)),
    "empty file": ("t.csv", lambda: b""),
    "header only": ("t.csv", lambda: (HEADER + "\n").encode()),
    "binary garbage": ("t.csv", lambda: bytes(range(256)) * 4),
    "logodds inf": ("t.csv", lambda: _feature("inf").encode()),
    "logodds text": ("t.csv", lambda: _feature("high").encode()),
    "single gold class": (
        "t.csv",
        lambda: "\n".join([HEADER] + [f"i{i},c{i},sim,1,1,0,1" for i in range(20)]).encode(),
    ),
    "too few clusters": (
        "t.csv",
        lambda: "\n".join([HEADER] + [f"i{i},c{i % 3},sim,{i % 2},{i % 2},0,1" for i in range(20)]).encode(),
    ),
    "parquet: corrupt": ("t.parquet", lambda: b"PAR1" + b"\x00" * 64 + b"PAR1"),
    "parquet: not parquet": ("t.parquet", lambda: valid_csv().encode()),
    "parquet: string NaN vote": (
        "t.parquet",
        lambda: _parquet(_valid_frame().assign(a=lambda d: d["a"].where(d.index != 3, "NaN"))),
    ),
    "parquet: vote 2": (
        "t.parquet",
        lambda: _parquet(_valid_frame().assign(a=lambda d: pd.to_numeric(d["a"]).where(d.index != 3, 2))),
    ),
    "parquet: null cluster": (
        "t.parquet",
        lambda: _parquet(_valid_frame().assign(cluster_id=lambda d: d["cluster_id"].where(d.index != 3, None))),
    ),
}

# A second catalogue (values a table used to take as meant although they cannot be): each must be rejected with one
# line naming the file, row and field
BOUNDARY_TABLES: dict[str, tuple[str, Callable[[], bytes]]] = {
    "logodds 1e300": ("t.csv", lambda: _feature("1e300").encode()),
    "logodds -71": ("t.csv", lambda: _feature("-71").encode()),
    "mass 5": ("t.csv", lambda: _feature("5", "a@mass", "0.9").encode()),
    "mass -3": ("t.csv", lambda: _feature("-3", "a@mass", "0.9").encode()),
    "mass NaN": ("t.csv", lambda: _feature("NaN", "a@mass", "0.9").encode()),
    "judge name with a zero-width space": ("t.csv", lambda: valid_csv().replace(",b,", ",a\u200b,", 1).encode()),
    "judge name with a no-break space inside": ("t.csv", lambda: valid_csv().replace(",b,", ",b\xa0b,", 1).encode()),
}

# name -> (file name, bytes) that are valid and must be accepted (and analysed)
GOOD_TABLES: dict[str, tuple[str, Callable[[], bytes]]] = {
    "plain CSV": ("t.csv", lambda: valid_csv().encode()),
    "UTF-8 BOM": ("t.csv", lambda: b"\xef\xbb\xbf" + valid_csv().encode()),
    "CRLF line ends": ("t.csv", lambda: valid_csv().replace("\n", "\r\n").encode()),
    "Parquet with nulls": (
        "t.parquet",
        lambda: _parquet(_valid_frame().assign(c=lambda d: pd.to_numeric(d["c"].replace("", None)).astype("Int64"))),
    ),
}


def write(tmp: Path, name: str, catalogue: dict) -> Path:
    fname, make = catalogue[name]
    path = tmp / re.sub(r"[^A-Za-z0-9_.-]+", "_", name) / fname  # a plain folder name (Hydra parses the path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(make())
    return path


def serving_requests(members: list[str]) -> dict[str, dict]:
    """Malformed scoring requests for a stacker over ``members`` (each must be a one-line 400)."""
    rec = {m: 1 for m in members}
    first, last = members[0], members[-1]
    without = {k: v for k, v in rec.items() if k != last}
    return {
        "missing column": {"dataframe_records": [without]},
        "extra column": {"dataframe_records": [{**rec, "m99": 1}]},
        "misspelt column": {"dataframe_records": [{**without, last[:-1]: 1}]},
        "extra column in a later row": {"dataframe_records": [rec, {**rec, "qwen": 0}]},
        "vote 0.7": {"dataframe_records": [{**rec, first: 0.7}]},
        "vote 2": {"dataframe_records": [{**rec, first: 2}]},
        "vote -1": {"dataframe_records": [{**rec, first: -1}]},
        "vote empty list": {"dataframe_records": [{**rec, first: []}]},
        "vote string": {"dataframe_records": [{**rec, first: "yes"}]},
        "vote numeric string": {"dataframe_records": [{**rec, first: "1"}]},
        "vote true": {"dataframe_records": [{**rec, first: True}]},
        "vote object": {"dataframe_records": [{**rec, first: {"v": 1}}]},
        "row not an object": {"dataframe_records": [[1, 0, 1]]},
        "no rows": {"dataframe_records": []},
        "split: short row": {"dataframe_split": {"columns": members, "data": [[1, 0]]}},
        "split: unknown column": {"dataframe_split": {"columns": members + ["zz"], "data": [[1] * (len(members) + 1)]}},
        "split: no data": {"dataframe_split": {"columns": members}},
        "inputs: missing column": {"inputs": {m: [1] for m in members[:-1]}},
        "inputs: ragged columns": {"inputs": {**{m: [1] for m in members}, first: [1, 0]}},
        "instances: bad vote": {"instances": [{**rec, last: 3}]},
    }


def raw_dataset(
    root: Path,
    records: list | None = None,
    fmt: str = "jsonl",
    text: str | None = None,
    spec_text: str | None = None,
    **builder,
) -> tuple[Path, Path]:
    """Dataset ``bench``: its raw file ``<root>/raw/bench/b.<fmt>`` (``records`` as JSON Lines / JSON, or ``text``;
    a Parquet file is left to the caller) and its spec ``<root>/specs/bench.yaml`` (a ``Fields`` builder with
    question field ``q`` and ``builder``'s settings, or ``spec_text``). Returns (raw root, spec folder), what
    ``src.io.datasets.build_dataset`` and ``python -m src.data --raw-dir … --spec-dir …`` read."""
    import json

    import yaml

    raw = root / "raw" / "bench"
    raw.mkdir(parents=True, exist_ok=True)
    if fmt != "parquet":
        body = (
            text
            if text is not None
            else ("".join(json.dumps(r) + "\n" for r in records) if fmt == "jsonl" else json.dumps(records))
        )
        (raw / f"b.{fmt}").write_text(body)
    specs = root / "specs"
    specs.mkdir(exist_ok=True)
    node = {"_target_": "src.io.datasets.Fields", "path": f"bench/b.{fmt}", "question": "q", **builder}
    (specs / "bench.yaml").write_text(
        spec_text
        if spec_text is not None
        else yaml.safe_dump({"name": "bench", "title": "B", "frame": "claim", "paper_n": None, "builder": node})
    )
    return root / "raw", specs


def boundary_requests(members: list[str]) -> dict[str, tuple[bytes, str | None]]:
    """Requests to a served stacker over ``members`` that bypassed the strict check or broke its one line: name ->
    (body, Content-Type). Each must be a one-line 400."""
    import json

    rec = {m: 1 for m in members}
    first = members[0]
    ok = json.dumps({"dataframe_records": [rec]})
    head = ",".join(members)
    return {
        "text/csv: unknown column": (f"{head},zz\n{','.join('1' * (len(members) + 1))}\n".encode(), "text/csv"),
        "text/csv: missing column": (
            f"{head[: head.rindex(',')]}\n{','.join('1' * (len(members) - 1))}\n".encode(),
            "text/csv",
        ),
        "text/csv: vote yes": (f"{head}\n{','.join(['yes'] + ['1'] * (len(members) - 1))}\n".encode(), "text/csv"),
        "inputs: list of lists": (json.dumps({"inputs": [[1] * len(members)]}).encode(), "application/json"),
        "instances: a scalar": (b'{"instances": 5}', "application/json"),
        "instances: a list of scalars": (b'{"instances": [5, 6]}', "application/json"),
        "vote: a bare NaN": (ok.replace(f'"{first}": 1', f'"{first}": NaN', 1).encode(), "application/json"),
        "a column given twice in one row": (
            ok.replace(f'"{first}": 1', f'"{first}": 1, "{first}": 0', 1).encode(),
            "application/json",
        ),
        "prevalence '2'": (ok[:-1].encode() + b', "params": {"prevalence": "2"}}', "application/json"),
        "prevalence -0.1": (ok[:-1].encode() + b', "params": {"prevalence": -0.1}}', "application/json"),
        "prevalence 'estimate' on one row": (
            ok[:-1].encode() + b', "params": {"prevalence": "estimate"}}',
            "application/json",
        ),
        "unknown parameter": (ok[:-1].encode() + b', "params": {"prior": 0.1}}', "application/json"),
        "body not JSON": (b"m0=1&m1=0", "application/json"),
        "body a JSON list": (b"[1, 2]", "application/json"),
        "body an object with no known key": (b'{"records": []}', "application/json"),
        "no Content-Type": (ok.encode(), None),
    }


def panel_requests() -> dict[str, tuple[bytes, str | None]]:
    """Requests to a served panel whose texts, frames or item ids cannot be judged as given (each a one-line 400)."""
    import json

    def rows(*rs):
        return json.dumps({"dataframe_records": list(rs)}).encode(), "application/json"

    return {
        "candidate a number": rows({"candidate": 5}),
        "candidate a list": rows({"candidate": ["a", "b"]}),
        "evidence a number": rows({"candidate": "c", "evidence": 3.5}),
        "unknown frame": rows({"candidate": "c", "frame": "nope"}),
        "path-like frame": rows({"candidate": "c", "frame": "../../etc/passwd"}),
        "one item id twice": rows({"candidate": "a", "item_id": "x"}, {"candidate": "b", "item_id": "x"}),
        "one text twice without ids": rows({"candidate": "a"}, {"candidate": "a"}),
    }
