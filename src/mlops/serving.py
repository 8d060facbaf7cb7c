"""MLflow pyfunc models that RAIM serves.

* :class:`StackerModel` wraps a fitted :class:`src.core.aggregate.StackedLogit` (the per-dataset meta-learner of §2).
  Input: one column per panel member holding its verdict (1 = hallucinated, 0 = supported, 0.5 or null =
  abstained). Output: ``p_hallucinated`` (the stacker's probability), ``verdict`` (1 iff p ≥ threshold) and
  ``label``. This is what ``mlflow models serve`` answers.
* :class:`PanelModel` takes raw items (question, evidence, candidate), runs the configured roster's judges
  through the verdict cache (a hit never loads a model) and stacks their verdicts with a fitted stacker.

Each is logged with its document (:mod:`src.mlops.artifact`, :func:`document_of`): RAIM's own commands rebuild
a model from that JSON alone (:func:`load_model`), never from the pickle MLflow keeps for ``mlflow models serve``.
``python -m src.serve model`` serves either behind MLflow's scoring server with strict inputs
(:class:`StrictInputs`). Logging and registering them is :mod:`src.mlops.tracking`'s and :mod:`src.mlops.registry`'s: both
import this module, which imports neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
import yaml

from src.core.errors import ArgumentParser, RaimError, one_line, one_line_message
from src.core.injection import DEFAULT_DEFENCE, ESCALATED, check_defence, defended, flag_column, immune_design
from src.core.priorshift import PrevalenceError, parse_setting, served
from src.core.textfiles import StrictJSONError, loads_strict, normal_id
from src.core.verdicts import ABSTAIN
from src.io.flagstore import record_flags_from
from src.io.modules import closure
from src.io.paths import CONF_DIR, PACKAGE_DIR, ROOT
from src.io.votestore import DEFAULT_ON_FAILURE, FAILURE_ENV, ON_FAILURE, on_failure, record_from, store_path
from src.judges.cache import item_content_hash
from src.judges.config import instruction_immune, resolve_roster
from src.judges.runner import verdict_table
from src.mlops import artifact
from src.mlops.limits import MIB, Disconnected, Limits, RequestRefused, read_body, reply, timed_protocol
from src.mlops.redact import persistable, resolved

SCORED_CACHE = ROOT / "verdicts" / "scored"  # new items' verdicts: not the committed benchmark cache (a DVC dependency)
OUTPUT_COLUMNS = ("p_hallucinated", "verdict", "label", "train_prevalence")
ITEM_INPUT = ("item_id", "question", "evidence", "candidate")
PANEL_OPTIONAL = ("question", "evidence", "item_id", "frame", "dataset")


class InputError(RaimError, ValueError):
    """A scoring request that does not match the model's inputs; one line naming the row and the column."""


def check_columns(given: Iterable[str], columns: list[str], where: str = "") -> None:
    """Exactly the model's columns: an unknown (e.g. misspelt) or a missing member column is an error; a member
    that abstained is given as null or 0.5, never by leaving its column out."""
    given = list(given)
    unknown = [c for c in given if c not in columns]
    missing = [c for c in columns if c not in given]
    if unknown or missing:
        parts = ([f"unknown column(s) {unknown}"] if unknown else []) + (
            [f"missing column(s) {missing}"] if missing else []
        )
        raise InputError(
            f"{where}{' and '.join(parts)}; the model takes exactly {columns} (a member that abstained: null or 0.5)"
        )


def _number(v: Any) -> float | None:
    """A JSON/pandas scalar as a float; None for a null; raises TypeError for anything else."""
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError
    return float(v)


def votes_from_rows(rows: list[Mapping[str, Any]], columns: list[str], n_votes: int | None = None) -> np.ndarray:
    """The stacker's input matrix from request rows (1-based row numbers in every error): a vote is 0, 1, or
    0.5 / null (abstained); columns past ``n_votes`` are continuous features (finite numbers, never null)."""

    k = len(columns) if n_votes is None else n_votes
    if not rows:
        raise InputError("no rows to score")
    X = np.empty((len(rows), len(columns)))
    for r, row in enumerate(rows, 1):
        if not isinstance(row, Mapping):
            raise InputError(f"row {r}: expected an object of member columns, got {type(row).__name__}")
        check_columns(row.keys(), columns, f"row {r}: ")
        for j, c in enumerate(columns):
            try:
                x = _number(row[c])
            except TypeError:
                x = "bad"
            vote_ok = x is None or x in (0.0, 1.0, ABSTAIN)
            if (j < k and not vote_ok) or (j >= k and (x is None or x == "bad" or not np.isfinite(x))):
                want = "a vote: 0, 1, or 0.5 / null (abstained)" if j < k else "a finite number"
                shown = f"{x:g}" if isinstance(x, float) else repr(row[c])[:40]
                raise InputError(f"row {r}: column {c!r}: {shown} is not {want}")
            X[r - 1, j] = ABSTAIN if x is None else x
    return X


def vote_matrix(frame: pd.DataFrame, columns: list[str], n_votes: int | None = None) -> np.ndarray:
    """:func:`votes_from_rows` over a DataFrame (its columns checked first: exactly the model's)."""
    if not isinstance(frame, pd.DataFrame):
        frame = pd.DataFrame(frame)
    check_columns(frame.columns, columns)
    return votes_from_rows(frame.to_dict("records"), columns, n_votes)


def stacked_output(stacker, X: np.ndarray, prevalence: Any = None) -> pd.DataFrame:
    """p(hallucinated), verdict and label per row; a row where every member abstained has no verdict: its
    p and verdict are null and its label is ``abstained`` (the intercept alone is not an answer).
    ``train_prevalence``: the hallucinated share the row's p assumes (the stacker's training prevalence, or the
    corrected prevalence), what :mod:`src.studies.estimate` needs for its label-free EM estimate.
    ``prevalence`` (the inference parameter): p under that deployment prevalence, or ``"estimate"`` its EM
    estimate over the batch's answered rows (:func:`src.studies.prevalence.served`); the verdict is then corrected
    p ≥ threshold. ``attrs``: the prevalence used and the uncorrected p."""

    k = X.shape[1] if stacker.n_votes is None else stacker.n_votes
    none = (X[:, :k] == ABSTAIN).all(axis=1)
    p_fit = stacker.predict_proba(X)[:, 1]
    p = p_fit.copy()
    try:
        p[~none], used = served(p_fit[~none], stacker, prevalence)
    except PrevalenceError as e:
        raise _invalid(InputError(str(e))) from None
    verdict = (p >= stacker.threshold).astype(int)
    label = np.where(none, "abstained", np.where(verdict == 1, "hallucinated", "supported"))
    fitted = getattr(stacker, "train_prevalence_", None)  # None: a stacker fitted before RAIM recorded it
    prior = used if used is not None else fitted
    out = pd.DataFrame(
        {
            "p_hallucinated": pd.array(np.where(none, np.nan, p), dtype="Float64"),
            "verdict": pd.array([pd.NA if n else int(v) for n, v in zip(none, verdict)], dtype="Int64"),
            "label": label,
            "train_prevalence": pd.array([prior] * len(p), dtype="Float64"),
        }
    )
    out.attrs.update(prevalence=used, p_uncorrected=np.where(none, np.nan, p_fit), train_prevalence=fitted)
    return out


