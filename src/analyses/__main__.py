"""``python -m src.analyses [verdicts=PATH] [suite=fast] …``: the analysis suite on the configured verdicts.

Same config as ``python -m src.run``. Reads the table of :func:`src.judges.tables.load_table`, runs
:func:`src.studies.suite.run_suite`, writes ``suite.output`` (results/suite.json) and the figures of
:mod:`src.present.figures` under ``suite.figures_dir`` (those of Figs. 2 and 3b need the ladder's ``output``,
results/results.json), and logs them to MLflow when ``tracking.enabled``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from src.core.errors import one_line
from src.core.names import metric_name
from src.io import files
from src.io.datasets import read_items
from src.io.paths import CONF_DIR
from src.io.settings import Settings
from src.io.trust import checked_command
from src.judges import tables
from src.mlops import tracking as track
from src.present import figures
from src.studies.checked import check_config, configured
from src.studies.suite import cascade, cost, run_suite

log = logging.getLogger("raim.suite")


def compute(cfg: Settings) -> tuple[dict, dict | None]:
    """(suite document, results.json document or None) for the configured table."""
    settings, stacker = configured(cfg)
    suite = cfg.suite
    table = tables.load_table(cfg)
    measured = None
    if not cfg.verdicts and suite.cost.use_measured:
        names = list(table.members) + ([table.frontier_name] if table.frontier_name else [])
        measured = cost.measured_from_cache(cfg.paths.cache_dir, names)
    doc = run_suite(table, stacker, settings, suite, measured, flags=shipped_flags(cfg, table))
    doc["meta"] = {"verdicts": table.source, "members": table.members, "frontier": table.frontier_name}
    res_path = Path(cfg.output)
    results = json.loads(res_path.read_text()) if res_path.exists() else None
    return doc, results


def shipped_flags(cfg: Settings, table) -> dict[str, bool]:
    """{item_id: flagged as a prompt injection} for the table's items whose text a shipped balanced set
    (``paths.datasets_dir``) holds (the cascade escalates them: :func:`src.studies.suite.cascade.item_flags`)."""
    ids = set(table.items["item_id"].astype(str))
    out: dict[str, bool] = {}
    for name in table.datasets:
        path = Path(cfg.paths.datasets_dir) / f"{name}.jsonl"
        if path.exists():
            out.update(cascade.item_flags(r for r in read_items(path).to_dict("records") if str(r["item_id"]) in ids))
    return out


def flat_metrics(doc: dict) -> dict[str, float]:
    """Headline numbers of suite.json as MLflow metrics."""

    out: dict[str, float] = {}
    for name, d in doc["datasets"].items():
        for b, v in d["regime"]["budgets"].items():
            if v:
                out[metric_name("regime", name, f"p_match_{b}")] = v["p_match"]
        for b, v in d["curve"]["budgets"].items():
            if v:
                out[metric_name("curve", name, f"kappa_{b}")] = v["mean"]
        for k, v in zip(d["size"]["k"], d["size"]["stacked"]):
            out[metric_name("size", name, f"kappa_K{k}")] = v
        for m, v in d["leave_one_out"]["members"].items():
            out[metric_name("loo", name, m)] = v["estimate"]
    for b, v in doc["regime_summary"].items():
        if v:
            out[metric_name("regime", f"p_match_{b}")] = v["p_match"]
    fe = doc["recovery"].get("logit_fe") or {}
    if "coef" in fe:
        out["mechanism/logit_fe_coef"] = fe["coef"]
    if doc["recovery"].get("pointbiserial"):
        out["mechanism/pointbiserial_r"] = doc["recovery"]["pointbiserial"]["r"]
    for k in ("paper", "panel"):
        out[f"cost/{k}_panel_per_1k"] = doc["cost"][k]["panel_per_1k"]
        out[f"cost/{k}_frontier_per_1k"] = doc["cost"][k]["frontier"]["per_1k"]
    out["appendix_c/share_points_direction_holds"] = doc["appendix_c"].get("share_points_direction_holds") or 0.0
    out.update(cascade.flat_metrics(doc.get("cascade") or {}))
    return {k: float(v) for k, v in out.items() if v is not None}


@checked_command
@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
@one_line
def main(composed: DictConfig) -> None:
    cfg = check_config(composed)  # the one checked path: every group, before any work
    files.check_output(cfg.suite.output)
    doc, results = compute(cfg)
    timings = doc.pop("timings")  # wall times vary run to run: logged, never in suite.json (a DVC output)
    figs = figures.draw(results, doc, cfg.suite.figures_dir)
    if cfg.tracking.enabled:  # before the JSON: a failed tracking leaves the previous suite.json in place
        tags = {"datasets": ",".join(doc["datasets"])}
        with track.tracking_errors(cfg, Path(cfg.suite.output).name), track.start_run(cfg, "suite", tags=tags):
            track.log_metrics({**flat_metrics(doc), **{f"timing/{k}_s": v for k, v in timings.items()}})
            track.log_json(doc, "suite.json")
            track.log_figures(figs)
    out = files.write_json(doc, cfg.suite.output)
    log.info(
        "suite written to %s; %d figures under %s; timings %s",
        out,
        len(figs),
        cfg.suite.figures_dir,
        {k: round(v, 1) for k, v in timings.items()},
    )


if __name__ == "__main__":
    main()
