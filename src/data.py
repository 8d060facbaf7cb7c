"""Real benchmarks -> balanced binary items (paper §2, Appendix J, Tables 18-20).

Every benchmark is reduced to items with the columns of ``ITEM_COLUMNS``; ``gold``
is 0 for a supported candidate and 1 for a hallucinated/unsupported one. Two
constructions (Table 18):

* matched pairs (MedHallu, RAGTruth, TruthfulQA, FActScore): one supported and one
  hallucinated candidate per source record, sharing question, evidence and cluster;
* pooled claims (WiCE, XSum, CNN/DM, ExpertQA, TRIVIA+): classes pooled across
  documents and the majority subsampled to the minority count (seed 0), the
  cluster being the shared document.

Output is deterministic: the same raw files and seed give the same bytes.
Run ``python -m src.data --raw-dir DIR --out-dir DIR`` to build every set whose
raw files are present, plus ``summary.json`` (the Table 18 columns).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import hashlib
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from .errors import RaimError, one_line
from .fsutil import atomic_write_text

ITEM_COLUMNS: tuple[str, ...] = (
    "item_id", "cluster_id", "dataset", "frame", "question", "evidence", "candidate", "gold",
)
SUPPORTED, HALLUCINATED = 0, 1
_TAG = {SUPPORTED: "pos", HALLUCINATED: "neg"}  # Table 19: "0:pos and 0:neg"
CONF_DIR = Path(__file__).resolve().parents[1] / "conf" / "dataset"


# --------------------------------------------------------------------------- raw records

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

    def child(self, key: str) -> "Rec":
        value = self.literal(key)
        if not isinstance(value, Mapping):
            raise self._fail(key, f"expected an object, got {type(value).__name__}")
        return Rec(value, self.where, f"{self.prefix}{key}.")

    def children(self, key: str, *, allow_null: bool = False) -> list["Rec"]:
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
            raise self._fail(key, f"unknown value {value!r}") from None


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _nonempty(records: list[Rec], name: str) -> list[Rec]:
    if not records:
        raise RawRecordError(name, None, "no records (empty file)")
    return records


def utf8_error(path: Path, name: str) -> RawRecordError | None:
    """Where a file stops being UTF-8 text (line and byte), or None when it is valid."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        return RawRecordError(f"{name} line {line}", None,
                              f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})")
    return None


