"""``python -m src.prevalence [overrides]``: the prior-shift study (:mod:`src.studies.prevalence`) on the
configured verdicts → ``prevalence.output`` (JSON), ``prevalence.figure`` (PNG) and an MLflow run of kind
``prevalence``."""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from src.core.errors import one_line
from src.io.paths import CONF_DIR
from src.io.trust import checked_command
from src.mlops import tracking
from src.present import figures
from src.studies import prevalence
from src.studies.checked import check_config

log = logging.getLogger("raim.prevalence")


@checked_command
@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
@one_line
def main(cfg: DictConfig) -> None:
    settings = check_config(cfg)  # the one checked path: every group, before any work
    doc, out, fig = tracking.run_study(
        settings,
        "prevalence",
        prevalence.compute,
        settings.prevalence.output,
        settings.prevalence.figure,
        figures.prevalence_figure,
        prevalence.flat_metrics,
        tags=lambda d: {"datasets": ",".join(d["datasets"])},
    )
    for line in prevalence.statements(doc):
        log.info("%s", line)
    log.info("prevalence study written to %s; figure %s", out, fig)


if __name__ == "__main__":
    main()