def _invalid(e: InputError):
    """An MLflow error the scoring server answers with HTTP 400 and this one line (no stack trace)."""
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE  # imported here, not at start-up: mlflow ~1.8 s

    return MlflowException(str(e), error_code=INVALID_PARAMETER_VALUE)


def _unavailable(message: str):
    """An MLflow error the scoring server answers with HTTP 503 and this one line."""
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE  # imported here, not at start-up: mlflow ~1.8 s

    return MlflowException(message, error_code=TEMPORARILY_UNAVAILABLE)


def run_decision(decision: Mapping[str, Any] | None) -> dict | None:
    """The deployment decision of the run that fitted a stacker (:mod:`src.core.decide`: ``action`` panel /
    single / none, its ``label`` and ``reason``), as a model carries it; None when unknown."""
    if not decision or not decision.get("action"):
        return None
    return {k: (None if decision.get(k) is None else str(decision[k])) for k in ("action", "label", "reason")}


def decision_warning(decision: Mapping[str, Any] | None) -> str | None:
    """One line when a model's own run did not decide to deploy the panel (§3.3: an inadmissible panel, or one
    that does not pay against the CV-best single judge, is not a deployment); None when it did, or is unknown."""
    d = run_decision(decision)
    if d is None or d["action"] == "panel":
        return None
    return (
        f"this model's run decided {d['label']!r}, not 'deploy the panel' ({d['reason']}); its verdicts are "
        f"not a deployment RAIM recommends (each output row says so in 'run_decision')"
    )


def mark_decision(out: pd.DataFrame, decision: Mapping[str, Any] | None) -> pd.DataFrame:
    """``out`` with a ``run_decision`` column (the run's decision label) when that run did not decide to deploy
    the panel; unchanged otherwise (a promoted model always did)."""
    if decision_warning(decision) is not None:
        out["run_decision"] = run_decision(decision)["label"]
    return out


class StackerModel(mlflow.pyfunc.PythonModel):
    """A fitted stacker over member verdicts → p(hallucinated) and the verdict.

    ``decision``: the deployment decision of the run that fitted it (:func:`run_decision`); when it is not
    "deploy the panel", every output row carries it in a ``run_decision`` column."""

    _skip_type_hint_validation = True  # the explicit signature validates inputs (MLflow warns otherwise)

    def __init__(self, stacker, columns: list[str], decision: Mapping[str, Any] | None = None):
        self.stacker = stacker
        self.columns = list(columns)
        self.decision = run_decision(decision)

    def __getstate__(self) -> dict:
        return persistent_state(self)

    def predict(self, context, model_input, params: dict[str, Any] | None = None) -> pd.DataFrame:
        try:
            X = vote_matrix(model_input, self.columns, self.stacker.n_votes)
        except InputError as e:
            raise _invalid(e) from None
        out = stacked_output(self.stacker, X, (params or {}).get("prevalence"))
        why = record_votes(params, "stacker", self.columns, X, self.stacker.n_votes, out)
        out = monitored(self, params, out, why)
        return mark_decision(out, getattr(self, "decision", None))  # a model pickled before it carried one: None


TRANSIENT = ("_live_roster", "_monitor_health")  # a model's per-process state, never pickled


def persistent_state(model) -> dict:
    """A served model's attributes as pickled: without its :data:`TRANSIENT` state (a resolved secret, the
    monitor's counts of this process)."""
    return {k: v for k, v in model.__dict__.items() if k not in TRANSIENT}


class MonitorHealth:
    """What a served model's monitor recorded in this process: rows recorded and not recorded, requests whose
    rows were lost, the last failure and whether the last attempt failed (:meth:`doc`: what ``/health``
    answers). Thread-safe: MLflow's server predicts in worker threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.store: str | None = None
        self.recorded = self.unrecorded = self.failed_requests = 0
        self.last_error: str | None = None
        self.failing = False

    def note(self, store: Path, rows: int, why: str | None) -> None:
        with self.lock:
            self.store, self.failing = str(store), why is not None
            if why is None:
                self.recorded += rows
            else:
                self.unrecorded += rows
                self.failed_requests += 1
                self.last_error = why

    def doc(self, config: Mapping[str, Any] | None = None) -> dict:
        """``status`` ("ok", "degraded": the last recording failed; "off": no store named) and the counts."""
        path = store_path(config)
        with self.lock:
            status = "off" if path is None else "degraded" if self.failing else "ok"
            return {
                "status": status,
                "store": str(path) if path is not None else None,
                "on_failure": on_failure(config),
                "recorded_rows": self.recorded,
                "unrecorded_rows": self.unrecorded,
                "failed_requests": self.failed_requests,
                "last_error": self.last_error,
            }


_HEALTH_LOCK = threading.Lock()


def monitor_health(model) -> MonitorHealth:
    """``model``'s :class:`MonitorHealth` in this process (created at its first use)."""
    with _HEALTH_LOCK:
        if not isinstance(model.__dict__.get("_monitor_health"), MonitorHealth):
            model.__dict__["_monitor_health"] = MonitorHealth()
        return model.__dict__["_monitor_health"]


def monitored(model, config: Mapping[str, Any] | None, out: pd.DataFrame, why: str | None) -> pd.DataFrame:
    """``out`` after the monitor's attempt to record its rows (``why``: why they were not recorded, None when
    they were or recording is off), counted in the model's :class:`MonitorHealth`. Rows not recorded: under
    ``monitor_on_failure: answer`` (the default) each output row says so in a ``monitor`` column; under
    ``refuse`` the request fails with HTTP 503 (:func:`src.io.votestore.on_failure`)."""
    path = store_path(config)
    if path is None:
        return out
    monitor_health(model).note(path, len(out), why)
    if why is None:
        return out
    if on_failure(config) == "refuse":
        raise _unavailable(
            f"monitor store {path}: the {len(out)} row(s) of this request could not be recorded ({why}); this "
            "server answers only what it records (monitor_on_failure: refuse)"
        )
    out["monitor"] = f"not recorded: {why}"
    return out


