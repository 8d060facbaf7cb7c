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
import numpy as np
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from src.core import ladder
from src.core import verdicts
from src.core.errors import RaimError, one_line
from src.io.files import atomic_write_text, to_json

log = logging.getLogger("raim")


def dataset_names(cfg: DictConfig) -> list[str]:
    """The datasets selected by the ``dataset`` group: a list option (``all``: ``datasets`` maps each name to
    its raw folder) or one dataset's own spec."""
    return list(cfg.dataset.datasets) if "datasets" in cfg.dataset else [cfg.dataset.name]


def frame_for(cfg: DictConfig, dataset: str) -> DictConfig:
    """``frame=auto`` gives each dataset its own frame (§2); any other choice forces one frame everywhere.
    A single selected dataset's spec is the composed ``dataset`` node (so a spec found on Hydra's search path
    works); a listed one is read from conf/dataset (:func:`src.io.datasets.dataset_spec`)."""
    if cfg.frame.name != "auto":
        return cfg.frame
    from src.io.datasets import dataset_spec

    spec = cfg.dataset if cfg.dataset.get("name") == dataset and "frame" in cfg.dataset else dataset_spec(dataset)
    from src.mlops.tracking import group_option

    return group_option("frame", spec["frame"])


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


MISSING_POLICIES = ("error", "judged_only", "skip")


class MissingVerdicts(RaimError):
    """Items of the analysis without a cached verdict: not abstentions, not analysed silently."""


def judge_command(cfg: DictConfig, datasets: list[str], members: list[str]) -> str:
    """The ``python -m src.judges`` command that computes the missing verdicts (``--members`` only for a subset)."""
    from src.judges.runner import compute_command

    subset = members if set(members) != {m.name for m in cfg.roster.members} else None
    return compute_command(cfg.roster.name, datasets, cfg.judge.per_dataset, subset)


def judged_items(report: dict, cached: dict[str, tuple]) -> tuple[np.ndarray, dict[str, int]]:
    """Which items every judge has a record for (an abstention is a record; a missing one is not), and the
    missing count per judge. A frontier judge with no cached verdict at all is simply absent (a paid comparator,
    computed on request), not missing."""
    missing = {j: r["uncached"] for j, r in report.items()
               if r["uncached"] and not (r.get("frontier") and r["cached"] == 0)}
    n = len(next(iter(cached.values()))) if cached else 0
    keep = np.logical_and.reduce([np.asarray(cached[j], bool) for j in missing]) if missing else np.ones(n, bool)
    return keep, missing


def _per_judge(missing: dict[str, int]) -> str:
    return ", ".join(f"{j} {c}" for j, c in missing.items())


def _gap_text(gaps: dict[str, tuple[int, int, dict]]) -> str:
    return "; ".join(f"{d}: {k} of {n} items (missing per judge: {_per_judge(m)})" for d, (k, n, m) in gaps.items())


def _gap_command(cfg: DictConfig, gaps: dict[str, tuple[int, int, dict]]) -> str:
    return judge_command(cfg, list(gaps), list(dict.fromkeys(j for _, _, m in gaps.values() for j in m)))


def refuse_missing(cfg: DictConfig, gaps: dict[str, tuple[int, int, dict]], policy: str) -> None:
    """One line naming, per dataset, how many items lack a verdict (from whom), and the command that computes
    them."""
    tail = "" if policy != "error" else (", or analyse only the judged items with judge.missing=judged_only "
                                         "(or leave these datasets out with judge.missing=skip)")
    raise MissingVerdicts(f"items without a cached verdict under {cfg.paths.cache_dir}: {_gap_text(gaps)}; compute "
                          f"them with `{_gap_command(cfg, gaps)}`{tail}")


def skipped_datasets(cfg: DictConfig, gaps: dict[str, tuple[int, int, dict]]) -> dict[str, dict]:
    """``judge.missing=skip``: each dataset with items lacking a verdict is left out whole (logged, and listed in
    results.json and the report with the command that computes its verdicts)."""
    out = {}
    for d, gap in gaps.items():
        out[d] = {"reason": f"{_gap_text({d: gap})}", "command": _gap_command(cfg, {d: gap})}
        log.warning("%s: left out (judge.missing=skip): %s; compute them with `%s`", d, out[d]["reason"],
                    out[d]["command"])
    return out


