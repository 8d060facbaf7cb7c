"""``python -m src.traces``: RAIM where the traffic already is (beyond the paper) — an MLflow experiment's traces in,
one assessment per trace out, people's labels back, and the panel against MLflow's own judge ensembles.

    python -m src.traces judge --experiment NAME --model-uri URI [--roster NAME] [--filter F] [--since T]
        [--until T] [--frame NAME] [--page-size N] [--limit N] [--no-compute] [--out scored.jsonl] [--report r.json]
    python -m src.traces labels --experiment NAME [--filter F] --out gold.csv [--table verdicts.csv]
    python -m src.traces [hydra overrides]    # the study: traces.output (JSON), traces.figure, an MLflow run "traces"

``judge`` reads the experiment's traces page by page (``--filter``: an ``mlflow.search_traces`` filter string;
``--since``/``--until``: a time window), maps each to an item (``traces.mapping``, :mod:`src.io.traces`), judges the
items with the model's roster through the verdict cache and writes RAIM's assessment on each trace
(:mod:`src.mlops.traces`), page by page. Traces it cannot map are counted per reason, never dropped in silence.
``labels`` writes the people's labels on the assessed traces as ``item_id, gold`` (the trace ids: ``src.rate``'s
labels) and, with ``--table``, the labelled traces' verdict table (their members' votes from the verdict cache and
the labels as gold) that ``python -m src.run verdicts=…`` calibrates a stacker on. ``src.rate`` reads such a pool
and its labels straight from the traces: ``python -m src.rate estimate traces:NAME --labels traces``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from pathlib import Path

import hydra
import pandas as pd

from src.core.errors import ArgumentParser, one_line
from src.io.config import thaw
from src.io.datasets import read_items
from src.io.files import atomic_write_text, to_json
from src.io.paths import CONF_DIR, ROOT
from src.io.settings import Settings, TracesSettings
from src.io.trust import commands_or_study
from src.judges.ray_engine import add_engine_args, engine_from_args
from src.judges.tables import frame_for, load_table
from src.mlops import assessing, tracking
from src.mlops import traces as mt
from src.mlops.panels import Items, assign_frames, load_panel, predict
from src.mlops.serving import SCORED_CACHE, decision_warning
from src.mlops.store import check_server, tracking_uri
from src.present import traces as present
from src.studies import ensembles
from src.studies.checked import check_config, configured

log = logging.getLogger("raim.traces")

COMMANDS = ("judge", "labels")


def parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m src.traces", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    def common(p):
        p.add_argument("--experiment", required=True, help="the MLflow experiment holding the traces (name or id)")
        p.add_argument(
            "--filter", default=None, help="an mlflow.search_traces filter string, e.g. \"tags.env = 'prod'\""
        )
        p.add_argument("--since", default=None, help="traces from this time: 2025-06-01T12:00 (UTC), epoch s, or 24h")
        p.add_argument("--until", default=None, help="traces before this time (same forms)")
        p.add_argument("--page-size", type=int, default=None, help="traces per page (default traces.page_size)")
        p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or the repo's mlflow.db")
        p.add_argument("--traces-config", type=Path, default=None, help="a traces settings file (default conf/traces)")
        p.add_argument(
            "--dataset", default=None, help="the verdict cache's folder of the items (default traces.dataset)"
        )

    j = sub.add_parser("judge", help="judge the traces and write one assessment per trace")
    common(j)
    j.add_argument("--model-uri", required=True, help="a RAIM stacker or panel model: models:/NAME@ALIAS, runs:/…")
    j.add_argument("--roster", default=None, help="a stacker's roster (default: the one its run was tagged with)")
    j.add_argument("--frame", default=None, help="judge every trace under this frame (default: the calibrated one)")
    j.add_argument("--limit", type=int, default=None, help="read at most this many traces")
    j.add_argument(
        "--cache-dir", type=Path, default=None, help=f"the verdict cache (default {SCORED_CACHE.relative_to(ROOT)})"
    )
    j.add_argument("--no-compute", action="store_true", help="judge nothing: a trace with a missing verdict waits")
    j.add_argument("--out", type=Path, default=None, help="also write the scored traces here (.jsonl or .csv)")
    j.add_argument("--report", type=Path, default=None, help="write the run's report here (JSON)")
    j.add_argument("--threads", type=int, default=0, help="llama.cpp threads (not part of a judge's identity)")
    j.add_argument("--no-progress", action="store_true")
    add_engine_args(j)  # the misses on a Ray cluster: --engine ray (default: conf/config.yaml's judge node)
    lab = sub.add_parser("labels", help="the people's labels on the assessed traces (and their verdict table)")
    common(lab)
    lab.add_argument("--out", type=Path, required=True, help="item_id, gold (CSV): src.rate's --labels")
    lab.add_argument("--table", type=Path, default=None, help="also the labelled traces' verdict table (CSV)")
    lab.add_argument("--cache-dir", type=Path, default=None, help="the verdict cache the traces were judged through")
    return ap


def _window(a: argparse.Namespace) -> str | None:
    now = time.time()
    return mt.search_filter(a.filter, mt.parse_time(a.since, now, "--since"), mt.parse_time(a.until, now, "--until"))


def _connect(a: argparse.Namespace) -> str:
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = a.tracking_uri or tracking_uri()
    check_server(uri)
    mlflow.set_tracking_uri(uri)
    return mt.experiment_id(a.experiment)


def settings(a: argparse.Namespace) -> TracesSettings:
    """conf/traces (or ``--traces-config``), with ``--dataset`` over ``traces.dataset``."""
    s = mt.settings(a.traces_config)
    return dataclasses.replace(s, dataset=a.dataset) if a.dataset else s


def judge(a: argparse.Namespace) -> int:
    s = settings(a)
    if a.out is not None and a.out.suffix not in (".jsonl", ".csv"):
        raise mt.TraceError(f"--out {a.out}: write .jsonl or .csv")
    if a.threads:
        os.environ["RAIM_THREADS"] = str(a.threads)
    experiment, flt = _connect(a), _window(a)
    panel = load_panel(a.model_uri, a.roster)
    if warning := decision_warning(getattr(panel.model, "decision", None)):
        print(f"warning: {warning}", file=sys.stderr)
    who = mt.Judge(
        s.assessment.name,
        str(panel.model.roster.get("name")),
        mt.identities(panel.model.roster),
        a.model_uri,
        mt.registry_version(a.model_uri),
    )
    cache_dir = a.cache_dir or panel.cache_dir or SCORED_CACHE
    engine = None if a.no_compute else engine_from_args(a)

    def score(frame: pd.DataFrame) -> pd.DataFrame:
        items = Items(
            frame[["candidate", "question", "evidence", "item_id", "dataset"]].assign(frame=None),
            [f"trace {t}" for t in frame["trace_id"]],
        )
        items = assign_frames(items, panel.model.frames, a.frame, panel.calibrated_frame)
        out, _ = predict(panel, items, cache_dir, not a.no_compute, not a.no_progress, engine, require_cached=False)
        return out

    def progress(r: assessing.Report) -> None:
        if not a.no_progress:
            print(f"… {r.line()}", file=sys.stderr)

    report, scored = assessing.judge(
        experiment, flt, s.mapping, panel, who, score, s.dataset, a.page_size or s.page_size, a.limit, progress
    )
    doc = {"experiment": a.experiment, "filter": flt, "model": who.model, "assessment": who.name, **report.as_dict()}
    print(report.line())
    for reason, r in report.skipped.items():
        print(f"  not judged, {reason}: {r['count']} ({r['meaning']}; first: {', '.join(r['first'])})")
    if a.out is not None:
        rows = pd.concat(scored, ignore_index=True) if scored else pd.DataFrame()
        print(f"wrote {write_scored(rows, a.out)}")
    if a.report is not None:
        print(f"wrote {atomic_write_text(a.report, to_json(doc))}")
    return 0


def write_scored(rows: pd.DataFrame, path: Path) -> Path:
    """The scored traces as a pool for ``src.rate`` (``item_id`` = the trace id; the verdict cache's id kept as
    ``cache_item_id``): JSON Lines or CSV by the suffix."""
    if "trace_id" in rows.columns:  # no rows at all (nothing judged): an empty file
        rows = rows.rename(columns={"item_id": "cache_item_id"}).rename(columns={"trace_id": "item_id"})
        first = ["item_id", "ts", "p_hallucinated", "verdict", "label"]
        rows = rows[first + [c for c in rows.columns if c not in first]]
    text = (
        rows.to_json(orient="records", lines=True, force_ascii=False)
        if path.suffix == ".jsonl"
        else rows.to_csv(index=False)
    )
    return atomic_write_text(path, text if text.endswith("\n") or not text else text + "\n")


def labels(a: argparse.Namespace) -> int:
    s = settings(a)
    experiment, flt = _connect(a), _window(a)
    names = (s.assessment.label, s.assessment.name)
    pool = mt.read_pool(experiment, s.assessment.name, names, flt, a.page_size or s.page_size)
    lab = ~pd.isna(pool.gold)
    gold = pd.DataFrame({"item_id": [t for t, k in zip(pool.trace_ids, lab) if k], "gold": pool.gold[lab].astype(int)})
    atomic_write_text(a.out, gold.to_csv(index=False))
    print(
        f"{len(gold)} labelled trace(s) of {len(pool.trace_ids)} assessed ({int(gold['gold'].sum())} hallucinated; "
        f"{pool.skipped} trace(s) in the window hold no RAIM assessment): wrote {a.out}"
    )
    if a.table is not None:
        table = assessing.labelled_table(
            experiment, flt, s, dict(zip(gold["item_id"], gold["gold"])), a.cache_dir or SCORED_CACHE
        )
        print(
            f"wrote {atomic_write_text(a.table, table.to_csv(index=False))} ({len(table)} rows): "
            f"`python -m src.run verdicts={a.table}` calibrates a stacker on them"
        )
    return 0


@one_line
def cli(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    return judge(a) if a.command == "judge" else labels(a)


# ------------------------------------------------------------------------------------------------- study


def compute(cfg: Settings) -> dict:
    """Config in, study document out (:mod:`src.studies.ensembles`): the ladder's stacker and analysis settings, the
    configured roster's verdict table, and MLflow's ensembles of its members as scorers over each dataset's items
    (:func:`src.mlops.scorers.ensemble_predictions`, reading the same verdict cache)."""
    from src.mlops import scorers  # imported here, not at start-up: mlflow.genai ~2 s

    settings_, stacker = configured(cfg)
    s = cfg.traces
    if cfg.verdicts:
        raise ensembles.EnsembleStudyError(
            f"verdicts={cfg.verdicts}: the traces study reads the roster's verdicts through MLflow scorers "
            "(the verdict cache); a bring-your-own table has no items to score"
        )
    table = load_table(cfg)
    items = {name: benchmark_items(cfg, name, table) for name in table.by_dataset()}
    roster = cfg.node("roster")

    def mlflow_side(name: str, members: list[str]):
        frame = frame_for(cfg, name)
        votes = scorers.Votes(
            {**roster, "members": [m for m in roster["members"] if m["name"] in members]},
            {frame["name"]: thaw(frame)},
            frame["name"],
            Path(cfg.paths.cache_dir),
            compute=False,
        )
        return scorers.ensemble_predictions(votes, items[name], members, s.ensembles, s.mean_threshold, s.mapping, name)

    doc = ensembles.study(table, stacker, settings_, mlflow_side)
    doc["settings"] = {"ensembles": list(s.ensembles), "mean_threshold": s.mean_threshold}
    doc["meta"] = {
        "verdicts": table.source,
        "members": table.members,
        "stacker": cfg.node("stacker"),
        "mlflow": scorers.MLFLOW_VERSION,
    }
    return doc


def benchmark_items(cfg: Settings, name: str, table) -> pd.DataFrame:
    """The dataset's judged items (question, evidence, candidate) in the table's order, with their frame."""
    items = read_items(Path(cfg.paths.datasets_dir) / f"{name}.jsonl").set_index("item_id", drop=False)
    ids = table.items.loc[table.items["dataset"] == name, "item_id"].astype(str)
    return items.loc[ids].reset_index(drop=True).assign(dataset=name, frame=frame_for(cfg, name)["name"])


def run_study(composed) -> None:
    """The study entry's body (:func:`src.mlops.tracking.run_study`: outputs checked first, figure, run, JSON),
    on the settings the composed config is checked into (:func:`src.studies.checked.check_config`)."""
    cfg = check_config(composed)
    doc, out, fig = tracking.run_study(
        cfg,
        "traces",
        compute,
        cfg.traces.output,
        cfg.traces.figure,
        present.traces_figure,
        ensembles.flat_metrics,
        tags=lambda d: {"datasets": ",".join(d["datasets"]), "ensembles": ",".join(d["settings"]["ensembles"])},
    )
    for line in ensembles.statements(doc):
        log.info("%s", line)
    log.info("traces study written to %s; figure %s", out, fig)


def main() -> None:
    """``python -m src.traces judge|labels …`` (argparse), else the study through Hydra (``@hydra.main`` +
    ``@one_line``, :func:`src.io.trust.commands_or_study`)."""
    study = hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")(one_line(run_study))
    commands_or_study(COMMANDS, cli, study)


if __name__ == "__main__":
    main()