@contextlib.contextmanager
def _readable(path: Path, name: str):
    """Turn a read failure (bytes that are not UTF-8, a file that is not Parquet) into one clear line."""
    try:
        yield
    except UnicodeDecodeError:
        raise (utf8_error(path, name) or RawRecordError(name, None, "not UTF-8 text")) from None
    except (ValueError, OSError) as e:
        if isinstance(e, (RawRecordError, FileNotFoundError, IsADirectoryError, PermissionError)):
            raise
        raise RawRecordError(name, None, f"unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None


def read_jsonl(path: Path, root: Path) -> list[Rec]:
    """JSON Lines with 1-based line numbers in every error."""
    name, out = _rel(path, root), []
    with _readable(path, name), open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{name} line {n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise RawRecordError(where, None, f"unreadable JSON ({err.msg}, column {err.colno})") from None
            if not isinstance(obj, dict):
                raise RawRecordError(where, None, "expected a JSON object")
            out.append(Rec(obj, where))
    return _nonempty(out, name)


def read_csv(path: Path, root: Path, required: Sequence[str]) -> list[Rec]:
    """CSV with a header; rows numbered from 1 after the header."""
    name = _rel(path, root)
    csv.field_size_limit(2**31 - 1)
    with _readable(path, name), open(path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        for col in required:
            if col not in header:
                raise RawRecordError(f"{name} header", col, "missing column")
        out = [Rec(row, f"{name} row {n}") for n, row in enumerate(reader, 1)]
    return _nonempty(out, name)


def read_parquet(path: Path, root: Path) -> list[Rec]:
    """Parquet rows numbered from 1."""
    name = _rel(path, root)
    with _readable(path, name):
        rows = pd.read_parquet(path).to_dict("records")
    return _nonempty([Rec(r, f"{name} row {n}") for n, r in enumerate(rows, 1)], name)


# --------------------------------------------------------------------------- shared helpers

def _stable_int(key: Any) -> int:
    return int.from_bytes(hashlib.sha1(str(key).encode("utf-8")).digest()[:8], "big")


def _ident(key: Any) -> str:
    """A short, stable, sortable token for an id: zero-padded int or a hash."""
    if isinstance(key, (int, np.integer)) or (isinstance(key, str) and key.isascii() and key.isdigit()):
        return f"{int(key):05d}"
    return hashlib.sha1(str(key).encode("utf-8")).hexdigest()[:12]


def pick(options: Sequence[Any], seed: int, key: Any) -> Any:
    """One of ``options``, chosen by an RNG seeded with (seed, key): stable per record."""
    rng = np.random.default_rng([seed, _stable_int(key)])
    return options[int(rng.integers(len(options)))]


def balance(items: list[dict], seed: int) -> list[dict]:
    """Pool both classes; subsample the majority to the minority count (seed; Appendix J)."""
    by_gold = {g: [it for it in items if it["gold"] == g] for g in (SUPPORTED, HALLUCINATED)}
    minority, majority = sorted(by_gold.values(), key=len)
    if not minority:
        raise ValueError("cannot balance: one class is empty")
    keep = np.sort(np.random.default_rng(seed).choice(len(majority), len(minority), replace=False))
    return minority + [majority[i] for i in keep]


def _join(parts: Iterable[str], sep: str = "\n\n") -> str:
    return sep.join(p.strip() for p in parts if p.strip())


MakeItem = Callable[..., dict]


def pair(make: MakeItem, key: Any, seed: int, question: str, evidence: str,
         supported: Sequence[str], hallucinated: Sequence[str], cluster: Any = None) -> list[dict]:
    """A matched pair (Table 19): one supported, one hallucinated candidate, same cluster.

    Returns [] when either side has no candidate; each side is ``pick``-ed with the seed.
    """
    if not supported or not hallucinated:
        return []
    cluster = key if cluster is None else cluster
    return [make(key, gold, cluster, question, evidence, pick(options, seed, (key, gold)))
            for gold, options in ((SUPPORTED, supported), (HALLUCINATED, hallucinated))]


def _to_frame(items: list[dict]) -> pd.DataFrame:
    if not items:
        raise ValueError("builder produced no items")
    df = pd.DataFrame(items)
    extra = [c for c in df.columns if c not in ITEM_COLUMNS]
    df = df[list(ITEM_COLUMNS) + extra].sort_values("item_id", kind="stable").reset_index(drop=True)
    dup = df["item_id"][df["item_id"].duplicated()]
    if len(dup):
        raise ValueError(f"duplicate item_id {dup.iloc[0]!r}")
    return df.astype({"gold": "int64"})


# --------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class Source:
    """Where a benchmark's raw files live (globs relative to raw_dir) and come from."""

    frame: str
    files: tuple[str, ...]
    public: str
    hub: Callable[[Path], None] | None = None


BUILDERS: dict[str, Callable[..., pd.DataFrame]] = {}
SOURCES: dict[str, Source] = {}


def register(name: str, *, frame: str, files: Sequence[str], public: str,
             hub: Callable[[Path], None] | None = None):
    """Register ``fn(raw_dir, seed, make) -> items`` as the builder ``name``."""
    def make(key: Any, gold: int, cluster: Any, question: str, evidence: str,
             candidate: str, **extra: Any) -> dict:
        return {"item_id": f"{name}-{_ident(key)}-{_TAG[gold]}", "cluster_id": f"{name}-{_ident(cluster)}",
                "dataset": name, "frame": frame, "question": question, "evidence": evidence,
                "candidate": candidate, "gold": gold, **extra}

    def deco(fn: Callable[[Path, int, MakeItem], list[dict]]) -> Callable[..., pd.DataFrame]:
        def builder(raw_dir: str | Path, seed: int = 0) -> pd.DataFrame:
            return _to_frame(fn(Path(raw_dir), seed, make))
        builder.__name__, builder.__doc__ = fn.__name__, fn.__doc__
        BUILDERS[name] = builder
        SOURCES[name] = Source(frame, tuple(files), public, hub)
        return builder
    return deco


def _resolve(raw_dir: Path, pattern: str) -> Path | None:
    """The raw file matching ``pattern`` (the last in sorted order for a glob)."""
    matches = sorted(raw_dir.glob(pattern))
    return matches[-1] if matches else None


def missing_files(name: str, raw_dir: str | Path) -> list[str]:
    return [p for p in _source(name).files if _resolve(Path(raw_dir), p) is None]


def _source(name: str) -> Source:
    if name not in SOURCES:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(sorted(SOURCES))}")
    return SOURCES[name]


def _file(raw_dir: Path, pattern: str) -> Path:
    found = _resolve(raw_dir, pattern)
    if found is None:
        raise FileNotFoundError(f"expected raw file {raw_dir / pattern}")
    return found


# --------------------------------------------------------------------------- Hugging Face hub

def _load_hub(path: str, config: str | None, split: str, revision: str | None = None):
    try:
        import datasets  # lazy: optional, network only
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "source='hub' needs the optional `datasets` package (pip install datasets) "
            "and access to huggingface.co; otherwise use source='local'") from None
    try:
        return datasets.load_dataset(path, config, split=split, revision=revision)
    except Exception as err:  # offline, gated, renamed ...
        raise RuntimeError(f"could not load {path!r} from the Hugging Face hub: {err}") from err


def _write_jsonl_rows(rows: Iterable[Mapping], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in rows))