def cached_table(cfg: DictConfig) -> verdicts.VerdictTable:
    """Verdicts of the configured roster on the selected datasets, from the verdict cache.

    Items without a cached verdict are not abstentions: ``judge.missing=error`` (default) stops, naming how many
    per dataset and judge and the command that computes them; ``judge.missing=judged_only`` analyses the items
    every judge has judged and logs (and records in the table's provenance) how many were left out;
    ``judge.missing=skip`` leaves such a dataset out whole (the DVC pipeline's choice: one dataset not yet judged
    does not stop the others). Bad cache lines are logged by file and line (:mod:`src.judges.cache`) and
    counted."""
    import pandas as pd

    from src.io.datasets import read_items
    from src.judges.ray_engine import engine_from_cfg
    from src.judges.runner import NothingCached, cluster_subsample, member_names, verdict_table

    policy = cfg.judge.get("missing", "error")
    if policy not in MISSING_POLICIES:
        raise RaimError(f"judge.missing={policy!r}: must be one of {list(MISSING_POLICIES)}")
    engine = engine_from_cfg(cfg.judge) if cfg.judge.compute else None  # judge.engine=ray: misses on Ray
    frames, cache, gaps = {}, {}, {}
    for name in dataset_names(cfg):
        items = read_items(Path(cfg.paths.datasets_dir) / f"{name}.jsonl")
        if cfg.judge.per_dataset:  # the same whole-cluster subsample as `python -m src.judges --per-dataset`
            items = cluster_subsample(items, int(cfg.judge.per_dataset), seed=0)
        frame = frame_for(cfg, name)
        try:
            t = verdict_table(cfg.roster, items.assign(frame=frame.name), frame, Path(cfg.paths.cache_dir),
                              compute=cfg.judge.compute, progress=bool(cfg.judge.compute), engine=engine)
        except NothingCached:  # a dataset not judged yet: every item lacks every member's verdict
            gaps[name], frames[name] = (len(items), len(items), {m: len(items) for m in member_names(cfg.roster)}), None
            continue
        report, cached = t.attrs["report"], t.attrs.pop("cached")
        cache[name] = {j: {"items": r["items"], "cached": r["cached"], "abstained": r["abstained"],
                           "path": r["cache"]["path"], "bad_lines": r["cache"]["bad_lines"],
                           "torn_tail_bytes": r["cache"]["torn_tail_bytes"], "problems": r["problems"]}
                       for j, r in report.items()}
        keep, missing = judged_items(report, cached)
        if missing:
            gaps[name] = (int((~keep).sum()), len(t), missing)
            if policy == "judged_only" and keep.any():
                log.warning("%s: judge.missing=judged_only: analysing the %d of %d items judged by every member "
                            "(%d without a verdict: %s)", name, int(keep.sum()), len(t), int((~keep).sum()),
                            _per_judge(missing))
                t = t.loc[keep].reset_index(drop=True)
        frames[name] = t
    skipped = skipped_datasets(cfg, gaps) if policy == "skip" else {}
    if skipped and len(skipped) == len(frames):
        refuse_missing(cfg, gaps, policy)
    empty = {d: g for d, g in gaps.items() if g[0] == g[1]}
    if gaps and (policy == "error" or (policy == "judged_only" and empty)):
        refuse_missing(cfg, gaps if policy == "error" else empty, policy)
    members = [m.name for m in cfg.roster.members]
    source = f"cache {cfg.paths.cache_dir} (roster {cfg.roster.name})"
    kept = [t for d, t in frames.items() if d not in skipped]
    table = verdicts.validate(pd.concat(kept, ignore_index=True), source=source, frontier=frontier_name(cfg),
                              members=members)
    # each dataset read a judge's whole cache file: one count per file (bad lines, and a torn tail as one)
    bad = {r["path"]: r["bad_lines"] + bool(r["torn_tail_bytes"]) for d in cache.values() for r in d.values()}
    bad = {f: n for f, n in bad.items() if n}
    dropped = {d: {"items": n, "judged": n - k, "dropped": k, "missing_per_judge": m}
               for d, (k, n, m) in gaps.items() if d not in skipped}
    table.provenance = {"cache": cache, "judged_only": dropped, "skipped": skipped,
                        "bad_cache_lines": sum(bad.values()), "bad_cache_files": sorted(bad)}
    return table


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
            "roster": cfg.roster.name if cfg.get("roster") and not cfg.verdicts else None,
            "stacker": OmegaConf.to_container(cfg.stacker), "frame": cfg.frame.name}
    doc = ladder.to_json(results, settings, meta)
    if table.provenance.get("skipped"):
        doc["skipped"] = table.provenance["skipped"]
    return table, results, doc


