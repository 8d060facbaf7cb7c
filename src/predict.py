"""Judge new items with a calibrated panel: each member's vote, p(hallucinated) and the stacked verdict.

This is the deployment step of RAIM: the cheap judges of a roster score each (question, evidence, candidate)
item once, and the stacked logistic regression of §2 — the per-dataset meta-learner, fitted on the labelled
calibration records and promoted only where §3.3's admissibility test and the paired Δκ against the CV-best
single judge say the panel pays — turns their votes into p(hallucinated) and a verdict.

    python -m src.predict items.jsonl --model-uri "models:/raim-stacker-wice@champion" --out verdicts.jsonl
    python -m src.predict --model-uri runs:/<run id>/stacker --roster cpu \
        --evidence "Paris is the capital of France." --candidate "The capital of France is Lyon."

The model is a stacker logged by ``src.run`` (:class:`src.mlops.serving.StackerModel`; by model URI, or ``--run-id``
with ``--dataset`` for a stacking run's dataset child) or a panel model (:class:`src.mlops.serving.PanelModel`, which
carries its roster). A stacker is wrapped in a :class:`~src.mlops.serving.PanelModel` over exactly the roster members it
votes with, so scoring is the panel model's own code. Judging goes through the verdict cache
(:func:`src.judges.runner.verdict_table`): the misses are scored first, with ``src.judges``' progress bars, then
the panel reads every vote from the cache — an item seen before is never judged again, and ``--no-compute``
judges nothing (a miss is an abstention, named in the ``uncached`` column).

Each output row also says whether the item's text looks like a prompt injection aimed at the judges
(``injection_flag``, ``injection_reasons``: :func:`src.core.detector.scan`; the panel model adds them), and what
the decision path did with a flagged item (``injection_action``). By default a flagged item is not decided by the
LLM members: it is **escalated** (label ``escalated``, no p and no verdict: for a person to decide);
``--injection-defence immune`` decides it by the members no instruction can address (the non-LLM judges), ``off``
as any other item (docs/security-injection.md). A panel model's own setting is the default.

Frames: ``--frame NAME`` judges every item under that prompt frame; otherwise an item's own ``frame`` field,
else the frame the stacker was calibrated under (its run's ``frame`` tag, or its dataset's frame when that is
``auto``; a panel model's default frame), else ``def_on`` for an item with a question and ``claim`` for one
without.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from src.core.errors import ArgumentParser, one_line
from src.core.injection import DEFENCES
from src.core.textfiles import normal_id
from src.io.files import atomic_write_text, check_not_an_input
from src.io.paths import ROOT
from src.io.raw import RawRecordError, read_csv, read_jsonl, read_parquet
from src.judges.ray_engine import add_engine_args, engine_from_args
from src.mlops.panels import (  # noqa: F401 - calibration_frame, tag_decision: src.predict's API as before
    Items,
    Panel,
    PanelError,
    assign_frames,
    calibration_frame,
    load_panel,
    predict,
    stacker_uri,
    tag_decision,
)
from src.mlops.serving import SCORED_CACHE, decision_warning
from src.mlops.store import check_server, tracking_uri

TEXT_FIELDS = ("question", "evidence")
ITEM_FIELDS = ("candidate", *TEXT_FIELDS, "item_id", "frame")
PASSED_THROUGH = ("gold", "cluster_id")  # copied to the output beside the verdicts, with every other `<x>_id` field
SUFFIXES = (".jsonl", ".csv", ".parquet")
SHOWN_ROWS = 20


PredictError = PanelError  # a request src.predict cannot answer (one line naming file, line and field)


# ------------------------------------------------------------------------------------------------ items


def _optional_text(rec, key: str) -> str:
    """An optional string field of a :class:`src.io.raw.Rec` ('' when absent, null or empty)."""

    v = rec.data.get(key)
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if not isinstance(v, str):
        raise RawRecordError(rec.where, key, f"expected a string, got {type(v).__name__}")
    return v


def _check_fields(rec) -> None:
    """A field that is almost a known one (``evidnce``) is a typo that would silently drop the text: refuse."""

    known = (*ITEM_FIELDS, *PASSED_THROUGH)
    for key in rec.data:
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.8) if key not in known else []
        if close:
            raise RawRecordError(
                rec.where, str(key), f"unknown field; did you mean {close[0]!r}? (an item has {list(ITEM_FIELDS)})"
            )


def passed_through(keys) -> list[str]:
    """The fields of an item copied to the output beside its verdicts: ``gold``, ``cluster_id`` (the cluster a rate's
    interval resamples, :mod:`src.studies.estimate`) and every other id field (``<x>_id``, e.g. ``conversation_id``)."""
    return [k for k in keys if k in PASSED_THROUGH or (str(k).endswith("_id") and k != "item_id")]


def _id_text(value: Any) -> Any:
    """A copied id field: a text in Unicode normal form C, anything else as it is."""
    return normal_id(value) if isinstance(value, str) else value


def _row(rec) -> dict[str, Any]:
    _check_fields(rec)
    row = {"candidate": rec.text("candidate"), **{k: _optional_text(rec, k) for k in TEXT_FIELDS}}
    item_id = rec.data.get("item_id")
    row["item_id"] = None if item_id is None or str(item_id).strip() in ("", "nan") else normal_id(str(item_id))
    row["frame"] = _optional_text(rec, "frame") or None
    return row


def _records(path: Path) -> list:

    if path.suffix not in SUFFIXES:
        raise PredictError(f"{path}: an items file is JSON Lines, CSV or Parquet ({', '.join(SUFFIXES)})")
    if not path.exists():
        raise PredictError(f"{path}: no such items file")
    root = Path.cwd()
    if path.suffix == ".csv":
        return read_csv(path, root, required=("candidate",))
    return read_jsonl(path, root) if path.suffix == ".jsonl" else read_parquet(path, root)


def read_items(path: str | Path) -> Items:
    """Items of a JSONL / CSV / Parquet file: ``candidate`` (required), ``question``, ``evidence``, ``item_id``,
    ``frame`` (optional); ``gold``, ``cluster_id`` and any other id field are carried to the output
    (:func:`passed_through`). Errors name the file, the line (row) and the field; an empty file and a repeated
    ``item_id`` are errors."""

    recs = _records(Path(path))
    rows = [_row(r) for r in recs]
    seen: dict[str, str] = {}
    for rec, row in zip(recs, rows):
        if row["item_id"] is not None and seen.setdefault(row["item_id"], rec.where) != rec.where:
            raise RawRecordError(
                rec.where, "item_id", f"{row['item_id']!r} repeats {seen[row['item_id']]} (item ids must be unique)"
            )
    keys = passed_through(dict.fromkeys(k for r in recs for k in r.data))
    passed = pd.DataFrame(
        [{k: _id_text(r.data.get(k)) for k in keys} for r in recs], index=range(len(recs)), columns=keys
    )
    return Items(pd.DataFrame(rows, columns=list(ITEM_FIELDS)), [r.where for r in recs], passed)


def one_item(candidate: str, question: str = "", evidence: str = "", item_id: str | None = None) -> Items:
    """The item given on the command line."""
    if not candidate.strip():
        raise PredictError("--candidate: empty (the text to judge)")
    row = {"candidate": candidate, "question": question, "evidence": evidence, "item_id": item_id, "frame": None}
    return Items(pd.DataFrame([row], columns=list(ITEM_FIELDS)), ["the command line"])


# ----------------------------------------------------------------------------------------------- output


def write_output(out: pd.DataFrame, path: str | Path) -> Path:
    """JSON Lines (abstentions as null) or CSV (abstentions as empty cells), by the file's suffix."""

    path = Path(path)
    if path.suffix == ".jsonl":
        text = out.to_json(orient="records", lines=True, force_ascii=False)
    elif path.suffix == ".csv":
        text = out.to_csv(index=False)
    else:
        raise PredictError(f"--out {path}: write .jsonl or .csv")
    return atomic_write_text(path, text if text.endswith("\n") else text + "\n")


