"""The benchmarks whose raw layout needs code, registered by name (paper Appendix J): ExpertQA, RAGTruth and
FActScore. A spec names one as ``{_target_: src.io.datasets.Registered, name: expertqa}``; each builder
follows its benchmark's published schema and the paper's label mapping (its docstring says which)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from src.io.builders import (
    HALLUCINATED,
    SUPPORTED,
    Builder,
    DatasetError,
    MakeItem,
    _ident,
    _maker,
    balance,
    pair,
)
from src.io.raw import _file, _found, _join, read_jsonl


@dataclass(frozen=True)
class Code:
    """A builder written in Python: ``fn(roots, seed, make) -> items`` and its raw files."""

    fn: Callable[[Sequence[Path], int, MakeItem], list[dict]]
    files: tuple[str, ...]
    public: str
    construction: str


BUILDERS: dict[str, Code] = {}


def register(name: str, *, files: Sequence[str], public: str, construction: str):
    """Register ``fn(roots, seed, make) -> items`` as the Python builder ``name``."""

    def deco(fn: Callable[[Sequence[Path], int, MakeItem], list[dict]]):
        BUILDERS[name] = Code(fn, tuple(files), public, construction)
        return fn

    return deco


class Registered(Builder):
    """A builder that needs code (``{_target_: src.io.datasets.Registered, name: expertqa}``)."""

    def __init__(self, name: str):
        if name not in BUILDERS:
            raise DatasetError(f"no registered builder {name!r}; registered: {', '.join(sorted(BUILDERS))}")
        self.code = BUILDERS[name]
        self.files, self.public, self.construction = self.code.files, self.code.public, self.code.construction

    def items(self, name: str, frame: str, roots: Sequence[Path], seed: int) -> tuple[list[dict], None]:
        return self.code.fn(roots, seed, _maker(name, frame)), None


# --------------------------------------------------------------------------- builders that need code

EXPERTQA_LABELS = {
    "Complete": SUPPORTED,
    "Partial": HALLUCINATED,
    "Incomplete": HALLUCINATED,
    "Missing": None,
    "N/A": None,
    None: None,
}


@register(
    "expertqa",
    construction="pooled",
    files=[f"expertqa/lfqa/{s}.jsonl" for s in ("rand_test", "rand_val", "domain_test", "domain_val")],
    public="https://github.com/chaitanyamalaviya/ExpertQA (data/lfqa/*.jsonl)",
)
def build_expertqa(roots: Sequence[Path], seed: int, make: MakeItem) -> list[dict]:
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
    root, paths = _found(roots, "expertqa/lfqa/*.jsonl") or (None, [])
    for path in paths:
        for r in read_jsonl(path, root):
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


@register(
    "ragtruth",
    construction="pairs",
    files=["ragtruth/response.jsonl", "ragtruth/source_info.jsonl"],
    public="https://github.com/ParticleMedia/RAGTruth (dataset/response.jsonl, dataset/source_info.jsonl)",
)
def build_ragtruth(roots: Sequence[Path], seed: int, make: MakeItem) -> list[dict]:
    """RAGTruth QA subtask as matched pairs (Appendix J, Table 18: 839 q -> 681 pairs).

    Label mapping: a response with no annotated span (``labels`` empty) -> gold 0;
    with at least one span (any ``label_type``) -> gold 1. Only ``quality == 'good'``
    responses are used (as in the RAGTruth baseline). Per QA source, one response of
    each class is picked with the seed; sources lacking either class are dropped.
    Question and evidence (``passages``) from ``source_info``; cluster = source_id.
    """
    sources = {}
    for r in read_jsonl(*_file(roots, "ragtruth/source_info.jsonl")):
        if r.text("task_type") == "QA":
            info = r.child("source_info")
            sources[str(r.raw("source_id"))] = (info.text("question"), info.text("passages"), {0: [], 1: []})
    for r in read_jsonl(*_file(roots, "ragtruth/response.jsonl")):
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


FACTSCORE_LABELS = {"S": SUPPORTED, "NS": HALLUCINATED, "IR": None}


@register(
    "factscore",
    construction="pairs",
    files=["factscore/InstructGPT.jsonl"],
    public="https://github.com/shmsw25/FActScore (labeled data: data/labeled/InstructGPT.jsonl)",
)
def build_factscore(roots: Sequence[Path], seed: int, make: MakeItem) -> list[dict]:
    """FActScore InstructGPT biographies as matched pairs (Table 18: 183 bios -> 165 pairs).

    Label mapping over ``annotations[].human-atomic-facts[].label``: S -> gold 0,
    NS -> gold 1, IR dropped. Per biography one S and one NS fact are picked with
    the seed; bios without both (or abstained, ``annotations`` null) are dropped.
    Question = "Tell me a bio of <topic>."; ungrounded (evidence ""); cluster = topic.
    """
    items = []
    for i, r in enumerate(read_jsonl(*_file(roots, "factscore/InstructGPT.jsonl"))):
        facts: dict[int, list[str]] = {SUPPORTED: [], HALLUCINATED: []}
        for sent in r.children("annotations", allow_null=True):
            for fact in sent.children("human-atomic-facts", allow_null=True):
                gold = fact.label("label", FACTSCORE_LABELS)
                if gold is not None:
                    facts[gold].append(fact.text("text"))
        topic = r.text("topic")
        items += pair(
            make, i, seed, f"Tell me a bio of {topic}.", "", facts[SUPPORTED], facts[HALLUCINATED], cluster=topic
        )
    return items
