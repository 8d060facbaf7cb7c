"""MLflow traces in, assessments out (beyond the paper): the traces of an experiment read page by page, each seen as
a :class:`src.io.traces.TraceView`; RAIM's verdict written back as one feedback assessment per trace; the people's
labels (HUMAN feedback) read back as gold; traces tagged for labelling. Judging an experiment's traces is
:mod:`src.mlops.assessing`.

RAIM's assessment (``traces.assessment.name``, default ``raim_hallucination``) is a feedback from an ``LLM_JUDGE``
source whose id starts with ``raim``: its value is p(hallucinated) (a number, so ``feedback.raim_hallucination >=
0.5`` filters on it in the UI and in ``mlflow.search_traces``), its rationale names the verdict and each member's
vote, its metadata the verdict, the threshold, the roster and each judge's identity, the model (URI and registry
version), the item's frame and cache id, the injection flag and the stacker's training prevalence. An item every
member abstained on has no p: its feedback carries the error ``RAIM_ABSTAINED`` instead of a value.

A trace already holding RAIM's assessment from the same model is not assessed again; one assessed by another model
is assessed again, the new feedback overriding the old (:func:`mlflow.override_feedback`: the old one stays,
marked invalid, as MLflow keeps an overridden judge's feedback).

Gold (:func:`label_of`): the latest valid feedback from a ``HUMAN`` source named ``traces.assessment.label``
(default ``hallucinated``) or RAIM's own name (a person who edits RAIM's assessment in the trace view overrides it
with a HUMAN feedback of that name); true/false, 1/0, yes/no, hallucinated/supported."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from src import __version__
from src.core.errors import RaimError
from src.io.config import build, conf_file, group_option, load_yaml
from src.io.settings import TracesSettings
from src.io.traces import TraceView
from src.judges.cache import identity_hash
from src.judges.runner import build_backend

SOURCE_PREFIX = "raim"


ABSTAINED = "RAIM_ABSTAINED"


ORDER = ["timestamp_ms ASC", "request_id ASC"]  # a stable order for paging


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


_YES = ("1", "1.0", "true", "yes", "y", "hallucinated", "hallucination", "unsupported")


_NO = ("0", "0.0", "false", "no", "n", "supported", "faithful", "grounded")


class TraceError(RaimError, ValueError):
    """A request about traces RAIM cannot answer (an unknown experiment, a bad time, a label that is not 0 / 1);
    one line naming the experiment, the trace and the field."""


def settings(path: str | Path | None = None) -> TracesSettings:
    """conf/traces/default.yaml (or another file of its shape) as :class:`TracesSettings`, every key checked."""
    if path is None:
        return build(TracesSettings, group_option("traces", "default"), conf_file("traces", "default"))
    return build(TracesSettings, load_yaml(path), str(path))


def identities(roster: Mapping) -> dict[str, str]:
    """Each member's judge identity hash (16 hex digits: the verdict cache file's name), as the assessments record
    it; a backend's constructor loads nothing."""
    return {
        m["name"]: identity_hash(build_backend(m["backend"], f"member {m['name']}").identity())[:16]
        for m in roster["members"]
    }


# ----------------------------------------------------------------------------------------------- reading


def experiment_id(name: str) -> str:
    """The id of the experiment named ``name`` (or with that id); one line when the store has none."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    exp = mlflow.get_experiment_by_name(name)
    if exp is None and name.isdigit():
        exp = mlflow.get_experiment(name)
    if exp is None:
        raise TraceError(f"--experiment {name!r}: no such experiment in {mlflow.get_tracking_uri()}")
    return exp.experiment_id


def parse_time(text: str | None, now: float, flag: str) -> int | None:
    """A time bound in milliseconds since the epoch: ISO 8601 (``2025-06-01``, ``2025-06-01T12:00``, UTC unless it
    says otherwise), seconds since the epoch, or a duration before ``now`` (``30m``, ``24h``, ``7d``)."""
    if text is None or not str(text).strip():
        return None
    text = str(text).strip()
    if m := _DURATION.match(text):
        return int((now - float(m.group(1)) * _SECONDS[m.group(2)]) * 1000)
    try:
        return int(float(text) * 1000)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(
            f"{flag} {text!r}: not a time (ISO 8601 such as 2025-06-01T12:00, seconds since the epoch, or a "
            "duration before now such as 24h or 7d)"
        ) from None
    return int((t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp() * 1000)


def search_filter(user: str | None, since_ms: int | None, until_ms: int | None) -> str | None:
    """The user's filter string and the time window (``since`` ≤ start < ``until``), joined by AND."""
    parts = [user] if user else []
    if since_ms is not None:
        parts.append(f"trace.timestamp_ms >= {since_ms}")
    if until_ms is not None:
        parts.append(f"trace.timestamp_ms < {until_ms}")
    return " AND ".join(p for p in parts if p) or None


