"""What a served model records for live monitoring (:mod:`src.studies.monitor`): each scored item's member votes
(never its text) and injection flags to the monitor's store (:mod:`src.io.votestore`, :mod:`src.io.flagstore`), and
the model's :class:`MonitorHealth` in this process (what ``/health`` answers); rows not recorded are answered or
refused as ``monitor_on_failure`` says.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from src.io.flagstore import record_flags_from
from src.io.votestore import on_failure, record_from, store_path


def _unavailable(message: str):
    """An MLflow error the scoring server answers with HTTP 503 and this one line."""
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE  # imported here, not at start-up: mlflow ~1.8 s

    return MlflowException(message, error_code=TEMPORARILY_UNAVAILABLE)


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


def record_injection_flags(config: Mapping[str, Any] | None, item_ids: list, out: pd.DataFrame) -> str | None:
    """The items' injection flags to the monitor's store (:mod:`src.io.flagstore`), as the votes
    (:func:`record_votes`: why not, or None)."""
    try:
        record_flags_from(config, "panel", item_ids, out["injection_flag"].tolist(), out["injection_reasons"].tolist())
    except Exception as e:  # noqa: BLE001 - a failure to record is counted and answered by `monitored`
        logging.getLogger("raim.serve").warning("monitor: injection flags not recorded (%s: %s)", type(e).__name__, e)
        return failure_line(e)
    return None
