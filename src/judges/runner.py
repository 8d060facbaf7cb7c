"""From items to the engine's verdict table, through the verdict cache.

``verdict_table(roster_cfg, items, frame_cfgs, cache_dir, compute)`` is the contract with the engine:

* columns ``item_id, cluster_id, dataset, gold``, then one column per member (its ``name``) holding 1
  (hallucinated), 0 (supported) or empty (abstained or not cached), then ``<member>@logodds`` and
  ``<member>@mass`` (continuous; empty where undefined), then the frontier column when the roster names one;
* ``compute=False`` reads only the cache (no model is built or loaded) and leaves uncached cells empty,
  reporting how many per member in ``table.attrs["report"]``; it raises only when nothing at all is cached;
* ``compute=True`` scores the missing items (grouped so items sharing a document are adjacent and reuse its
  KV cache), appending each record to the cache as soon as it exists: a killed run loses at most the item in
  flight.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from src.core.errors import RaimError
from src.core.evaluate import scores
from src.core.verdicts import ABSTAIN, invisible
from src.io.config import plain
from src.judges.cache import (
    dataset_caches,
    identity_difference,
    item_folder,
    merged_stats,
    other_identities,
    write_identity,
)
from src.judges.config import BACKENDS, load_roster, member_where, resolve_roster, roster_options
from src.judges.frames import Frame, load_frames
from src.judges.http import RetryPolicy, unreachable

log = logging.getLogger("raim.judges")

BASE_COLS = ["item_id", "cluster_id", "dataset", "gold"]


class NothingCached(RaimError, RuntimeError):
    """Not one verdict of the roster is cached for these items (and computing was not asked for)."""


def build_backend(backend_cfg: Any, where: str = "backend"):
    """Instantiate a backend node (``_target_`` + kwargs) through the allow-list of RAIM's backends
    (:data:`src.judges.config.BACKENDS`: the target and every key checked before anything is called); constructors
    load nothing. ``where`` names the node in an error line."""

    return BACKENDS.instantiate(backend_cfg, where)


def roster_judges(roster_cfg: Any, include_frontier: bool = True) -> list[tuple[str, Any, bool]]:
    """[(column name, backend node, is_frontier)] for the roster's members (and frontier), the roster checked
    first (:func:`src.judges.config.resolve_roster`: keys, backend targets, ``drop_members``)."""
    r = resolve_roster(roster_cfg)
    out = [(m["name"], m["backend"], False) for m in r.get("members", [])]
    names = [n for n, _, _ in out]
    if len(set(names)) != len(names):
        raise RaimError(f"duplicate member names in roster {r.get('name')}: {names}")
    for n in names + ([r["frontier"]["name"]] if r.get("frontier") else []):
        hidden = invisible(str(n))
        if hidden:  # its column and cache folder would be a judge of their own beside the one it looks like
            raise RaimError(f"roster {r.get('name')}: member name {n!r} holds {hidden}")
    fr = r.get("frontier")
    if include_frontier and fr:
        out.append((fr["name"], fr["backend"], True))
    return out


def compute_command(
    roster: str, datasets: Iterable[str], per_dataset: int | None = None, members: Iterable[str] | None = None
) -> str:
    """The ``python -m src.judges`` command that computes a roster's missing verdicts on ``datasets`` (only
    ``members``' when given)."""
    cmd = f"python -m src.judges --roster {roster} --datasets {' '.join(datasets)}"
    if per_dataset:
        cmd += f" --per-dataset {int(per_dataset)}"
    if members:
        cmd += f" --members {','.join(members)}"
    return cmd + " --compute"


IDENTITY_KEYS = "backend, model, sha256, template, n_ctx, scoring mode, mass floor"


