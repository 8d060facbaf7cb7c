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

log = logging.getLogger("raim.prevalence")


@checked_command
@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
@one_line
def main(cfg: DictConfig) -> None:
    doc, out, fig = tracking.run_study(
        cfg,
        "prevalence",
        prevalence.compute,
        cfg.prevalence.output,
        cfg.prevalence.figure,
        figures.prevalence_figure,
        prevalence.flat_metrics,
        tags=lambda d: {"datasets": ",".join(d["datasets"])},
    )
    for line in prevalence.statements(doc):
        log.info("%s", line)
    log.info("prevalence study written to %s; figure %s", out, fig)


if __name__ == "__main__":
    main()