def _cell(value: Any, fmt: str) -> str:
    return "-" if pd.isna(value) else fmt.format(value)


def table_text(out: pd.DataFrame, members: list[str], rows: int | None = SHOWN_ROWS) -> str:
    """The short stdout table: item, frame, each member's vote (``-`` = abstained), p and the stacked label."""
    cols = ["item_id", "frame", *members, "p_hallucinated", "label"]
    if out["uncached"].astype(bool).any():
        cols.append("uncached")
    if "injection_flag" in out and out["injection_flag"].any():  # text that looks like a prompt injection
        cols.append("injection_reasons")
    shown = out[cols].head(rows) if rows else out[cols]
    cells = {c: [_cell(v, "{:.0f}") for v in shown[c]] for c in members}
    shown = shown.assign(
        item_id=shown["item_id"].str.slice(0, 24),
        **cells,
        p_hallucinated=[_cell(p, "{:.3f}") for p in shown["p_hallucinated"]],
    )
    text = shown.to_string(index=False)
    if rows and len(out) > rows:
        text += f"\n… {len(out) - rows} more"
    return text


def summary(out: pd.DataFrame, report: dict, members: list[str]) -> str:
    """One line: how many items got each label, and how many verdicts were judged now vs read from the cache."""
    report = {m: report.get(m, {}) for m in members}
    counts = out["label"].value_counts()
    labels = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("hallucinated", "supported", "abstained", "escalated"))
    computed = sum(r.get("computed", 0) for r in report.values())
    cached = sum(r.get("cached", 0) for r in report.values()) - computed
    missing = sum(r.get("uncached", 0) for r in report.values())
    judged = ", ".join(f"{m} {r['computed']}" for m, r in report.items() if r.get("computed"))
    flagged = int(out["injection_flag"].sum()) if "injection_flag" in out else 0
    return (
        f"{len(out)} items: {labels}; verdicts judged now: {computed}"
        + (f" ({judged})" if judged else "")
        + f", read from the cache: {cached}"
        + (f", not cached (abstained): {missing}" if missing else "")
        + (f"; {flagged} flagged as a possible prompt injection (injection_flag)" if flagged else "")
        + (
            f"; the model's own run decided {out['run_decision'].iloc[0]!r}, not 'deploy the panel' (run_decision)"
            if "run_decision" in out and len(out)
            else ""
        )
    )