def identity_notes(roster_cfg: Any, cache_dir: Path | str, folder: str, judges: Iterable[str]) -> dict[str, str]:
    """Why each of ``judges`` (members lacking verdicts) does not read the verdicts a judge of its name left in a
    dataset's cache folder: how the two identities differ and, when another roster's member of that name is the
    other identity, that roster (whose verdicts an analysis with it reads as they are)."""
    wanted = set(judges)
    notes = {}
    for name, bcfg, _ in roster_judges(roster_cfg):
        if name not in wanted:
            continue
        ours = build_backend(bcfg, f"judge {name}").identity()
        for theirs, n in other_identities(Path(cache_dir) / folder, name, ours):
            owners = rosters_owning(name, theirs)
            whose = f"roster {' or '.join(owners)}'s {name}" if owners else f"a {name} of another identity"
            notes[name] = (
                f"{name}: {n} verdict(s) of {whose} are there ({identity_difference(theirs, ours)}), not read here: "
                f"a judge reads only the verdicts of its own identity ({IDENTITY_KEYS})"
                + (f"; an analysis with {' or '.join(f'roster={o}' for o in owners)} reads them" if owners else "")
            )
            break
    return notes


def rosters_owning(member: str, identity: Mapping[str, Any]) -> list[str]:
    """The conf/roster options whose member ``member`` has this judge identity (a hint in a message: a roster that
    cannot be read here is passed over)."""
    out = []
    for option in roster_options():
        try:
            judges = roster_judges(load_roster(option), include_frontier=False)
            if any(n == member and build_backend(b, f"judge {n}").identity() == dict(identity) for n, b, _ in judges):
                out.append(option)
        except Exception:  # noqa: BLE001 - a roster this process cannot compose (an unset secret…): no hint from it
            continue
    return out


def member_names(roster_cfg: Any) -> list[str]:
    return [n for n, _, f in roster_judges(roster_cfg) if not f]


def _item_records(items: pd.DataFrame) -> list[dict]:
    return items.to_dict("records")


def _order_for_reuse(frame_of: list[str], recs: list[dict]) -> list[int]:
    """Indices ordered so items that share (frame, evidence, question) are adjacent (KV prefix reuse)."""

    def k(i: int):
        r = recs[i]
        ev = r.get("evidence")
        return (frame_of[i], str(r.get("cluster_id")), ev if isinstance(ev, str) else "", str(r.get("question")), i)

    return sorted(range(len(recs)), key=k)


def _frame_for(rec: Mapping[str, Any], frames: dict[str, Frame], default: str | None) -> Frame:
    name = rec.get("frame")
    if not isinstance(name, str) or not name:
        name = default
    if name not in frames:
        raise RaimError(f"item {rec.get('item_id')}: frame {name!r} not among {sorted(frames)}")
    return frames[name]


Engine = Callable[[str, Any, Any, list[Frame], list[dict]], Iterator[tuple[int, dict]]]
"""``engine(member, backend, backend_cfg, frames, items)`` yields ``(position in items, backend record)`` for
every item, in any order; ``frames[j]`` is item ``j``'s frame and the items arrive ordered for prefix reuse."""


def local_scores(
    name: str, be: Any, backend_cfg: Any, frames: list[Frame], items: list[dict]
) -> Iterator[tuple[int, dict]]:
    """The in-process engine: consecutive items of one frame streamed through ``be.score_iter``."""
    start = 0
    while start < len(items):
        end = start
        while end < len(items) and frames[end].name == frames[start].name:
            end += 1
        yield from zip(range(start, end), be.score_iter(frames[start], items[start:end]))
        start = end


