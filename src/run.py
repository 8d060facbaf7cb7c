"""Hydra entry point: ``python -m src.run [verdicts=PATH] [roster=…] [dataset=…] [frame=…] [stacker=…]``.

Composes roster × dataset × frame × stacker, gets a verdict table (a bring-your-own file, or the roster's
verdict cache), runs the ladder of Table 1 on every dataset, writes ``results.json``, logs the run to MLflow
and returns the mean stacked κ (the metric Hydra sweepers optimise).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from src.core.errors import one_line
from src.io.files import atomic_write_text, check_not_an_input, check_output, write_json
from src.io.paths import CONF_DIR
from src.io.trust import checked_command
from src.mlops.background import TrackingWorker
from src.mlops.redact import scrub
from src.mlops.store import ui_command
from src.present.stagefiles import write_stage_files
from src.present.summary import skipped_lines, summary_lines

log = logging.getLogger("raim")


def log_members(results: dict) -> None:
    """Each dataset's per-member κ / bacc / coverage, and any member set aside, in the run's log."""
    for name, r in results.items():
        s = r.summary
        log.info(
            "%s: n=%d; members set aside (no verdict): %s; not eligible as single judge: %s",
            name,
            s["n"],
            s["excluded_members"] or "none",
            s["selected"]["ineligible"] or "none",
        )
        for m, v in s["members"].items():
            log.info("  %-14s κ=%.3f bacc=%.3f coverage=%.3f", m, v["kappa"], v["bacc"], v["coverage"])


RESULTS_FILE, RUN_ID_FILE = "results.json", "mlflow_run_id"  # in the run's own folder, side by side


def output_paths(output: str) -> list[Path]:
    """Where this run writes results.json: its own Hydra folder (each sweep job its own), and the pipeline's
    ``output`` (results/results.json, a DVC output) only when a single run names ``output=`` on its command line,
    as the DVC stage does. So ad-hoc runs and sweeps never overwrite the tracked file. The run's own folder comes
    last."""

    if not HydraConfig.initialized():
        return [Path(output)]
    hc = HydraConfig.get()
    own = Path(hc.runtime.output_dir) / RESULTS_FILE
    named = any(o.split("=", 1)[0].lstrip("+~") == "output" for o in hc.overrides.task)
    if named and hc.mode == RunMode.MULTIRUN:
        log.info("output=%s is not used in a sweep: each job writes %s", output, own.name)
    return [Path(output), own] if named and hc.mode != RunMode.MULTIRUN and Path(output) != own else [own]


@checked_command
@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
@one_line
def main(cfg: DictConfig) -> float:
    outputs = output_paths(cfg.output)
    for path in outputs:
        check_output(path)
        check_not_an_input("output=", path, {"verdict table": cfg.verdicts}, "results.json")
    from src.studies.checked import check_config  # imported here, not at start-up: scikit-learn, SciPy, pandas ~1.5 s
    from src.studies.stacking import analyse  # imported here, not at start-up: scikit-learn, SciPy, pandas ~1.5 s

    settings = check_config(cfg)  # the one checked path: every group, before any work

    # a tracked run loads MLflow in a worker forked beside the analysis (src.mlops.background), which then logs it;
    # forked once the analysis's libraries are loaded, it inherits them instead of importing them a second time
    worker = TrackingWorker.start(settings) if settings.tracking.enabled else None
    try:
        table, results, doc = analyse(settings)
    except BaseException:
        if worker is not None:
            worker.cancel()
        raise
    log_members(results)
    bad = table.provenance.get("bad_cache_lines", 0)
    if bad:
        log.warning(
            "%d bad verdict-cache line(s) in %s: none was read as a verdict (see the lines above)",
            bad,
            ", ".join(table.provenance["bad_cache_files"]),
        )
    run_id = None
    if settings.tracking.enabled:  # before results.json: a failed tracking leaves the previous results in place
        if worker is not None:
            run_id = worker.log(table, results, doc)
        else:  # no os.fork here: logged in this process
            from src.mlops import tracking as track  # imported here, not at start-up: only a tracked run needs it

            run_id = track.log_analysis(settings, table, results, doc)
    for path in outputs:  # results.json depends on the inputs only (a DVC output): the run id goes beside it
        write_json(doc, path)
    if run_id:
        atomic_write_text(outputs[-1].parent / RUN_ID_FILE, run_id + "\n")
    if settings.top.metrics or settings.top.betas:  # DVC stage files (dvc.yaml: +metrics=… +betas=…)
        write_stage_files(doc, settings.top.metrics, settings.top.betas)
    print(
        "\n".join(
            ["", "RAIM summary", *summary_lines(doc), *skipped_lines(doc), f"results: {', '.join(map(str, outputs))}"]
        )
    )
    if run_id:
        print(f"MLflow run {run_id}; compare runs with: {ui_command(settings.tracking)}")
    import numpy as np  # imported here, not at start-up: numpy ~0.2 s (the analysis above has loaded it)

    return float(np.mean([r.summary["comparators"]["stacked"]["kappa"]["estimate"] for r in results.values()]))


class SweepSummary(Callback):
    """At the end of a ``-m`` sweep, one compact table of its jobs: the swept overrides, then per dataset the
    stacked κ, its paired call against the CV-best single judge (§2), the admissibility verdict (§3.3), the
    decision (:mod:`src.core.decide`) and the MLflow run; printed and written as ``sweep_summary.csv`` in the sweep
    folder, secrets scrubbed (:func:`src.mlops.redact.scrub`: a swept ``+judge.api_key=…`` reads ``…=***``)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.rows: list[dict] = []

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        if hasattr(self, "rows"):  # a sweep's job (a single run has no table to add to)
            self.rows += sweep_rows(job_return)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        import pandas as pd  # imported here, not at start-up: pandas ~0.5 s

        rows = getattr(self, "rows", [])
        if not rows:
            return
        shared = set.intersection(*(set(r["job"]) for r in rows))  # the sweep's fixed overrides: said once
        df = pd.DataFrame(
            scrub([{**r, "job": " ".join(o for o in r["job"] if o not in shared) or "(defaults)"} for r in rows])
        )  # an override's secret never reaches the table
        atomic_write_text(Path(config.hydra.sweep.dir) / "sweep_summary.csv", df.to_csv(index=False))
        print("\nRAIM sweep summary\n" + df.to_string(index=False, na_rep="-", float_format="{:.3f}".format))