def pages(
    experiment: str, filter_string: str | None, page_size: int, include_spans: bool = True
) -> Iterator[list[Any]]:
    """The experiment's traces matching ``filter_string``, oldest first, ``page_size`` at a time (the store's page
    tokens: memory stays one page, however many traces match)."""
    from mlflow import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s

    client, token = MlflowClient(), None
    while True:
        try:
            page = client.search_traces(
                locations=[experiment],
                filter_string=filter_string,
                max_results=page_size,
                order_by=ORDER,
                page_token=token,
                include_spans=include_spans,
            )
        except MlflowException as e:
            raise TraceError(f"search_traces (filter {filter_string!r}): {' '.join(e.message.split())[:300]}") from e
        yield list(page)
        token = page.token
        if not token:
            return


def _state(info: Any) -> str:
    state = getattr(info, "state", None)
    return str(getattr(state, "value", state) or "")


def view(trace: Any) -> TraceView:
    """What :func:`src.io.traces.to_item` reads of an MLflow trace: its root span's inputs and outputs and the
    outputs of its top-level RETRIEVER spans (those not inside another RETRIEVER span), in start order."""
    spans = list(trace.data.spans) if trace.data is not None else []
    by_id = {s.span_id: s for s in spans}
    root = next((s for s in spans if s.parent_id is None), None)

    def inside_retriever(span) -> bool:
        parent = by_id.get(span.parent_id)
        while parent is not None:
            if parent.span_type == "RETRIEVER":
                return True
            parent = by_id.get(parent.parent_id)
        return False

    retrievers = sorted(
        (s for s in spans if s.span_type == "RETRIEVER" and not inside_retriever(s)), key=lambda s: s.start_time_ns
    )
    info = trace.info
    return TraceView(
        trace_id=info.trace_id,
        timestamp_ms=int(info.timestamp_ms),
        state=_state(info),
        client_request_id=info.client_request_id,
        tags=dict(info.tags or {}),
        metadata=dict(info.trace_metadata or {}),
        request=root.inputs if root is not None else None,
        response=root.outputs if root is not None else None,
        retrieved=[s.outputs for s in retrievers] or None,
    )


# ------------------------------------------------------------------------------------------- assessments


@dataclass(frozen=True)
class Judge:
    """Who assesses: the assessment's name, the roster (name, each member's judge identity hash), the model (its
    URI and registry version, when it has one)."""

    name: str
    roster: str
    judges: Mapping[str, str]
    model_uri: str
    model_version: str | None = None

    @property
    def model(self) -> str:
        """The model as the assessments record it: its URI, and its registry version when the URI names one."""
        return self.model_uri + (f" (version {self.model_version})" if self.model_version else "")

    @property
    def source_id(self) -> str:
        return f"{SOURCE_PREFIX}/{self.roster}"


def registry_version(uri: str) -> str | None:
    """The registry version a ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` URI names now; None otherwise."""
    from mlflow import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

    m = re.match(r"^models:/([^/@]+)(?:@(.+)|/(\d+))$", uri)
    if not m:
        return None
    if m.group(3):
        return m.group(3)
    try:
        return str(MlflowClient().get_model_version_by_alias(m.group(1), m.group(2)).version)
    except Exception:  # noqa: BLE001 - the model was loaded already; the version is a record, not a gate
        return None