def finish_record(
    raw: Mapping[str, Any], key: str, member: str, item: Mapping[str, Any], frame: Frame, judge_hash: str
) -> dict:
    """A backend's verdict record as the cache stores it: non-finite floats as null (JSON has no NaN/inf), plus
    its key, member, item, frame and judge identity, and when it was written."""
    rec = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in raw.items()}
    rec.update(
        key=key,
        member=member,
        item_id=str(item["item_id"]),
        dataset=str(item.get("dataset", "")),
        frame=frame.name,
        frame_hash=frame.hash[:16],
        judge=judge_hash[:16],
        created=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    return rec


PROGRESS_LOG_S = 60.0  # without a progress bar (DVC stages, --no-progress): a progress line this often


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600} h {s % 3600 // 60:02d} m" if s >= 3600 else f"{s // 60} m {s % 60:02d} s"


class Progress:
    """Items judged so far, their rate and the time left, as the misses of one judge are scored: a tqdm bar
    (items/s and an ETA) on stderr, or without one (``bar=False``: DVC stages, ``--no-progress``) a log line every
    :data:`PROGRESS_LOG_S` seconds, so a long run always says how far it is and how long the rest will take."""

    def __init__(self, label: str, total: int, bar: bool):
        self.label, self.total, self.done, self.every = label, total, 0, PROGRESS_LOG_S
        self.t0 = self.last = time.perf_counter()
        self.bar = None
        if bar:
            from tqdm import tqdm  # imported here, not at start-up: tqdm

            self.bar = tqdm(total=total, desc=label, unit="item", file=sys.stderr, mininterval=2.0)
        else:
            log.info("%s: judging %d item(s)", label, total)

    def line(self, end: bool = False) -> str:
        """``12/60 items, 0.21 items/s, ~3 m 48 s left`` (the rate of the items judged so far); at the end the
        time it took instead of the time left."""
        spent = time.perf_counter() - self.t0
        rate = self.done / spent if spent > 0 else 0.0
        if end:
            tail = f"in {_clock(spent)}"
        else:
            tail = f"~{_clock((self.total - self.done) / rate)} left" if rate > 0 else "time left unknown yet"
        return f"{self.label}: {self.done}/{self.total} items, {rate:.2f} items/s, {tail}"

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif time.perf_counter() - self.last >= self.every and self.done < self.total:
            self.last = time.perf_counter()
            log.info("%s", self.line())

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            log.info("%s", self.line(end=True))


def score_judge(
    name: str,
    backend_cfg: Any,
    recs: list[dict],
    frames: dict[str, Frame],
    cache_dir: Path,
    compute: bool,
    default_frame: str | None = None,
    progress: bool = True,
    backend: Any = None,
    engine: Engine | None = None,
    where: str | None = None,
    label: str | None = None,
) -> tuple[list[dict | None], dict]:
    """Records (or None where uncached) for one judge over ``recs``; computes missing ones if asked.

    ``backend``: an already built backend to score with instead of building one from ``backend_cfg``; the caller
    owns it (it is left loaded, e.g. for a second call), whereas a backend built here is closed here.
    ``engine``: what scores the missing items (default :func:`local_scores`, this process; or
    :class:`src.judges.ray_engine.RayEngine`); it is called only when some item is missing, and every record it
    yields is written here, by this process, to the cache. ``where``: the member's node in error lines
    (``conf/roster/cpu.yaml: members[0] (qwen15b)``). ``label`` names the judge in its progress (:class:`Progress`:
    a bar with ``progress``, else log lines; default its name)."""
    be = backend if backend is not None else build_backend(backend_cfg, where or f"judge {name}")
    folder = [item_folder(r) for r in recs]  # each item's verdicts live in its dataset's folder
    caches = dataset_caches(cache_dir, name, be.identity(), folder)
    cache_of = [caches[f] for f in folder]
    fr = [_frame_for(r, frames, default_frame) for r in recs]
    keys = [c.key(f.name, f.hash, r) for c, f, r in zip(cache_of, fr, recs)]
    computed = 0
    t_compute = 0.0
    if compute:
        for c in caches.values():
            c.open_for_append()
        missing = [i for i, k in enumerate(keys) if k not in cache_of[i]]
        if missing:
            for c in dict.fromkeys(cache_of[i] for i in missing):
                write_identity(c)
            order = _order_for_reuse([fr[i].name for i in missing], [recs[i] for i in missing])
            todo = [missing[j] for j in order]
            meter = Progress(label or name, len(todo), progress)
            t0 = time.perf_counter()
            run = engine or local_scores
            try:
                for j, raw in run(name, be, backend_cfg, [fr[i] for i in todo], [recs[i] for i in todo]):
                    i = todo[j]
                    if cache_of[i].put(finish_record(raw, keys[i], name, recs[i], fr[i], cache_of[i].identity_hash)):
                        computed += 1
                    meter.update(1)
            except Exception as e:
                err = unreachable(name, be, e)
                if err is None:
                    raise
                raise err from e
            t_compute = time.perf_counter() - t0
            meter.close()
        if backend is None:  # a backend handed in stays open: its owner closes it
            be.close()
    out: list[dict | None] = [c.get(k) for c, k in zip(cache_of, keys)]
    n_cached = sum(r is not None for r in out)
    n_abst = sum(1 for r in out if r is not None and r.get("vote") is None)
    reasons: dict[str, int] = {}
    for r in out:
        if r is not None and r.get("vote") is None:
            reasons[str(r.get("abstain"))] = reasons.get(str(r.get("abstain")), 0) + 1
    report = {
        "items": len(recs),
        "cached": n_cached,
        "uncached": len(recs) - n_cached,
        "abstained": n_abst,
        "abstain_reasons": reasons,
        "truncated": sum(1 for r in out if r is not None and r.get("truncated")),
        "computed": computed,
        "compute_seconds": round(t_compute, 3),
        "cache": merged_stats(caches),
        "problems": [line for c in caches.values() for line in c.problems()],
    }
    retry = getattr(be, "retry", None)
    if isinstance(retry, RetryPolicy):  # a judge behind HTTP: its requests, retries and seconds waited
        report["http"] = dict(retry.counts)
    return out, report


def verdict_table(
    roster_cfg: Any,
    items: pd.DataFrame,
    frame_cfgs: Any = None,
    cache_dir: Path | str = "verdicts/cache",
    compute: bool = False,
    *,
    frontier: bool | None = None,
    members: Iterable[str] | None = None,
    progress: bool = True,
    allow_empty: bool = False,
    engine: Engine | None = None,
) -> pd.DataFrame:
    """The engine's verdict table for ``items`` (see module doc).

    ``frontier``: also compute the frontier judge (a paid API: off by default; its cached verdicts are always
    read).  ``members`` restricts the members computed; the others are read from the cache. With no cached
    verdict at all it raises :class:`NothingCached`, unless ``allow_empty`` (a table of empty cells).
    ``engine`` scores the misses (see :func:`score_judge`; default: this process).
    """
    cache_dir = Path(cache_dir)
    frames = load_frames(frame_cfgs)
    default_frame = next(iter(frames)) if len(frames) == 1 else None
    recs = _item_records(items)
    table = items[[c for c in BASE_COLS if c in items.columns]].copy()
    table["item_id"] = table["item_id"].astype(str)
    report: dict[str, dict] = {}
    cached: dict[str, tuple[bool, ...]] = {}  # per judge and item: a record exists (vote or abstention)
    only = set(members) if members else None
    checked = resolve_roster(roster_cfg, resolve=False)
    judges = roster_judges(roster_cfg)
    sets = sorted({str(r.get("dataset", "")) for r in recs} - {""})
    for k, (name, bcfg, is_frontier) in enumerate(judges, 1):
        # members outside `members` are still read from the cache (their columns stay in the table)
        do = compute and (bool(frontier) if is_frontier else (only is None or name in only))
        out, rep = score_judge(
            name,
            bcfg,
            recs,
            frames,
            cache_dir,
            do,
            default_frame,
            progress,
            engine=engine,
            where=member_where(checked, name),
            label=f"{sets[0] + ' ' if len(sets) == 1 else ''}{name} ({k}/{len(judges)})",
        )
        cached[name] = tuple(r is not None for r in out)
        votes = [None if r is None else r.get("vote") for r in out]
        table[name] = pd.array(votes, dtype="Int64")
        if not is_frontier:
            table[f"{name}@logodds"] = pd.array([None if r is None else r.get("logodds") for r in out], dtype="Float64")
            table[f"{name}@mass"] = pd.array([None if r is None else r.get("mass") for r in out], dtype="Float64")
        rep["frontier"] = is_frontier
        secs = [r.get("seconds") for r in out if r is not None and r.get("seconds") is not None]
        rep["seconds_per_item"] = float(np.mean(secs)) if secs else None
        report[name] = rep
        for line in rep["problems"]:
            log.warning("%s", line)
        if rep["uncached"] and not do:
            log.warning("%s: %d of %d items not cached (cells left empty)", name, rep["uncached"], len(recs))
    total_cached = sum(r["cached"] for r in report.values())
    if recs and report and total_cached == 0 and not allow_empty:
        raise NothingCached(
            f"no cached verdict for any judge of roster {(plain(roster_cfg, True) or {}).get('name')} on these "
            f"{len(recs)} items under {cache_dir}; run `python -m src.judges --compute ...` first"
        )
    table.attrs["report"] = report
    table.attrs["cached"] = cached
    return table


# -- audit -----------------------------------------------------------------------------------------
def coverage_audit(tables: Mapping[str, pd.DataFrame], judges: list[str]) -> pd.DataFrame:
    """Table 22 shape plus the extra columns we measure: one row per (member, dataset) with coverage (share of
    items with a parseable verdict), cached count, abstentions, truncations, κ vs gold on answered items,
    balanced accuracy (abstention = error), the AUC of the log-odds against gold (ranking signal, where the
    member has a continuous score) and mean seconds per item."""
    rows = []
    for ds, t in tables.items():
        rep = t.attrs.get("report", {})
        for j in judges:
            if j not in t.columns:
                continue
            answered = ~pd.isna(t[j]).to_numpy()
            r = rep.get(j, {})
            gold = t["gold"].to_numpy().astype(int)
            vv = np.where(answered, t[j].fillna(-1).to_numpy(dtype=int), -1)
            sc = scores(gold, np.where(answered, vv, ABSTAIN).astype(float))  # the engine's κ and bacc (§2)
            k = sc["kappa"] if answered.sum() >= 2 else None
            auc = None
            if f"{j}@logodds" in t.columns:  # the ranking signal of the continuous score (constant voters keep it)
                lo = t[f"{j}@logodds"].to_numpy(dtype=float, na_value=np.nan)
                ok = ~np.isnan(lo)
                if ok.sum() >= 2 and len(set(gold[ok])) == 2:
                    from sklearn.metrics import roc_auc_score  # imported here, not at start-up: scikit-learn ~1.4 s

                    auc = round(float(roc_auc_score(gold[ok], lo[ok])), 4)
            rows.append(
                {
                    "member": j,
                    "dataset": ds,
                    "n": len(t),
                    "cached": r.get("cached"),
                    "coverage": float(answered.mean()) if len(t) else None,
                    "abstained": r.get("abstained"),
                    "truncated": r.get("truncated"),
                    "kappa": None if k is None else round(k, 4),
                    "bacc": round(sc["bacc"], 4),
                    "share_voted_hallucinated": float((vv == 1).sum() / max(answered.sum(), 1)),
                    "auc_logodds": auc,
                    "seconds_per_item": r.get("seconds_per_item"),
                }
            )
    return pd.DataFrame(rows)


def coverage_matrix(audit: pd.DataFrame) -> pd.DataFrame:
    """member × dataset coverage (the paper's Table 22)."""
    if audit.empty:
        return audit
    return audit.pivot(index="member", columns="dataset", values="coverage")


# -- subsampling -----------------------------------------------------------------------------------
def cluster_subsample(items: pd.DataFrame, n: int, seed: int = 0) -> pd.DataFrame:
    """Whole clusters, stratified by gold: shuffle clusters (seed), keep a cluster when it keeps both classes
    at or under n/2, until both classes hold n/2 (or clusters run out).  Item order is preserved."""
    if n <= 0 or len(items) <= n:
        return items
    per = n / 2.0
    rng = np.random.default_rng(seed)
    gold = items["gold"].to_numpy()
    counts = pd.DataFrame({"n0": gold == 0, "n1": gold == 1}).groupby(items["cluster_id"].to_numpy(), sort=True).sum()
    ids, n0, n1 = counts.index.to_numpy(), counts["n0"].tolist(), counts["n1"].tolist()
    order = np.arange(len(ids))
    rng.shuffle(order)  # the same swaps as shuffling the ids themselves
    c0 = c1 = 0
    keep = []
    for i in order.tolist():
        a, b = n0[i], n1[i]
        if c0 + a <= per and c1 + b <= per:
            keep.append(ids[i])
            c0, c1 = c0 + a, c1 + b
        if c0 >= per and c1 >= per:
            break
    return items[items["cluster_id"].isin(set(keep))]