# -------------------------------------------------------------------------------------------------- cli


def parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m src.predict", description=__doc__.splitlines()[0])
    ap.add_argument("items", nargs="?", type=Path, help="items file: .jsonl, .csv or .parquet")
    ap.add_argument("--candidate", help="one item on the command line: the text to judge")
    ap.add_argument("--question", default="")
    ap.add_argument("--evidence", default="")
    ap.add_argument("--item-id", default=None)
    model = ap.add_mutually_exclusive_group(required=True)
    model.add_argument("--model-uri", help="a stacker or panel model: models:/NAME@ALIAS, runs:/ID/stacker, a folder")
    model.add_argument("--run-id", help="a stacking run (with --dataset for an analysis' parent run)")
    ap.add_argument(
        "--dataset",
        default=None,
        help="with --run-id: which dataset's stacker; the items' verdicts are that dataset's in the cache",
    )
    ap.add_argument("--roster", default=None, help="default: the roster the stacker's run was tagged with")
    ap.add_argument("--frame", default=None, help="judge every item under this frame (def_on, claim)")
    ap.add_argument("--out", type=Path, default=None, help="write every prediction here (.jsonl or .csv)")
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"the verdict cache (default {SCORED_CACHE.relative_to(ROOT)}: kept apart from the committed "
        "benchmark cache, which the DVC stages depend on)",
    )
    ap.add_argument("--no-compute", action="store_true", help="judge nothing: a cache miss is an abstention")
    ap.add_argument(
        "--injection-defence",
        choices=DEFENCES,
        default=None,
        help="an item flagged as a prompt injection: escalate (no verdict; the default), immune (decided by the "
        "non-LLM members), off (decided as any item); default: the panel model's own setting",
    )
    ap.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or the repo's mlflow.db")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="llama.cpp threads (sets RAIM_THREADS; default: the physical cores this process may use; not part of a judge's identity)",
    )
    ap.add_argument("--no-progress", action="store_true")

    add_engine_args(ap)  # a batch job's misses on a Ray cluster: --engine ray
    return ap


def _items(a: argparse.Namespace) -> Items:
    if (a.items is None) == (a.candidate is None):
        raise PredictError("give an items file or one item with --candidate (and --question / --evidence), not both")
    if a.items is not None:
        return read_items(a.items)
    return one_item(a.candidate, a.question, a.evidence, a.item_id)


@one_line
def main(argv: list[str] | None = None) -> int:
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    a = parser().parse_args(argv)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    if a.threads:
        os.environ["RAIM_THREADS"] = str(a.threads)
    if a.out is not None and a.out.suffix not in (".jsonl", ".csv"):
        raise PredictError(f"--out {a.out}: write .jsonl or .csv")
    if a.out is not None:
        check_not_an_input("--out", a.out, {"items file": a.items}, "the predictions")
    items = _items(a)
    check_server(a.tracking_uri or tracking_uri())
    mlflow.set_tracking_uri(a.tracking_uri or tracking_uri())
    uri = a.model_uri or stacker_uri(a.run_id, a.dataset)
    panel = load_panel(uri, a.roster)
    if a.injection_defence:
        panel.model.config["injection_defence"] = a.injection_defence
    warning = decision_warning(getattr(panel.model, "decision", None))
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    items = assign_frames(items, panel.model.frames, a.frame, panel.calibrated_frame)
    if a.dataset and "dataset" not in items.frame:  # the stacker's dataset: its items' folder of the verdict cache
        items.frame["dataset"] = a.dataset
    if a.frame and panel.calibrated_frame and a.frame != panel.calibrated_frame:
        print(
            f"warning: the stacker was calibrated on votes under frame {panel.calibrated_frame!r}; "
            f"judging under {a.frame!r}",
            file=sys.stderr,
        )
    cache_dir = a.cache_dir or panel.cache_dir or SCORED_CACHE

    engine = None if a.no_compute else engine_from_args(a)
    out, report = predict(panel, items, cache_dir, compute=not a.no_compute, progress=not a.no_progress, engine=engine)
    members = [m["name"] for m in panel.model.roster["members"]]
    print(table_text(out, members, SHOWN_ROWS if a.out else None))
    print(summary(out, report, members))
    if a.out is not None:
        print(f"wrote {write_output(out, a.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
