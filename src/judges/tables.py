"""The verdict table an analysis reads, as the composed config asks for it: a bring-your-own file
(``verdicts=PATH``), or the roster's verdicts on the selected datasets from the verdict cache — with the policy
for items no judge has scored yet (``judge.missing``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from src.core.errors import RaimError
from src.core.verdicts import VerdictError, VerdictTable, validate
from src.core.verdicts import load as load_verdicts
from src.io.config import freeze, group_option, node_source, plain
from src.io.datasets import check_spec, dataset_spec, read_items
from src.io.paths import dataset_folder
from src.io.settings import Settings
from src.judges.ray_engine import engine_from_cfg
from src.judges.runner import (
    NothingCached,
    cluster_subsample,
    compute_command,
    identity_notes,
    member_names,
    verdict_table,
)

log = logging.getLogger("raim")


def dataset_names(s: Settings) -> list[str]:
    """The datasets selected by the ``dataset`` group: a list option (``all``: ``datasets`` maps each name to
    its raw folder) or one dataset's own spec."""
    return list(s.dataset["datasets"]) if "datasets" in s.dataset else [s.dataset["name"]]


def frame_for(s: Settings, dataset: str) -> Mapping[str, Any]:
    """``frame=auto`` gives each dataset its own frame (§2); any other choice forces one frame everywhere.
    A single selected dataset's spec is the composed ``dataset`` node (so a spec found on Hydra's search path
    works); a listed one is read from conf/dataset (:func:`src.io.datasets.dataset_spec`)."""
    if s.frame["name"] != "auto":
        return s.frame
    if s.dataset.get("name") == dataset and "frame" in s.dataset:  # checked as a spec file is: no interpolation
        spec = check_spec(plain(s.dataset, False), node_source("dataset", s.dataset))
    else:
        spec = dataset_spec(dataset)
    return freeze(plain(group_option("frame", spec["frame"]), True))


def frontier_name(s: Settings) -> str | None:
    """The frontier judge's column: ``frontier``, else the roster's frontier judge, else None."""
    if s.top.frontier:
        return s.top.frontier
    front = s.roster.get("frontier")
    return front["name"] if front else None


def load_table(s: Settings) -> VerdictTable:
    """A bring-your-own verdict table when ``verdicts`` is set, else the roster's verdicts from the cache."""
    if s.verdicts:
        table = load_verdicts(s.verdicts, frontier=frontier_name(s) or "frontier")
        if s.dataset["name"] != "all":
            keep = table.items["dataset"].to_numpy() == s.dataset["name"]
            if not keep.any():
                raise VerdictError(f"{s.verdicts}: no rows with dataset == {s.dataset['name']!r}")
            table = table.subset(keep)
        return table
    return cached_table(s)


MISSING_POLICIES = ("auto", "error", "judged_only", "skip")


class MissingVerdicts(RaimError):
    """Items of the analysis without a cached verdict: not abstentions, not analysed silently."""


def judge_command(s: Settings, datasets: list[str], members: list[str]) -> str:
    """The ``python -m src.judges`` command that computes the missing verdicts (``--members`` only for a subset)."""
    subset = members if set(members) != set(member_names(s.roster)) else None
    return compute_command(s.roster["name"], datasets, s.judge.per_dataset, subset)


def judged_items(report: dict, cached: dict[str, tuple]) -> tuple[np.ndarray, dict[str, int]]:
    """Which items every judge has a record for (an abstention is a record; a missing one is not), and the
    missing count per judge. A frontier judge with no cached verdict at all is simply absent (a paid comparator,
    computed on request), not missing."""
    missing = {
        j: r["uncached"] for j, r in report.items() if r["uncached"] and not (r.get("frontier") and r["cached"] == 0)
    }
    n = len(next(iter(cached.values()))) if cached else 0
    keep = np.logical_and.reduce([np.asarray(cached[j], bool) for j in missing]) if missing else np.ones(n, bool)
    return keep, missing


def _per_judge(missing: dict[str, int]) -> str:
    return ", ".join(f"{j} {c}" for j, c in missing.items())


Notes = dict[str, dict[str, str]]  # dataset → judge → why its verdicts there are not read (runner.identity_notes)


def _gap_text(gaps: dict[str, tuple[int, int, dict]], notes: Notes | None = None) -> str:
    return "; ".join(
        f"{d}: {k} of {n} items (missing per judge: {_per_judge(m)})"
        + "".join(f"; {line}" for line in (notes or {}).get(d, {}).values())
        for d, (k, n, m) in gaps.items()
    )


def gap_notes(s: Settings, gaps: dict[str, tuple[int, int, dict]]) -> Notes:
    """Per dataset with missing verdicts, why a missing judge's verdicts of another identity there are not read."""
    out = {}
    for d, (_, _, missing) in gaps.items():
        notes = identity_notes(s.roster, s.paths.cache_dir, dataset_folder(d), missing)
        if notes:
            out[d] = notes
    return out


def _gap_command(s: Settings, gaps: dict[str, tuple[int, int, dict]]) -> str:
    return judge_command(s, list(gaps), list(dict.fromkeys(j for _, _, m in gaps.values() for j in m)))


def refuse_missing(
    s: Settings, gaps: dict[str, tuple[int, int, dict]], policy: str, notes: Notes | None = None
) -> None:
    """One line naming, per dataset, how many items lack a verdict (from whom), and the command that computes
    them."""
    tail = (
        ""
        if policy != "error"
        else (
            ", or analyse only the judged items with judge.missing=judged_only "
            "(or leave these datasets out with judge.missing=skip)"
        )
    )
    raise MissingVerdicts(
        f"items without a cached verdict under {s.paths.cache_dir}: {_gap_text(gaps, notes)}; compute "
        f"them with `{_gap_command(s, gaps)}`{tail}"
    )


