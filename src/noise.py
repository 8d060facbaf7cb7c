"""``python -m src.noise [overrides]``: the noisy-calibration-label study (:mod:`src.studies.noise`) →
``noise.output`` (JSON), ``noise.figure`` (PNG), an MLflow run of kind ``noise`` and its summary lines."""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from src.core.errors import one_line
from src.io.paths import CONF_DIR
from src.io.trust import checked_command
from src.mlops import tracking
from src.present import figures
from src.present.noise import noise_section
from src.studies import noise
from src.studies.checked import check_config


@checked_command
@hydra.main(version_base=None, config_path=str(CONF_DIR), config_name="config")
@one_line
def main(cfg: DictConfig) -> None:
    settings = check_config(cfg)  # the one checked path: every group, before any work
    doc, out, fig = tracking.run_study(
        settings,
        "noise",
        noise.compute,
        settings.noise.output,
        Path(settings.noise.figure),
        figures.noise_figure,
        noise.flat_metrics,
        tags=lambda d: {"datasets": ",".join(d["datasets"])},
    )
    print("\n".join(["", *noise_section(doc, brief=True), f"noise study: {out}, figure {fig}"]))


if __name__ == "__main__":
    main()
