"""The bring-your-own-verdicts contract: parsing, and clear errors that name file, row and field."""

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from src.core import verdicts
from src.core.verdicts import ABSTAIN, VerdictError

GOOD = (
    "item_id,cluster_id,dataset,gold,a,b,sonnet,a@logodds\n"
    "i1,c1,d,0,0,,0,-1.5\n"
    "i2,c1,d,1,1,1,1,2.0\n"
    "i3,c2,d,1,0,1.0,,\n"
)


def write(tmp_path, text, name="v.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_parses_votes_abstentions_frontier_and_features(tmp_path):
    t = verdicts.load(write(tmp_path, GOOD), frontier="sonnet")
    assert t.members == ["a", "b"]
    assert t.votes.tolist() == [[0, ABSTAIN], [1, 1], [0, 1]]
    assert t.frontier.tolist() == [0, 1, ABSTAIN]
    assert t.features["a@logodds"].tolist() == [-1.5, 2.0, 0.0]
    assert t.gold.tolist() == [0, 1, 1]
    back = t.to_frame()
    assert back["b"].isna().tolist() == [True, False, False]


def test_parquet_roundtrip(tmp_path):
    df = pd.read_csv(write(tmp_path, GOOD), dtype=str, keep_default_na=False)
    p = tmp_path / "v.parquet"
    df.to_parquet(p)
    assert verdicts.load(p, frontier="sonnet").votes.tolist() == [[0, ABSTAIN], [1, 1], [0, 1]]


def test_missing_dataset_column_defaults(tmp_path):
    t = verdicts.load(write(tmp_path, "item_id,cluster_id,gold,a\ni1,c,0,1\n"))
    assert t.datasets == ["all"]


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("item_id,gold,a\ni1,0,1\n", r"missing required column.*cluster_id"),
        ("item_id,cluster_id,gold,a\ni1,c,2,1\n", r"row 2 \(item_id='i1'\): field 'gold': value '2'"),
        ("item_id,cluster_id,gold,a\ni1,c,,1\n", r"row 2 .*field 'gold'"),
        ("item_id,cluster_id,gold,a\ni1,c,0,1\ni1,c,1,0\n", r"row 3: field 'item_id': duplicate item_id 'i1'"),
        ("item_id,cluster_id,gold,a\ni1,c,0,1\ni2,c,1,yes\n", r"row 3 \(item_id='i2'\): field 'a': value 'yes'"),
        ("item_id,cluster_id,gold,a\ni1,c,0,0.5\n", r"field 'a': value '0.5' not in \{0, 1, empty\}"),
        ("item_id,cluster_id,gold,a\ni1,,0,1\n", r"row 2 \(item_id='i1'\): field 'cluster_id': empty"),
        ("item_id,cluster_id,gold\ni1,c,0\n", r"no judge columns"),
        (
            "item_id,cluster_id,gold,a,a@logodds\ni1,c,0,1,abc\n",
            r"row 2 \(item_id='i1'\): field 'a@logodds': not a number",
        ),
        ("", r"empty file"),
        ("item_id,cluster_id,gold,a\n", r"no rows"),
    ],
)
def test_bad_input_names_file_row_and_field(tmp_path, text, pattern):
    p = write(tmp_path, text)
    with pytest.raises(VerdictError, match=pattern) as e:
        verdicts.load(p)
    assert str(p) in str(e.value)


def test_missing_file_and_missing_roster_member(tmp_path):
    with pytest.raises(VerdictError, match="not found"):
        verdicts.load(tmp_path / "nope.csv")
    with pytest.raises(VerdictError, match=r"roster member column\(s\) \['zz'\]"):
        verdicts.load(write(tmp_path, GOOD), members=["a", "zz"])


def test_subset_and_by_dataset():
    df = pd.DataFrame(
        {
            "item_id": list("abcd"),
            "cluster_id": list("xxyy"),
            "dataset": ["d1", "d1", "d2", "d2"],
            "gold": [0, 1, 0, 1],
            "m1": [0, 1, 1, 1],
            "m2": [0, 0, None, 1],
        }
    )
    t = verdicts.validate(df)
    parts = t.by_dataset()
    assert list(parts) == ["d1", "d2"] and parts["d2"].votes.tolist() == [[1, ABSTAIN], [1, 1]]
    assert t.subset(np.ones(4, bool), ["m2"]).members == ["m2"]


