"""``python -m src.rate``: how much of my traffic hallucinates — the rate with a valid interval (beyond the paper).

    python -m src.rate estimate POOL --labels gold.csv [--proposal p.json] [--segment dataset] [--out rate.json]
    python -m src.rate propose POOL K --proposal p.json [--labels already.csv] [--seed 0] [--tau 0.5]
    python -m src.rate plan POOL --halfwidth 0.02 [--labels gold.csv] [--train-prevalence 0.5]
    python -m src.rate [hydra overrides]       # the study: rate.output (JSON), rate.figure, an MLflow run "rate"

POOL is a scored table (a ``src.predict`` output, or any CSV / JSON Lines / Parquet file with ``item_id`` and
``p_hallucinated``), a served model's monitoring store (.db), or ``traces:EXPERIMENT`` — the traces of an MLflow
experiment that hold RAIM's assessment (``python -m src.traces judge``; ``--traces-filter`` narrows them, and
``--segment`` names a trace tag); gold is ``item_id, gold`` (0 / 1), or ``--labels traces``: the people's labels on the
pool's traces (HUMAN feedback, conf/traces). ``propose --tag-traces`` tags the traces it proposes, so a person
finds them in the MLflow UI. The files read are :mod:`src.studies.pool`, the proposal file
:mod:`src.studies.proposal`, the methods :mod:`src.studies.estimate` and the study :mod:`src.studies.rate` (maths:
:mod:`src.core.rates`).
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import hydra
import numpy as np

from src.core import names
from src.core.errors import ArgumentParser, one_line
from src.core.rates import RateError
from src.io.files import atomic_write_text, check_not_an_input, to_json
from src.io.paths import CONF_DIR
from src.io.settings import Settings
from src.io.trust import commands_or_study
from src.judges import tables
from src.mlops import traces
from src.mlops import tracking as track
from src.mlops.store import check_server, tracking_uri
from src.present import rate as present
from src.studies import rate as study
from src.studies.checked import check_config, configured
from src.studies.estimate import estimate, plan_labels, text_table
from src.studies.pool import Pool, one_prevalence, pool_of, read_labels, read_pool
from src.studies.proposal import propose, read_proposal, template_path, write_proposal
from src.studies.suite import cascade, cost

log = logging.getLogger("raim.rate")

COMMANDS = ("estimate", "propose", "plan")
HELP = ("-h", "--help")  # the tool's help (its commands), not Hydra's (the whole composed configuration)
STUDY_HELP = """\
without a command, python -m src.rate [hydra overrides] runs the study (conf/rate/default.yaml): simulated and
real pools, each method's coverage and width, written to rate.output (JSON), rate.figure and an MLflow run "rate";
`python -m src.rate --cfg job` prints its composed configuration, `--hydra-help` Hydra's own options.
Each command's options: python -m src.rate estimate --help (propose, plan likewise). Methods: docs/rates.md."""
TRACES = "traces:"  # a pool read from an MLflow experiment's assessed traces
TRACES_LABELS = "traces"  # --labels: the people's labels on those traces