def failure_line(e: BaseException) -> str:
    """Why a recording failed, in one line: the exception's type and message."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def record_votes(
    config: Mapping[str, Any] | None,
    kind: str,
    columns: list[str],
    X: np.ndarray,
    n_votes: int | None,
    out: pd.DataFrame,
    item_ids: list | None = None,
) -> str | None:
    """Live monitoring (:mod:`src.studies.monitor`): the scored items' member votes (never the text) and
    the stacker's p(hallucinated) as fitted (before any prevalence correction) go to the store named by the panel
    model's config ``monitor_store`` or ``$RAIM_MONITOR_STORE``; off when neither is set. A failure to record is
    logged and returned (why, in one line), never raised here: :func:`monitored` decides what the answer says."""

    k = len(columns) if n_votes is None else n_votes
    try:
        record_from(
            config,
            kind,
            columns[:k],
            np.asarray(X, dtype=float)[:, :k],
            out.attrs["p_uncorrected"],
            item_ids,
            out.attrs.get("train_prevalence"),
        )
    except Exception as e:  # noqa: BLE001 - a failure to record is counted and answered by `monitored`
        logging.getLogger("raim.serve").warning(
            "monitor: votes of %d item(s) not recorded (%s: %s)", len(X), type(e).__name__, e
        )
        return failure_line(e)
    return None


class PanelModel(mlflow.pyfunc.PythonModel):
    """Raw items → the roster's judges (through the verdict cache) → the stacked verdict.

    Input columns: ``candidate`` (required), ``question``, ``evidence``, ``item_id``, ``frame``, ``dataset``.
    An item without ``item_id`` gets one from its content, so a repeated item is a cache hit; an item without
    ``frame`` is scored under the model's default frame. ``model_config`` (overridable at load time):
    ``cache_dir`` (the verdict cache), ``compute`` (score cache misses; False: a miss is an abstention, named in
    the ``uncached`` output column). Output: ``item_id``, one column per member (its vote; null = abstained),
    ``p_hallucinated``, ``verdict``, ``label``, ``uncached`` (comma-separated members whose verdict was neither
    cached nor computed; empty when every member judged), ``injection_flag`` / ``injection_reasons``
    (:func:`src.core.injection.scan`: the item's text looks like a prompt injection aimed at the judges). The
    roster holds exactly the members the stacker votes with, in its column order. ``decision``: that of the
    stacker's run, as in :class:`StackerModel` (a ``run_decision`` column when it is not "deploy the panel").

    The roster is kept as :func:`src.mlops.redact.persistable` makes it: a secret stays the reference it is in
    the roster (``${oc.env:RAIM_OPENAI_API_KEY,null}``), so the pickled model holds no key; it is resolved from
    the serving environment when the model is loaded (:meth:`load_context`, or at the first prediction of a
    model built in-process) and that resolved copy is never pickled.
    """

    _skip_type_hint_validation = True

    def __init__(
        self,
        roster: dict,
        frames: dict[str, dict],
        default_frame: str,
        stacker,
        columns: list[str],
        decision: Mapping[str, Any] | None = None,
    ):
        self.roster = roster
        self.frames = frames
        self.default_frame = default_frame
        self.stacker = stacker
        self.columns = list(columns)
        self.config: dict = {}
        self.decision = run_decision(decision)

    def load_context(self, context) -> None:
        self.config = dict(getattr(context, "model_config", None) or {})
        self._live_roster = resolved(self.roster, f"panel model (roster {self.roster.get('name')!r})")

    def live_roster(self) -> dict:
        """The roster with its references resolved from this process's environment."""
        if getattr(self, "_live_roster", None) is None:
            self._live_roster = resolved(self.roster, f"panel model (roster {self.roster.get('name')!r})")
        return self._live_roster

    def __getstate__(self) -> dict:
        return persistent_state(self)  # never pickle a resolved key

    def items(self, frame: pd.DataFrame) -> pd.DataFrame:

        df = pd.DataFrame(frame).copy()
        unknown = [c for c in df.columns if c not in ("candidate", *PANEL_OPTIONAL)]
        if unknown:
            raise InputError(
                f"unknown column(s) {unknown}; a panel model takes 'candidate' and optionally {list(PANEL_OPTIONAL)}"
            )
        if "candidate" not in df:
            raise InputError("each item needs a 'candidate' (the text to judge)")
        check_item_cells(df, self.frames)
        bad = df["candidate"].isna() | (df["candidate"].astype(str).str.strip() == "")
        if bad.any():
            raise InputError(f"row {int(np.flatnonzero(bad.to_numpy())[0]) + 1}: column 'candidate': empty")
        for c in ("question", "evidence"):
            if c not in df:
                df[c] = ""
            df[c] = df[c].fillna("").astype(str)
        ids = [f"item-{item_content_hash(r)}" for r in df[["question", "evidence", "candidate"]].to_dict("records")]
        df["item_id"] = df["item_id"].fillna(pd.Series(ids)).astype(str).map(normal_id) if "item_id" in df else ids
        df["frame"] = df["frame"].fillna(self.default_frame) if "frame" in df else self.default_frame
        df["dataset"] = df["dataset"].fillna("served") if "dataset" in df else "served"
        df["cluster_id"] = df["item_id"]
        first: dict[str, int] = {}
        for r, i in enumerate(df["item_id"], 1):
            if first.setdefault(i, r) != r:
                raise InputError(
                    f"row {r}: column 'item_id': {i!r} repeats row {first[i]} (one request scores an "
                    "item once; without an item_id, an item's id is its content's hash)"
                )
        return df

    def predict(self, context, model_input, params: dict[str, Any] | None = None) -> pd.DataFrame:

        cfg = {**self.config, **(params or {})}
        try:
            items = self.items(model_input)
        except InputError as e:
            raise _invalid(e) from None
        compute = bool(cfg.get("compute", True))
        table = verdict_table(
            self.live_roster(),
            items,
            self.frames,
            Path(cfg.get("cache_dir", SCORED_CACHE)),
            compute=compute,
            progress=False,
            allow_empty=not compute,
        )  # a miss abstains
        self.last_report = table.attrs.get("report", {})
        votes = table[self.columns].reset_index(drop=True)  # nullable: an abstention is null, never NaN
        X = vote_matrix(votes.astype("Float64").astype(float), self.columns, self.stacker.n_votes)
        out = stacked_output(self.stacker, X, cfg.get("prevalence"))
        cached = table.attrs.get("cached", {})
        out["uncached"] = [",".join(m for m in cached if not cached[m][i]) for i in range(len(out))]
        why = record_votes(cfg, "panel", self.columns, X, self.stacker.n_votes, out, items["item_id"].tolist())
        out["injection_flag"], out["injection_reasons"] = flag_column(items.to_dict("records"))
        why = record_injection_flags(cfg, items["item_id"].tolist(), out) if why is None else why
        policy = check_defence(cfg.get("injection_defence", DEFAULT_DEFENCE), "panel model config injection_defence")
        out = defend(out, X, self.stacker, instruction_immune(self.roster), policy)
        out = mark_decision(monitored(self, cfg, out, why), getattr(self, "decision", None))
        return pd.concat([items[["item_id"]].reset_index(drop=True), votes, out], axis=1)


def defend(out: pd.DataFrame, X: np.ndarray, stacker, immune: list[bool], policy: str) -> pd.DataFrame:
    """The decision path's defence (:func:`src.core.injection.defended`) on a panel's output: a flagged item
    (``injection_flag``) is escalated — no p, no verdict, label ``escalated`` —, or decided by the members no
    instruction can address (``immune``: the stacker on :func:`src.core.injection.immune_design`), or decided as
    any item (``off``). ``injection_action`` says which: ``escalated``, ``immune``, ``flagged`` (off), '' (not
    flagged)."""
    flagged = out["injection_flag"].to_numpy(dtype=bool)
    out["injection_action"] = ""
    if not flagged.any():
        return out
    if policy == "off":
        out.loc[flagged, "injection_action"] = "flagged"
        return out
    k = stacker.n_votes or X.shape[1]
    alt = None
    if policy == "immune" and any(immune):
        alt_out = stacked_output(stacker, immune_design(X, immune, k))
        alt = alt_out["verdict"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    verdict, escalated = defended(
        out["verdict"].astype("Float64").to_numpy(dtype=float, na_value=np.nan), flagged, policy, alt
    )
    by_immune = flagged & ~escalated
    if by_immune.any():
        out.loc[by_immune, "p_hallucinated"] = alt_out["p_hallucinated"][by_immune].to_numpy()
        out.loc[by_immune, "verdict"] = [int(v) for v in verdict[by_immune]]
        out.loc[by_immune, "label"] = np.where(verdict[by_immune] == 1, "hallucinated", "supported")
        out.loc[by_immune, "injection_action"] = "immune"
    out.loc[escalated, "p_hallucinated"] = pd.NA
    out.loc[escalated, "verdict"] = pd.NA
    out.loc[escalated, "label"] = ESCALATED
    out.loc[escalated, "injection_action"] = ESCALATED
    return out


def record_injection_flags(config: Mapping[str, Any] | None, item_ids: list, out: pd.DataFrame) -> str | None:
    """The items' injection flags to the monitor's store (:mod:`src.io.flagstore`), as the votes
    (:func:`record_votes`: why not, or None)."""
    try:
        record_flags_from(config, "panel", item_ids, out["injection_flag"].tolist(), out["injection_reasons"].tolist())
    except Exception as e:  # noqa: BLE001 - a failure to record is counted and answered by `monitored`
        logging.getLogger("raim.serve").warning("monitor: injection flags not recorded (%s: %s)", type(e).__name__, e)
        return failure_line(e)
    return None


def check_item_cells(df: pd.DataFrame, frames: Mapping[str, Any]) -> None:
    """A panel request's cells: ``candidate``, ``question``, ``evidence`` and ``dataset`` are texts (a number or a
    list is not judged as its printed form), ``item_id`` a text or an integer, ``frame`` one of the model's
    frames; all but ``candidate`` may be null. The first bad cell is an :class:`InputError` naming row and column."""
    kinds = {
        "candidate": (str,),
        "question": (str,),
        "evidence": (str,),
        "dataset": (str,),
        "frame": (str,),
        "item_id": (str, int, np.integer),
    }
    for c, ok in kinds.items():
        if c not in df:
            continue
        for r, v in enumerate(df[c].tolist(), 1):
            if v is None or (isinstance(v, float) and np.isnan(v)):
                continue
            if isinstance(v, bool) or not isinstance(v, ok):
                want = "a text or an integer" if c == "item_id" else "a text"
                raise InputError(f"row {r}: column {c!r}: {type(v).__name__} {str(v)[:40]!r} is not {want}")
            if c == "frame" and v not in frames:
                raise InputError(
                    f"row {r}: column 'frame': {v[:60]!r} is not one of the model's frames {sorted(frames)}"
                )


def panel_signature(columns: list[str], n_votes: int):
    from mlflow.models import ModelSignature  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.types import ColSpec, Schema  # imported here, not at start-up: mlflow ~1.8 s

    inputs = Schema([ColSpec("string", "candidate")] + [ColSpec("string", c, required=False) for c in PANEL_OPTIONAL])
    outputs = Schema(
        [ColSpec("string", "item_id")]
        + [ColSpec("long" if j < n_votes else "double", c, required=False) for j, c in enumerate(columns)]
        + list(stacker_signature(columns, n_votes).outputs.inputs)
        + [ColSpec("string", "uncached")]
        + [ColSpec("boolean", "injection_flag"), ColSpec("string", "injection_reasons")]
        + [ColSpec("string", "injection_action")]
    )
    return ModelSignature(inputs=inputs, outputs=outputs, params=inference_params())


def frame_configs() -> dict[str, dict]:
    """Every prompt frame under conf/frame, as plain data (baked into a panel model)."""

    out = {}
    for p in sorted((CONF_DIR / "frame").glob("*.yaml")):
        node = yaml.safe_load(p.read_text())
        if isinstance(node, dict) and node.get("name", p.stem) != "auto":
            out[p.stem] = node
    return out


def panel_roster(
    roster: Mapping[str, Any], columns: list[str], n_votes: int | None, drop_frontier: bool = False
) -> dict:
    """``roster`` cut to exactly the members the stacker votes with, in its column order (e.g. on a dataset where
    some members never voted, they are not inputs); names the stacker columns the roster lacks. The roster is
    checked first and its ``drop_members`` applied (:func:`src.judges.config.resolve_roster`)."""
    roster = resolve_roster(roster, resolve=False)
    votes = list(columns[: n_votes or len(columns)])
    by_name = {m["name"]: m for m in roster["members"]}
    absent = [c for c in votes if c not in by_name]
    if absent:
        raise RaimError(
            f"the stacker votes with member(s) {absent} that roster {roster.get('name')!r} does not have "
            f"(its members: {list(by_name)})"
        )
    kept = {k: v for k, v in roster.items() if not (drop_frontier and k == "frontier")}
    return {**kept, "members": [by_name[c] for c in votes]}


def log_panel(
    roster: dict,
    stacker,
    columns: list[str],
    default_frame: str = "claim",
    cache_dir: str | Path | None = None,
    compute: bool = True,
    name: str = "panel",
    decision: Mapping[str, Any] | None = None,
    injection_defence: str = DEFAULT_DEFENCE,
):
    """Log a :class:`PanelModel` (roster + frames + fitted stacker) in the active run; returns ``ModelInfo``.
    ``injection_defence``: what it does with an item flagged as a prompt injection (:data:`src.core.injection.
    DEFENCES`; its model config, which the scoring requests cannot change).
    The roster is logged unresolved where it holds a secret (:func:`src.mlops.redact.persistable`); one that
    holds a secret as a value is refused (:class:`src.mlops.redact.SecretInConfig`)."""

    roster = persistable(roster, f"roster {roster.get('name')!r}")  # the pickled model holds no secret
    roster = panel_roster(roster, columns, stacker.n_votes)
    members = [m["name"] for m in roster["members"]]
    frames = frame_configs()
    if default_frame not in frames:
        raise ValueError(f"default frame {default_frame!r} not among {sorted(frames)}")
    example = pd.DataFrame(
        {
            "question": [""],
            "evidence": ["Paris is the capital of France."],
            "candidate": ["The capital of France is Paris."],
        }
    )
    config = {
        "cache_dir": str(Path(cache_dir or SCORED_CACHE).resolve()),
        "compute": bool(compute),
        "monitor_store": "",  # "": $RAIM_MONITOR_STORE
        "injection_defence": check_defence(injection_defence, "injection_defence"),
    }
    model = PanelModel(roster, frames, default_frame, stacker, columns, decision)
    model.config = dict(config)  # its document (document_of) records the config it is logged with
    return _log_pyfunc(
        name,
        model,
        panel_signature(list(columns), stacker.n_votes or len(columns)),
        example,
        model_config=config,
        metadata={
            "roster": roster.get("name"),
            "members": members,
            "default_frame": default_frame,
            **_decision_metadata(decision),
        },
    )


def _decision_metadata(decision: Mapping[str, Any] | None) -> dict:
    d = run_decision(decision)
    return {"run_decision": d["label"], "run_decision_action": d["action"]} if d else {}


@contextlib.contextmanager
def _pins_from_this_environment() -> Iterator[None]:
    """MLflow checks a model's pinned requirements against the environment when it saves the model and again when
    it loads it back to validate the input example, rebuilding a map of every installed package to do it (~1.5 s
    of a ``src.run`` that logs four stackers). RAIM's pins are read from this interpreter
    (:func:`pip_requirements`), so while RAIM logs its own models that check cannot find a mismatch and is skipped
    (tests/test_track.py checks the pins against the installed distributions). Loading a model anywhere else
    still runs it."""
    import mlflow.pyfunc  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.utils import environment  # imported here, not at start-up: mlflow ~1.8 s

    modules = [m for m in (environment, mlflow.pyfunc) if hasattr(m, "warn_dependency_requirement_mismatches")]
    checks = [m.warn_dependency_requirement_mismatches for m in modules]
    try:
        for m in modules:
            m.warn_dependency_requirement_mismatches = lambda requirements: None
        yield
    finally:
        for m, check in zip(modules, checks):
            m.warn_dependency_requirement_mismatches = check


@contextlib.contextmanager
def code_tree(modules: Iterable[str] | None) -> Iterator[str]:
    """A folder shaped like this package holding the source files ``modules`` need (:func:`src.io.modules.closure`:
    their import closure), linked where the file system allows, else copied, for a model's ``code_paths``;
    ``None``: the whole package."""
    if modules is None:
        yield str(PACKAGE_DIR)
        return
    with tempfile.TemporaryDirectory(prefix="raim-code-") as tmp:
        for path in closure(modules):
            dest = Path(tmp) / path.relative_to(PACKAGE_DIR.parent)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, dest)
            except OSError:
                shutil.copy2(path, dest)
        yield str(Path(tmp) / PACKAGE_DIR.name)


def _log_pyfunc(name: str, model, signature, example: pd.DataFrame, code: Iterable[str] | None = None, **kwargs):
    """``pyfunc.log_model`` with RAIM's pins, and the model's document (:mod:`src.mlops.artifact`: what RAIM's own
    commands read, never the pickle) as its artifact ``raim_model.json``, its sha256 a tag of the logged model.
    Pickled objects refer to ``src.*``, so for ``mlflow models serve`` the model ships the package's code: the
    modules ``code`` needs (:func:`code_tree`), or the whole package (``None``: the panel, whose judges read the
    package's files)."""
    from mlflow.tracking import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

    with _pins_from_this_environment(), code_tree(code) as code_path, tempfile.TemporaryDirectory() as tmp:
        doc = artifact.write(document_of(model), tmp)
        info = mlflow.pyfunc.log_model(
            name=name,
            python_model=model,
            code_paths=[code_path],
            artifacts={"raim_model": str(doc)},
            signature=signature,
            input_example=example,
            pip_requirements=pip_requirements(),
            **kwargs,
        )
        MlflowClient().set_logged_model_tags(info.model_id, {artifact.DIGEST_TAG: artifact.sha256(doc.read_bytes())})
    return info


def document_of(model: StackerModel | PanelModel) -> artifact.ModelDocument:
    """A RAIM model's document (:mod:`src.mlops.artifact`): what :func:`model_from` rebuilds it from."""
    common = {
        "format": artifact.FORMAT,
        "version": 1,
        "columns": list(model.columns),
        "stacker": artifact.stacker_state(model.stacker),
        "decision": getattr(model, "decision", None),
    }
    if isinstance(model, StackerModel):
        return artifact.ModelDocument(kind="stacker", **common)
    config = artifact.PanelConfig(
        cache_dir=str(model.config.get("cache_dir", SCORED_CACHE)),
        compute=bool(model.config.get("compute", True)),
        monitor_store=str(model.config.get("monitor_store") or ""),
        injection_defence=str(model.config.get("injection_defence", DEFAULT_DEFENCE)),
    )
    return artifact.ModelDocument(
        kind="panel",
        roster=model.roster,
        frames=model.frames,
        default_frame=model.default_frame,
        config=config,
        **common,
    )


def model_from(doc: artifact.ModelDocument, stacker) -> StackerModel | PanelModel:
    """The model a checked document describes, built from the installed RAIM (:func:`src.mlops.artifact.parse`)."""
    if doc.kind == "stacker":
        return StackerModel(stacker, doc.columns, doc.decision)
    model = PanelModel(doc.roster, doc.frames, doc.default_frame, stacker, doc.columns, doc.decision)
    model.config = dataclasses.asdict(doc.config)
    return model


def load_model(uri: str) -> StackerModel | PanelModel:
    """A RAIM model from its document alone (:func:`src.mlops.artifact.read`: checked, and compared with the digest
    recorded for ``uri``): nothing in the model folder is unpickled or imported."""
    doc, stacker, _ = artifact.read(uri)
    return model_from(doc, stacker)


def pyfunc_model(inner: StackerModel | PanelModel):
    """MLflow's ``PyFuncModel`` around a model RAIM rebuilt (what MLflow's scoring server serves), with the signature
    RAIM derives from the document, not the one the folder's MLmodel file states."""
    from mlflow.models import Model  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.pyfunc.model import (  # imported here, not at start-up: mlflow ~1.8 s
        PythonModelContext,
        _PythonModelPyfuncWrapper,
    )

    signature = model_signature(inner)
    context = PythonModelContext(artifacts={}, model_config=getattr(inner, "config", {}))
    if isinstance(inner, PanelModel):
        inner.load_context(context)
    meta = Model(signature=signature)
    return mlflow.pyfunc.PyFuncModel(meta, _PythonModelPyfuncWrapper(inner, context, signature))


def model_signature(inner: StackerModel | PanelModel):
    """The signature RAIM derives for a stacker or a panel model (its columns and votes)."""
    if isinstance(inner, StackerModel):
        return stacker_signature(inner.columns, inner.stacker.n_votes)
    return panel_signature(inner.columns, inner.stacker.n_votes or len(inner.columns))


def save_model(inner: StackerModel | PanelModel, folder: str | Path) -> Path:
    """``inner`` as a local MLflow model folder with its document (:mod:`src.mlops.artifact`): a folder
    ``python -m src.serve model`` and ``src.predict`` read by its ``--model-uri`` (a panel's ``config`` goes into the
    document)."""
    with _pins_from_this_environment(), tempfile.TemporaryDirectory() as tmp:
        doc = artifact.write(document_of(inner), tmp)
        mlflow.pyfunc.save_model(
            folder,
            python_model=inner,
            artifacts={"raim_model": str(doc)},
            signature=model_signature(inner),
            pip_requirements=pip_requirements(),
        )
    return Path(folder)


def stacker_signature(columns: list[str], n_votes: int | None = None):
    """Every column required (a vote: 0, 1, or null / 0.5 = abstained; then continuous features); the output's
    p and verdict are null for a row where every member abstained (its label is ``abstained``)."""
    from mlflow.models import ModelSignature  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.types import ColSpec, Schema  # imported here, not at start-up: mlflow ~1.8 s

    inputs = Schema([ColSpec("double", c, required=True) for c in columns])
    outputs = Schema(
        [
            ColSpec("double", "p_hallucinated", required=False),
            ColSpec("long", "verdict", required=False),
            ColSpec("string", "label"),
            ColSpec("double", "train_prevalence", required=False),
        ]
    )
    return ModelSignature(inputs=inputs, outputs=outputs, params=inference_params())


def inference_params():
    """The parameters a served model takes at inference: ``prevalence`` — the deployment's hallucinated share
    as text ("0.1"; MLflow types a parameter once, and it must also carry ``"estimate"``: the EM estimate over
    the request's rows, :mod:`src.studies.prevalence`); unset: the posteriors as fitted."""
    from mlflow.types import ParamSchema, ParamSpec  # imported here, not at start-up: mlflow ~1.8 s

    return ParamSchema([ParamSpec("prevalence", "string", None)])


def pip_requirements() -> list[str]:
    """Exact pins of what unpickling and running the models needs (inference of these is slow and wrong)."""
    import cloudpickle  # imported here, not at start-up: cloudpickle
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s
    import sklearn  # imported here, not at start-up: scikit-learn ~1.4 s

    return [
        f"mlflow=={mlflow.__version__}",
        f"scikit-learn=={sklearn.__version__}",
        f"numpy=={np.__version__}",
        f"pandas=={pd.__version__}",
        f"scipy=={__import__('scipy').__version__}",
        f"cloudpickle=={cloudpickle.__version__}",
    ]


def log_stacker(
    stacker,
    columns: list[str],
    example: pd.DataFrame | None = None,
    name: str = "stacker",
    decision: Mapping[str, Any] | None = None,
):
    """Log a fitted stacker as a pyfunc model in the active run; returns MLflow's ``ModelInfo``. ``decision``:
    the run's deployment decision (:func:`run_decision`), carried by the model and named in its metadata.

    The model must accept exactly its signature's columns and predict its own input example: checked before
    anything is logged (a stacker fitted on other columns than ``columns`` raises here, not at serving time)."""
    if example is None:
        example = pd.DataFrame([[1.0] * len(columns), [0.0] * len(columns)], columns=columns)
    example = example.head(5)
    model = StackerModel(stacker, columns, decision)
    n_in = getattr(stacker, "n_features_in_", len(columns))
    if n_in != len(columns) or list(example.columns) != list(columns):
        raise ValueError(
            f"stacker fitted on {n_in} columns cannot be logged with columns {list(columns)} "
            f"(example columns {list(example.columns)})"
        )
    model.predict(None, example)  # raises if the stacker cannot score its own example
    return _log_pyfunc(
        name,
        model,
        stacker_signature(columns, stacker.n_votes),
        example,
        code=[type(model).__module__, type(stacker).__module__],  # the model's code and the stacker's
        metadata={"columns": list(columns), "threshold": float(stacker.threshold), **_decision_metadata(decision)},
    )


def self_check(model_uri: str) -> str | None:
    """Why a logged stacker cannot serve (None: its document reads and checks — :func:`load_model`, nothing
    unpickled — and, served as MLflow's server would, it answers one row per row of votes: all hallucinated, all
    supported, all abstained)."""
    try:
        inner = load_model(model_uri)
        if not isinstance(inner, StackerModel):
            return f"it is a {type(inner).__name__}, not a stacker model"
        n, k = len(inner.columns), inner.stacker.n_votes or len(inner.columns)
        example = pd.DataFrame([[v] * k + [0.0] * (n - k) for v in (1.0, 0.0, ABSTAIN)], columns=inner.columns)
        out = pyfunc_model(inner).predict(example)
        if len(out) != len(example):
            return f"it answered {len(out)} rows for {len(example)}"
    except Exception as e:  # any failure to load or predict is the reason to refuse
        return f"it cannot be read or cannot predict ({type(e).__name__}: {' '.join(str(e).split())[:300]})"
    return None


# ------------------------------------------------------------------------------------------- strict serving


REQUEST_KEYS = ("dataframe_records", "dataframe_split", "inputs", "instances")
JSON_TYPE, CSV_TYPE, PARQUET_TYPE = "application/json", "text/csv", "application/vnd.apache.parquet"


def request_rows(body: bytes) -> list:
    """The rows of an MLflow JSON scoring request (``dataframe_records``, ``dataframe_split``, ``inputs`` /
    ``instances`` as records or columns). Anything else is an :class:`InputError`: a body that is not JSON (a bare
    ``NaN`` or ``Infinity`` included: it is no abstention), a key given twice, rows of unnamed values (a list of
    lists, a scalar), or none of those keys."""
    return checked_text(_rows(_payload(body)))


SURROGATE = re.compile("[\ud800-\udfff]")


def checked_text(rows: list) -> list:
    """``rows`` when no column name or text cell holds a lone surrogate (a JSON ``\\ud800`` escape of half a
    UTF-16 pair, which is no character: no judge, cache or store can encode it), else an :class:`InputError`
    naming the row and the column."""
    for r, row in enumerate(rows, 1):
        if not isinstance(row, Mapping):
            continue
        for key, value in row.items():
            for what, text in (("its name", key), ("its value", value)):
                found = SURROGATE.search(text) if isinstance(text, str) else None
                if found:
                    raise InputError(
                        f"row {r}: column {str(key)[:40]!r}: {what} holds a lone surrogate "
                        f"U+{ord(found.group()):04X} (half of a UTF-16 pair, not a character)"
                    )
    return rows


def _payload(body: bytes) -> dict:
    try:
        payload = loads_strict(body)
    except StrictJSONError as e:  # a key given twice, a bare NaN / Infinity, nesting too deep
        raise InputError(f"the request body: {e.msg}") from None
    except UnicodeDecodeError:
        raise InputError("the request body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise InputError(f"the request body is not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(payload, dict) or not any(k in payload for k in REQUEST_KEYS):
        raise InputError(
            f"a request is a JSON object with one of {list(REQUEST_KEYS)}, got "
            f"{'keys ' + str(sorted(payload))[:80] if isinstance(payload, dict) else type(payload).__name__}"
        )
    given = [k for k in payload if k in REQUEST_KEYS]
    unknown = [k for k in payload if k not in (*REQUEST_KEYS, "params")]
    if unknown or len(given) > 1:
        raise InputError(
            f"the request: {'unknown top-level key(s) ' + _shown(unknown) if unknown else 'rows given twice'} "
            f"({_shown(given + unknown)}); a request holds exactly one of {list(REQUEST_KEYS)} and optionally "
            "'params'"
        )
    return payload


def _shown(keys: list, most: int = 5) -> str:
    """Key names for a one-line message: each clipped, at most ``most`` of them."""
    names = [repr(str(k)[:40]) for k in keys[:most]]
    return "[" + ", ".join(names) + (f", … {len(keys) - most} more" if len(keys) > most else "") + "]"


def _rows(payload: dict) -> list:
    if "dataframe_records" in payload:
        rows = payload["dataframe_records"]
        return rows if isinstance(rows, list) else [rows]
    if "dataframe_split" in payload:
        split = payload["dataframe_split"]
        if not isinstance(split, dict) or not isinstance(split.get("data"), list):
            raise InputError("dataframe_split needs 'columns' and 'data' (a list of rows)")
        cols = list(split.get("columns") or [])
        twice = next((c for i, c in enumerate(cols) if c in cols[:i]), None)
        if twice is not None:
            at = [i + 1 for i, c in enumerate(cols) if c == twice]
            raise InputError(
                f"dataframe_split: column {str(twice)[:40]!r} appears {len(at)} times (columns "
                f"{', '.join(map(str, at))}): each column is named once"
            )
        for r, row in enumerate(split["data"], 1):
            if not isinstance(row, list) or len(row) != len(cols):
                raise InputError(
                    f"row {r}: {len(row) if isinstance(row, list) else 'no'} values for {len(cols)} columns {cols}"
                )
        return [dict(zip(cols, row)) for row in split["data"]]
    key = next(k for k in ("inputs", "instances") if k in payload)
    rows = payload[key]
    if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
        return rows
    if isinstance(rows, dict) and all(isinstance(v, list) for v in rows.values()):
        n = {len(v) for v in rows.values()}
        if len(n) > 1:
            raise InputError(f"{key}: columns of different lengths {sorted(n)}")
        return [dict(zip(rows, vals)) for vals in zip(*rows.values())]
    got = (
        next((type(r).__name__ for r in rows if not isinstance(r, dict)), "list")
        if isinstance(rows, list)
        else type(rows).__name__
    )
    raise InputError(
        f"{key}: rows must be objects naming their columns (or an object of column lists), got "
        f"{'a row that is a ' + got if isinstance(rows, list) else 'a ' + got}"
    )


def request_input(body: bytes, content_type: str | None, schema=None) -> tuple[list | None, dict]:
    """(rows, params) of a scoring request as MLflow's server would read it: JSON (:func:`request_rows`, and its
    ``params``), CSV or Parquet (parsed by MLflow's own readers, with the model's input ``schema``). Rows None: a
    content type MLflow refuses itself (415). A request with no content type is an :class:`InputError`."""
    from mlflow.pyfunc import scoring_server  # imported here, not at start-up: mlflow ~1.8 s

    if not content_type:
        raise InputError(f"the request has no Content-Type: send {JSON_TYPE} (or {CSV_TYPE})")
    mime = content_type.split(";")[0].strip().lower()
    if mime == JSON_TYPE:
        payload = _payload(body)
        params = payload.get("params") or {}
        return checked_text(_rows(payload)), params if isinstance(params, dict) else {"": params}
    if mime not in (CSV_TYPE, PARQUET_TYPE):
        return None, {}
    try:
        if mime == CSV_TYPE:
            frame = scoring_server.parse_csv_input(io.StringIO(body.decode("utf-8")), schema=schema)
        else:
            frame = scoring_server.parse_parquet_input(io.BytesIO(body))
    except UnicodeDecodeError:
        raise InputError("the request body is not UTF-8 text") from None
    except Exception as e:  # noqa: BLE001 - whatever the reader refuses is the request's fault
        if mime == CSV_TYPE:  # a cell the schema's types refuse: the rows as pandas reads them name it
            with contextlib.suppress(Exception):
                return pd.read_csv(io.BytesIO(body)).to_dict("records"), {}
        msg = re.sub(r"^Failed to parse input.*?Error: ", "", getattr(e, "message", None) or str(e), flags=re.S)
        raise InputError(f"the {mime} request body cannot be read ({' '.join(msg.split())[:200]})") from None
    return pd.DataFrame(frame).to_dict("records"), {}


def check_params(params: Mapping[str, Any]) -> None:
    """The inference parameters RAIM's models take (``prevalence``, :func:`inference_params`), checked as the
    model will read them."""
    if "" in params:
        raise InputError("params: expected an object of parameters")
    unknown = sorted(set(params) - {"prevalence"})
    if unknown:
        raise InputError(f"params: unknown parameter(s) {unknown}; a RAIM model takes 'prevalence'")
    parse_setting(params.get("prevalence"))


class StrictInputs:
    """ASGI wrapper of MLflow's scoring app: a request to ``/invocations`` whose rows (JSON, CSV or Parquet) or
    parameters break the model's input contract gets HTTP 400 with one line, before MLflow reads it (MLflow would
    drop an unknown column and answer 200). Every valid request goes to MLflow's app as sent (a numeric
    ``prevalence`` as its text: :func:`text_params`); an error it answers is cut to one line
    (:class:`_OneLineErrors`: no input dump, no stack trace in the answer).

    Every request's body is read within ``limits`` (:func:`src.mlops.limits.read_body`: 408 / 413, one line, the
    connection closed). ``GET /ping`` and ``/health`` answer the model's monitor (``health``: a function returning
    :meth:`MonitorHealth.doc`): ``/ping`` always 200 (the process answers), ``/health`` 503 while the last
    recording failed."""

    def __init__(self, app, check, schema=None, limits: Limits | None = None, health=None):
        self.app, self.check, self.schema = app, check, schema
        self.limits, self.health = limits or Limits(), health

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            body = await read_body(receive, scope.get("headers"), self.limits)
        except RequestRefused as e:
            return await reply(send, e.status, {"error_code": e.code, "message": e.message}, close=True)
        except Disconnected:
            return None
        if scope["method"] == "GET" and scope["path"] in ("/ping", "/health") and self.health is not None:
            doc = {"model": "loaded", "monitor": self.health()}
            degraded = doc["monitor"]["status"] == "degraded"
            return await reply(send, 503 if degraded and scope["path"] == "/health" else 200, doc)
        if scope["path"] == "/invocations" and scope["method"] == "POST":
            ctype = dict(scope.get("headers") or []).get(b"content-type", b"").decode("latin-1")
            try:
                rows, params = request_input(body, ctype, self.schema)
                if rows is not None:
                    self.check(rows)
                    check_params(params)
                    body = text_params(body, params)
            except RaimError as e:  # InputError, PrevalenceError
                return await reply(send, 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": one_line_message(e)})
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, _OneLineErrors(send))


def text_params(body: bytes, params: Mapping[str, Any]) -> bytes:
    """The JSON request ``body`` with a numeric ``prevalence`` written as its text: MLflow types the parameter as a
    string (:func:`inference_params`) and would refuse ``0.1`` with its own type error, where RAIM reads
    ``0.1`` and ``"0.1"`` alike (:func:`src.core.priorshift.parse_setting`, already checked). Any other body as
    sent."""
    value = params.get("prevalence")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return body
    payload = json.loads(body)
    payload["params"]["prevalence"] = repr(float(value))
    return json.dumps(payload).encode()


class _OneLineErrors:
    """``send`` for MLflow's app: an error answer (status ≥ 400, JSON) is rewritten to one line — MLflow wraps a
    model's own message as ``Failed to predict data '<the input>'. Error: <message>`` and attaches the stack
    trace of any other exception; the answer keeps the message (or the exception's last line), the server's log
    keeps the trace."""

    def __init__(self, send):
        self.send, self.start, self.body = send, None, b""

    async def __call__(self, message):
        if message["type"] == "http.response.start" and message.get("status", 200) >= 400:
            self.start = message
            return None
        if self.start is None or message["type"] != "http.response.body":
            return await self.send(message)
        self.body += message.get("body", b"")
        if message.get("more_body", False):
            return None
        try:
            doc = json.loads(self.body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            text = " ".join(self.body.decode("utf-8", "replace").split())[:400]
            doc = {"error_code": "BAD_REQUEST", "message": text}
        return await reply(self.send, self.start["status"], one_line_error(doc))


def one_line_error(doc: dict) -> dict:
    """MLflow's error answer ``doc`` as ``{error_code, message}`` with a one-line message (see :class:`_OneLineErrors`)."""
    msg = str(doc.get("message", ""))
    trace = doc.get("stack_trace")
    if trace:
        logging.getLogger("raim.serve").warning("scoring error: %s\n%s", msg, trace)
        last = [ln for ln in str(trace).strip().splitlines() if ln.strip()][-1:]
        if last and not msg.startswith("Failed to predict data '"):  # the exception's own line
            msg = last[0].split(": ", 1)[-1] if ": " in last[0] else last[0]
    if msg.startswith("Failed to predict data '") and "\nError: " in msg:
        msg = msg.rpartition("\nError: ")[2]
    msg = " ".join(msg.split())
    return {"error_code": str(doc.get("error_code", "BAD_REQUEST")), "message": msg[:500] or "scoring failed"}


def input_check(inner):
    """The row check of a loaded RAIM model (a stacker's votes, or a panel's item columns)."""
    kind = type(inner).__name__  # by name: under `python -m src.serve` this module is __main__, not src.serve
    if kind == "StackerModel":
        return lambda rows: votes_from_rows(rows, inner.columns, inner.stacker.n_votes)
    if kind == "PanelModel":
        return lambda rows: inner.items(pd.DataFrame(rows))
    raise RaimError(f"not a RAIM model ({type(inner).__name__}); serve it with `mlflow models serve`")


def serve_model(model_uri: str, host: str = "127.0.0.1", port: int = 5001, limits: Limits | None = None) -> None:
    """MLflow's scoring server (same routes and JSON) for a RAIM model, with :class:`StrictInputs` in front and
    uvicorn's protocol timing each request's headers (:mod:`src.mlops.limits`)."""
    import uvicorn  # imported here, not at start-up: the server stack

    limits = limits or Limits()
    inner = load_model(model_uri)  # its document, checked: nothing in the model folder is unpickled or imported
    app = strict_app(pyfunc_model(inner), limits)
    warning = decision_warning(getattr(inner, "decision", None))
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # bound and listening: the one line a user (or a script) waits for
                print(ready_line(model_uri, host, port, inner), flush=True)

    _Server(server_config(app, host, port, limits)).run()


def strict_app(model, limits: Limits | None = None) -> StrictInputs:
    """A loaded pyfunc ``model`` behind MLflow's scoring app and :class:`StrictInputs` (its input check, schema,
    ``limits`` and its monitor's health). The monitor's setting is checked here: a bad one stops the start."""
    from mlflow.pyfunc import scoring_server  # imported here, not at start-up: mlflow ~1.8 s

    inner = model.unwrap_python_model()
    config = getattr(inner, "config", None)
    on_failure(config)
    schema = model.metadata.get_input_schema() if model.metadata else None
    health = lambda: monitor_health(inner).doc(config)  # noqa: E731 - read at each request
    return StrictInputs(scoring_server.init(model), input_check(inner), schema, limits or Limits(), health)


def server_config(app, host: str, port: int, limits: Limits):
    """uvicorn's configuration for ``app``: the header-timed HTTP/1.1 protocol (:func:`src.mlops.limits.timed_protocol`)
    and no access log."""
    import uvicorn  # imported here, not at start-up: the server stack

    return uvicorn.Config(app, host=host, port=port, log_level="warning", http=timed_protocol(limits.header_timeout_s))


def ready_line(model_uri: str, host: str, port: int, inner) -> str:
    """The server's one start-up line: where it listens, what it serves and the input columns it takes."""
    kind = type(inner).__name__
    takes = (
        f"member columns {list(inner.columns)}"
        if kind == "StackerModel"
        else f"items: 'candidate' and optionally {list(PANEL_OPTIONAL)}"
    )
    return f"ready on http://{host}:{port}/invocations ({kind} {model_uri}; {takes}; Ctrl-C stops it)"


@one_line
def main(argv: list[str] | None = None) -> int:
    """``python -m src.serve model --model-uri models:/raim-stacker-wice@champion --port 5001`` (a panel model
    is logged with ``python -m src.registry log-panel``)."""
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s

    ap = ArgumentParser(prog="python -m src.serve", description="serve a RAIM model")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model", help="serve a stacker or panel model (MLflow's server, strict inputs)")
    m.add_argument("--model-uri", required=True)
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=5001)
    d = Limits()
    m.add_argument("--header-timeout", type=float, default=d.header_timeout_s, help="seconds to send the headers")
    m.add_argument("--body-timeout", type=float, default=d.body_timeout_s, help="seconds to send the body")
    m.add_argument("--max-body-mb", type=float, default=d.max_body_bytes / MIB, help="the largest body (MiB)")
    m.add_argument(
        "--monitor-on-failure",
        choices=ON_FAILURE,
        default=None,
        help=f"rows the monitor store could not record: answer (and say so) or refuse (503); default "
        f"${FAILURE_ENV}, else {DEFAULT_ON_FAILURE}",
    )
    a = ap.parse_args(argv)
    if a.monitor_on_failure:
        os.environ[FAILURE_ENV] = a.monitor_on_failure
    try:
        limits = Limits(a.header_timeout, a.body_timeout, int(a.max_body_mb * MIB))
    except ValueError as e:
        ap.error(str(e))
    try:
        serve_model(a.model_uri, a.host, a.port, limits)
        return 0
    except MlflowException as e:
        raise RaimError(f"{a.cmd}: {e.message}") from e


if __name__ == "__main__":
    raise SystemExit(main())