def log_members(results: dict) -> None:
    """Each dataset's per-member κ / bacc / coverage, and any member set aside, in the run's log."""
    for name, r in results.items():
        s = r.summary
        log.info("%s: n=%d; members set aside (no verdict): %s; not eligible as single judge: %s", name, s["n"],
                 s["excluded_members"] or "none", s["selected"]["ineligible"] or "none")
        for m, v in s["members"].items():
            log.info("  %-14s κ=%.3f bacc=%.3f coverage=%.3f", m, v["kappa"], v["bacc"], v["coverage"])


def summary_lines(doc: dict) -> list[str]:
    """One line per dataset: the stacker against the CV-best single judge, the call, the admissibility verdict
    (§2, §3.3), and what to deploy there (:mod:`src.decide`)."""
    out = []
    for name, s in doc["datasets"].items():
        st, cv = (s["comparators"][c]["kappa"]["estimate"] for c in ("stacked", "best_cv"))
        d = s["deltas"]["best_cv"]["kappa"]
        adm = s["admissibility"]
        verdict = "admissible" if adm["admissible"] else f"not admissible ({adm['reason']})"
        out.append(f"{name}: stacked κ {st:.3f} vs CV-best single {cv:.3f}, Δκ {d['estimate']:+.3f} "
                   f"[{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]: {d['call']}; {verdict} → {s['decision']['label']}")
    return out


RESULTS_FILE, RUN_ID_FILE = "results.json", "mlflow_run_id"  # in the run's own folder, side by side