def skipped_datasets(
    s: Settings, gaps: dict[str, tuple[int, int, dict]], notes: Notes | None = None
) -> dict[str, dict]:
    """``judge.missing=skip``: each dataset with items lacking a verdict is left out whole (logged, and listed in
    results.json and the report with the command that computes its verdicts, and why a judge's verdicts of
    another identity there are not read)."""
    out = {}
    for d, gap in gaps.items():
        out[d] = {"reason": f"{_gap_text({d: gap}, notes)}", "command": _gap_command(s, {d: gap})}
        log.warning(
            "%s: left out (judge.missing=skip): %s; compute them with `%s`", d, out[d]["reason"], out[d]["command"]
        )
    return out


def cached_table(s: Settings) -> VerdictTable:
    """Verdicts of the configured roster on the selected datasets, from the verdict cache.

    Items without a cached verdict are not abstentions: ``judge.missing=error`` stops, naming how many
    per dataset and judge and the command that computes them; ``judge.missing=judged_only`` analyses the items
    every judge has judged and logs (and records in the table's provenance) how many were left out;
    ``judge.missing=skip`` leaves such a dataset out whole (the DVC pipeline's choice: one dataset not yet judged
    does not stop the others); ``judge.missing=auto`` (default) is ``skip`` for a list of datasets
    (``dataset=all``: a set added to it but not judged by this roster yet leaves the headline run green, and
    says so with the command that judges it) and ``error`` for one dataset named on its own. Bad cache lines are
    logged by file and line (:mod:`src.judges.cache`) and counted."""
    policy = s.judge.missing
    if policy not in MISSING_POLICIES:
        raise RaimError(f"judge.missing={policy!r}: must be one of {list(MISSING_POLICIES)}")
    if policy == "auto":  # a set of the list not judged yet must not stop the others; a set asked for by name must
        policy = "skip" if "datasets" in s.dataset else "error"
    engine = engine_from_cfg(s.judge) if s.judge.compute else None  # judge.engine=ray: misses on Ray
    frames, cache, gaps = {}, {}, {}
    for name in dataset_names(s):
        items = read_items(Path(s.paths.datasets_dir) / f"{name}.jsonl")
        if s.judge.per_dataset:  # the same whole-cluster subsample as `python -m src.judges --per-dataset`
            items = cluster_subsample(items, int(s.judge.per_dataset), seed=0)
        frame = frame_for(s, name)
        try:
            t = verdict_table(
                s.roster,
                items.assign(frame=frame["name"]),
                frame,
                Path(s.paths.cache_dir),
                compute=s.judge.compute,
                progress=bool(s.judge.compute),
                engine=engine,
            )
        except NothingCached:  # a dataset not judged yet: every item lacks every member's verdict
            gaps[name], frames[name] = (len(items), len(items), {m: len(items) for m in member_names(s.roster)}), None
            continue
        report, cached = t.attrs["report"], t.attrs.pop("cached")
        cache[name] = {
            j: {
                "items": r["items"],
                "cached": r["cached"],
                "abstained": r["abstained"],
                "path": r["cache"]["path"],
                "bad_lines": r["cache"]["bad_lines"],
                "torn_tail_bytes": r["cache"]["torn_tail_bytes"],
                "problems": r["problems"],
            }
            for j, r in report.items()
        }
        keep, missing = judged_items(report, cached)
        if missing:
            gaps[name] = (int((~keep).sum()), len(t), missing)
            if policy == "judged_only" and keep.any():
                log.warning(
                    "%s: judge.missing=judged_only: analysing the %d of %d items judged by every member "
                    "(%d without a verdict: %s)",
                    name,
                    int(keep.sum()),
                    len(t),
                    int((~keep).sum()),
                    _per_judge(missing),
                )
                t = t.loc[keep].reset_index(drop=True)
        frames[name] = t
    notes = gap_notes(s, gaps) if gaps else {}
    skipped = skipped_datasets(s, gaps, notes) if policy == "skip" else {}
    if skipped and len(skipped) == len(frames):
        refuse_missing(s, gaps, policy, notes)
    empty = {d: g for d, g in gaps.items() if g[0] == g[1]}
    if gaps and (policy == "error" or (policy == "judged_only" and empty)):
        refuse_missing(s, gaps if policy == "error" else empty, policy, notes)
    members = member_names(s.roster)
    source = f"cache {s.paths.cache_dir} (roster {s.roster['name']})"
    kept = [t for d, t in frames.items() if d not in skipped]
    table = validate(pd.concat(kept, ignore_index=True), source=source, frontier=frontier_name(s), members=members)
    # each dataset read a judge's whole cache file: one count per file (bad lines, and a torn tail as one)
    bad = {r["path"]: r["bad_lines"] + bool(r["torn_tail_bytes"]) for d in cache.values() for r in d.values()}
    bad = {f: n for f, n in bad.items() if n}
    dropped = {
        d: {"items": n, "judged": n - k, "dropped": k, "missing_per_judge": m}
        for d, (k, n, m) in gaps.items()
        if d not in skipped
    }
    table.provenance = {
        "cache": cache,
        "judged_only": dropped,
        "skipped": skipped,
        "bad_cache_lines": sum(bad.values()),
        "bad_cache_files": sorted(bad),
    }
    return table