# --- every bad table is one VerdictError line naming the file, and the row and field where there are ones


def cell(row: int, col: str, value: str) -> str:
    """GOOD with one cell replaced (``row``: 0-based record, i.e. file row ``row + 2``)."""
    lines = GOOD.splitlines()
    header = lines[0].split(",")
    cells = lines[row + 1].split(",")
    cells[header.index(col)] = value
    lines[row + 1] = ",".join(cells)
    return "\n".join(lines) + "\n"


def good_frame(**cols) -> pd.DataFrame:
    df = pd.DataFrame(
        {
            "item_id": ["i1", "i2", "i3"],
            "cluster_id": ["c1", "c1", "c2"],
            "gold": [0, 1, 1],
            "a": [0.0, 1.0, np.nan],
            "b": pd.array([1, None, 0], dtype="Int64"),
        }
    )
    return df.assign(**cols)


def parquet(df) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False), sink)
    return sink.getvalue().to_pybytes()


DUP_PARQUET = pa.table(
    [pa.array(x) for x in (["i1"], ["c"], [0], [1], [0], [1])],
    names=["item_id", "cluster_id", "gold", "llama", "b", "llama"],
)
MARKERS = ["NA", "N/A", "None", "null", "NaN", "nan", "<NA>", "na", "NULL"]

