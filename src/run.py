"""Hydra entry point: ``python -m src.run [verdicts=PATH] [roster=…] [dataset=…] [frame=…] [stacker=…]``.

Composes roster × dataset × frame × stacker, gets a verdict table (a bring-your-own file, or the roster's
verdict cache), runs the ladder of Table 1 on every dataset, writes ``results.json``, logs the run to MLflow
and returns the mean stacked κ (the metric Hydra sweepers optimise).
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from . import ladder, verdicts
from .fsutil import atomic_write_text, to_json

log = logging.getLogger("raim")
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def dataset_names(cfg: DictConfig) -> list[str]:
    """The datasets selected by the ``dataset`` group (``all`` lists several)."""
    return list(cfg.dataset.datasets) if cfg.dataset.name == "all" else [cfg.dataset.name]


def group_option(group: str, name: str) -> DictConfig:
    """Load one option of a config group by name (e.g. a dataset's frame when ``frame=auto``)."""
    path = CONF_DIR / group / f"{name}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no config {group}/{name}.yaml under {CONF_DIR}")
    return OmegaConf.load(path)


def frame_for(cfg: DictConfig, dataset: str) -> DictConfig:
    """``frame=auto`` gives each dataset its own frame (§2); any other choice forces one frame everywhere."""
    if cfg.frame.name != "auto":
        return cfg.frame
    return group_option("frame", group_option("dataset", dataset).frame)


def frontier_name(cfg: DictConfig) -> str | None:
    if cfg.get("frontier"):
        return cfg.frontier
    front = cfg.roster.get("frontier") if "roster" in cfg else None
    return front.name if front else None


def load_table(cfg: DictConfig) -> verdicts.VerdictTable:
    """A bring-your-own verdict table when ``verdicts`` is set, else the roster's verdicts from the cache."""
    if cfg.verdicts:
        table = verdicts.load(cfg.verdicts, frontier=frontier_name(cfg) or "frontier")
        if cfg.dataset.name != "all":
            keep = table.items["dataset"].to_numpy() == cfg.dataset.name
            if not keep.any():
                raise verdicts.VerdictError(f"{cfg.verdicts}: no rows with dataset == {cfg.dataset.name!r}")
            table = table.subset(keep)
        return table
    return cached_table(cfg)


def cached_table(cfg: DictConfig) -> verdicts.VerdictTable:
    """Verdicts of the configured roster on the selected datasets, from the verdict cache."""
    import pandas as pd

    from .data import read_items
    from .judges.runner import cluster_subsample, verdict_table

    frames = []
    for name in dataset_names(cfg):
        items = read_items(Path(cfg.paths.datasets_dir) / f"{name}.jsonl")
        if cfg.judge.per_dataset:  # the same whole-cluster subsample as `python -m src.judges --per-dataset`
            items = cluster_subsample(items, int(cfg.judge.per_dataset), seed=0)
        frame = frame_for(cfg, name)
        frames.append(verdict_table(cfg.roster, items.assign(frame=frame.name), frame, Path(cfg.paths.cache_dir),
                                    compute=cfg.judge.compute, progress=False))
    members = [m.name for m in cfg.roster.members]
    source = f"cache {cfg.paths.cache_dir} (roster {cfg.roster.name})"
    return verdicts.validate(pd.concat(frames, ignore_index=True), source=source,
                             frontier=frontier_name(cfg), members=members)


def write_json(doc: dict, path: str | Path) -> Path:
    """Write atomically (temp file then rename), so a crash never leaves a truncated results.json."""
    return atomic_write_text(path, to_json(doc))


def analyse(cfg: DictConfig) -> tuple[verdicts.VerdictTable, dict, dict]:
    """Pure part of the entry: config in, (table, fitted results, results document) out."""
    settings = instantiate(cfg.analysis, _convert_="all")
    stacker = instantiate(cfg.stacker, _convert_="all")
    table = load_table(cfg)
    results = ladder.analyze(table, stacker, settings)
    meta = {"verdicts": table.source, "members": table.members, "frontier": table.frontier_name,
            "roster": cfg.roster.name if cfg.get("roster") else None,
            "stacker": OmegaConf.to_container(cfg.stacker), "frame": cfg.frame.name}
    return table, results, ladder.to_json(results, settings, meta)


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    table, results, doc = analyse(cfg)
    out = write_json(doc, cfg.output)
    if cfg.get("metrics") or cfg.get("betas"):  # DVC stage files (dvc.yaml: +metrics=… +betas=…)
        from .track import write_stage_files

        write_stage_files(doc, cfg.get("metrics"), cfg.get("betas"))
    for name, r in results.items():
        s = r.summary
        log.info("%s: n=%d stacked κ=%.3f best_cv κ=%.3f (%s) admissible=%s", name, s["n"],
                 s["comparators"]["stacked"]["kappa"]["estimate"], s["comparators"]["best_cv"]["kappa"]["estimate"],
                 s["deltas"]["best_cv"]["kappa"]["call"], s["admissibility"]["admissible"])
        for m, v in s["members"].items():
            log.info("  %-14s κ=%.3f bacc=%.3f coverage=%.3f", m, v["kappa"], v["bacc"], v["coverage"])
    log.info("results written to %s", out)
    if cfg.tracking.enabled:
        from . import track

        track.log_analysis(cfg, table, results, doc)
    return float(np.mean([r.summary["comparators"]["stacked"]["kappa"]["estimate"] for r in results.values()]))


if __name__ == "__main__":
    main()
