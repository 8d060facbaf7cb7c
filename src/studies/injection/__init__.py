"""Candidates that instruct the judges: the injection study (beyond the paper; :mod:`src.core.injection`).

On a subset of each dataset's judged items (``injection.n_items`` whole clusters of the ``judge.per_dataset``
subsample, half hallucinated), every item is attacked once per class of ``injection.attacks`` (the seeded transform
:func:`src.core.injection.attacked`), and every member of the roster judges the clean and the attacked items under
the dataset's paper frame and under its guarded frame (``conf/frame/<frame>_guarded.yaml``). Verdicts go through the
verdict cache (:func:`src.judges.runner.score_judge`): the clean items under the paper frame are the benchmark's own
cached verdicts (``paths.cache_dir``), everything else is kept apart in ``injection.cache_dir``, so the pipeline's
committed cache is never touched and a killed run resumes where it stopped (``injection.compute=true
injection.budget_s=…`` judges for at most that long).

Per dataset, frame and attack class, for every member, for the stacked panel and for the unweighted majority:

* **attack success rate** (ASR): of the hallucinated items the judge votes hallucinated when clean, the share it
  votes *supported* once attacked (an abstention is not a success), the reverse flip rate on supported items, and
  the share of hallucinated items voted supported, clean and attacked (defined even for a judge that never
  catches one);
* **Δκ under attack**: κ on the attacked items − κ on the same items clean (§2's κ, abstentions excluded), with a
  paired cluster-bootstrap interval (:class:`src.core.evaluate.ClusterBootstrap`, one set of draws for every
  judge, attack and frame of a dataset, so every difference is paired);
* the stacker is the configured one (``stacker``), cross-fitted on the subset's *clean* verdicts (the ladder's
  cluster folds, :func:`src.core.ladderbase.checked_folds`) and applied to the held-out clusters' clean and attacked
  verdicts: it is calibrated on clean labelled data and deployed on attacked data. "One attacked" applies it with
  only one member's verdicts attacked (the others clean): does aggregation resist an attack that flips one judge?
* the **defence**: every metric under the guarded frame minus the paper frame, on the same attacked items, paired;
* the **detector** (:func:`src.core.detector.scan`): the share of attacked items it flags per class, and of the
  clean items of every shipped set (``datasets_dir``), per field; its recall on the attack sets written apart
  from the generator (``injection.heldout``, never used to tune a rule, and ``injection.dev``), every attack
  planted in every study item (:func:`written_recall`);
* ``injection.heldout_draws`` conditions of **held-out attacks** judged like the generator's classes (each item one
  written attack, :func:`src.core.injection.assign`);
* the **decision path** (:func:`decision_study`): per path (:data:`PATHS`: the panel alone, the defaults of
  ``src.predict`` and the served panel, the immune members, an aggregation-level disagreement rule, a stacker
  whose members' weights are bounded) and per attack class, generator and held-out, the attack success with
  cluster-bootstrap intervals; each path's clean κ and share escalated; the inherited flips with one LLM member
  attacked.

The items and their judging are :mod:`src.studies.injection.items`, the metrics per dataset
:mod:`src.studies.injection.metrics`, the decision path :mod:`src.studies.injection.path`; this module holds the
detector's rates and the study's document.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from src.core import detector
from src.core import injection as inj
from src.core.evaluate import interval
from src.core.names import metric_name
from src.io.datasets import read_items
from src.io.settings import Settings
from src.judges.config import instruction_immune, resolve_roster
from src.judges.runner import roster_judges
from src.studies.checked import configured
from src.studies.injection.items import (
    CLEAN,
    HELDOUT,
    STUDY_KEYS,
    cells,
    compute_command,
    judge,
    read_votes,
    settings,
    written_set,
)
from src.studies.injection.metrics import dataset_study
from src.studies.injection.path import PATHS, decision_study

log = logging.getLogger("raim.injection")


# ------------------------------------------------------------------------------------------------ detector


def detector_rates(grid: dict[str, dict], datasets_dir: Path, seed: int = 0) -> dict:
    """The detector on every clean item of every shipped set (per field, with the rules that fired) and on the
    study's items under every attack class of :data:`src.core.injection.ATTACKS`."""
    clean: dict[str, dict] = {}
    for path in sorted(Path(datasets_dir).glob("*.jsonl")):
        recs = read_items(path).to_dict("records")
        per: dict[str, dict] = {}
        for f in detector.SCANNED:
            texts = [r.get(f) for r in recs if isinstance(r.get(f), str) and r.get(f)]
            found = [detector.detect(t, f) for t in texts]
            reasons: dict[str, int] = {}
            for d in found:
                for r in d.reasons:
                    reasons[r] = reasons.get(r, 0) + 1
            n, k = len(texts), sum(d.flagged for d in found)
            per[f] = {"n": n, "flagged": k, "rate": k / n if n else None, "reasons": reasons}
        items = [detector.scan(r).flagged for r in recs]
        per["item"] = {"n": len(items), "flagged": int(sum(items)), "rate": float(np.mean(items)) if items else None}
        clean[path.stem] = per
    attacked: dict[str, dict] = {}
    for cell in grid.values():  # every class, not only the judged ones: the detector needs no model
        recs = cell["items"][CLEAN].to_dict("records")
        for a in inj.ATTACKS:
            hits = [detector.detect(it[inj.ATTACK_FIELD]).flagged for it in inj.attacked(recs, [a], seed)]
            cnt = attacked.setdefault(a, {"n": 0, "flagged": 0})
            cnt["n"] += len(hits)
            cnt["flagged"] += int(sum(hits))
    for a in attacked.values():
        a["rate"] = a["flagged"] / a["n"] if a["n"] else None
    return {"clean": clean, "attacked": attacked}


