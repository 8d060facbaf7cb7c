"""Builders of balanced binary items (src/io/datasets.py; paper Appendix J, Table 18)."""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from src.io import benchmarks, builders
from src.io import datasets as data
from src.io.datasets import ITEM_COLUMNS, RawRecordError
from src.io.raw import read_records

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "raw"
REAL = ("medhallu", "truthfulqa", "wice", "expertqa")
PAIRED = {"medhallu", "truthfulqa", "ragtruth", "factscore"}
PAPER_N = {
    "medhallu": 2000,
    "wice": 222,
    "ragtruth": 1362,
    "xsum": 546,
    "cnndm": 114,
    "expertqa": 1462,
    "factscore": 330,
    "truthfulqa": 1634,
    "triviaplus": None,
}


def _real_raw_dir() -> Path | None:
    candidates = [
        os.environ.get("RAIM_RAW_DIR"),
        ROOT / "data" / "shipped",
        ROOT.parent / "shared" / "data" / "raw",  # data.dvc's import source, where it exists
    ]
    for c in candidates:
        if c and all(not data.missing_files(n, c) for n in REAL):
            return Path(c)
    return None


RAW = _real_raw_dir()
needs_raw = pytest.mark.skipif(RAW is None, reason="no raw benchmarks in data/shipped/ (or RAIM_RAW_DIR)")


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
    assert (df.frame == data.dataset_spec(name)["frame"]).all()
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
        by_claim = {r["claim"]: f"wice-{builders._ident(m[key])}" for r, m in zip(rows, metas)}
        assert (df.question.map(by_claim) == df.cluster_id).all()
    else:
        sizes = df.groupby("cluster_id").size()
        assert sizes.max() > 2  # several claims per ExpertQA question


@needs_raw
@pytest.mark.parametrize("name", REAL)
def test_real_output_byte_identical_on_two_runs_and_to_committed(real, tmp_path, name):
    """Committed verdict caches are keyed by item id + content: the committed sets must not move."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    data.write_items(real[name], first)
    data.write_items(data.build(name, RAW), second)
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes() == (ROOT / "datasets" / f"{name}.jsonl").read_bytes()
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
        assert set(df[df.gold == 1].candidate) == {
            "The bridge will close for a year.",
            "A frog species was found in Brazil.",
        }
        assert any('said, on Monday, that "the bridge" will close.\nRepairs' in e for e in df.evidence)


def test_factscore_fixture_pairs(fixtures):
    df = fixtures["factscore"]
    _check_schema(df, "factscore")
    _check_pairs(df)
    assert (df.evidence == "").all()
    assert set(df.question) == {"Tell me a bio of Ada Lovelace.", "Tell me a bio of Grace Hopper."}
    neg = set(df[df.gold == 1].candidate)
    assert "Ada Lovelace was born in Paris." in neg and "This helps." not in set(df.candidate)
    assert neg <= {"Ada Lovelace was born in Paris.", "Grace Hopper invented Python.", "Grace Hopper was born in 1950."}


def test_triviaplus_fixture_balance_and_noisy_columns(fixtures):
    df = fixtures["triviaplus"]
    _check_schema(df, "triviaplus")
    assert list(df.columns[len(ITEM_COLUMNS) :]) == ["noisy_ws", "noisy_dw", "noisy_dl", "noisy_rf"]
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
    assert (
        parquet.drop(columns=["answer_sentence_list", "sentence_level_majority_vote"])
        .astype(str)
        .equals(rows.drop(columns=["answer_sentence_list", "sentence_level_majority_vote"]).astype(str))
    )


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


def test_dataset_specs_are_read_and_build_from_their_node(shipped_conf):
    """Every key of a dataset spec is read (name, title, frame, paper_n by the report/run; builder here). The
    project's own specs are the paper's sets; a user's own spec beside them (docs/own-benchmark.md) is theirs."""
    frames = {p.stem for p in (ROOT / "conf" / "frame").glob("*.yaml")}
    for name, n in PAPER_N.items():
        spec = data.dataset_spec(name)
        assert set(spec) == {"name", "title", "frame", "paper_n", "builder"}
        assert spec["name"] == name and spec["paper_n"] == n and spec["frame"] in frames
        builder = data.builder_for(name)
        coded = name in {"expertqa", "ragtruth", "factscore"}
        assert isinstance(builder, data.Registered if coded else data.Fields)
        assert builder.construction == ("pairs" if name in PAIRED else "pooled")
    assert set(data.dataset_names(shipped_conf / "dataset")) == set(PAPER_N) <= set(data.dataset_names())
    assert set(benchmarks.BUILDERS) == {
        "expertqa",
        "ragtruth",
        "factscore",
    }
    assert "builder" not in data.dataset_spec("all")


