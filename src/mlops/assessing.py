"""RAIM's assessment of an experiment's traces (beyond the paper; the traces themselves are
:mod:`src.mlops.traces`): :func:`judge` maps each trace to an item, scores them in batches of unique item ids with
a panel through the verdict cache and writes one feedback per trace, counting every trace not judged per reason in
a :class:`Report`; :func:`labelled_table`: the verdicts of the traced items beside the people's labels;
:func:`roster_of`: the roster an assessment names, checked against the judges that made it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from src.io.settings import TracesSettings
from src.io.traces import SKIP_REASONS, Skip, TraceMapping, to_item
from src.judges.runner import verdict_table
from src.mlops.panels import load_panel
from src.mlops.serving import frame_configs
from src.mlops.traces import Judge, TraceError, assessed_by, feedback, identities, pages, raim_assessment, view, write

# ------------------------------------------------------------------------------------------------- judging


@dataclass
class Report:
    """What a judging run did: traces read, assessed (logged, or overriding another model's), already assessed by
    this model, and every trace not judged, per reason (:data:`src.io.traces.SKIP_REASONS` and ``not_cached``: a
    member's verdict was neither cached nor computed, ``--no-compute``), with the first trace ids of each."""

    read: int = 0
    logged: int = 0
    overrode: int = 0
    already: int = 0
    skipped: dict[str, dict] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=lambda: {"read": 0.0, "judge": 0.0, "write": 0.0})

    def skip(self, reason: str, detail: str, trace_id: str, keep: int = 5) -> None:
        row = self.skipped.setdefault(
            reason, {"count": 0, "meaning": SKIP_MEANINGS.get(reason, reason), "first": [], "detail": detail}
        )
        row["count"] += 1
        if len(row["first"]) < keep:
            row["first"].append(trace_id)

    def as_dict(self) -> dict:
        return {
            "read": self.read,
            "assessed": self.logged + self.overrode,
            "logged": self.logged,
            "overrode": self.overrode,
            "already_assessed": self.already,
            "skipped": self.skipped,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }

    def line(self) -> str:
        """The run in one line (the command's summary)."""
        skipped = sum(r["count"] for r in self.skipped.values())
        why = ", ".join(f"{k} {r['count']}" for k, r in sorted(self.skipped.items(), key=lambda kv: -kv[1]["count"]))
        return (
            f"{self.read} trace(s) read: {self.logged + self.overrode} assessed"
            + (f" ({self.overrode} overriding another model's assessment)" if self.overrode else "")
            + f", {self.already} already assessed by this model, {skipped} not judged"
            + (f" ({why})" if why else "")
        )


SKIP_MEANINGS = {**SKIP_REASONS, "not_cached": "a member's verdict is neither cached nor computed (--no-compute)"}


def unique_batches(items: list[dict]) -> list[list[int]]:
    """Positions of ``items`` in batches whose item ids are unique (a panel scores an item id once per request;
    two traces of one client request id come in separate batches)."""
    batches: list[list[int]] = []
    placed: list[set[str]] = []
    for i, it in enumerate(items):
        for b, ids in zip(batches, placed):
            if it["item_id"] not in ids:
                b.append(i)
                ids.add(it["item_id"])
                break
        else:
            batches.append([i])
            placed.append({it["item_id"]})
    return batches


def judge(
    experiment: str,
    filter_string: str | None,
    mapping: TraceMapping,
    panel: Any,
    who: Judge,
    score: Callable[[pd.DataFrame], pd.DataFrame],
    dataset: str,
    page_size: int,
    limit: int | None = None,
    progress: Callable[[Report], None] | None = None,
) -> tuple[Report, list[pd.DataFrame]]:
    """Read the experiment's traces page by page, map each to an item, score the page's items with ``score`` (a
    :func:`src.mlops.panels.predict` over the panel, through the verdict cache) and write one assessment per
    judged trace before the next page is read: a killed run keeps every page it finished, and the next run
    skips the traces already assessed by this model. Returns the report and the rows of the traces it assessed
    (with ``trace_id`` and ``ts``)."""
    report, scored = Report(), []
    members = [m["name"] for m in panel.model.roster["members"]]
    threshold = float(panel.model.stacker.threshold)
    t0 = time.perf_counter()
    for page in pages(experiment, filter_string, page_size):
        if limit is not None:
            page = page[: max(limit - report.read, 0)]
        report.read += len(page)
        todo, items = [], []
        for t in page:
            if assessed_by(t, who):
                report.already += 1
                continue
            item = to_item(view(t), mapping)
            if isinstance(item, Skip):
                report.skip(item.reason, item.detail, t.info.trace_id)
                continue
            todo.append(t)
            items.append({**item, "dataset": dataset})
        report.seconds["read"] += time.perf_counter() - t0
        for batch in unique_batches(items):
            t1 = time.perf_counter()
            rows = score(pd.DataFrame([items[i] for i in batch]))
            t2 = time.perf_counter()
            report.seconds["judge"] += t2 - t1
            for i, (_, row) in zip(batch, rows.iterrows()):
                t, rec = todo[i], row.to_dict()
                if rec.get("uncached"):
                    report.skip("not_cached", f"no verdict of {rec['uncached']}", t.info.trace_id)
                    continue
                outcome = write(t, feedback(rec, members, threshold, who))
                report.logged += outcome == "logged"
                report.overrode += outcome == "overrode"
            report.seconds["write"] += time.perf_counter() - t2
            written = (rows["uncached"].fillna("") == "").to_numpy()  # what reached the traces: the pool
            rows = rows.assign(trace_id=[items[i]["trace_id"] for i in batch], ts=[items[i]["ts"] for i in batch])
            scored.append(rows[written])
        if progress is not None:
            progress(report)
        if limit is not None and report.read >= limit:
            break
        t0 = time.perf_counter()
    return report, scored


def labelled_table(
    experiment: str,
    filter_string: str | None,
    s: TracesSettings,
    gold: Mapping[str, int],
    cache_dir: str | Path,
) -> pd.DataFrame:
    """The labelled traces' verdict table (the contract of :mod:`src.core.verdicts`: ``item_id`` the trace id, each
    trace its own cluster, ``gold`` the people's label, each member's vote, log-odds and mass): every labelled
    trace mapped to its item again, under the frame and cache id RAIM's assessment records, its votes read from the
    verdict cache by the roster of the model the assessment names — whose judges must still be the ones that
    judged it."""
    rows, models = [], set()
    for page in pages(experiment, filter_string, s.page_size):
        for t in page:
            a = raim_assessment(t, s.assessment.name) if t.info.trace_id in gold else None
            item = to_item(view(t), s.mapping) if a is not None else None
            if a is None or item is None or isinstance(item, Skip):
                continue
            meta = a.metadata or {}
            models.add((meta.get("model_uri", ""), meta.get("judges", "")))
            rows.append({**item, "item_id": meta.get("item_id") or item["item_id"], "frame": meta.get("frame") or None})
            rows[-1].update(dataset=s.dataset, cluster_id=t.info.trace_id, gold=int(gold[t.info.trace_id]))
    if not rows:
        raise TraceError(f"experiment {experiment}: none of the {len(gold)} labelled trace(s) maps to an item")
    if len(models) > 1:
        raise TraceError(
            f"experiment {experiment}: the labelled traces were assessed by {len(models)} models or judge versions "
            f"({sorted(m for m, _ in models)}): a verdict table holds one roster; narrow the traces (--filter, --since)"
        )
    ((uri, judges),) = models
    roster = roster_of(uri, judges)
    frames = frame_configs()
    items = pd.DataFrame(rows)
    table = verdict_table(roster, items, {f: frames[f] for f in set(items["frame"])}, Path(cache_dir))
    return table.assign(item_id=items["cluster_id"].to_numpy())


def roster_of(model_uri: str, judges: str) -> dict:
    """The roster of the model an assessment names (its members, checked against the judge identities the
    assessment records: a member whose judge changed since would read another judge's verdicts)."""
    want = dict(kv.split("=", 1) for kv in judges.split(",") if "=" in kv)
    roster = load_panel(model_uri).model.live_roster()
    now = identities(roster)
    changed = [m for m in want if now.get(m) != want[m]]
    if changed or set(now) != set(want):
        raise TraceError(
            f"model {model_uri}: member(s) {changed or sorted(set(now) ^ set(want))} are not the judges that "
            "assessed the traces (their identity changed since): their cached verdicts are another judge's"
        )
    return roster
