"""A panel loaded for scoring new items, and the scoring itself: a logged stacker or panel model (rebuilt from its
document, :func:`src.mlops.packaging.load_model`) wrapped in a :class:`~src.mlops.serving.PanelModel` over its roster,
each item's prompt frame, and the items' member votes, p(hallucinated) and verdict through the verdict cache.

``src.predict`` (items files) and ``src.traces`` (an MLflow experiment's traces) both score through here.

Frames: a forced frame judges every item under that prompt frame; otherwise an item's own ``frame`` field, else
the frame the stacker was calibrated under (its run's ``frame`` tag, or its dataset's frame when that is ``auto``;
a panel model's default frame), else ``def_on`` for an item with a question and ``claim`` for one without."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from src.core.decide import ACTIONS
from src.core.errors import RaimError
from src.io.config import thaw
from src.io.datasets import DatasetError, dataset_spec
from src.io.raw import RawRecordError
from src.judges.config import load_roster
from src.judges.runner import verdict_table
from src.mlops.packaging import load_model
from src.mlops.registry import find_candidate
from src.mlops.serving import PanelModel, frame_configs, panel_roster
from src.mlops.store import quiet_mlflow


class PanelError(RaimError, ValueError):
    """A model or request that cannot be scored; one line naming the file, line and field where there is one."""


@dataclass
class Items:
    """Items as the panel model takes them, with where each came from (``file line n``) for errors."""

    frame: pd.DataFrame
    where: list[str]
    passed: pd.DataFrame = field(default_factory=pd.DataFrame)


@dataclass
class Panel:
    """A loaded panel: the model that scores, the frame its stacker was calibrated under, where it came from."""

    model: Any  # src.mlops.serving.PanelModel
    calibrated_frame: str | None
    uri: str
    cache_dir: Path | None = None


def assign_frames(items: Items, frames: Mapping[str, Any], forced: str | None, calibrated: str | None) -> Items:
    """Each item's prompt frame: ``forced``, else its own, else ``calibrated``, else by shape (see module doc)."""

    df = items.frame.copy()
    if forced is not None:
        df["frame"] = forced
    for i, (name, q) in enumerate(zip(df["frame"], df["question"])):
        if name is None or pd.isna(name):
            df.loc[i, "frame"] = calibrated or ("def_on" if q.strip() else "claim")
        elif name not in frames:
            raise RawRecordError(items.where[i], "frame", f"{name!r} not among {sorted(frames)}")
    return Items(df, items.where, items.passed)