def _write_csv_rows(rows: list[Mapping], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def _hub_medhallu(raw_dir: Path) -> None:
    ds = _load_hub("UTAustin-AIHealth/MedHallu", "pqa_labeled", "train",
                   revision="515060458a945c633debc6fd5baac7764416b724")
    _write_jsonl_rows(ds, raw_dir / "medhallu" / "medhallu_pqa_labeled.jsonl")


def _hub_truthfulqa(raw_dir: Path) -> None:
    ds = _load_hub("truthfulqa/truthful_qa", "generation", "validation")
    rows = [{"Type": r["type"], "Category": r["category"], "Question": r["question"],
             "Best Answer": r["best_answer"], "Correct Answers": "; ".join(r["correct_answers"]),
             "Incorrect Answers": "; ".join(r["incorrect_answers"]), "Source": r["source"]} for r in ds]
    _write_csv_rows(rows, raw_dir / "truthfulqa" / "TruthfulQA.csv")


def _hub_aggrefact(raw_dir: Path) -> None:
    """LLM-AggreFact's AggreFact-XSum/-CNN test rows, written in the AggreFact SOTA layout."""
    ds = _load_hub("lytang/LLM-AggreFact", None, "test")
    origin = {"AggreFact-XSum": "xsum", "AggreFact-CNN": "cnndm"}
    rows = [{"dataset": r["dataset"], "origin": origin[r["dataset"]], "doc": r["doc"], "summary": r["claim"],
             "label": r["label"], "cut": "test", "model_name": ""} for r in ds if r["dataset"] in origin]
    _write_csv_rows(rows, raw_dir / AGGREFACT_CSV)


def fetch_hub(name: str, raw_dir: str | Path) -> None:
    """Materialise ``name``'s raw files under ``raw_dir`` from the Hugging Face hub."""
    src = _source(name)
    if src.hub is None:
        raise ValueError(f"{name}: no Hugging Face copy of the published raw files is known; "
                         f"download them from {src.public} into {Path(raw_dir)} and use source='local'")
    src.hub(Path(raw_dir))


# --------------------------------------------------------------------------- builders

@register("medhallu", frame="def_on", files=["medhallu/medhallu_pqa_labeled.jsonl"],
          public="https://huggingface.co/datasets/UTAustin-AIHealth/MedHallu (pqa_labeled)",
          hub=_hub_medhallu)
def build_medhallu(raw: Path, seed: int, make: MakeItem) -> list[dict]:
    """MedHallu pqa_labeled (Appendix J, Table 18): 1000 questions -> 2000 items.

    Label mapping: ``Ground Truth`` -> gold 0 (supported), ``Hallucinated Answer`` ->
    gold 1. Evidence = the ``Knowledge`` contexts joined; cluster = question (row).
    Exactly 1000/1000; the seed is unused (one candidate per side).
    """
    recs = read_jsonl(_file(raw, "medhallu/medhallu_pqa_labeled.jsonl"), raw)
    return [it for i, r in enumerate(recs)
            for it in pair(make, i, seed, r.text("Question"), _join(r.texts("Knowledge")),
                           [r.text("Ground Truth")], [r.text("Hallucinated Answer")])]


@register("truthfulqa", frame="def_on", files=["truthfulqa/TruthfulQA.csv"],
          public="https://github.com/sylinrl/TruthfulQA (TruthfulQA.csv)", hub=_hub_truthfulqa)
def build_truthfulqa(raw: Path, seed: int, make: MakeItem) -> list[dict]:
    """TruthfulQA generation (Appendix J, Table 18): 817 questions -> 1634 items.

    Label mapping: ``Best Answer`` -> gold 0; one ``Incorrect Answers`` entry (split
    on ';') -> gold 1, chosen per question by an RNG seeded with (seed, question row),
    not the first entry. Ungrounded: evidence "". Cluster = question (row).
    """
    recs = read_csv(_file(raw, "truthfulqa/TruthfulQA.csv"), raw,
                    ["Question", "Best Answer", "Incorrect Answers"])
    items = []
    for i, r in enumerate(recs):
        wrong = [a.strip() for a in r.text("Incorrect Answers").split(";") if a.strip()]
        items += pair(make, i, seed, r.text("Question"), "", [r.text("Best Answer").strip()], wrong)
    return items


WICE_LABELS = {"supported": SUPPORTED, "partially_supported": HALLUCINATED, "not_supported": HALLUCINATED}


@register("wice", frame="claim", files=["wice/claim/test.jsonl"],
          public="https://github.com/ryokamoi/wice (data/entailment_retrieval/claim/test.jsonl)")
def build_wice(raw: Path, seed: int, make: MakeItem) -> list[dict]:
    """WiCE claim-level test set (358 rows; LLM-AggreFact's WiCE) -> 222 items, 111/111.

    Label mapping (LLM-AggreFact convention): ``supported`` -> gold 0;
    ``partially_supported`` and ``not_supported`` -> gold 1. Claim frame: question =
    candidate = claim, evidence = the evidence sentences joined by newlines. Classes
    pooled, majority subsampled with the seed (Appendix J, Table 20); cluster =
    ``meta.claim_title`` (the Wikipedia article).
    """
    items = []
    for i, r in enumerate(read_jsonl(_file(raw, "wice/claim/test.jsonl"), raw)):
        claim = r.text("claim")
        items.append(make(i, r.label("label", WICE_LABELS), r.child("meta").text("claim_title"),
                          claim, _join(r.texts("evidence"), "\n"), claim))
    return balance(items, seed)


EXPERTQA_LABELS = {"Complete": SUPPORTED, "Partial": HALLUCINATED, "Incomplete": HALLUCINATED,
                   "Missing": None, "N/A": None, None: None}


@register("expertqa", frame="claim",
          files=[f"expertqa/lfqa/{s}.jsonl" for s in ("rand_test", "rand_val", "domain_test", "domain_val")],
          public="https://github.com/chaitanyamalaviya/ExpertQA (data/lfqa/*.jsonl)")
def build_expertqa(raw: Path, seed: int, make: MakeItem) -> list[dict]:
    """ExpertQA claims (Appendix J): union of ``lfqa/*.jsonl``, deduplicated on
    (question, answer system, claim_string), first occurrence kept.

    Label mapping: ``support`` Complete -> gold 0; Partial / Incomplete -> gold 1;
    Missing, N/A and null dropped, as are claims with empty evidence. Claim frame:
    question = candidate = claim, evidence = the evidence passages joined. Classes
    pooled, supported subsampled with the seed; cluster = the ExpertQA question.
    The paper's n = 1462 drew on the train split, absent here: the val+test files
    give 590 unsupported claims and so 1180 items (more if train files are added).
    """
    seen: set[tuple[str, str, str]] = set()
    items: list[dict] = []
    for path in sorted((raw / "expertqa" / "lfqa").glob("*.jsonl")):
        for r in read_jsonl(path, raw):
            question, answers = r.text("question"), r.child("answers")
            for system in sorted(answers.data):
                for c in answers.child(system).children("claims", allow_null=True):
                    key = (question, system, c.text("claim_string"))
                    if key in seen:
                        continue
                    seen.add(key)
                    gold, evidence = c.label("support", EXPERTQA_LABELS), c.texts("evidence")
                    if gold is not None and evidence:
                        items.append(make(len(items), gold, question, key[2], _join(evidence), key[2]))
    return balance(items, seed)


RAGTRUTH_QUALITY = {"good": True, "incorrect_refusal": False, "truncated": False}


@register("ragtruth", frame="def_on", files=["ragtruth/response.jsonl", "ragtruth/source_info.jsonl"],
          public="https://github.com/ParticleMedia/RAGTruth (dataset/response.jsonl, dataset/source_info.jsonl)")
def build_ragtruth(raw: Path, seed: int, make: MakeItem) -> list[dict]:
    """RAGTruth QA subtask as matched pairs (Appendix J, Table 18: 839 q -> 681 pairs).

    Label mapping: a response with no annotated span (``labels`` empty) -> gold 0;
    with at least one span (any ``label_type``) -> gold 1. Only ``quality == 'good'``
    responses are used (as in the RAGTruth baseline). Per QA source, one response of
    each class is picked with the seed; sources lacking either class are dropped.
    Question and evidence (``passages``) from ``source_info``; cluster = source_id.
    """
    sources = {}
    for r in read_jsonl(_file(raw, "ragtruth/source_info.jsonl"), raw):
        if r.text("task_type") == "QA":
            info = r.child("source_info")
            sources[str(r.raw("source_id"))] = (info.text("question"), info.text("passages"), {0: [], 1: []})
    for r in read_jsonl(_file(raw, "ragtruth/response.jsonl"), raw):
        sid = str(r.raw("source_id"))
        if sid in sources and r.label("quality", RAGTRUTH_QUALITY):
            gold = HALLUCINATED if r.children("labels") else SUPPORTED
            sources[sid][2][gold].append((str(r.raw("id")), r.text("response")))
    items = []
    for sid in sorted(sources, key=_ident):
        question, passages, by_gold = sources[sid]
        sup, hal = ([text for _, text in sorted(by_gold[g])] for g in (SUPPORTED, HALLUCINATED))
        items += pair(make, sid, seed, question, passages, sup, hal)
    return items


AGGREFACT_CSV = "aggrefact/aggre_fact_sota.csv"
AGGREFACT_LABELS = {"1": SUPPORTED, "0": HALLUCINATED, "1.0": SUPPORTED, "0.0": HALLUCINATED,
                    1: SUPPORTED, 0: HALLUCINATED}


def _aggrefact(raw: Path, seed: int, make: MakeItem, origin: str) -> list[dict]:
    """AggreFact SOTA rows of one ``origin``, test cut, pooled and balanced."""
    recs = read_csv(_file(raw, AGGREFACT_CSV), raw, ["origin", "cut", "doc", "summary", "label"])
    items = []
    for i, r in enumerate(recs, 1):
        if r.text("origin") == origin and r.text("cut") == "test":
            doc, summary = r.text("doc"), r.text("summary")
            items.append(make(i, r.label("label", AGGREFACT_LABELS), doc, summary, doc, summary))
    return balance(items, seed)


_AGGREFACT_DOC = """AggreFact SOTA {title} test cut (``origin == '{origin}'``; Appendix J, Table 20).

    Label mapping: ``label`` 1 (factually consistent) -> gold 0; 0 -> gold 1. Claim
    frame: question = candidate = summary, evidence = doc; cluster = doc. Classes
    pooled, majority subsampled with the seed (paper n = {n}).
    """
_AGGREFACT_PUBLIC = "https://github.com/Liyan06/AggreFact (data/aggre_fact_sota.csv)"


def _aggrefact_builder(name: str, origin: str, title: str, n: int) -> None:
    def build(raw: Path, seed: int, make: MakeItem) -> list[dict]:
        return _aggrefact(raw, seed, make, origin)
    build.__name__ = f"build_{name}"
    build.__doc__ = _AGGREFACT_DOC.format(title=title, origin=origin, n=n)
    register(name, frame="claim", files=[AGGREFACT_CSV], public=_AGGREFACT_PUBLIC, hub=_hub_aggrefact)(build)


_aggrefact_builder("xsum", "xsum", "XSum", 546)
_aggrefact_builder("cnndm", "cnndm", "CNN/DailyMail", 114)

FACTSCORE_LABELS = {"S": SUPPORTED, "NS": HALLUCINATED, "IR": None}


@register("factscore", frame="def_on", files=["factscore/InstructGPT.jsonl"],
          public="https://github.com/shmsw25/FActScore (labeled data: data/labeled/InstructGPT.jsonl)")
def build_factscore(raw: Path, seed: int, make: MakeItem) -> list[dict]:
    """FActScore InstructGPT biographies as matched pairs (Table 18: 183 bios -> 165 pairs).

    Label mapping over ``annotations[].human-atomic-facts[].label``: S -> gold 0,
    NS -> gold 1, IR dropped. Per biography one S and one NS fact are picked with
    the seed; bios without both (or abstained, ``annotations`` null) are dropped.
    Question = "Tell me a bio of <topic>."; ungrounded (evidence ""); cluster = topic.
    """
    items = []
    for i, r in enumerate(read_jsonl(_file(raw, "factscore/InstructGPT.jsonl"), raw)):
        facts: dict[int, list[str]] = {SUPPORTED: [], HALLUCINATED: []}
        for sent in r.children("annotations", allow_null=True):
            for fact in sent.children("human-atomic-facts", allow_null=True):
                gold = fact.label("label", FACTSCORE_LABELS)
                if gold is not None:
                    facts[gold].append(fact.text("text"))
        topic = r.text("topic")
        items += pair(make, i, seed, f"Tell me a bio of {topic}.", "", facts[SUPPORTED],
                      facts[HALLUCINATED], cluster=topic)
    return items


TRIVIAPLUS_NOISY = {"noisy_ws": "response_level_label_binary_ws_llm_aaj",
                    "noisy_dw": "response_level_label_binary_15pct_noise_dissenting_workers",
                    "noisy_dl": "response_level_label_binary_15pct_noise_dissenting_label",
                    "noisy_rf": "response_level_label_binary_15pct_noise_random_flipping"}
BINARY = {0: 0, 1: 1}


@register("triviaplus", frame="def_on", files=["triviaplus/Triviaplus*.parquet"],
          public="https://github.com/Wenbo11/TriviaPlus (Triviaplus_all_withnoise_cleaned_*.parquet)")
def build_triviaplus(raw: Path, seed: int, make: MakeItem) -> list[dict]:
    """TRIVIA+ long-context RAG (seed 002), all splits, response level.

    Label mapping: ``response_level_label_binary`` (1 when any sentence is
    Contradicted or Not Mentioned) -> gold 1, else gold 0. Question, evidence =
    ``article``, candidate = ``answer``; cluster = (source, question, article).
    The four noisy labels WS, DW, DL, RF are kept as ``noisy_ws/dw/dl/rf`` when
    present. Classes pooled, majority subsampled with the seed.
    """
    recs = read_parquet(_file(raw, "triviaplus/Triviaplus*.parquet"), raw)
    noisy = {k: col for k, col in TRIVIAPLUS_NOISY.items() if col in recs[0].data}
    items = []
    for i, r in enumerate(recs):
        question, article = r.text("question"), r.text("article")
        extra = {k: r.label(col, BINARY) for k, col in noisy.items()}
        items.append(make(i, r.label("response_level_label_binary", BINARY),
                          (r.text("source"), question, article), question, article, r.text("answer"), **extra))
    return balance(items, seed)


# --------------------------------------------------------------------------- public API

def build(name: str, raw_dir: str | Path, seed: int = 0, source: str = "local") -> pd.DataFrame:
    """Balanced binary items for benchmark ``name`` (columns ``ITEM_COLUMNS`` [+ extras]).

    ``source='local'`` reads ``raw_dir``; ``source='hub'`` first downloads the published
    files from the Hugging Face hub into ``raw_dir`` (needs ``datasets`` and network).
    """
    src, raw = _source(name), Path(raw_dir)
    if source == "hub":
        fetch_hub(name, raw)
    elif source != "local":
        raise ValueError(f"source must be 'local' or 'hub', not {source!r}")
    missing = missing_files(name, raw)
    if missing:
        raise FileNotFoundError(f"{name}: expected raw file {raw / missing[0]} is absent; "
                                f"public source: {src.public}")
    return BUILDERS[name](raw, seed)


def _native(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def write_items(df: pd.DataFrame, path: str | Path) -> None:
    """JSON Lines, keys in column order, rows sorted by item_id: byte-identical per input."""
    if tuple(df.columns[: len(ITEM_COLUMNS)]) != ITEM_COLUMNS:
        raise ValueError(f"columns must start with {ITEM_COLUMNS}, got {tuple(df.columns)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = df.sort_values("item_id", kind="stable").to_dict("records")
    atomic_write_text(path, "".join(
        json.dumps({k: _native(v) for k, v in row.items()}, ensure_ascii=False) + "\n" for row in rows))


def read_items(path: str | Path) -> pd.DataFrame:
    """Read ``write_items`` output; a bad line raises RawRecordError (file, line, field)."""
    path = Path(path)
    recs = read_jsonl(path, path.parent)
    first: dict[str, str] = {}
    for r in recs:
        for col in ITEM_COLUMNS:
            r.raw(col)
        r.label("gold", BINARY)
        item_id = r.text("item_id")
        if item_id in first:
            raise RawRecordError(r.where, "item_id", f"duplicate value {item_id!r} (first at {first[item_id]})")
        first[item_id] = r.where
    return _to_frame([dict(r.data) for r in recs])


def summarize(df: pd.DataFrame) -> dict[str, Any]:
    """Table 18 columns: items, clusters, items per cluster, class balance."""
    sizes = df.groupby("cluster_id").size()
    n_hal = int(df["gold"].sum())
    return {"n": len(df), "n_clusters": int(len(sizes)),
            "items_per_cluster": round(float(sizes.mean()), 4),
            "max_cluster": int(sizes.max()),
            "n_supported": len(df) - n_hal, "n_hallucinated": n_hal,
            "hallucinated_share": round(n_hal / len(df), 4)}


def paper_n(name: str) -> int | None:
    """The paper's n for ``name`` from conf/dataset/<name>.yaml (None if not stated)."""
    import yaml

    path = CONF_DIR / f"{name}.yaml"
    return yaml.safe_load(path.read_text()).get("paper_n") if path.exists() else None


def build_all(raw_dir: str | Path, out_dir: str | Path, names: Sequence[str] | None = None,
              seed: int = 0, source: str = "local") -> dict[str, dict]:
    """Write ``<out_dir>/<name>.jsonl`` per buildable set and ``summary.json``; skip absent ones."""
    unknown = [n for n in names or [] if n not in BUILDERS]
    if unknown:
        raise RaimError(f"unknown dataset(s) {unknown}; builders exist for {sorted(BUILDERS)}")
    if source == "local" and not Path(raw_dir).is_dir():
        raise RaimError(f"raw data folder {raw_dir} not found (--raw-dir, or RAIM_RAW_DIR)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, dict] = {}
    for name in names or sorted(BUILDERS):
        if source == "local" and missing_files(name, raw_dir):
            print(f"skip {name}: raw files absent ({', '.join(missing_files(name, raw_dir))}); "
                  f"public source: {_source(name).public}", file=sys.stderr)
            continue
        df = build(name, raw_dir, seed=seed, source=source)
        write_items(df, out / f"{name}.jsonl")
        summary[name] = {**summarize(df), "paper_n": paper_n(name)}
    if not summary:  # nothing built: keep what an earlier build wrote
        raise RaimError(f"no dataset could be built from {raw_dir}: every raw file is absent (see the lines above)")
    old = out / "summary.json"
    if names and old.exists():  # a partial rebuild keeps the other sets' rows
        try:
            summary = {**json.loads(old.read_text()), **summary}
        except ValueError:
            pass
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


@one_line
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build balanced binary items (Appendix J, Table 18).")
    ap.add_argument("--raw-dir", default=os.environ.get("RAIM_RAW_DIR", "../shared/data/raw"))
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--datasets", default="", help="comma-separated names (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", choices=("local", "hub"), default="local")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()] or None
    summary = build_all(args.raw_dir, args.out_dir, names, args.seed, args.source)
    for name, s in summary.items():
        print(f"{name:11s} n={s['n']:5d} clusters={s['n_clusters']:5d} "
              f"per_cluster={s['items_per_cluster']:.2f} balance={s['n_supported']}/{s['n_hallucinated']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
