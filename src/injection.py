"""``python -m src.injection [overrides]``: the injection study (:mod:`src.studies.injection`) on the configured
roster → ``injection.output`` (JSON), ``injection.figure`` (PNG) and an MLflow run of kind ``injection``.
``injection.compute=true injection.budget_s=280`` first judges the missing verdicts for at most that long
(resumable: every verdict is cached as it comes)."""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from src.core.errors import one_line
from src.io.paths import CONF_DIR
from src.io.trust import checked_command
from src.mlops import tracking
from src.present import injection as present
from src.studies import injection
from src.studies.checked import check_config

log = logging.getLogger("raim.injection")


@checked_command
@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
@one_line
def main(cfg: DictConfig) -> None:
    settings = check_config(cfg)  # the one checked path: every group, before any work
    doc, out, fig = tracking.run_study(
        settings,
        "injection",
        injection.compute,
        settings.injection.output,
        settings.injection.figure,
        present.injection_figure,
        injection.flat_metrics,
        tags=lambda d: {"datasets": ",".join(d["datasets"]), "complete": str(d["complete"]).lower()},
    )
    for line in injection.statements(doc):
        log.info("%s", line)
    log.info("injection study written to %s; figure %s", out, fig)


if __name__ == "__main__":
    main()
