"""``python -m src.judges``: fill the verdict cache and write verdict tables + the coverage audit.

    python -m src.judges --roster cpu --datasets medhallu wice truthfulqa expertqa \
        --items-dir datasets --per-dataset 200 --compute

Reads ``<items-dir>/<dataset>.jsonl`` (``src.io.datasets.read_items``), takes a whole-cluster, gold-stratified
subsample (seed 0) when ``--per-dataset`` is given, scores missing verdicts with ``--compute`` (dataset by
dataset, member by member; kill it at any time and rerun the same command to resume), and writes
``<tables-dir>/<roster>/<dataset>.csv`` plus ``coverage.csv`` / ``coverage.json`` (Table 22 shape with κ,
abstentions, truncations and seconds per item).  Without ``--compute`` it only reads the cache.
``--engine ray`` (default: conf/config.yaml's ``judge.engine``) scores the misses on a Ray cluster
(:mod:`src.judges.ray_engine`; ``--ray-address``, ``--ray-actors``, ``--ray-batch-size``, ``--ray-cpus``,
``--ray-gpus`` override ``judge.ray``); the cache is written by this process either way.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import pandas as pd

from src.core.errors import ArgumentParser, RaimError, one_line
from src.io.datasets import read_dataset
from src.io.files import atomic_write_text, to_json
from src.io.paths import ROOT
from src.judges.cache import split_by_dataset
from src.judges.config import load_frame_cfgs, load_roster
from src.judges.ray_engine import add_engine_args, engine_from_args
from src.judges.runner import (
    cluster_subsample,
    compute_command,
    coverage_audit,
    coverage_matrix,
    member_names,
    roster_judges,
    verdict_table,
)


def _relative(text: str) -> str:
    """Paths under the repository written relative to it (committed files carry no machine paths)."""
    return text.replace(str(ROOT) + "/", "")


AUDIT_HEAD = ("roster", "per_dataset", "seed")
AUDIT_NAME = "coverage"  # the merged audit beside the verdict tables: coverage.csv / coverage.json, coverage/*.json


def write_dataset_audit(out_dir: Path, dataset: str, audit: pd.DataFrame, report: dict, head: dict) -> Path:
    """One dataset's audit rows and per-judge hit/miss report, ``coverage/<dataset>.json`` (each DVC
    ``verdicts`` stage owns one such file); undefined values (κ of a member with no verdict) are JSON null."""
    rows = audit[audit["dataset"] == dataset].sort_values("member").to_dict("records")
    doc = {**head, "dataset": dataset, "rows": rows, "report": report}
    return atomic_write_text(out_dir / "coverage" / f"{dataset}.json", _relative(to_json(doc, indent=1, default=str)))


def merge_audits(out_dir: Path) -> pd.DataFrame:
    """``coverage.csv`` / ``coverage.json`` (Table 22 shape) from every ``coverage/<dataset>.json``, written
    atomically; an undefined value is an empty cell / JSON null."""
    docs = [json.loads(p.read_text()) for p in sorted((out_dir / "coverage").glob("*.json"))]
    if not docs:
        return pd.DataFrame()
    audit = pd.DataFrame([r for d in docs for r in d["rows"]]).sort_values(["dataset", "member"])
    audit = audit.reset_index(drop=True)
    atomic_write_text(out_dir / "coverage.csv", audit.to_csv(index=False))
    heads = {tuple(d.get(k) for k in AUDIT_HEAD) for d in docs}
    head = dict(zip(AUDIT_HEAD, next(iter(heads)))) if len(heads) == 1 else {"per_dataset_heads": True}
    doc = {
        **head,
        "coverage": coverage_matrix(audit).to_dict(),
        "rows": audit.to_dict("records"),
        "reports": {d["dataset"]: d["report"] for d in sorted(docs, key=lambda d: d["dataset"])},
    }
    atomic_write_text(out_dir / "coverage.json", to_json(doc, indent=1, default=str))
    return audit


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1", "yes")


def _size(text: str) -> int:
    """A subsample size; 0, ``null`` or ``None`` (as DVC writes an unset param) mean every item."""
    return 0 if text.lower() in ("null", "none", "") else int(text)


@one_line
def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m src.judges", description=__doc__.splitlines()[0])
    ap.add_argument("--roster", default="cpu")
    ap.add_argument("--datasets", nargs="+", default=["medhallu", "wice", "truthfulqa", "expertqa"])
    ap.add_argument("--items-dir", type=Path, default=ROOT / "datasets")
    ap.add_argument("--cache-dir", type=Path, default=ROOT / "verdicts" / "cache")
    ap.add_argument("--tables-dir", type=Path, default=ROOT / "verdicts" / "tables")
    ap.add_argument("--per-dataset", type=_size, default=0, help="whole-cluster stratified subsample size (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--members", default="", help="comma-separated subset of members to compute")
    ap.add_argument(
        "--compute",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="score missing verdicts (otherwise read the cache); `--compute false` reads only",
    )
    ap.add_argument("--frontier", action="store_true", help="also compute the frontier judge (paid API)")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="llama.cpp threads (sets RAIM_THREADS; default: the physical cores this process may use; not part of the identity)",
    )
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument(
        "--no-merge",
        action="store_true",
        help="write only the datasets' coverage/<dataset>.json, not the merged coverage.csv/json",
    )
    ap.add_argument(
        "--merge-only",
        action="store_true",
        help="only merge <tables-dir>/<roster>/coverage/*.json into coverage.csv/json (no cache read)",
    )
    ap.add_argument(
        "--split-cache",
        action="store_true",
        help="convert --cache-dir from one file per judge to one folder per dataset (once; no judge is loaded)",
    )
    add_engine_args(ap)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if a.threads:
        os.environ["RAIM_THREADS"] = str(a.threads)

    if a.split_cache:
        moved = split_by_dataset(a.cache_dir)
        for path, parts in moved.items():
            print(f"{_relative(path)}: " + ", ".join(f"{n} records to {d}/" for d, n in sorted(parts.items())))
        print(
            f"{len(moved)} cache files split by dataset under {_relative(str(a.cache_dir))}"
            if moved
            else f"nothing to split: {_relative(str(a.cache_dir))} has no file of the one-file-per-judge layout"
        )
        return 0
    if a.merge_only:
        audit = merge_audits(a.tables_dir / a.roster)
        print(coverage_matrix(audit).round(3).to_string() if not audit.empty else "no dataset audit to merge")
        return 0
    if AUDIT_NAME in a.datasets:  # its table <tables-dir>/<roster>/coverage.csv would be overwritten by the audit
        raise RaimError(
            f"dataset name {AUDIT_NAME!r} is the name of the coverage audit written beside the verdict "
            f"tables ({a.tables_dir / a.roster / (AUDIT_NAME + '.csv')}): give the dataset another name"
        )
    roster = load_roster(a.roster)
    frames = load_frame_cfgs()
    only = [m for m in a.members.split(",") if m] or None
    if only:
        unknown = set(only) - set(member_names(roster))
        if unknown:
            raise RaimError(f"unknown members {sorted(unknown)}; roster has {member_names(roster)}")
    engine = engine_from_args(a) if a.compute else None  # `--engine ray`: misses scored on a Ray cluster
    out_dir = a.tables_dir / a.roster
    out_dir.mkdir(parents=True, exist_ok=True)
    tables: dict[str, pd.DataFrame] = {}
    reports: dict[str, dict] = {}
    for ds in a.datasets:
        items = read_dataset(a.items_dir, ds)
        if a.per_dataset:
            items = cluster_subsample(items, a.per_dataset, seed=a.seed)
        logging.info("%s: %d items, %d clusters", ds, len(items), items["cluster_id"].nunique())
        t0 = time.time()
        try:
            t = verdict_table(
                roster,
                items,
                frames,
                a.cache_dir,
                a.compute,
                frontier=a.frontier,
                members=only,
                progress=not a.no_progress,
                allow_empty=True,
                engine=engine,
            )
        except ImportError as e:  # a judge's Python package (llama_cpp, torch, …) is not installed
            if isinstance(e, RaimError):
                raise
            raise RaimError(
                f"{ds}: a judge of roster {a.roster} cannot load: {e} (the optional packages: "
                f"scripts/install_models.sh)"
            ) from e
        if not any(r["cached"] for r in t.attrs["report"].values()):
            logging.warning(
                "%s: not one verdict of roster %s is cached under %s (its table has empty cells); "
                "compute them with `%s`",
                ds,
                a.roster,
                a.cache_dir,
                compute_command(a.roster, [ds], a.per_dataset),
            )
        # a table lists every roster member (uncached cells empty) even when only some were computed
        atomic_write_text(out_dir / f"{ds}.csv", t.to_csv(index=False))
        tables[ds] = t
        reports[ds] = t.attrs["report"]
        for m, r in t.attrs["report"].items():
            logging.info(
                "%s %-12s cached %d/%d abstained %d truncated %d computed %d (%.1fs) hits %d misses %d",
                ds,
                m,
                r["cached"],
                r["items"],
                r["abstained"],
                r["truncated"],
                r["computed"],
                r["compute_seconds"],
                r["cache"]["hits"],
                r["cache"]["misses"],
            )
            if "http" in r:  # a judge behind HTTP (src.judges.http): what its retry policy did
                h = r["http"]
                logging.info(
                    "%s %-12s http requests %d retries %d (%d as the server asked) waited %.1fs gave up %d",
                    ds,
                    m,
                    h["requests"],
                    h["retries"],
                    h["retry_after"],
                    h["waited_s"],
                    h["gave_up"],
                )
        logging.info("%s done in %.0fs", ds, time.time() - t0)
    judges = [n for n, _, _ in roster_judges(roster)]
    audit = coverage_audit(tables, judges)
    head = {"roster": a.roster, "per_dataset": a.per_dataset, "seed": a.seed}
    for ds in tables:
        write_dataset_audit(out_dir, ds, audit, reports[ds], head)
    if not a.no_merge:
        audit = merge_audits(out_dir)
    if not audit.empty:
        print(coverage_matrix(audit).round(3).to_string())
        print(
            audit[
                ["member", "dataset", "n", "cached", "coverage", "kappa", "bacc", "auc_logodds", "seconds_per_item"]
            ].to_string()
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