def is_raim(a: Any, name: str) -> bool:
    """Whether an assessment is RAIM's feedback of that name (an LLM_JUDGE source whose id starts with ``raim``)."""
    src = getattr(a, "source", None)
    return (
        getattr(a, "name", None) == name
        and getattr(a, "feedback", None) is not None
        and str(getattr(src, "source_type", "")) == "LLM_JUDGE"
        and str(getattr(src, "source_id", "")).startswith(SOURCE_PREFIX)
    )


def raim_assessment(trace: Any, name: str) -> Any | None:
    """The trace's current RAIM assessment of that name: the valid one, else the latest (a person overrode it)."""
    mine = [a for a in (trace.info.assessments or []) if is_raim(a, name)]
    valid = [a for a in mine if a.valid is not False]
    pick = valid or mine
    return max(pick, key=lambda a: a.last_update_time_ms or 0) if pick else None


def assessed_by(trace: Any, judge: Judge) -> bool:
    """Whether RAIM already assessed the trace with this model (any of its assessments of that name, valid or
    overridden): re-running adds nothing twice."""
    return any(
        is_raim(a, judge.name) and (a.metadata or {}).get("model") == judge.model
        for a in (trace.info.assessments or [])
    )


def _vote_word(v: Any, uncached: bool) -> str:
    if uncached:
        return "not judged (no cached verdict)"
    if v is None:
        return "abstained"
    return "hallucinated" if int(v) == 1 else "supported"


def rationale(row: Mapping[str, Any], members: Sequence[str], threshold: float, judge: Judge) -> str:
    """The verdict, p against the threshold, and each member's vote, in one line."""
    uncached = set(filter(None, str(row.get("uncached") or "").split(",")))
    votes = ", ".join(f"{m} {_vote_word(_cell(row.get(m)), m in uncached)}" for m in members)
    p = _cell(row.get("p_hallucinated"))
    head = (
        f"{row['label']} (p = {p:.3f}, threshold {threshold:g})"
        if p is not None
        else "no verdict: every member abstained"
    )
    tail = f"; stacked by {judge.model}"
    if row.get("injection_flag"):
        tail += f"; the text looks like a prompt injection aimed at the judges ({row.get('injection_reasons')})"
    return f"{head}. Votes: {votes}{tail}."


def _cell(v: Any) -> Any:
    """A DataFrame cell as a plain value (pandas' NA and NaN: None)."""
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def feedback(row: Mapping[str, Any], members: Sequence[str], threshold: float, judge: Judge) -> Any:
    """RAIM's feedback for one scored item (a row of :func:`src.mlops.panels.predict`'s output)."""
    from mlflow.entities import AssessmentError, AssessmentSource, Feedback  # imported here, not at start-up: mlflow

    p = _cell(row.get("p_hallucinated"))
    meta = {
        "verdict": str(row["label"]),
        "p_hallucinated": "" if p is None else f"{p:.6f}",
        "threshold": f"{threshold:g}",
        "roster": judge.roster,
        "judges": ",".join(f"{m}={h}" for m, h in judge.judges.items()),
        "model": judge.model,
        "model_uri": judge.model_uri,
        "model_version": judge.model_version or "",
        "frame": str(row.get("frame") or ""),
        "item_id": str(row["item_id"]),
        "uncached": str(row.get("uncached") or ""),
        "injection_flag": str(bool(row.get("injection_flag"))).lower(),
        "injection_reasons": str(row.get("injection_reasons") or ""),
        "train_prevalence": "" if _cell(row.get("train_prevalence")) is None else f"{row['train_prevalence']:.6f}",
        "raim_version": __version__,
    }
    if row.get("run_decision"):
        meta["run_decision"] = str(row["run_decision"])
    source = AssessmentSource(source_type="LLM_JUDGE", source_id=judge.source_id)
    why = rationale(row, members, threshold, judge)
    if p is None:
        err = AssessmentError(error_code=ABSTAINED, error_message="every member of the panel abstained")
        return Feedback(name=judge.name, error=err, source=source, rationale=why, metadata=meta)
    return Feedback(name=judge.name, value=round(float(p), 6), source=source, rationale=why, metadata=meta)