# (case, file name, content: text or bytes, None for no file, a callable for a folder; fragments of the message)
BAD = [
    *[(f"vote {m}", "v.csv", cell(1, "b", m), ["row 3 (item_id='i2')", "field 'b'", f"value '{m}'"]) for m in MARKERS],
    *[
        (f"vote {v}", "v.csv", cell(0, "a", v), ["row 2 (item_id='i1')", "field 'a'", f"value '{v}'"])
        for v in ["0.5", "2", "-1", "yes", "true", "1;0"]
    ],
    *[
        (f"gold {v or 'empty'}", "v.csv", cell(2, "gold", v), ["row 4 (item_id='i3')", "field 'gold'"])
        for v in ["2", "yes", "", " ", "NaN", "None", "0.5"]
    ],
    *[
        (f"frontier {v}", "v.csv", cell(0, "sonnet", v), ["row 2 (item_id='i1')", "field 'sonnet'", f"'{v}'"])
        for v in ["NaN", "NA", "2"]
    ],
    *[
        (f"{c} {m}", "v.csv", cell(1, c, m), ["row 3", f"field '{c}'", f"'{m}' is a missing-value marker"])
        for c in ("item_id", "cluster_id", "dataset")
        for m in MARKERS
    ],
    *[
        (f"{c} blank", "v.csv", cell(1, c, " "), ["row 3", f"field '{c}'", "empty value"])
        for c in ("item_id", "cluster_id", "dataset")
    ],
    ("duplicate item_id", "v.csv", cell(2, "item_id", "i1"), ["row 4", "field 'item_id'", "duplicate", "row 2"]),
    (
        "duplicate header",
        "v.csv",
        GOOD.replace(",b,", ",a,", 1),
        ["header: column 'a' appears twice (columns 5 and 6)"],
    ),
    ("empty header name", "v.csv", GOOD.replace(",sonnet,", ", ,", 1), ["header: column 7 has no name"]),
    ("too many fields", "v.csv", GOOD.replace("i2,c1,", "i2,c1,x,", 1), ["row 3 (item_id='i2')", "9 fields"]),
    ("too few fields", "v.csv", GOOD + "i4,c3,d\n", ["row 5 (item_id='i4')", "field 'gold': missing"]),
    ("non-UTF-8", "v.csv", GOOD.encode().replace(b"i3,", b"i\xe93,"), ["line 4", "byte 0xe9", "not UTF-8"]),
    ("Parquet named .csv", "v.csv", parquet(good_frame()), ["not UTF-8", "name it .parquet"]),
    ("logodds inf", "v.csv", cell(0, "a@logodds", "inf"), ["row 2 (item_id='i1')", "field 'a@logodds'", "'inf'"]),
    ("logodds -inf", "v.csv", cell(0, "a@logodds", "-inf"), ["row 2", "field 'a@logodds'", "not a finite number"]),
    ("logodds NaN", "v.csv", cell(0, "a@logodds", "NaN"), ["row 2", "field 'a@logodds'", "'NaN'"]),
    ("logodds text", "v.csv", cell(0, "a@logodds", "high"), ["row 2", "field 'a@logodds'", "not a number: 'high'"]),
    ("missing file", "nope.csv", None, ["file not found"]),
    ("directory", "dir.csv", lambda p: p.mkdir(), ["is a directory"]),
    ("empty file", "v.csv", "", ["empty file"]),
    ("blank lines only", "v.csv", "\n \n\n", ["empty file"]),
    ("header only", "v.csv", GOOD.splitlines()[0] + "\n", ["no rows"]),
    ("Parquet corrupt", "v.parquet", b"PAR1" + bytes(64) + b"PAR1", ["not a readable Parquet file"]),
    ("Parquet not Parquet", "v.parquet", GOOD, ["not a readable Parquet file", "magic bytes"]),
    ("Parquet duplicate header", "v.parquet", parquet(DUP_PARQUET), ["column 'llama' appears twice (columns 4 and 6)"]),
    (
        "Parquet timestamp votes",
        "v.parquet",
        parquet(good_frame(a=pd.Timestamp("2024-01-01"))),
        ["field 'a'", "column type datetime64", "cannot hold votes"],
    ),
    ("Parquet bool votes", "v.parquet", parquet(good_frame(a=True)), ["field 'a'", "column type bool"]),
    (
        "Parquet string NaN vote",
        "v.parquet",
        parquet(good_frame(a=["0", "NaN", None])),
        ["row 2 (item_id='i2')", "field 'a'", "value 'NaN'"],
    ),
    ("Parquet string None vote", "v.parquet", parquet(good_frame(a=["None", "1", None])), ["row 1 ", "'None'"]),
    (
        "Parquet vote 2",
        "v.parquet",
        parquet(good_frame(b=pd.array([1, 2, None], dtype="Int64"))),
        ["row 2 (item_id='i2')", "field 'b'", "value 2 not in"],
    ),
    ("Parquet vote inf", "v.parquet", parquet(good_frame(a=[0.0, np.inf, 1.0])), ["row 2", "field 'a'", "inf"]),
    (
        "Parquet null gold",
        "v.parquet",
        parquet(good_frame(gold=[0.0, np.nan, 1.0])),
        ["row 2", "field 'gold'", "empty"],
    ),
    (
        "Parquet null cluster",
        "v.parquet",
        parquet(good_frame(cluster_id=["c", None, "c"])),
        ["row 2 (item_id='i2')", "field 'cluster_id'", "empty value"],
    ),
    (
        "Parquet null item_id",
        "v.parquet",
        parquet(good_frame(item_id=["i1", None, "i3"])),
        ["row 2: field 'item_id'", "empty value"],
    ),
    (
        "Parquet string NA cluster",
        "v.parquet",
        parquet(good_frame(cluster_id=["c", "c", "NA"])),
        ["row 3", "'NA' is a missing-value marker"],
    ),
    (
        "Parquet logodds inf",
        "v.parquet",
        parquet(good_frame(**{"a@logodds": [0.0, -np.inf, 1.0]})),
        ["row 2", "field 'a@logodds'", "not a finite number: -inf"],
    ),
]


def put(tmp_path: Path, name: str, content) -> Path:
    p = tmp_path / name
    if callable(content):
        content(p)
    elif content is not None:
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


@pytest.mark.parametrize("name, content, fragments", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_every_bad_table_is_one_line_naming_file_row_and_field(tmp_path, name, content, fragments):
    p = put(tmp_path, name, content)
    with pytest.raises(VerdictError) as e:
        verdicts.load(p, frontier="sonnet")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}: "), msg
    for f in fragments:
        assert f in msg, msg


CRLF_BOM_BLANKS = (
    b"\xef\xbb\xbf"
    + "\r\n".join(GOOD.splitlines()[:2] + ["", " , , , , , , , "] + GOOD.splitlines()[2:]).encode()
    + b"\r\n"
)
OK = [  # (case, file name, content) that load exactly like GOOD
    ("UTF-8 BOM, CRLF, blank lines", "v.csv", CRLF_BOM_BLANKS),
    ("spaces around cells and names", "v.csv", GOOD.replace(",", " , ").replace("\n", " \n")),
    ("blank vote cell is an abstention", "v.csv", GOOD.replace("i1,c1,d,0,0,,0,", "i1,c1,d,0,0, ,0,")),
    ("quoted cells", "v.csv", GOOD.replace("i2,c1,d,1,1,1,1,", '"i2","c1",d,"1",1,1,1,')),
    ("Parquet of strings", "v.parquet", parquet(pd.read_csv(io.StringIO(GOOD), dtype=str, keep_default_na=False))),
]