def parser() -> ArgumentParser:
    ap = ArgumentParser(
        prog="python -m src.rate",
        description="\n".join(__doc__.replace("``", "").splitlines()[:6]).split(": ", 1)[1],  # the usage lines
        epilog=STUDY_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True, parser_class=ArgumentParser, metavar="COMMAND")

    def pool_args(p):
        p.add_argument(
            "pool",
            help="scored table (.csv/.jsonl/.parquet with item_id, p_hallucinated), store (.db) or traces:EXPERIMENT",
        )
        p.add_argument(
            "--labels", help="gold labels: item_id, gold (0 supported / 1 hallucinated); `traces`: the traces' own"
        )
        p.add_argument("--traces-filter", help="a traces: pool's mlflow.search_traces filter (fix the pool with it)")
        p.add_argument("--labels-column", default="gold", help="the gold column of --labels (default: gold)")
        p.add_argument("--proposal", help="the proposal the labels were drawn by (src.rate propose)")
        p.add_argument(
            "--train-prevalence",
            type=float,
            help="the stacker's training prevalence (EM estimate; default: the table's train_prevalence column)",
        )
        p.add_argument("--model", help="monitoring store: only this served model's rows")
        p.add_argument("--level", type=float, default=0.95, help="interval level (default 0.95)")
        p.add_argument("--min-labels", type=int, default=10, help="fewest labels per segment for an interval")
        p.add_argument("--tau", type=float, default=0.5, help="uniform share of the active sampling design")

    e = sub.add_parser("estimate", help="the rate per segment by every method")
    pool_args(e)
    e.add_argument("--segment", help="a column of the pool to report by (e.g. dataset)")
    e.add_argument("--window", type=float, help="seconds per time window over the pool's ts (or the store's)")
    e.add_argument("--threshold", type=float, default=0.5, help="the panel's decision threshold (naive share)")
    e.add_argument("--labeller", help="who labelled (e.g. a frontier judge): the rate then estimates what it says")
    e.add_argument("--out", help="write the document here (JSON)")
    p = sub.add_parser("propose", help="the next items to label (active sampling, seeded)")
    pool_args(p)
    p.add_argument("budget", type=int, help="expected number of items to label")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tag-traces", action="store_true", help="traces: pool: tag the proposed traces for the UI")
    q = sub.add_parser("plan", help="labels needed for a target half-width")
    pool_args(q)
    q.add_argument("--halfwidth", type=float, required=True, help="target interval half-width (e.g. 0.02)")
    q.add_argument("--prevalence", type=float, help="anticipated rate when planning without labels (default: EM)")
    return ap


def check_outputs(a: argparse.Namespace) -> None:
    """Before any work: no file this command writes (``propose``'s proposal and its labels template, ``estimate
    --out``) is one of the files it reads."""
    labels = None if a.labels == TRACES_LABELS else a.labels
    inputs = {"pool": None if a.pool.startswith(TRACES) else a.pool, "labels file": labels}
    if a.command == "propose" and a.proposal:
        proposal = Path(a.proposal)
        check_not_an_input("--proposal", proposal, inputs, "the proposal")
        check_not_an_input(f"--proposal {proposal} writes", template_path(proposal), inputs, "its labels template")
    elif a.command == "estimate" and a.out:
        check_not_an_input("--out", a.out, {**inputs, "proposal": a.proposal}, "the estimate")