def sweep_rows(job_return) -> list[dict]:
    """One row per dataset of a finished sweep job, read back from the job's results.json."""

    job = list(job_return.overrides)
    path = Path(job_return.hydra_cfg.hydra.runtime.output_dir) / RESULTS_FILE
    if job_return.status != JobStatus.COMPLETED or not path.exists():
        err = job_return._return_value if job_return.status == JobStatus.FAILED else "no results.json"
        return [
            {
                "job": job,
                "dataset": "-",
                "stacked_kappa": None,
                "call_vs_cv_best": f"failed: {err}"[:80],
                "admissible": None,
                "decision": None,
                "run_id": None,
            }
        ]
    doc = json.loads(path.read_text())
    run_id = path.with_name(RUN_ID_FILE).read_text().strip() if path.with_name(RUN_ID_FILE).exists() else None
    return [
        {
            "job": job,
            "dataset": name,
            "stacked_kappa": s["comparators"]["stacked"]["kappa"]["estimate"],
            "call_vs_cv_best": s["deltas"]["best_cv"]["kappa"]["call"],
            "admissible": s["admissibility"]["admissible"],
            "decision": s["decision"]["label"],
            "run_id": run_id,
        }
        for name, s in doc["datasets"].items()
    ]


if __name__ == "__main__":
    main()
