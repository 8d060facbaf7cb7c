"""The paper's analysis suite (§3.1–§3.3, Appendices C, E, H) on any verdict table: :func:`run_suite` → the
suite.json document.

Per dataset: the pairwise φ matrix (Fig. 4), regime-call recovery from a label budget (Table 6), the
stacker's learning curve (Table 7, Fig. 6b), stacked κ against panel size (Fig. 6a), leave-one-member-out Δκ
(Fig. 5), the label-free rungs against the CV-best single (Table 17) and the (sub-)panel outcomes of
Appendix C. Across datasets: leave-one-dataset-out transfer
(Fig. 8), the item-level mechanism test (Table 4), the cross-dataset predictor (Table 5), the admissibility
threshold grid, Fig. 3a's invariance region, and the cost model (Table 2, Appendix H).

``python -m src.analyses`` runs it on the table of ``src.judges.tables.load_table(cfg)``, writes suite.json and the
figures (:mod:`src.present.figures`) and logs them to MLflow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import numpy as np
from threadpoolctl import threadpool_limits

from src.core.aggregate import StackedLogit
from src.core.ladder import dataset_threads
from src.core.ladderbase import LadderSettings
from src.core.threads import in_order
from src.core.verdicts import VerdictTable
from src.io.files import jsonable
from src.io.suite_settings import SuiteSettings, as_dict, suite_settings
from src.studies.suite import budget, cascade, common, cost, mechanism, panel
from src.studies.suite.reference import Reference, references, rng_for

log = logging.getLogger("raim.suite")


def _timed(timings: dict, key: str):
    class _T:
        def __enter__(self):
            self.t = time.perf_counter()

        def __exit__(self, *exc):
            timings[key] = timings.get(key, 0.0) + time.perf_counter() - self.t

    return _T()


def run_suite(
    table: VerdictTable,
    stacker: StackedLogit,
    s: LadderSettings,
    cfg: SuiteSettings | Mapping,
    measured: Mapping | None = None,
    folds: Mapping[str, list] | None = None,
    flags: Mapping[str, bool] | None = None,
) -> dict:
    """Every analysis of the suite; ``cfg``: the suite's settings (:class:`SuiteSettings`, or the ``suite``
    config node / a mapping, checked into one); ``folds``: each dataset's cluster folds when the caller has them
    (:func:`src.core.ladder.dataset_folds`); ``flags``: {item_id: flagged as a prompt injection}, which the
    cascade escalates (:func:`src.studies.suite.cascade.item_flags`). BLAS runs on one thread (small products; threads contending for
    shared cores multiply the time)."""

    cfg = suite_settings(cfg)
    with threadpool_limits(1):
        return _run_suite(table, stacker, s, cfg, measured, folds, flags)


def bootstrap_lengths(cfg: SuiteSettings | Mapping, s: LadderSettings) -> dict[int, int]:
    """Per seed, the most paired-bootstrap draws any analysis of the suite takes (each dataset's bootstrap is
    drawn once at that length; shorter ones are its first draws)."""
    cfg = suite_settings(cfg)
    seed = cfg.seed
    out = {seed: max(cfg.panel.n_boot, cfg.mechanism.subpanel_boot)}
    out[s.seed] = max(out.get(s.seed, 0), s.n_boot)
    return out


def _run_suite(table, stacker, s, cfg: SuiteSettings, measured, folds, flags=None) -> dict:
    seed = cfg.seed
    tm: dict[str, float] = {}
    with _timed(tm, "references"):
        refs = references(table, stacker, s, None if folds is None else dict(folds))
        for ref in refs.values():
            for sd, n_boot in bootstrap_lengths(cfg, s).items():
                ref.bootstrap(n_boot, sd)
    b, p, m = cfg.budget, cfg.panel, cfg.mechanism
    per: dict[str, dict] = {}
    sps: dict[str, dict] = {}
    K = len(table.members)
    subsets = mechanism.draw_subpanels(K, m.subpanels, m.subpanel_min_size, rng_for(seed, "subpanels"))
    outer, _ = dataset_threads(table, s.n_boot)  # small datasets side by side (each one's parts are independent)
    jobs = ((name, ref, cfg, s, subsets) for name, ref in refs.items())
    for name, (row, sps[name], took) in in_order(_per_dataset, jobs, outer):
        per[name] = row
        for key, seconds in took.items():
            tm[key] = tm.get(key, 0.0) + seconds
    wanted = list(p.transfer or s.core or [])
    core = [n for n in wanted if n in refs] or list(refs)  # as the ladder's Holm family: all when none is present
    with _timed(tm, "transfer"):
        transfer = panel.transfer(refs, stacker, s, core, p.n_boot, seed)
    with _timed(tm, "mechanism"):
        rec = mechanism.recovery(refs)
        cross = mechanism.cross_dataset(refs, s.kappa0, list(m.held_back))
    with _timed(tm, "threshold_grid"):
        grid = mechanism.threshold_grid(sps, as_dict(m.grid), m.near_frontier, (s.kappa0, s.c, s.phi0))
        inv = mechanism.invariance(refs, s.kappa0, s.c, s.phi0)
    lpr = {n: len(r.table.items) / len(np.unique(r.table.clusters)) for n, r in refs.items()}
    with _timed(tm, "cost"):
        costs = {
            "paper": cost.paper(cfg.cost),
            "panel": cost.compute(cfg.cost, table.members, lpr, measured, table.frontier_name),
        }
    doc = {
        "settings": {"suite": as_dict(cfg), "analysis": dict(s.__dict__)},
        "members": table.members,
        "frontier": table.frontier_name,
        "datasets": per,
        "regime_summary": budget.summarise_regime({n: r["regime"] for n, r in per.items()}, list(b.budgets)),
        "transfer": transfer,
        "recovery": rec,
        "cross_dataset": cross,
        "appendix_c": {**grid, "invariance": inv, "subpanels": _subpanel_rows(sps, table.members, subsets)},
        "cost": costs,
        "timings": tm,
    }
    with _timed(tm, "cascade"):
        doc["cascade"] = cascade.run(refs, table, stacker, s, cfg.cascade, costs["panel"], seed, flags)
    return jsonable(doc)


def _per_dataset(job: tuple) -> tuple[str, tuple[dict, dict, dict]]:
    """One dataset's rows of the suite: (name, (its row of ``datasets``, its sub-panel outcomes, each part's
    seconds)); its random draws from generators of its own (:func:`rng_for`), whichever thread computes it."""
    name, ref, cfg, s, subsets = job
    b, p, m, seed = cfg.budget, cfg.panel, cfg.mechanism, cfg.seed
    tm: dict[str, float] = {}
    log.info("suite: %s", name)
    row = {
        "members": ref.table.members,
        "member_kappa": ref.member_kappa,
        "phi": np.where(np.isnan(ref.phi), None, ref.phi).tolist(),
        "admissibility": ref.admissibility.as_dict(),
    }
    with _timed(tm, "regime_recovery"):
        row["regime"] = budget.regime_recovery(
            ref, list(b.budgets), b.draws, rng_for(seed, "regime", name), s.kappa0, s.c, s.phi0
        )
    with _timed(tm, "learning_curve"):
        row["curve"] = budget.learning_curve(ref, list(b.curve_budgets), b.curve_draws, rng_for(seed, "curve", name))
    with _timed(tm, "size_curve"):
        row["size"] = panel.size_curve(ref)
    with _timed(tm, "leave_one_out"):
        row["leave_one_out"] = panel.leave_one_out(ref, p.n_boot, seed, s.level)
    with _timed(tm, "label_free"):
        row["label_free"] = panel.label_free(ref, s.n_boot, s.seed, s.level)
    with _timed(tm, "subpanels"):
        sp = mechanism.subpanels(ref, subsets, m.subpanel_boot, seed, s.level, s.min_coverage)
    return name, (row, sp, tm)


def _subpanel_rows(sps: dict, members: list[str], subsets: np.ndarray) -> dict:
    """Compact per-(sub-)panel outcomes (members as a bit string in roster order)."""
    codes = ["".join("1" if x else "0" for x in row) for row in subsets]
    return {
        "members": members,
        "panels": codes,
        "datasets": {
            n: {
                "phi_bar": sp["phi_bar"],
                "stacked": sp["stacked"],
                "best_cv": sp["best_cv"],
                "delta_lo": sp["delta_ci"][:, 0],
                "frontier": sp["frontier"],
            }
            for n, sp in sps.items()
        },
    }


__all__ = ["run_suite", "SuiteSettings", "Reference", "references", "budget", "panel", "mechanism", "cost", "common"]