def written_recall(
    grid: dict[str, dict], attacks: Sequence[inj.WrittenAttack], n_boot: int, seed: int, level: float
) -> dict:
    """The detector's recall on an attack set written apart from the generator: every attack planted in every
    study item (:func:`src.core.injection.plant`), flagged by :func:`src.core.detector.scan`; per class and in all,
    the flagged share of (attack, item) pairs with a bootstrap interval over the attacks (the unit an attacker
    varies), and the number of attacks flagged in most items."""
    recs = [r for cell in grid.values() for r in cell["items"][CLEAN].to_dict("records")]
    hits = np.array([[detector.scan(inj.plant(r, a)).flagged for r in recs] for a in attacks], dtype=float)
    kinds = np.array([a.kind for a in attacks], dtype=object)
    out: dict[str, Any] = {}
    for name in [*sorted(set(kinds)), "all"]:
        rows = hits if name == "all" else hits[kinds == name]
        per = rows.mean(axis=1)
        rng = np.random.default_rng(seed)
        draws = per[rng.integers(0, len(per), size=(n_boot, len(per)))].mean(axis=1)
        out[name] = {
            "attacks": int(len(rows)),
            "pairs": int(rows.size),
            "flagged": int(rows.sum()),
            "rate": float(rows.mean()),
            "ci": interval(draws, level),
            "attacks_flagged": int((per > 0.5).sum()),
        }
    return out


# ------------------------------------------------------------------------------------------------ the study


def study(cfg: Settings, grid: dict[str, dict] | None = None) -> dict:
    """The study's document from the cached verdicts (judging nothing): per dataset, every member's, the
    stacked panel's and the majority's ASR and Δκ under each attack, per frame, the guarded − paper deltas, the
    aggregation contrasts; the detector's rates; the cells still missing and the command that judges them."""
    s = settings(cfg)
    grid = grid or cells(cfg)
    members = [n for n, _, _ in roster_judges(cfg.roster, include_frontier=False)]
    analysis, stacker = configured(cfg)
    tables, missing = read_votes(cfg, grid)
    doc: dict[str, Any] = {
        "settings": {k: s[k] for k in STUDY_KEYS},
        "roster": str(cfg.roster["name"]),
        "members": members,
        "stacker": cfg.node("stacker"),
        "features": list(analysis.features),
        "datasets": {},
    }
    for ds, per in tables.items():
        covered = {
            fk: {c: [m for m in members if m not in missing.get(ds, {}).get(fk, {}).get(c, {})] for c in conds}
            for fk, conds in per.items()
        }
        d = dataset_study(per, covered, members, stacker, analysis, s)
        d["frames"] = {fk: f.name for fk, f in grid[ds]["frames"].items()}
        d["frame_hashes"] = {fk: f.hash[:16] for fk, f in grid[ds]["frames"].items()}
        if ds in missing:
            d["missing"] = missing[ds]
        doc["datasets"][ds] = d
    doc["detector"] = detector_rates(grid, Path(cfg.paths.datasets_dir), int(s["seed"]))
    doc["detector"]["written"] = {
        name: written_recall(grid, written_set(s[name]), int(s["n_boot"]), int(s["seed"]), float(s["level"]))
        for name in ("dev", "heldout")
    }
    immune = instruction_immune(resolve_roster(cfg.roster, resolve=False))
    for ds, per in tables.items():
        block = {}
        for fk, conds in per.items():
            full = {c: t for c, t in conds.items() if not missing.get(ds, {}).get(fk, {}).get(c)}
            if CLEAN in full and len(full) > 1:
                block[fk] = decision_study(full, grid[ds]["items"], members, immune, stacker, analysis, s)
        doc["datasets"][ds]["decision"] = block
    doc["complete"] = not missing
    if missing:
        doc["command"] = compute_command(cfg, missing)
        log.warning("injection: verdicts missing in %d dataset(s); judge them with `%s`", len(missing), doc["command"])
    doc["headline"] = headline(doc)
    return doc