def output_paths(cfg: DictConfig) -> list[Path]:
    """Where this run writes results.json: its own Hydra folder (each sweep job its own), and the pipeline's
    ``output`` (results/results.json, a DVC output) only when a single run names ``output=`` on its command line,
    as the DVC stage does. So ad-hoc runs and sweeps never overwrite the tracked file. The run's own folder comes
    last."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return [Path(cfg.output)]
    hc = HydraConfig.get()
    own = Path(hc.runtime.output_dir) / RESULTS_FILE
    named = any(o.split("=", 1)[0].lstrip("+~") == "output" for o in hc.overrides.task)
    if named and hc.mode == RunMode.MULTIRUN:
        log.info("output=%s is not used in a sweep: each job writes %s", cfg.output, own.name)
    return [Path(cfg.output), own] if named and hc.mode != RunMode.MULTIRUN and Path(cfg.output) != own else [own]


def check_output(path: str | Path) -> None:
    """Fail before any work when results.json could not be written (a directory, an uncreatable folder)."""
    p = Path(path)
    if p.is_dir():
        raise RaimError(f"output={path}: is a directory (give a file path, e.g. {p / 'results.json'})")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RaimError(f"output={path}: cannot create {p.parent} ({e.strerror})") from None


def skipped_lines(doc: dict) -> list[str]:
    return [f"{d}: left out, {v['reason']}; compute with `{v['command']}`" for d, v in doc.get("skipped", {}).items()]


@hydra.main(version_base=None, config_path="../conf", config_name="config")
@one_line
def main(cfg: DictConfig) -> float:
    outputs = output_paths(cfg)
    for path in outputs:
        check_output(path)
    table, results, doc = analyse(cfg)
    log_members(results)
    bad = table.provenance.get("bad_cache_lines", 0)
    if bad:
        log.warning("%d bad verdict-cache line(s) in %s: none was read as a verdict (see the lines above)", bad,
                    ", ".join(table.provenance["bad_cache_files"]))
    run_id = None
    if cfg.tracking.enabled:  # before results.json: a failed tracking leaves the previous results in place
        from src.mlops import tracking as track

        run_id = track.log_analysis(cfg, table, results, doc)
    for path in outputs:  # results.json depends on the inputs only (a DVC output): the run id goes beside it
        write_json(doc, path)
    if run_id:
        atomic_write_text(outputs[-1].parent / RUN_ID_FILE, run_id + "\n")
    if cfg.get("metrics") or cfg.get("betas"):  # DVC stage files (dvc.yaml: +metrics=… +betas=…)
        from src.mlops.tracking import write_stage_files

        write_stage_files(doc, cfg.get("metrics"), cfg.get("betas"))
    print("\n".join(["", "RAIM summary", *summary_lines(doc), *skipped_lines(doc),
                      f"results: {', '.join(map(str, outputs))}"]))
    if run_id:
        from src.mlops.tracking import ui_command

        print(f"MLflow run {run_id}; compare runs with: {ui_command(cfg)}")
    return float(np.mean([r.summary["comparators"]["stacked"]["kappa"]["estimate"] for r in results.values()]))


class SweepSummary(Callback):
    """At the end of a ``-m`` sweep, one compact table of its jobs: the swept overrides, then per dataset the
    stacked κ, its paired call against the CV-best single judge (§2), the admissibility verdict (§3.3), the
    decision (:mod:`src.decide`) and the MLflow run; printed and written as ``sweep_summary.csv`` in the sweep
    folder."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.rows: list[dict] = []

    def on_job_end(self, config: DictConfig, job_return, **kwargs) -> None:
        if hasattr(self, "rows"):  # a sweep's job (a single run has no table to add to)
            self.rows += sweep_rows(job_return)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        import pandas as pd

        rows = getattr(self, "rows", [])
        if not rows:
            return
        shared = set.intersection(*(set(r["job"]) for r in rows))  # the sweep's fixed overrides: said once
        df = pd.DataFrame([{**r, "job": " ".join(o for o in r["job"] if o not in shared) or "(defaults)"}
                           for r in rows])
        atomic_write_text(Path(config.hydra.sweep.dir) / "sweep_summary.csv", df.to_csv(index=False))
        print("\nRAIM sweep summary\n" + df.to_string(index=False, na_rep="-", float_format="{:.3f}".format))


def sweep_rows(job_return) -> list[dict]:
    """One row per dataset of a finished sweep job, read back from the job's results.json."""
    from hydra.core.utils import JobStatus

    job = list(job_return.overrides)
    path = Path(job_return.hydra_cfg.hydra.runtime.output_dir) / RESULTS_FILE
    if job_return.status != JobStatus.COMPLETED or not path.exists():
        err = job_return._return_value if job_return.status == JobStatus.FAILED else "no results.json"
        return [{"job": job, "dataset": "-", "stacked_kappa": None, "call_vs_cv_best": f"failed: {err}"[:80],
                 "admissible": None, "decision": None, "run_id": None}]
    doc = json.loads(path.read_text())
    run_id = path.with_name(RUN_ID_FILE).read_text().strip() if path.with_name(RUN_ID_FILE).exists() else None
    return [{"job": job, "dataset": name, "stacked_kappa": s["comparators"]["stacked"]["kappa"]["estimate"],
             "call_vs_cv_best": s["deltas"]["best_cv"]["kappa"]["call"],
             "admissible": s["admissibility"]["admissible"], "decision": s["decision"]["label"],
             "run_id": run_id}
            for name, s in doc["datasets"].items()]


if __name__ == "__main__":
    main()
