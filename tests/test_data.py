"""Builders of balanced binary items (src/data.py; paper Appendix J, Table 18)."""
from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from src import data
from src.data import ITEM_COLUMNS, RawRecordError

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "raw"
REAL = ("medhallu", "truthfulqa", "wice", "expertqa")
PAIRED = {"medhallu", "truthfulqa", "ragtruth", "factscore"}
PAPER_N = {"medhallu": 2000, "wice": 222, "ragtruth": 1362, "xsum": 546, "cnndm": 114,
           "expertqa": 1462, "factscore": 330, "truthfulqa": 1634, "triviaplus": None}


def _real_raw_dir() -> Path | None:
    candidates = [os.environ.get("RAIM_RAW_DIR"), "/work/shared/data/raw",
                  Path(__file__).resolve().parents[2] / "shared" / "data" / "raw"]
    for c in candidates:
        if c and all(not data.missing_files(n, c) for n in REAL):
            return Path(c)
    return None


RAW = _real_raw_dir()
needs_raw = pytest.mark.skipif(RAW is None, reason="real raw benchmarks (../shared/data/raw) absent")


@pytest.fixture(scope="module")
def real() -> dict[str, pd.DataFrame]:
    return {n: data.build(n, RAW) for n in REAL}


@pytest.fixture(scope="module")
def fixtures() -> dict[str, pd.DataFrame]:
    return {n: data.build(n, FIXTURES) for n in ("ragtruth", "xsum", "cnndm", "factscore", "triviaplus")}


def _balance(df: pd.DataFrame) -> tuple[int, int]:
    return int((df.gold == 0).sum()), int((df.gold == 1).sum())


def _check_schema(df: pd.DataFrame, name: str) -> None:
    assert tuple(df.columns[: len(ITEM_COLUMNS)]) == ITEM_COLUMNS
    assert df.item_id.is_unique
    assert list(df.item_id) == sorted(df.item_id)
    assert set(df.gold) <= {0, 1} and (df.dataset == name).all()
    assert (df.frame == data.SOURCES[name].frame).all()
    assert df.item_id.str.startswith(f"{name}-").all() and df.cluster_id.str.startswith(f"{name}-").all()
    assert (df.candidate.str.strip() != "").all() and (df.question.str.strip() != "").all()
    assert df.item_id.str.endswith("-pos").eq(df.gold == 0).all()  # pos = supported (Table 19)


def _check_pairs(df: pd.DataFrame) -> None:
    """Table 19: each cluster is one supported + one hallucinated, same question and evidence."""
    for _, g in df.groupby("cluster_id"):
        assert sorted(g.gold) == [0, 1]
        assert g.question.nunique() == 1 and g.evidence.nunique() == 1
        assert g.candidate.nunique() == 2


# ---------------------------------------------------------------- real raw files