def compute(cfg: Settings) -> dict:
    """Config in, document out (the entry's ``compute``): judges the missing verdicts first when
    ``injection.compute`` is true (for at most ``injection.budget_s`` seconds), then :func:`study`."""
    grid = cells(cfg)
    node = cfg.injection
    if node.compute:
        judge(cfg, grid, node.budget_s, list(node.members) if node.members else None, progress=bool(node.progress))
    return study(cfg, grid)


def headline(doc: dict) -> dict:
    """Per dataset and attack: ASR of each member, the stacked panel and the majority, paper → guarded."""
    out: dict[str, dict] = {}
    for ds, d in doc["datasets"].items():
        per: dict[str, dict] = {}
        for j, frames in d["judges"].items():
            for fk, cell in frames.items():
                for a, v in cell.items():
                    if a == CLEAN:
                        continue
                    per.setdefault(a, {}).setdefault(j, {})[fk] = v["asr"]["estimate"]
        out[ds] = per
    return out


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f} %"


def statements(doc: dict) -> list[str]:
    """The study's findings in plain sentences (the report and the log)."""
    lines = []
    for ds, d in doc["datasets"].items():
        for a, per in doc["headline"].get(ds, {}).items():
            parts = [f"{j} {_pct(v.get('paper'))} → {_pct(v.get('guarded'))}" for j, v in per.items()]
            lines.append(f"{ds}, {a}: attack success (paper frame → guarded frame): " + "; ".join(parts))
        if d.get("missing"):
            lines.append(f"{ds}: verdicts still missing ({doc.get('command')})")
    for ds, d in doc["datasets"].items():
        for fk, block in d.get("decision", {}).items():
            for g in ("generator (all)", f"{HELDOUT} (all)"):
                parts = [
                    f"{p} {_pct((block['asr'][p].get(g) or {}).get('estimate'))}"
                    for p in PATHS
                    if block["asr"].get(p, {}).get(g)
                ]
                if parts:
                    lines.append(f"{ds}, {fk} frame, decision path under {g} attacks: " + "; ".join(parts))
    det = doc["detector"]
    for name, per in det.get("written", {}).items():
        lines.append(f"detector recall on the {name} set: {_pct(per['all']['rate'])} of (attack, item) pairs")
    att = ", ".join(f"{a} {_pct(v['rate'])}" for a, v in det["attacked"].items())
    clean = ", ".join(f"{ds} {_pct(v['item']['rate'])}" for ds, v in det["clean"].items())
    lines.append(f"detector: attacked items flagged: {att}; clean items flagged: {clean}")
    return lines


def flat_metrics(doc: dict) -> dict[str, float]:
    """The study's numbers as MLflow metrics: ``<set>/<frame>/<judge>/<attack>/{asr,kappa,delta_kappa}``, the
    defence's Δ and the detector's rates."""
    out: dict[str, float] = {}
    for ds, d in doc["datasets"].items():
        for j, frames in d["judges"].items():
            for fk, cell in frames.items():
                out[metric_name(ds, fk, j, CLEAN, "kappa")] = cell[CLEAN]["kappa"]["estimate"]
                for a, v in cell.items():
                    if a == CLEAN:
                        continue
                    out[metric_name(ds, fk, j, a, "kappa")] = v["kappa"]["estimate"]
                    out[metric_name(ds, fk, j, a, "delta_kappa")] = v["delta_kappa"]["estimate"]
                    if v["asr"]["estimate"] is not None:
                        out[metric_name(ds, fk, j, a, "asr")] = v["asr"]["estimate"]
        for j, per in d["defence"].items():
            for a, v in per.items():
                for m, dd in v.items():
                    if dd is not None:
                        out[metric_name(ds, "defence", j, a, m)] = dd["estimate"]
    for a, v in doc["detector"]["attacked"].items():
        if v["rate"] is not None:
            out[metric_name("detector", a, "flagged")] = v["rate"]
    for name, per in doc["detector"].get("written", {}).items():
        out[metric_name("detector", name, "recall")] = per["all"]["rate"]
    for ds, d in doc["datasets"].items():
        for fk, block in d.get("decision", {}).items():
            for path, groups in block["asr"].items():
                for g in ("generator (all)", f"{HELDOUT} (all)"):
                    v = (groups.get(g) or {}).get("estimate")
                    if v is not None:
                        out[metric_name(ds, fk, "decision", path, g.split()[0], "asr")] = v
            for path, v in block["clean"].items():
                out[metric_name(ds, fk, "decision", path, "kappa")] = v["kappa"]["estimate"]
                out[metric_name(ds, fk, "decision", path, "escalated")] = v["escalated"]
    for ds, v in doc["detector"]["clean"].items():
        if v["item"]["rate"] is not None:
            out[metric_name("detector", "clean", ds, "flagged")] = v["item"]["rate"]
    return {k: float(v) for k, v in out.items() if v is not None and np.isfinite(v)}