def _run_tags(uri: str) -> dict[str, str]:
    """Tags of the run that logged the model at ``uri`` ({} when that run is not in this store)."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    try:
        run_id = mlflow.models.get_model_info(uri).run_id
        return dict(mlflow.get_run(run_id).data.tags) if run_id else {}
    except Exception:  # a local model folder, or a run from another store: no defaults from it
        return {}


def calibration_frame(tags: Mapping[str, str], frames: Mapping[str, Any]) -> str | None:
    """The frame a stacker's votes were judged under: its run's ``frame`` choice, or its dataset's frame
    (``frame=auto``); None when the run does not say."""

    name = tags.get("frame")
    if name in frames:
        return name
    if name == "auto" and tags.get("dataset"):
        try:
            spec = dataset_spec(tags["dataset"])
        except DatasetError:
            return None
        return spec.get("frame") if spec.get("frame") in frames else None
    return None


def _load(uri: str):
    """The RAIM stacker or panel model behind ``uri``, rebuilt from its document alone
    (:func:`src.mlops.packaging.load_model`: nothing unpickled or imported, a registered version's digest
    compared); one line for an unknown URI or a model RAIM will not read."""
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s

    try:
        with quiet_mlflow():
            return load_model(uri)
    except (MlflowException, OSError) as e:
        why = e.message if isinstance(e, MlflowException) else str(e)
        raise PanelError(f"cannot load model {uri!r}: {' '.join(why.split())[:300]}") from e


def _roster(name: str | None, tags: Mapping[str, str], uri: str) -> dict:

    name = name or tags.get("roster")
    if not name:
        raise PanelError(
            f"the run of {uri} names no roster; pass --roster NAME (the roster the stacker was fitted with)"
        )
    return thaw(load_roster(name))


def load_panel(uri: str, roster: str | None = None) -> Panel:
    """A :class:`~src.mlops.serving.PanelModel` for ``uri``: a panel model as logged, or a stacker over ``roster``'s
    members (default: the roster its run was tagged with)."""

    inner = _load(uri)
    if type(inner).__name__ == "PanelModel":
        if roster:
            raise PanelError(
                f"{uri} is a panel model: it carries its roster "
                f"({[m['name'] for m in inner.roster['members']]}); drop --roster"
            )
        cache = inner.config.get("cache_dir")
        return Panel(inner, inner.default_frame, uri, Path(cache) if cache else None)
    tags = _run_tags(uri)
    decision = getattr(inner, "decision", None) or tag_decision(tags)  # an older stacker: its run's tags
    frames = frame_configs()
    chosen = _roster(roster, tags, uri)  # its own errors already say what to pass
    try:  # no frontier: it never votes
        members = panel_roster(chosen, inner.columns, inner.stacker.n_votes, drop_frontier=True)
    except RaimError as e:
        raise PanelError(f"{e}; pass --roster with the roster it was fitted on") from None
    calibrated = calibration_frame(tags, frames)
    model = PanelModel(members, frames, calibrated or "claim", inner.stacker, inner.columns, decision)
    return Panel(model, calibrated, uri)


def tag_decision(tags: Mapping[str, str]) -> dict | None:
    """The deployment decision a stacking run's tags record (``decision``, ``decision_member``,
    ``decision_reason``: :func:`src.mlops.tracking.decision_tags`); None when the run has none."""
    action = tags.get("decision")
    if action not in ACTIONS:
        return None
    member = tags.get("decision_member")
    label = ACTIONS[action] + (f" {member}" if member and member != "none" else "")
    return {"action": action, "label": label, "reason": tags.get("decision_reason", "")}


def stacker_uri(run_id: str, dataset: str | None) -> str:
    """The stacker of a stacking run (its ``dataset`` child when the run is an analysis' parent)."""

    return find_candidate(run_id, dataset).model_uri


# ---------------------------------------------------------------------------------------------- predict


def predict(
    panel: Panel,
    items: Items,
    cache_dir: str | Path,
    compute: bool = True,
    progress: bool = True,
    engine: Any = None,
    require_cached: bool = True,
) -> tuple[pd.DataFrame, dict]:
    """Each item's frame, member votes (null = abstained), ``p_hallucinated``, ``verdict``, ``label`` and
    ``uncached``; and the per-member verdict-cache report (``computed``: judged now, the rest were cached).
    ``engine``: where the misses are scored (:func:`src.judges.ray_engine.engine_from_args`; None: here).
    ``require_cached``: refuse a request none of whose items has a cached verdict (else each is ``uncached``)."""
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s

    model, cache_dir = panel.model, Path(cache_dir)
    raw = items.frame
    report: dict = {}
    if compute:  # score the misses first (progress bars); the panel below then reads every vote from the cache
        table = verdict_table(
            model.roster, model.items(raw), model.frames, cache_dir, compute=True, progress=progress, engine=engine
        )
        report = table.attrs["report"]
    try:
        out = model.predict(None, raw, params={"cache_dir": str(cache_dir), "compute": False})
    except MlflowException as e:
        raise PanelError(e.message) from e
    if require_cached and not any(r["cached"] for r in getattr(model, "last_report", {}).values()):
        raise PanelError(
            f"none of the {len(raw)} items has a cached verdict of any member under {cache_dir}; "
            f"run without --no-compute to judge them"
        )
    report = report or getattr(model, "last_report", {})
    out.insert(1, "frame", raw["frame"].to_numpy())
    if not items.passed.empty:
        out = pd.concat([out.iloc[:, :2], items.passed.reset_index(drop=True), out.iloc[:, 2:]], axis=1)
    return out, report