def write(trace: Any, fb: Any) -> str:
    """Log ``fb`` on the trace, overriding RAIM's current assessment of that name when another model wrote it
    (:func:`assessed_by` is checked first by the caller); returns ``"logged"`` or ``"overrode"``."""
    from mlflow.tracing.client import TracingClient  # imported here, not at start-up: mlflow ~1.8 s

    old = raim_assessment(trace, fb.name)
    fb.overrides = old.assessment_id if old is not None and old.valid is not False else None
    TracingClient().log_assessment(trace.info.trace_id, fb)
    return "overrode" if fb.overrides else "logged"


# ------------------------------------------------------------------------------------------------- gold


def gold_value(value: Any, where: str) -> int:
    """A person's label as gold: 1 hallucinated, 0 supported (see module doc)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip().lower() in _YES + _NO:
        return int(value.strip().lower() in _YES)
    raise TraceError(
        f"{where}: value {value!r} is not a label (true/false, 1/0, yes/no, hallucinated/supported; 1 = hallucinated)"
    )


def label_of(trace: Any, names: Sequence[str]) -> int | None:
    """The trace's gold from people: its latest valid HUMAN feedback named one of ``names``; None without one."""
    human = [
        a
        for a in (trace.info.assessments or [])
        if getattr(a, "name", None) in names
        and getattr(a, "feedback", None) is not None
        and str(getattr(a.source, "source_type", "")) == "HUMAN"
        and a.valid is not False
        and a.feedback.error is None
    ]
    if not human:
        return None
    last = max(human, key=lambda a: a.last_update_time_ms or 0)
    return gold_value(last.value, f"trace {trace.info.trace_id}: assessment {last.name!r} ({last.assessment_id})")


def tag(trace_ids: Sequence[str], key: str, value: str) -> int:
    """Set the tag ``key=value`` on each trace; returns how many."""
    from mlflow import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

    client = MlflowClient()
    for t in trace_ids:
        client.set_trace_tag(t, key, value)
    return len(trace_ids)


# ------------------------------------------------------------------------------------------------- pools


@dataclass
class TracePool:
    """The assessed traces of an experiment as a pool (:class:`src.studies.pool.Pool`'s columns): trace ids,
    p (NaN where every member abstained), times in seconds, the stacker's training prevalence per trace
    (NaN: unknown), a segment per trace (a tag's value) and the gold of the labelled ones (NaN elsewhere)."""

    trace_ids: list[str]
    p: np.ndarray
    ts: np.ndarray
    train_prevalence: np.ndarray
    segments: list[str] | None
    gold: np.ndarray
    skipped: int  # traces in the window without RAIM's assessment


def read_pool(
    experiment: str,
    name: str,
    labels: Sequence[str],
    filter_string: str | None = None,
    page_size: int = 500,
    segment_tag: str | None = None,
) -> TracePool:
    """Every trace of the experiment (matching ``filter_string``) that holds RAIM's assessment ``name``: its p, time,
    training prevalence and people's label (:func:`label_of` with ``labels``). Spans are not read."""
    ids, p, ts, tp, seg, gold, skipped = [], [], [], [], [], [], 0
    for page in pages(experiment, filter_string, page_size, include_spans=False):
        for t in page:
            a = raim_assessment(t, name)
            if a is None:
                skipped += 1
                continue
            ids.append(t.info.trace_id)
            value = a.value if a.feedback.error is None else None
            p.append(np.nan if value is None else float(value))
            ts.append(t.info.timestamp_ms / 1000.0)
            prior = (a.metadata or {}).get("train_prevalence")
            tp.append(float(prior) if prior else np.nan)
            if segment_tag is not None:
                seg.append(str((t.info.tags or {}).get(segment_tag, "(none)")))
            g = label_of(t, labels)
            gold.append(np.nan if g is None else g)
    return TracePool(
        ids,
        np.asarray(p, float),
        np.asarray(ts, float),
        np.asarray(tp, float),
        seg if segment_tag is not None else None,
        np.asarray(gold, float),
        skipped,
    )