@needs_raw
@pytest.mark.parametrize("name,n", [("medhallu", 2000), ("truthfulqa", 1634), ("wice", 222), ("expertqa", 1180)])
def test_real_n_and_exact_balance(real, name, n):
    df = real[name]
    _check_schema(df, name)
    assert len(df) == n
    assert _balance(df) == (n // 2, n // 2)


@needs_raw
@pytest.mark.parametrize("name", ["medhallu", "truthfulqa"])
def test_real_pairs_share_question_and_evidence(real, name):
    df = real[name]
    _check_pairs(df)
    assert df.cluster_id.nunique() == len(df) // 2
    assert (df.evidence != "").all() if name == "medhallu" else (df.evidence == "").all()


@needs_raw
def test_real_medhallu_candidates_match_raw(real):
    rows = [json.loads(line) for line in open(RAW / "medhallu" / "medhallu_pqa_labeled.jsonl")]
    df = real["medhallu"].set_index("item_id")
    assert df.loc["medhallu-00007-pos", "candidate"] == rows[7]["Ground Truth"]
    assert df.loc["medhallu-00007-neg", "candidate"] == rows[7]["Hallucinated Answer"]
    assert df.loc["medhallu-00007-neg", "question"] == rows[7]["Question"]
    assert rows[7]["Knowledge"][0].strip() in df.loc["medhallu-00007-neg", "evidence"]


@needs_raw
def test_real_truthfulqa_incorrect_answer_is_a_listed_one(real):
    raw = pd.read_csv(RAW / "truthfulqa" / "TruthfulQA.csv")
    df = real["truthfulqa"]
    neg = df[df.gold == 1].reset_index(drop=True)
    pos = df[df.gold == 0].reset_index(drop=True)
    for i in (0, 100, 816):
        wrong = [a.strip() for a in raw.loc[i, "Incorrect Answers"].split(";")]
        assert neg.loc[i, "candidate"] in wrong and neg.loc[i, "question"] == raw.loc[i, "Question"]
        assert pos.loc[i, "candidate"] == raw.loc[i, "Best Answer"].strip()


@needs_raw
@pytest.mark.parametrize("name,key", [("wice", "claim_title"), ("expertqa", "question")])
def test_real_claim_sets_cluster_on_shared_document(real, name, key):
    """Claim frame (Table 20): question = candidate = claim; clusters from the shared source."""
    df = real[name]
    assert (df.question == df.candidate).all() and (df.evidence != "").all()
    assert 1 < df.cluster_id.nunique() < len(df)
    if name == "wice":
        rows = [json.loads(line) for line in open(RAW / "wice" / "claim" / "test.jsonl")]
        metas = [r["meta"] if isinstance(r["meta"], dict) else ast.literal_eval(r["meta"]) for r in rows]
        by_claim = {r["claim"]: f"wice-{data._ident(m[key])}" for r, m in zip(rows, metas)}
        assert (df.question.map(by_claim) == df.cluster_id).all()
    else:
        sizes = df.groupby("cluster_id").size()
        assert sizes.max() > 2  # several claims per ExpertQA question


@needs_raw
@pytest.mark.parametrize("name", REAL)
def test_real_output_byte_identical_on_two_runs(real, tmp_path, name):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    data.write_items(real[name], first)
    data.write_items(data.build(name, RAW), second)
    assert first.read_bytes() == second.read_bytes()
    pd.testing.assert_frame_equal(data.read_items(first), real[name])


@needs_raw
def test_real_seed_changes_subsample_not_balance(real):
    other = data.build("wice", RAW, seed=1)
    assert _balance(other) == (111, 111)
    assert set(other.item_id) != set(real["wice"].item_id)


# ---------------------------------------------------------------- fixtures (unavailable sets)

def test_ragtruth_fixture_pairs(fixtures):
    df = fixtures["ragtruth"]
    _check_schema(df, "ragtruth")
    _check_pairs(df)
    # 102: its only hallucinated response is truncated; 104 is a Summary source
    assert sorted(df.cluster_id.unique()) == ["ragtruth-00101", "ragtruth-00103"]
    got = dict(zip(df.item_id, df.candidate))
    assert got["ragtruth-00101-neg"] == "101 hallucinated A"
    assert got["ragtruth-00101-pos"] in {"101 supported A", "101 supported B"}
    assert got["ragtruth-00103-pos"] == "103 supported A"
    assert df.loc[df.cluster_id == "ragtruth-00101", "question"].iloc[0] == "how long do cats sleep"
    assert df.evidence.str.startswith("passage 1:").all()


@pytest.mark.parametrize("name,n,docs", [("xsum", 4, 3), ("cnndm", 2, 2)])
def test_aggrefact_fixture_balanced_claims(fixtures, name, n, docs):
    df = fixtures[name]
    _check_schema(df, name)
    assert len(df) == n and _balance(df) == (n // 2, n // 2)
    assert (df.question == df.candidate).all()
    assert df.groupby("cluster_id").evidence.nunique().eq(1).all()  # cluster = doc
    assert df.cluster_id.nunique() == docs
    assert "A frog was found." not in set(df.candidate)  # the val cut is excluded
    if name == "xsum":  # label 0 (unfaithful) -> gold 1, both minority items kept
        assert set(df[df.gold == 1].candidate) == {"The bridge will close for a year.",
                                                   "A frog species was found in Brazil."}
        assert any('said, on Monday, that "the bridge" will close.\nRepairs' in e for e in df.evidence)


def test_factscore_fixture_pairs(fixtures):
    df = fixtures["factscore"]
    _check_schema(df, "factscore")
    _check_pairs(df)
    assert (df.evidence == "").all()
    assert set(df.question) == {"Tell me a bio of Ada Lovelace.", "Tell me a bio of Grace Hopper."}
    neg = set(df[df.gold == 1].candidate)
    assert "Ada Lovelace was born in Paris." in neg and "This helps." not in set(df.candidate)
    assert neg <= {"Ada Lovelace was born in Paris.", "Grace Hopper invented Python.",
                   "Grace Hopper was born in 1950."}


def test_triviaplus_fixture_balance_and_noisy_columns(fixtures):
    df = fixtures["triviaplus"]
    _check_schema(df, "triviaplus")
    assert list(df.columns[len(ITEM_COLUMNS):]) == ["noisy_ws", "noisy_dw", "noisy_dl", "noisy_rf"]
    assert len(df) == 6 and _balance(df) == (3, 3)
    rows = pd.read_json(FIXTURES / "triviaplus" / "rows.jsonl", lines=True)
    merged = df.merge(rows, left_on="candidate", right_on="answer")
    assert len(merged) == 6
    assert (merged.gold == merged.response_level_label_binary).all()
    assert (merged.noisy_dw == merged.response_level_label_binary_15pct_noise_dissenting_workers).all()
    assert (merged.noisy_ws == merged.response_level_label_binary_ws_llm_aaj).all()
    # same question, different source/article -> different clusters
    eiffel = merged[merged.question_x == "Who built the Eiffel Tower?"]
    assert eiffel.groupby("source").cluster_id.nunique().eq(1).all() and eiffel.cluster_id.nunique() == 2


def test_triviaplus_parquet_fixture_matches_its_readable_rows():
    parquet = pd.read_parquet(next((FIXTURES / "triviaplus").glob("*.parquet")))
    rows = pd.read_json(FIXTURES / "triviaplus" / "rows.jsonl", lines=True)
    assert parquet.drop(columns=["answer_sentence_list", "sentence_level_majority_vote"]).astype(str).equals(
        rows.drop(columns=["answer_sentence_list", "sentence_level_majority_vote"]).astype(str))


@pytest.mark.parametrize("name", ["ragtruth", "xsum", "factscore", "triviaplus"])
def test_fixture_output_byte_identical_and_roundtrip(fixtures, tmp_path, name):
    data.write_items(fixtures[name], tmp_path / "a.jsonl")
    data.write_items(data.build(name, FIXTURES), tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    first = json.loads((tmp_path / "a.jsonl").read_text().splitlines()[0])
    assert tuple(first)[: len(ITEM_COLUMNS)] == ITEM_COLUMNS
    pd.testing.assert_frame_equal(data.read_items(tmp_path / "a.jsonl"), fixtures[name])


# ---------------------------------------------------------------- availability, config, CLI

def test_absent_raw_files_raise_file_not_found_naming_source(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"ragtruth/response\.jsonl.*github\.com/ParticleMedia/RAGTruth"):
        data.build("ragtruth", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"medhallu_pqa_labeled\.jsonl"):
        data.build("medhallu", tmp_path)


def test_unknown_dataset_and_source():
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        data.build("nope", FIXTURES)
    with pytest.raises(ValueError, match="source must be"):
        data.build("xsum", FIXTURES, source="s3")


def test_hub_without_known_copy_points_to_public_source(tmp_path):
    with pytest.raises(ValueError, match=r"no Hugging Face copy.*github\.com/ryokamoi/wice"):
        data.build("wice", tmp_path, source="hub")


def test_hub_offline_or_without_datasets_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises((ModuleNotFoundError, RuntimeError), match=r"datasets|Hugging Face hub"):
        data.build("medhallu", tmp_path, source="hub")
    assert not (tmp_path / "medhallu").exists()


def test_dataset_configs_match_builders():
    for name, n in PAPER_N.items():
        cfg = yaml.safe_load((ROOT / "conf" / "dataset" / f"{name}.yaml").read_text())
        assert cfg["name"] == name and cfg["builder"] in data.BUILDERS
        assert cfg["frame"] == data.SOURCES[cfg["builder"]].frame
        assert cfg["paper_n"] == n and isinstance(cfg["grounded"], bool)
        assert cfg["core"] == (name in {"medhallu", "wice", "ragtruth", "xsum"})
        assert cfg["available"] == (name in REAL)
        assert cfg["grounded"] == (name not in {"truthfulqa", "factscore"})
    assert set(data.BUILDERS) == set(PAPER_N)


def test_build_all_writes_sets_and_summary_and_skips_absent(tmp_path, capsys):
    summary = data.build_all(FIXTURES, tmp_path, seed=0)
    assert set(summary) == {"ragtruth", "xsum", "cnndm", "factscore", "triviaplus"}
    assert "skip medhallu" in capsys.readouterr().err
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    s = summary["ragtruth"]
    assert (s["n"], s["n_clusters"], s["items_per_cluster"], s["n_supported"], s["n_hallucinated"]) == (4, 2, 2.0, 2, 2)
    assert s["paper_n"] == 1362
    assert len((tmp_path / "xsum.jsonl").read_text().splitlines()) == summary["xsum"]["n"]
    assert not (tmp_path / "medhallu.jsonl").exists()


def test_cli_main_selected_datasets(tmp_path):
    assert data.main(["--raw-dir", str(FIXTURES), "--out-dir", str(tmp_path), "--datasets", "cnndm,factscore"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnndm.jsonl", "factscore.jsonl", "summary.json"]


# ---------------------------------------------------------------- bad raw input (§6)

def _wice_dir(tmp_path: Path, lines: list[str]) -> Path:
    (tmp_path / "wice" / "claim").mkdir(parents=True)
    (tmp_path / "wice" / "claim" / "test.jsonl").write_text("".join(line + "\n" for line in lines))
    return tmp_path


def _wice_row(label: str = "supported", **override) -> str:
    """A WiCE claim row as published (Python-literal strings); an override of None drops the field."""
    row = {"label": label, "claim": "A claim.", "evidence": "['Sentence one.', 'Sentence two.']",
           "supporting_sentences": "[[0]]", "meta": "{'id': 'test00001', 'claim_title': 'Title'}", **override}
    return json.dumps({k: v for k, v in row.items() if v is not None})


def test_wice_accepts_python_literal_fields(tmp_path):
    df = data.build("wice", _wice_dir(tmp_path, [_wice_row(), _wice_row("not_supported")]))
    assert _balance(df) == (1, 1) and df.cluster_id.nunique() == 1
    assert df.evidence.iloc[0] == "Sentence one.\nSentence two."


@pytest.mark.parametrize("bad,match", [
    ('{"label": "supported", "claim": ', r"^wice/claim/test\.jsonl line 2: unreadable JSON"),
    (_wice_row(claim=None), r"^wice/claim/test\.jsonl line 2: field 'claim': missing$"),
    (_wice_row("maybe"), r"^wice/claim/test\.jsonl line 2: field 'label': unknown value 'maybe'$"),
    (_wice_row(evidence="['unclosed"), r"line 2: field 'evidence': unreadable literal"),
])
def test_bad_wice_record_names_file_line_field(tmp_path, bad, match):
    with pytest.raises(RawRecordError, match=match):
        data.build("wice", _wice_dir(tmp_path, [_wice_row(), bad]))


def test_bad_nested_field_is_named_with_its_path(tmp_path):
    raw = tmp_path / "factscore"
    raw.mkdir()
    lines = (FIXTURES / "factscore" / "InstructGPT.jsonl").read_text().splitlines()
    lines[3] = lines[3].replace('"label": "NS"', '"label": "XX"', 1)
    (raw / "InstructGPT.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(RawRecordError) as err:
        data.build("factscore", tmp_path)
    assert str(err.value) == ("factscore/InstructGPT.jsonl line 4: field "
                              "'annotations[1].human-atomic-facts[1].label': unknown value 'XX'")
    assert err.value.field.endswith(".label") and isinstance(err.value, ValueError)


def test_bad_csv_row_and_missing_column(tmp_path):
    shutil.copytree(FIXTURES / "aggrefact", tmp_path / "aggrefact")
    path = tmp_path / "aggrefact" / "aggre_fact_sota.csv"
    df = pd.read_csv(path, dtype=str)
    df.loc[2, "label"] = "0.5"
    df.to_csv(path, index=False)
    row3 = r"^aggrefact/aggre_fact_sota\.csv row 3: field 'label': unknown value '0\.5'$"
    with pytest.raises(RawRecordError, match=row3):
        data.build("xsum", tmp_path)
    df.drop(columns=["summary"]).to_csv(path, index=False)
    with pytest.raises(RawRecordError, match=r"aggre_fact_sota\.csv header: field 'summary': missing column"):
        data.build("cnndm", tmp_path)


def test_empty_raw_file(tmp_path):
    with pytest.raises(RawRecordError, match=r"wice/claim/test\.jsonl: no records"):
        data.build("wice", _wice_dir(tmp_path, []))


def test_read_items_rejects_bad_lines_and_keeps_existing_output(tmp_path, fixtures):
    path = tmp_path / "items.jsonl"
    data.write_items(fixtures["cnndm"], path)
    good = path.read_bytes()
    with pytest.raises(ValueError):
        data.write_items(fixtures["cnndm"][["gold", "item_id"]], path)
    assert path.read_bytes() == good  # nothing already written is lost
    lines = good.decode().splitlines()
    row = json.loads(lines[1])
    for broken, match in [({**row, "gold": 2}, r"line 2: field 'gold': unknown value 2"),
                          ({k: v for k, v in row.items() if k != "cluster_id"}, r"line 2: field 'cluster_id': missing"),
                          (json.loads(lines[0]), r"line 2: field 'item_id': duplicate value")]:
        path.write_text(lines[0] + "\n" + json.dumps(broken) + "\n")
        with pytest.raises(RawRecordError, match=match):
            data.read_items(path)