@pytest.mark.parametrize("name, content", [c[1:] for c in OK], ids=[c[0] for c in OK])
def test_accepted_spellings(tmp_path, name, content):
    t = verdicts.load(put(tmp_path, name, content), frontier="sonnet")
    assert list(t.items.columns) == ["item_id", "cluster_id", "dataset", "gold"]
    assert t.items["item_id"].tolist() == ["i1", "i2", "i3"] and t.members == ["a", "b"]
    assert t.votes.tolist() == [[0, ABSTAIN], [1, 1], [0, 1]] and t.frontier.tolist() == [0, 1, ABSTAIN]
    assert t.features["a@logodds"].tolist() == [-1.5, 2.0, 0.0]


def test_rows_are_line_numbers_past_blank_lines(tmp_path):
    text = GOOD.replace("\ni2,", "\n\ni2,").replace("i3,c2,d,1,0,1.0", "i3,c2,d,1,0,yes")
    with pytest.raises(VerdictError, match=r"row 5 \(item_id='i3'\): field 'b': value 'yes'"):
        verdicts.load(put(tmp_path, "v.csv", text))


def test_parquet_nulls_are_abstentions_and_neutral_features(tmp_path):
    df = good_frame(**{"a@logodds": [0.5, None, np.nan], "sonnet": [None, 1.0, 0.0]})
    t = verdicts.load(put(tmp_path, "v.parquet", parquet(df)), frontier="sonnet")
    assert t.votes.tolist() == [[0, 1], [1, ABSTAIN], [ABSTAIN, 0]]
    assert t.frontier.tolist() == [ABSTAIN, 1, 0] and t.features["a@logodds"].tolist() == [0.5, 0.0, 0.0]


def test_in_memory_nullable_frames_keep_na_as_abstention():
    """src.run validates frames built from the verdict cache: Int64 votes and Float64 features with pd.NA."""
    df = pd.DataFrame(
        {
            "item_id": ["x", "y", "z"],
            "cluster_id": ["c", "c", "d"],
            "dataset": ["s"] * 3,
            "frame": ["f"] * 3,
            "gold": [0, 1, 1],
            "m1": pd.array([0, pd.NA, 1], dtype="Int64"),
            "m2": pd.array([pd.NA] * 3, dtype="Int64"),
            "m1@logodds": pd.array([-0.5, pd.NA, 1.5], dtype="Float64"),
            "frontier": pd.array([1, 0, pd.NA], dtype="Int64"),
        }
    )
    t = verdicts.validate(df, source="cache c", frontier="frontier", members=["m1", "m2"])
    assert t.votes.tolist() == [[0, ABSTAIN], [ABSTAIN, ABSTAIN], [1, ABSTAIN]]
    assert t.frontier.tolist() == [1, 0, ABSTAIN] and t.features["m1@logodds"].tolist() == [-0.5, 0.0, 1.5]
    df["m2"] = pd.array([pd.NA, 3, pd.NA], dtype="Int64")
    with pytest.raises(VerdictError, match=r"^cache c: row 3 \(item_id='y'\): field 'm2': value 3 not in"):
        verdicts.validate(df, source="cache c", frontier="frontier", members=["m1", "m2"])


def test_cli_bad_table_is_one_error_line(tmp_path):
    bad = put(tmp_path, "bad.csv", cell(1, "a", "NaN"))
    env = {**os.environ, "RAIM_HYDRA_DIR": str(tmp_path / "hydra"), "RAIM_DEBUG": "0"}
    env.pop("HYDRA_FULL_ERROR", None)
    out = tmp_path / "r.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "src.run",
            f"verdicts={bad}",
            "tracking.enabled=false",
            f"output={out}",
            "analysis=fast",
        ],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode != 0 and not out.exists()
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {bad}: row 3 (item_id='i2'): field 'a'"), p.stderr
    assert "Traceback" not in p.stderr and "HYDRA_FULL_ERROR" not in p.stderr