@one_line
def cli(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    check_outputs(a)
    if a.pool.startswith(TRACES):
        pool, traced = traces_pool(a)
    else:
        pool, traced = (
            read_pool(a.pool, getattr(a, "segment", None), getattr(a, "window", None), a.train_prevalence, a.model),
            None,
        )
    lab, y = labels_of(a, pool, traced)
    if a.command == "propose":
        if not a.proposal:
            raise RateError("propose: name the proposal file to write with --proposal FILE.json")
        doc = propose(pool, a.budget, a.seed, a.tau, lab)
        out, template = write_proposal(doc, a.proposal)
        print(
            f"{len(doc['proposed'])} item(s) to label (expected {a.budget}; {doc['already_labelled']} already "
            f"labelled) of {len(pool)}: proposal {out}, fill in {template} and run "
            f"`python -m src.rate estimate {a.pool} --labels {template} --proposal {out}`"
        )
        if a.tag_traces:
            tag_proposed(a, doc, out)
        return 0
    proposal = read_proposal(a.proposal, pool) if a.proposal else None
    if lab is None:
        lab, y = np.zeros(len(pool), bool), np.full(len(pool), np.nan)
    if a.command == "plan":
        doc = plan_labels(pool, lab, y, a.halfwidth, a.level, a.tau, proposal, a.prevalence, a.min_labels)
        print(
            f"labels for a ±{a.halfwidth:g} interval ({round(100 * a.level)} %) on {len(pool)} items "
            f"(rate ≈ {doc['prevalence']:.3f}, from {doc['basis']}):"
        )
        for m, n in doc["labels"].items():
            print(f"  {m:9s} {n if n is not None else unreachable(doc, m)}")
        print(f"note: {doc['note']}")
        return 0
    if a.labels is None:
        raise RateError("estimate: no labels (--labels FILE); `python -m src.rate propose` says which items")
    doc = estimate(pool, lab, y, proposal, a.level, a.threshold, a.min_labels, a.labeller, a.labels)
    print(text_table(doc))
    if a.out:
        atomic_write_text(a.out, to_json(doc))
    return 0


def unreachable(plan: dict, method: str) -> str:
    """What a plan says where the target half-width is out of this pool's reach: the narrowest it allows and the
    pool of the same traffic that would reach the target (:func:`src.core.rates.plan`)."""
    return (
        f"not reachable on this pool: ±{plan['narrowest_halfwidth'][method]:.3f} at best (every item labelled); "
        f"a pool of about {plan['pool_needed'][method]:,} such items would reach ±{plan['halfwidth']:g}"
    )


def traces_pool(a) -> tuple[Pool, np.ndarray]:
    """A ``traces:EXPERIMENT`` pool (every trace holding RAIM's assessment, ``--traces-filter`` applied; ``--segment``:
    a trace tag) and the people's labels on it (NaN where none: :func:`src.mlops.traces.label_of`)."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    s = traces.settings()
    check_server(tracking_uri())
    mlflow.set_tracking_uri(tracking_uri())
    got = traces.read_pool(
        traces.experiment_id(a.pool[len(TRACES) :]),
        s.assessment.name,
        (s.assessment.label, s.assessment.name),
        a.traces_filter,
        s.page_size,
        getattr(a, "segment", None),
    )
    if not got.trace_ids:
        raise RateError(
            f"{a.pool}: no trace holds RAIM's assessment {s.assessment.name!r} ({got.skipped} without): judge them "
            "first with `python -m src.traces judge`"
        )
    prior = one_prevalence(a.pool, got.train_prevalence, "traces", "pass the stacker's with --train-prevalence")
    seg = None if got.segments is None else np.asarray(got.segments, dtype=object)
    pool = pool_of(
        a.pool,
        got.trace_ids,
        got.p,
        None,
        seg,
        got.ts,
        prior,
        getattr(a, "segment", None),
        getattr(a, "window", None),
        a.train_prevalence,
    )
    return pool, got.gold


def labels_of(a, pool: Pool, traced: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(labelled mask, gold) of ``--labels``: a file, or ``traces`` (the labels read with a ``traces:`` pool)."""
    if a.labels != TRACES_LABELS:
        return read_labels(a.labels, pool, a.labels_column) if a.labels else (None, None)
    if traced is None:
        raise RateError(f"--labels traces: the pool {a.pool} is not a traces:EXPERIMENT pool")
    return ~np.isnan(traced), traced


def tag_proposed(a, doc: dict, proposal) -> None:
    """Tag the proposed traces ``<traces.assessment.request_tag>=<the proposal's name>`` (one request per trace)."""
    if not a.pool.startswith(TRACES):
        raise RateError(f"--tag-traces: the pool {a.pool} is not a traces:EXPERIMENT pool")
    s = traces.settings()
    value = Path(proposal).stem
    n = traces.tag(doc["proposed"], s.assessment.request_tag, value)
    print(
        f"tagged {n} trace(s) {s.assessment.request_tag}={value}: in the MLflow UI, filter the traces on "
        f"tags.`{s.assessment.request_tag}` = '{value}', add feedback {s.assessment.label!r} (true = hallucinated) "
        f"to each, then run `python -m src.rate estimate {a.pool} --labels traces --proposal {proposal}`"
    )


def compute(cfg: Settings) -> dict:
    """Config in, study document out: the ladder's stacker and analysis settings, the configured verdict table
    (:func:`src.run.load_table`) when ``rate.real``, the labeller (:func:`labeller`), the ``rate`` settings."""
    settings, stacker = configured(cfg)
    s = cfg.node("rate")
    study.check_study(s)  # before reading the table
    table = tables.load_table(cfg) if s["real"] else None
    who = labeller(cfg, table, s["labeller"]) if table is not None else None
    doc = study.study(table, stacker, settings, s, who)
    doc["meta"] = {
        "verdicts": None if table is None else table.source,
        "members": None if table is None else table.members,
        "labeller": None if who is None else {"name": who[0], "chosen_as": who[1]},
        "stacker": cfg.node("stacker"),
    }
    return doc


def labeller(cfg: Settings, table, wanted) -> tuple[str, str] | None:
    """The judge whose verdicts stand in for gold in the study's labeller regimes: none (null), a named member or
    frontier column, or ``auto`` — the frontier column, else the most expensive member by the suite's cost model
    (:func:`src.studies.suite.cascade.choose_expensive`, measured seconds per verdict from the verdict cache)."""
    if wanted in (None, False, "none", "null"):
        return None
    names = list(table.members) + ([table.frontier_name] if table.has_frontier else [])
    if wanted != "auto" and wanted not in names:
        raise RateError(
            f"rate.labeller={wanted!r}: neither a member nor the frontier column of "
            f"{table.source} (judges: {', '.join(names)}; or auto, or null)"
        )
    costs = cost.compute(
        cfg.suite.cost,
        table.members,
        None,
        cost.measured_from_cache(cfg.paths.cache_dir, names),
        table.frontier_name,
    )
    return cascade.choose_expensive(table, costs, None if wanted == "auto" else wanted)


def flat_metrics(doc: dict) -> dict[str, float]:
    """The study's numbers as MLflow metrics: ``<regime>/<method>/<stat>`` (the summary) and
    ``<regime>/p<π>/n<labels>/<method>/<coverage|width_rel>`` (the cells)."""
    out = {}
    for name, per in doc["summary"].items():
        for m, d in per.items():
            for k in ("coverage", "coverage_min", "width", "width_rel", "effective_labels", "multiplier"):
                if d[k] is not None:
                    out[names.metric_name(name, m, k)] = d[k]
    for name, reg in doc["regimes"].items():
        for q, c in reg["cells"].items():
            for n, cell in c["labels"].items():
                for m, d in cell["methods"].items():
                    out[names.metric_name(name, f"p{q}", f"n{n}", m, "coverage")] = d["coverage"]
                    if d["width_rel"] is not None:
                        out[names.metric_name(name, f"p{q}", f"n{n}", m, "width_rel")] = d["width_rel"]
    if doc["crosscheck"]["ppi_py"]["max_abs_diff"] is not None:
        out["crosscheck/ppi_py_max_abs_diff"] = doc["crosscheck"]["ppi_py"]["max_abs_diff"]
    return out


def run_study(composed) -> None:
    """The study entry's body (:func:`src.mlops.tracking.run_study`: outputs checked first, figure, MLflow run, JSON),
    on the settings the composed config is checked into (:func:`src.studies.checked.check_config`)."""
    cfg = check_config(composed)
    started = time.perf_counter()  # the wall time is logged, not written: rate.json is a DVC output
    doc, out, fig = track.run_study(
        cfg,
        "rate",
        compute,
        cfg.rate.output,
        cfg.rate.figure,
        present.rate_figure,
        flat_metrics,
        tags=lambda d: {"regimes": ",".join(d["regimes"])},
    )
    for line in study.statements(doc):
        log.info("%s", line)
    log.info("rate study written to %s; figure %s (%.0f s)", out, fig, time.perf_counter() - started)


def main() -> None:
    """``python -m src.rate estimate|propose|plan …`` (argparse), else the study through Hydra (``@hydra.main`` +
    ``@one_line``, :func:`src.io.trust.commands_or_study`)."""
    study = hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")(one_line(run_study))
    commands_or_study((*COMMANDS, *HELP), cli, study)


if __name__ == "__main__":
    main()
