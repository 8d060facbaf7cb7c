"""``python -m src.monitor [overrides]``: live admissibility monitoring (:mod:`src.studies.monitor`) on a served
model's vote store (``monitor.source=store``) or a replayed simulated stream → ``monitor.output`` (JSON),
``monitor.figure`` (PNG) and an MLflow run of kind ``monitor`` with the windows as step metrics."""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from src.core.errors import one_line
from src.io.paths import CONF_DIR
from src.io.trust import checked_command
from src.mlops import tracking
from src.present import figures
from src.studies import monitor
from src.studies.checked import check_config

log = logging.getLogger("raim.monitor")


@checked_command
@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
@one_line
def main(cfg: DictConfig) -> None:
    settings = check_config(cfg)  # the one checked path: every group, before any work
    doc, out, fig = tracking.run_study(
        settings,
        "monitor",
        monitor.compute,
        settings.monitor.output,
        settings.monitor.figure,
        figures.monitor_figure,
        monitor.summary_metrics,
        tags=lambda d: {"source": d["source"]},
        series=monitor.window_series,
    )
    rep = doc.get("replay")
    log.info(
        "monitor written to %s (%d windows; alarms %s%s)",
        out,
        len(doc["windows"]),
        doc["alarms"],
        f"; change at item {doc['stream']['change']}, delay {rep['delay']}" if rep else "",
    )


if __name__ == "__main__":
    main()
