"""Raw files fetched from the Hugging Face hub (``python -m src.data --source hub``): the published copies of
MedHallu, TruthfulQA and LLM-AggreFact written in the layout their local builders read. Needs the optional
``datasets`` package and network; nothing here runs offline or in the default pipeline."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from src.io.files import atomic_write_text

# --------------------------------------------------------------------------- Hugging Face hub


def _load_hub(path: str, config: str | None, split: str, revision: str | None = None):
    try:
        import datasets  # lazy: optional, network only
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "source='hub' needs the optional `datasets` package (pip install datasets) "
            "and access to huggingface.co; otherwise use source='local'"
        ) from None
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
    ds = _load_hub(
        "UTAustin-AIHealth/MedHallu", "pqa_labeled", "train", revision="515060458a945c633debc6fd5baac7764416b724"
    )
    _write_jsonl_rows(ds, raw_dir / "medhallu" / "medhallu_pqa_labeled.jsonl")


def _hub_truthfulqa(raw_dir: Path) -> None:
    ds = _load_hub("truthfulqa/truthful_qa", "generation", "validation")
    rows = [
        {
            "Type": r["type"],
            "Category": r["category"],
            "Question": r["question"],
            "Best Answer": r["best_answer"],
            "Correct Answers": "; ".join(r["correct_answers"]),
            "Incorrect Answers": "; ".join(r["incorrect_answers"]),
            "Source": r["source"],
        }
        for r in ds
    ]
    _write_csv_rows(rows, raw_dir / "truthfulqa" / "TruthfulQA.csv")


def _hub_aggrefact(raw_dir: Path) -> None:
    """LLM-AggreFact's AggreFact-XSum/-CNN test rows, written in the AggreFact SOTA layout."""
    ds = _load_hub("lytang/LLM-AggreFact", None, "test")
    origin = {"AggreFact-XSum": "xsum", "AggreFact-CNN": "cnndm"}
    rows = [
        {
            "dataset": r["dataset"],
            "origin": origin[r["dataset"]],
            "doc": r["doc"],
            "summary": r["claim"],
            "label": r["label"],
            "cut": "test",
            "model_name": "",
        }
        for r in ds
        if r["dataset"] in origin
    ]
    _write_csv_rows(rows, raw_dir / AGGREFACT_CSV)


AGGREFACT_CSV = "aggrefact/aggre_fact_sota.csv"
HUB: dict[str, Callable[[Path], None]] = {
    "medhallu": _hub_medhallu,
    "truthfulqa": _hub_truthfulqa,
    "aggrefact": _hub_aggrefact,
}
