"""The injection study's items and their judging (:mod:`src.studies.injection`): the attacked subset of each
dataset, its frames (paper and guarded) and conditions (the generator's classes, the held-out draws), the verdict
cache of each cell, and the judges run on them within a time budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from src.core import injection as inj
from src.core.errors import RaimError
from src.io.config import group_option, plain
from src.io.datasets import read_items
from src.io.paths import ROOT
from src.io.raw import read_jsonl
from src.io.settings import Settings
from src.judges.frames import Frame
from src.judges.runner import cluster_subsample, local_scores, roster_judges, score_judge
from src.judges.tables import frame_for

CLEAN = "clean"


FRAMES = ("paper", "guarded")


AGGREGATES = ("stacked", "majority")


STUDY_KEYS = ("datasets", "n_items", "attacks", "heldout_draws", "defence", "guarded", "seed", "n_boot", "level")


HELDOUT = "heldout"


class InjectionStudyError(RaimError):
    """A setting or a verdict set the injection study cannot run with."""


log = logging.getLogger("raim.injection")

# ------------------------------------------------------------------------------------------------ items


def check_settings(s: Mapping[str, Any]) -> None:
    """Refuse settings the study cannot run with, in one line naming the key."""
    unknown = [a for a in s["attacks"] if a not in inj.ATTACKS]
    if not isinstance(s["heldout_draws"], int) or isinstance(s["heldout_draws"], bool) or s["heldout_draws"] < 0:
        raise InjectionStudyError(f"injection.heldout_draws={s['heldout_draws']!r}: must be an integer ≥ 0")
    if s["defence"] not in inj.DEFENCES:
        raise InjectionStudyError(f"injection.defence={s['defence']!r}: must be one of {list(inj.DEFENCES)}")
    if not 0 < float(s["max_weight_share"]) <= 1:
        raise InjectionStudyError(f"injection.max_weight_share={s['max_weight_share']!r}: must be in (0, 1]")
    if unknown or not s["attacks"]:
        raise InjectionStudyError(
            f"injection.attacks={list(s['attacks'])}: each must be one of {list(inj.ATTACKS)} (and at least one)"
        )
    if not isinstance(s["n_items"], int) or isinstance(s["n_items"], bool) or s["n_items"] < 10:
        raise InjectionStudyError(f"injection.n_items={s['n_items']!r}: must be an integer ≥ 10")
    if not isinstance(s["n_boot"], int) or s["n_boot"] < 1:
        raise InjectionStudyError(f"injection.n_boot={s['n_boot']!r}: must be an integer ≥ 1")
    if not 0 < float(s["level"]) < 1:
        raise InjectionStudyError(f"injection.level={s['level']!r}: must be in (0, 1)")
    if not s["datasets"]:
        raise InjectionStudyError("injection.datasets: empty")


def base_items(cfg: Settings, dataset: str) -> pd.DataFrame:
    """The clean subset of one dataset: the judged subsample (``judge.per_dataset``, as ``src.judges`` draws it),
    then ``injection.n_items`` of its items in whole clusters, half of each gold class (seed ``injection.seed``)."""
    path = Path(cfg.paths.datasets_dir) / f"{dataset}.jsonl"
    if not path.exists():
        raise InjectionStudyError(f"injection.datasets: {dataset!r} has no balanced set {path}")
    items = read_items(path)
    if cfg.judge.per_dataset:
        items = cluster_subsample(items, int(cfg.judge.per_dataset), seed=0)
    sub = cluster_subsample(items, int(cfg.injection.n_items), seed=int(cfg.injection.seed))
    return sub.reset_index(drop=True)


def frames_of(cfg: Settings, dataset: str, guarded: bool) -> dict[str, Frame]:
    """{"paper": the dataset's frame, "guarded": its guarded version} (only "paper" when ``guarded`` is off)."""
    paper = Frame(frame_for(cfg, dataset))
    out = {"paper": paper}
    if guarded:
        try:
            out["guarded"] = Frame(plain(group_option("frame", f"{paper.name}_guarded"), True))
        except FileNotFoundError:
            raise InjectionStudyError(
                f"{dataset}: frame {paper.name!r} has no guarded version conf/frame/{paper.name}_guarded.yaml"
            ) from None
    return out


def heldout_conditions(draws: int) -> list[str]:
    """The names of the judged conditions of held-out attacks: ``heldout-1`` … ``heldout-<draws>``."""
    return [f"{HELDOUT}-{d + 1}" for d in range(draws)]


def written_set(path: str | Path) -> list[inj.WrittenAttack]:
    """An attack set written apart from the generator (data/injection/*.jsonl), every entry checked; a bad entry
    is one line naming the file, the line and the key."""
    p = Path(path)
    p = p if p.is_absolute() else ROOT / p
    try:
        recs = read_jsonl(p, ROOT)
        out = [inj.written_attack(r.data, r.where) for r in recs]
    except inj.InjectionError as e:
        raise InjectionStudyError(str(e)) from None
    dup = sorted({a.id for a in out if [b.id for b in out].count(a.id) > 1})
    if dup:
        raise InjectionStudyError(f"{path}: attack id(s) {dup} repeat (ids must be unique)")
    return out


def conditions(
    base: pd.DataFrame, attacks: Sequence[str], seed: int, written: Sequence[inj.WrittenAttack] = (), draws: int = 0
) -> dict[str, pd.DataFrame]:
    """{"clean": the items, <attack>: the items under that generator attack, ``heldout-<d>``: each item with one
    written attack planted (:func:`src.core.injection.assign`, draw d)}, rows aligned with ``base``."""
    recs = base.to_dict("records")
    out = {CLEAN: base}
    for a in attacks:
        out[a] = pd.DataFrame(inj.attacked(recs, [a], seed))
    for d, name in enumerate(heldout_conditions(draws)):
        out[name] = pd.DataFrame(inj.assign(recs, written, d, seed))
    return out


def cells(cfg: Settings) -> dict[str, dict]:
    """Per dataset: its frames, its conditions' items, and the cache directory of each (frame, condition)."""
    s = settings(cfg)
    draws = int(s["heldout_draws"])
    written = written_set(s["heldout"]) if draws else []
    out = {}
    for ds in s["datasets"]:
        base = base_items(cfg, ds)
        out[ds] = {
            "frames": frames_of(cfg, ds, bool(s["guarded"])),
            "items": conditions(base, s["attacks"], int(s["seed"]), written, draws),
        }
    return out


def cache_dir(cfg: Settings, frame: str, condition: str) -> Path:
    """The clean items under the paper frame are the benchmark's cached verdicts; the rest live apart."""
    return Path(cfg.paths.cache_dir if (frame, condition) == ("paper", CLEAN) else cfg.injection.cache_dir)


def settings(cfg: Settings) -> dict:
    s = cfg.node("injection")
    check_settings(s)
    return s


# ------------------------------------------------------------------------------------------------ judging


def deadline_engine(deadline: float | None):
    """The in-process engine (:func:`src.judges.runner.local_scores`) that stops once ``time.monotonic()`` passes
    ``deadline``: every record yielded before is cached, the rest stays missing for the next run."""

    def run(name, be, bcfg, frames, items):
        if deadline is not None and time.monotonic() >= deadline:
            return
        for j, rec in local_scores(name, be, bcfg, frames, items):
            yield j, rec
            if deadline is not None and time.monotonic() >= deadline:
                return

    return run


def _records(items: pd.DataFrame, frame: Frame) -> list[dict]:
    return items.assign(frame=frame.name).to_dict("records")


def judge(
    cfg: Settings,
    grid: dict[str, dict] | None = None,
    budget_s: float | None = None,
    members: Sequence[str] | None = None,
    progress: bool = False,
) -> dict[str, dict]:
    """Judge every missing verdict of the study (dataset by dataset — one dataset's study is complete before the
    next is started —, then member by member in roster order, then frame; a frame's items in one pass, item by
    item, so the variants of one item reuse the KV cache of its document and of its candidate's own tokens),
    stopping after ``budget_s`` seconds. Returns {member: {dataset/frame: computed count}}."""
    grid = grid or cells(cfg)
    deadline = None if budget_s is None else time.monotonic() + float(budget_s)
    engine = deadline_engine(deadline)
    done: dict[str, dict] = {}
    for ds, cell in grid.items():
        for name, bcfg, _ in roster_judges(cfg.roster, include_frontier=False):
            if members and name not in members:
                continue
            for fk, frame in cell["frames"].items():
                groups: dict[Path, list[dict]] = {}
                recs_of = {cond: _records(items, frame) for cond, items in cell["items"].items()}
                for i in range(len(recs_of[CLEAN])):  # item by item: its variants share the candidate's tokens too
                    for cond, recs in recs_of.items():
                        groups.setdefault(cache_dir(cfg, fk, cond), []).append(recs[i])
                for cdir, recs in groups.items():
                    if deadline is not None and time.monotonic() >= deadline:
                        return done
                    _, rep = score_judge(
                        name, bcfg, recs, {frame.name: frame}, cdir, compute=True, progress=progress, engine=engine
                    )
                    if rep["computed"]:
                        done.setdefault(name, {})[f"{ds}/{fk}"] = rep["computed"]
                        log.info(
                            "%s %s/%s: %d verdicts judged (%d still missing)",
                            name,
                            ds,
                            fk,
                            rep["computed"],
                            rep["uncached"],
                        )
    return done


def read_votes(cfg: Settings, grid: dict[str, dict]) -> tuple[dict, dict]:
    """Every cached verdict of the study, judging nothing: {dataset: {frame: {condition: table}}} (a verdict
    table per cell, as :func:`src.judges.runner.verdict_table` lays it out) and the missing count per
    (dataset, frame, condition, member)."""
    judges = roster_judges(cfg.roster, include_frontier=False)
    tables: dict[str, dict] = {}
    missing: dict[str, dict] = {}
    for ds, cell in grid.items():
        for fk, frame in cell["frames"].items():
            for cond, items in cell["items"].items():
                recs = _records(items, frame)
                t = items[["item_id", "cluster_id", "dataset", "gold"]].copy()
                gaps = {}
                for name, bcfg, _ in judges:
                    out, rep = score_judge(
                        name, bcfg, recs, {frame.name: frame}, cache_dir(cfg, fk, cond), compute=False, progress=False
                    )
                    t[name] = pd.array([None if r is None else r.get("vote") for r in out], dtype="Int64")
                    for feat in ("logodds", "mass"):
                        t[f"{name}@{feat}"] = pd.array(
                            [None if r is None else r.get(feat) for r in out], dtype="Float64"
                        )
                    if rep["uncached"]:
                        gaps[name] = rep["uncached"]
                tables.setdefault(ds, {}).setdefault(fk, {})[cond] = t
                if gaps:
                    missing.setdefault(ds, {}).setdefault(fk, {})[cond] = gaps
    return tables, missing


def compute_command(cfg: Settings, missing: dict) -> str:
    members = sorted({m for per in missing.values() for f in per.values() for c in f.values() for m in c})
    roster = cfg.roster["name"]
    who = (
        ""
        if len(members) == len(roster_judges(cfg.roster, include_frontier=False))
        else f" injection.members=[{','.join(members)}]"
    )
    return f"python -m src.injection roster={roster} injection.compute=true injection.budget_s=280{who}"
