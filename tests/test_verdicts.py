"""The bring-your-own-verdicts contract: parsing, and clear errors that name file, row and field."""

import numpy as np
import pandas as pd
import pytest

from src import verdicts
from src.verdicts import ABSTAIN, VerdictError

GOOD = "item_id,cluster_id,dataset,gold,a,b,sonnet,a@logodds\n" \
       "i1,c1,d,0,0,,0,-1.5\n" \
       "i2,c1,d,1,1,1,1,2.0\n" \
       "i3,c2,d,1,0,1.0,,\n"


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


@pytest.mark.parametrize("text, pattern", [
    ("item_id,gold,a\ni1,0,1\n", r"missing required column.*cluster_id"),
    ("item_id,cluster_id,gold,a\ni1,c,2,1\n", r"row 2 \(item_id='i1'\): field 'gold': value '2'"),
    ("item_id,cluster_id,gold,a\ni1,c,,1\n", r"row 2 .*field 'gold'"),
    ("item_id,cluster_id,gold,a\ni1,c,0,1\ni1,c,1,0\n", r"row 3: field 'item_id': duplicate item_id 'i1'"),
    ("item_id,cluster_id,gold,a\ni1,c,0,1\ni2,c,1,yes\n", r"row 3 \(item_id='i2'\): field 'a': value 'yes'"),
    ("item_id,cluster_id,gold,a\ni1,c,0,0.5\n", r"field 'a': value '0.5' not in \{0, 1, empty\}"),
    ("item_id,cluster_id,gold,a\ni1,,0,1\n", r"row 2: field 'cluster_id': empty"),
    ("item_id,cluster_id,gold\ni1,c,0\n", r"no judge columns"),
    ("item_id,cluster_id,gold,a,a@logodds\ni1,c,0,1,abc\n", r"row 2: field 'a@logodds': not a number"),
    ("", r"empty file"),
    ("item_id,cluster_id,gold,a\n", r"no rows"),
])
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
    df = pd.DataFrame({"item_id": list("abcd"), "cluster_id": list("xxyy"), "dataset": ["d1", "d1", "d2", "d2"],
                       "gold": [0, 1, 0, 1], "m1": [0, 1, 1, 1], "m2": [0, 0, None, 1]})
    t = verdicts.validate(df)
    parts = t.by_dataset()
    assert list(parts) == ["d1", "d2"] and parts["d2"].votes.tolist() == [[1, ABSTAIN], [1, 1]]
    assert t.subset(np.ones(4, bool), ["m2"]).members == ["m2"]