def test_build_all_writes_sets_and_summary_and_skips_absent(tmp_path, capsys):
    summary = data.build_all(FIXTURES, tmp_path, seed=0)
    assert set(summary) == {"ragtruth", "xsum", "cnndm", "factscore", "triviaplus"}
    assert "skip medhallu" in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()  # one summary per dataset: each stage owns its files
    assert {n: json.loads((tmp_path / "summary" / f"{n}.json").read_text()) for n in summary} == summary
    assert summary["xsum"]["duplicates"] == {"count": 0, "first": []} and summary["ragtruth"]["duplicates"] is None
    assert (summary["xsum"]["title"], summary["factscore"]["construction"]) == ("XSum", "pairs")
    s = summary["ragtruth"]
    assert (s["n"], s["n_clusters"], s["items_per_cluster"], s["n_supported"], s["n_hallucinated"]) == (4, 2, 2.0, 2, 2)
    assert s["paper_n"] == 1362
    assert len((tmp_path / "xsum.jsonl").read_text().splitlines()) == summary["xsum"]["n"]
    assert not (tmp_path / "medhallu.jsonl").exists()


def test_cli_main_selected_datasets(tmp_path):
    assert data.main(["--raw-dir", str(FIXTURES), "--out-dir", str(tmp_path), "--datasets", "cnndm,factscore"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnndm.jsonl", "factscore.jsonl", "summary"]
    assert sorted(p.name for p in (tmp_path / "summary").iterdir()) == ["cnndm.json", "factscore.json"]


# ---------------------------------------------------------------- bad raw input (§6)


def _wice_dir(tmp_path: Path, lines: list[str]) -> Path:
    (tmp_path / "wice" / "claim").mkdir(parents=True)
    (tmp_path / "wice" / "claim" / "test.jsonl").write_text("".join(line + "\n" for line in lines))
    return tmp_path


def _wice_row(label: str = "supported", **override) -> str:
    """A WiCE claim row as published (Python-literal strings); an override of None drops the field."""
    row = {
        "label": label,
        "claim": "A claim.",
        "evidence": "['Sentence one.', 'Sentence two.']",
        "supporting_sentences": "[[0]]",
        "meta": "{'id': 'test00001', 'claim_title': 'Title'}",
        **override,
    }
    return json.dumps({k: v for k, v in row.items() if v is not None})


def test_wice_accepts_python_literal_fields(tmp_path):
    df = data.build("wice", _wice_dir(tmp_path, [_wice_row(), _wice_row("not_supported")]))
    assert _balance(df) == (1, 1) and df.cluster_id.nunique() == 1
    assert df.evidence.iloc[0] == "Sentence one.\nSentence two."


@pytest.mark.parametrize(
    "bad,match",
    [
        ('{"label": "supported", "claim": ', r"^wice/claim/test\.jsonl line 2: unreadable JSON"),
        (_wice_row(claim=None), r"^wice/claim/test\.jsonl line 2: field 'claim': missing$"),
        (
            _wice_row("maybe"),
            r"^wice/claim/test\.jsonl line 2: field 'label': unknown value 'maybe' "
            r"\(label map: 'supported', 'partially_supported', 'not_supported'\)$",
        ),
        (_wice_row(meta="{'id': 'test00001', 'claim_title': "), r"line 2: field 'meta': unreadable literal"),
    ],
)
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
    assert str(err.value) == (
        "factscore/InstructGPT.jsonl line 4: field "
        "'annotations[1].human-atomic-facts[1].label': unknown value 'XX' "
        "(label map: 'S', 'NS', 'IR')"
    )
    assert err.value.field.endswith(".label") and isinstance(err.value, ValueError)


def test_bad_csv_row_and_missing_column(tmp_path):
    shutil.copytree(FIXTURES / "aggrefact", tmp_path / "aggrefact")
    path = tmp_path / "aggrefact" / "aggre_fact_sota.csv"
    df = pd.read_csv(path, dtype=str)
    df.loc[2, "label"] = "0.5"
    df.to_csv(path, index=False)
    row3 = r"^aggrefact/aggre_fact_sota\.csv row 3: field 'label': unknown value '0\.5' \(label map: '1', '0',"
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
    for broken, match in [
        ({**row, "gold": 2}, r"line 2: field 'gold': unknown value 2"),
        ({k: v for k, v in row.items() if k != "cluster_id"}, r"line 2: field 'cluster_id': missing"),
        (json.loads(lines[0]), r"line 2: field 'item_id': duplicate value"),
    ]:
        path.write_text(lines[0] + "\n" + json.dumps(broken) + "\n")
        with pytest.raises(RawRecordError, match=match):
            data.read_items(path)


# ---------------------------------------------------------------- a dataset from config alone (src.io.datasets.Fields)

GENERIC = ROOT / "tests" / "fixtures" / "data_generic"
MYBENCH = {
    "_target_": "src.io.datasets.Fields",
    "path": "mybench/qa.jsonl",
    "question": "query",
    "evidence": "context",
    "candidate": "response",
    "gold": {"field": "hallucination", "labels": {"yes": 1, "no": 0, "unsure": None}},
}
QA = [json.loads(line) for line in (GENERIC / "raw" / "mybench" / "qa.jsonl").read_text().splitlines()]


def _specs(tmp_path: Path, frame: str = "def_on", **builders: dict) -> Path:
    """A spec folder holding one ``<name>.yaml`` per builder node."""
    folder = tmp_path / "specs"
    folder.mkdir(exist_ok=True)
    for name, node in builders.items():
        spec = {"name": name, "title": name.title(), "frame": frame, "paper_n": None, "builder": node}
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


def _generic(tmp_path: Path, node: dict, roots=(GENERIC / "raw",), seed: int = 0) -> data.Built:
    return data.build_dataset("mybench", list(roots), seed, spec_dir=_specs(tmp_path, mybench=node))


def _rows(df: pd.DataFrame) -> list[tuple]:
    return list(df[["item_id", "cluster_id", "question", "evidence", "candidate", "gold"]].itertuples(index=False))


def _expected(ids: tuple[str, ...] = ("00000", "00001", "00003", "00004"), clusters=None) -> list[tuple]:
    """Records 1, 2, 4, 5 of qa.jsonl (record 3, "unsure", maps to null and is dropped); 2/2: all kept."""
    recs = [QA[i] for i in (0, 1, 3, 4)]
    clusters = clusters or ids
    return [
        (
            f"mybench-{i}-{'neg' if r['hallucination'] == 'yes' else 'pos'}",
            f"mybench-{c}",
            r["query"],
            r["context"],
            r["response"],
            int(r["hallucination"] == "yes"),
        )
        for i, c, r in zip(ids, clusters, recs)
    ]


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet"])
def test_generic_reads_each_format_known_answer_same_bytes(tmp_path, fmt):
    """JSON (an object holding the list), JSON Lines, CSV, Parquet: the same records give the same bytes."""
    own = tmp_path / "own"
    (own / "mybench").mkdir(parents=True)
    pd.DataFrame(QA).to_parquet(own / "mybench" / "qa.parquet", index=False)
    built = _generic(tmp_path, {**MYBENCH, "path": f"mybench/qa.{fmt}"}, roots=(GENERIC / "raw", own))
    assert _rows(built.items) == _expected()
    assert (built.items.dataset == "mybench").all() and (built.items.frame == "def_on").all()
    data.write_items(built.items, tmp_path / "got.jsonl")
    data.write_items(_generic(tmp_path, MYBENCH).items, tmp_path / "jsonl.jsonl")
    assert (tmp_path / "got.jsonl").read_bytes() == (tmp_path / "jsonl.jsonl").read_bytes()


def test_generic_json_object_with_several_lists_needs_records_key(tmp_path):
    root = tmp_path / "raw"
    (root / "mybench").mkdir(parents=True)
    (root / "mybench" / "qa.json").write_text(json.dumps({"data": QA, "notes": ["x"]}))
    node = {**MYBENCH, "path": "mybench/qa.json"}
    with pytest.raises(RawRecordError, match=r"^mybench/qa\.json: a JSON object holding 2 lists.*`records`"):
        _generic(tmp_path, node, roots=(root,))
    assert _rows(_generic(tmp_path, {**node, "records": "data"}, roots=(root,)).items) == _expected()


def test_generic_cluster_field_vs_one_cluster_per_record(tmp_path):
    per_record = _generic(tmp_path, MYBENCH).items
    assert per_record.cluster_id.nunique() == len(per_record) == 4
    by_doc = _generic(tmp_path, {**MYBENCH, "cluster": "doc"}).items
    docs = [builders._ident(QA[i]["doc"]) for i in (0, 1, 3, 4)]
    assert _rows(by_doc) == _expected(clusters=docs)
    assert by_doc.groupby("cluster_id").size().sort_values().tolist() == [1, 1, 2]  # q1, q2 share d1


def test_generic_id_field_names_items(tmp_path):
    df = _generic(tmp_path, {**MYBENCH, "id": "id"}).items
    assert _rows(df) == sorted(_expected(ids=tuple(builders._ident(f"q{i}") for i in (1, 2, 4, 5))))


def test_generic_filter_field_equals_value(tmp_path):
    only_d1 = _generic(tmp_path, {**MYBENCH, "filter": {"doc": "d1"}}).items
    assert list(only_d1.candidate) == [QA[0]["response"], QA[1]["response"]]
    several = _generic(tmp_path, {**MYBENCH, "filter": {"doc": ["d1", "d3"], "id": ["q1", "q5"]}}).items
    assert list(several.item_id) == ["mybench-00000-pos", "mybench-00004-neg"]


def test_generic_label_map_drop_and_unmapped_value(tmp_path):
    labels = {"field": "hallucination", "labels": {"yes": 1, "no": 0}}
    with pytest.raises(RawRecordError) as err:
        _generic(tmp_path, {**MYBENCH, "gold": labels})
    assert str(err.value) == (
        "mybench/qa.jsonl line 3: field 'hallucination': unknown value 'unsure' (label map: 'yes', 'no')"
    )
    with pytest.raises(RawRecordError, match=r"^mybench/qa\.csv row 3: field 'hallucination': unknown value"):
        _generic(tmp_path, {**MYBENCH, "gold": labels, "path": "mybench/qa.csv"})


def test_generic_labels_compare_as_text(tmp_path):
    """YAML 1 matches CSV "1" and JSON 1.0 (ints beside nulls); "null" matches a null label."""
    root = tmp_path / "raw"
    (root / "mybench").mkdir(parents=True)
    rows = [{**r, "hallucination": {"yes": 1, "no": 0, "unsure": None}[r["hallucination"]]} for r in QA]
    pd.DataFrame(rows).to_json(root / "mybench" / "qa.jsonl", orient="records", lines=True)
    gold = {"field": "hallucination", "labels": {1: 1, 0: 0, "null": None}}
    assert _rows(_generic(tmp_path, {**MYBENCH, "gold": gold}, roots=(root,)).items) == _expected()


@pytest.mark.parametrize("path,where", [("mybench/qa.jsonl", "line 1"), ("mybench/qa.json", "record 1")])
def test_generic_missing_field_names_file_record_field(tmp_path, path, where):
    with pytest.raises(RawRecordError) as err:
        _generic(tmp_path, {**MYBENCH, "path": path, "candidate": "answer"})
    assert str(err.value) == f"{path} {where}: field 'answer': missing"


def test_generic_missing_csv_column_is_named(tmp_path):
    with pytest.raises(RawRecordError, match=r"^mybench/qa\.csv header: field 'answer': missing column$"):
        _generic(tmp_path, {**MYBENCH, "path": "mybench/qa.csv", "candidate": "answer"})


def test_generic_ungrounded_without_evidence(tmp_path):
    node = {k: v for k, v in MYBENCH.items() if k != "evidence"}
    df = _generic(tmp_path, node).items
    assert (df.evidence == "").all() and len(df) == 4


def test_generic_balances_majority_with_seed(tmp_path):
    """Classes pooled, majority subsampled to the minority count with the seed (Table 20)."""
    node = {**MYBENCH, "gold": {"field": "doc", "labels": {"d1": 0, "d2": 0, "d3": 1}}}
    picks = {tuple(_generic(tmp_path, node, seed=s).items.item_id) for s in range(8)}
    assert all(len(p) == 2 and sum(i.endswith("-neg") for i in p) == 1 for p in picks) and len(picks) > 1
    unbalanced = _generic(tmp_path, {**node, "balance": False}).items
    assert len(unbalanced) == 5


PAIRS = {
    "_target_": "src.io.datasets.Fields",
    "path": "pairs/answers.json",
    "question": "question",
    "evidence": "passages",
    "cluster": "meta.topic",
    "pairs": {"supported": "answers.right", "hallucinated": {"field": "answers.wrong", "split": ";"}},
}


def test_generic_pairs_nested_fields_and_split_pick(tmp_path):
    with pytest.raises(
        RawRecordError,
        match=r"^pairs/answers\.json record 3: field 'answers\.wrong': no candidate "
        r"\(splits on ';' to nothing\)$",
    ):
        _generic(tmp_path, PAIRS)
    built = _generic(tmp_path, {**PAIRS, "on_bad_record": "drop"})  # record 3: no wrong answer after the split
    df = built.items
    assert built.summary()["bad_records"]["count"] == 1
    assert sorted(df.item_id) == ["mybench-00000-neg", "mybench-00000-pos", "mybench-00001-neg", "mybench-00001-pos"]
    for _, g in df.groupby(df.item_id.str[:13]):
        assert sorted(g.gold) == [0, 1] and g.question.nunique() == 1 and g.evidence.nunique() == 1
    first = df.set_index("item_id")
    assert first.loc["mybench-00000-pos", "candidate"] == "William Shakespeare."
    assert first.loc["mybench-00000-neg", "candidate"] == builders.pick(
        ["Christopher Marlowe", "Ben Jonson", "Thomas Kyd"], 0, (0, 1)
    )
    evidence = "Hamlet is a tragedy.\n\nIt was written by William Shakespeare."
    assert first.loc["mybench-00000-pos", "evidence"] == evidence
    assert set(df.cluster_id) == {f"mybench-{builders._ident('Hamlet')}"}  # cluster = meta.topic, both Hamlet
    negs = {
        _generic(tmp_path, {**PAIRS, "on_bad_record": "drop"}, seed=s)
        .items.set_index("item_id")
        .loc["mybench-00000-neg", "candidate"]
        for s in range(10)
    }
    assert len(negs) > 1 and negs <= {"Christopher Marlowe", "Ben Jonson", "Thomas Kyd"}


def test_generic_duplicates_dropped_first_kept_and_reported(tmp_path, capsys):
    root = tmp_path / "raw"
    (root / "mybench").mkdir(parents=True)
    lines = (GENERIC / "raw" / "mybench" / "qa.jsonl").read_text().splitlines()
    changed = json.dumps({**QA[1], "response": "Another response."})  # same id q2, other content
    (root / "mybench" / "qa.jsonl").write_text("\n".join([*lines, lines[0], changed, lines[3]]) + "\n")
    by_content = _generic(tmp_path, MYBENCH, roots=(root,))
    assert by_content.duplicates.first == [
        "mybench/qa.jsonl line 6 (= mybench/qa.jsonl line 1)",
        "mybench/qa.jsonl line 8 (= mybench/qa.jsonl line 4)",
    ]
    assert "Another response." in set(by_content.items.candidate)  # not identical: kept
    by_id = _generic(tmp_path, {**MYBENCH, "id": "id"}, roots=(root,))
    assert (by_id.duplicates.count, by_id.duplicates.first) == (3, ["q1", "q2", "q4"])
    assert "Another response." not in set(by_id.items.candidate) and len(by_id.items) == 4  # first kept
    assert "mybench: 3 duplicate record(s) dropped, the first kept: q1; q2; q4" in capsys.readouterr().err
    assert by_id.summary()["duplicates"] == {"count": 3, "first": ["q1", "q2", "q4"]}


# ---------------------------------------------------------------- raw roots, specs, CLI


def test_raw_roots_searched_in_order_and_absolute_paths(tmp_path):
    shipped, own = tmp_path / "shipped", tmp_path / "own"
    for root, response in ((shipped, "shipped"), (own, "own")):
        (root / "mybench").mkdir(parents=True)
        (root / "mybench" / "qa.jsonl").write_text(
            "".join(json.dumps({**r, "response": f"{response} {i}"}) + "\n" for i, r in enumerate(QA))
        )
    assert _generic(tmp_path, MYBENCH, roots=(shipped, own)).items.candidate.str.startswith("shipped").all()
    (shipped / "mybench" / "qa.jsonl").unlink()
    assert _generic(tmp_path, MYBENCH, roots=(shipped, own)).items.candidate.str.startswith("own").all()
    absolute = {**MYBENCH, "path": str(GENERIC / "raw" / "mybench" / "qa.csv")}
    assert _rows(_generic(tmp_path, absolute, roots=(shipped,)).items) == _expected()
    (own / "mybench" / "qa.jsonl").unlink()
    with pytest.raises(FileNotFoundError) as err:
        _generic(tmp_path, MYBENCH, roots=(shipped, own))
    assert str(err.value) == (
        f"mybench: expected raw file mybench/qa.jsonl is absent from {shipped}, {own} "
        "(searched in order); public source: not stated"
    )
    assert isinstance(err.value, data.RaimError)


def test_config_only_dataset_through_cli(tmp_path):
    """A new dataset from a spec in --spec-dir and a raw file in --own-dir: no Python."""
    specs = tmp_path / "specs"
    shutil.copytree(GENERIC / "specs", specs)
    (tmp_path / "shipped").mkdir()
    args = ["--raw-dir", str(tmp_path / "shipped"), "--own-dir", str(GENERIC / "raw"), "--spec-dir", str(specs)]
    assert data.main([*args, "--out-dir", str(tmp_path / "a"), "--datasets", "mybench"]) == 0
    assert data.main([*args, "--out-dir", str(tmp_path / "b")]) == 0  # every spec in the folder
    got = (tmp_path / "a" / "mybench.jsonl").read_bytes()
    assert got == (tmp_path / "b" / "mybench.jsonl").read_bytes()
    df = data.read_items(tmp_path / "a" / "mybench.jsonl")
    assert _rows(df) == _expected(clusters=[builders._ident(QA[i]["doc"]) for i in (0, 1, 3, 4)])
    summary = json.loads((tmp_path / "a" / "summary" / "mybench.json").read_text())
    assert summary == {
        "n": 4,
        "n_clusters": 3,
        "items_per_cluster": 1.3333,
        "max_cluster": 2,
        "n_supported": 2,
        "n_hallucinated": 2,
        "hallucinated_share": 0.5,
        "title": "My benchmark",
        "frame": "def_on",
        "construction": "pooled",
        "paper_n": None,
        "duplicates": {"count": 0, "first": []},
    }


def test_your_own_set_builds_before_the_shipped_snapshot_is_imported(tmp_path):
    """On a fresh clone data/shipped/ exists only after `dvc repro`: a set under --own-dir builds without it,
    and only when no raw folder exists at all is that the error."""
    specs = _specs(tmp_path, mybench=MYBENCH)
    args = ["--raw-dir", str(tmp_path / "shipped"), "--spec-dir", str(specs), "--out-dir", str(tmp_path / "o")]
    assert data.main([*args, "--own-dir", str(GENERIC / "raw"), "--datasets", "mybench"]) == 0
    assert (tmp_path / "o" / "mybench.jsonl").exists()
    with pytest.raises(data.RaimError, match="raw data folder .* not found"):
        data.build_all(tmp_path / "shipped", tmp_path / "o", ["mybench"], own_dir=tmp_path / "own", spec_dir=specs)


def test_cli_named_dataset_without_raw_files_is_an_error_all_skips(tmp_path, capsys):
    specs = _specs(tmp_path, mybench=MYBENCH, other={**MYBENCH, "path": "other/qa.jsonl"})
    (specs / "both.yaml").write_text("name: both\ndatasets: [mybench, other]\n")
    (specs / "folders.yaml").write_text("name: folders\ndatasets: {mybench: x/mybench, other: x/other}\n")
    args = ["--raw-dir", str(GENERIC / "raw"), "--own-dir", str(tmp_path / "own"), "--spec-dir", str(specs)]
    with pytest.raises(SystemExit):
        data.main([*args, "--out-dir", str(tmp_path / "o"), "--datasets", "other"])
    err = capsys.readouterr().err
    assert err.startswith(
        "error: other: expected raw file other/qa.jsonl is absent from "
        f"{GENERIC / 'raw'}, {tmp_path / 'own'} (absent) (searched in order)"
    )
    assert not (tmp_path / "o").exists()
    for names in (["--datasets", "both"], ["--datasets", "folders"], []):
        assert data.main([*args, "--out-dir", str(tmp_path / "o"), *names]) == 0
        assert "skip other: raw files absent (other/qa.jsonl in" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["mybench.jsonl", "summary"]


@pytest.mark.parametrize(
    "node,match",
    [
        ({**MYBENCH, "pairs": PAIRS["pairs"]}, r"give `gold`.*or `pairs`.*not both or neither"),
        (
            {**MYBENCH, "candidat": "response"},
            r"unknown key 'candidat' for Fields \(known: path, .*; did you mean 'candidate'\?\)$",
        ),
        ({**MYBENCH, "gold": {"field": "hallucination", "labels": {"yes": 2}}}, r"`gold.labels` maps each raw label"),
        ({**MYBENCH, "gold": {"field": "hallucination"}}, r"`gold`: missing \['labels'\]"),
        (
            {"_target_": "src.io.datasets.Registered", "name": "nope"},
            r"no registered builder 'nope'; registered: expertqa",
        ),
        (
            {"_target_": "collections.OrderedDict"},
            r"_target_ 'collections.OrderedDict' is not a dataset builder RAIM ships",
        ),
    ],
)
def test_bad_builder_node_is_one_line_naming_the_spec(tmp_path, node, match):
    with pytest.raises(data.DatasetError, match=rf"^{tmp_path / 'specs' / 'mybench.yaml'}: builder.*{match}"):
        _generic(tmp_path, node)


def test_dataset_spec_and_unknown_names(tmp_path):
    assert data.dataset_spec("wice")["builder"]["_target_"] == "src.io.datasets.Fields"
    specs = _specs(tmp_path, mybench=MYBENCH)
    assert data.dataset_spec("mybench", specs)["title"] == "Mybench" and data.dataset_names(specs) == ["mybench"]
    with pytest.raises(data.DatasetError, match=r"unknown dataset 'wice': no spec .*wice\.yaml; datasets: mybench"):
        data.dataset_spec("wice", specs)
    with pytest.raises(data.DatasetError, match=r"unknown dataset\(s\) \['nope'\]"):
        data.build_all(GENERIC / "raw", tmp_path / "o", ["nope"], spec_dir=specs)
    (specs / "renamed.yaml").write_text("name: other\nframe: def_on\n")
    with pytest.raises(data.DatasetError, match=r"renamed\.yaml: name 'other' differs from the file name"):
        data.dataset_spec("renamed", specs)


# --------------------------------------------------------------------- a .json file that holds JSON Lines


def test_json_lines_named_json_are_read_as_json_lines(tmp_path):
    """A ``.json`` file of one object a line is JSON Lines whatever its name says (it used to be refused as
    "unreadable JSON (Extra data …)"); a JSON document, pretty-printed or on one line, stays JSON."""
    recs = [{"uid": "a", "answer": "x"}, {"uid": "b", "answer": "y"}]
    lines = tmp_path / "qa.json"
    lines.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert [r.data for r in read_records(lines, tmp_path)] == recs
    assert "line 2" in read_records(lines, tmp_path)[1].where  # errors name the line, as for .jsonl
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps({"data": recs}, indent=2))
    assert [r.data for r in read_records(pretty, tmp_path)] == recs
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(recs[0]) + "\n")  # one object on one line: a JSON document
    with pytest.raises(RawRecordError):
        read_records(listed, tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(recs[0]) + "\n{not json\n")
    with pytest.raises(RawRecordError, match="line 2"):
        read_records(bad, tmp_path)
