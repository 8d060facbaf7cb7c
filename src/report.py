"""``python -m src.report [overrides]``: the Markdown report (:mod:`src.present.report`) from results.json,
suite.json and the beyond-the-paper studies' documents → ``suite.report``."""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from src.core.errors import one_line
from src.io.paths import CONF_DIR
from src.io.trust import checked_command
from src.present.report import BEYOND, write
from src.studies.checked import check_config

log = logging.getLogger("raim.report")


@checked_command
@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
@one_line
def main(cfg: DictConfig) -> None:
    s = check_config(cfg)  # the one checked path: every group, before any work
    beyond = {name: (getattr(s, name).output, getattr(s, name).figure) for name in BEYOND}
    out = write(
        s.output,
        s.suite.output,
        s.suite.figures_dir,
        s.suite.report,
        redraw=bool(s.top.redraw),
        beyond=beyond,
    )
    log.info("report written to %s", out)


if __name__ == "__main__":
    main()
