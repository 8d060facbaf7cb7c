"""RAIM as MLflow scorers (beyond the paper): the stacked panel and each of its members as
``mlflow.genai.scorers.Scorer`` objects, so that an evaluation written for ``mlflow.genai.evaluate`` adds RAIM in one
line, and MLflow's own ``make_scorer_ensemble`` can aggregate RAIM's members (:mod:`src.studies.ensembles`).

    import mlflow
    from src.mlops.scorers import raim_scorers
    raim = raim_scorers("models:/raim-stacker-medhallu@champion")
    mlflow.genai.evaluate(data=traces_or_rows, scorers=[*my_scorers, *raim])

A scorer reads one item from what ``mlflow.genai.evaluate`` hands it (:func:`item_from`): the question from
``inputs``, the candidate from ``outputs`` (the keys of ``traces.mapping``), the evidence from the trace's RETRIEVER
spans — or, for rows without retrieval spans, from ``inputs`` under ``context``, ``evidence`` or ``documents``
(given empty: an item judged without evidence, as an ungrounded benchmark's);
``inputs`` may also name the ``item_id``, ``dataset`` and ``frame`` (else the content's hash, ``traces.dataset``
and the panel's calibrated frame). Every verdict goes through the verdict cache, as ``src.predict``'s: a repeated
item is never judged twice, and with ``compute=False`` a miss is an error feedback, never a guess.

* :class:`PanelScorer` (named ``traces.assessment.name``): p(hallucinated) with the rationale and metadata of
  :func:`src.mlops.traces.feedback` — the same assessment ``python -m src.traces judge`` writes.
* :class:`MemberScorer` (``raim_<member>``): the member's vote, ``True`` for hallucinated (a numeric 0 / 1 to
  MLflow's ``mean``), or an error feedback ``RAIM_ABSTAINED`` where it abstained — which MLflow's built-in
  ensembles treat as a failed sub-scorer.

Judging is serialised within a process (one lock): MLflow runs scorers on a thread pool, and each miss would load its
judge's weights once per thread."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.entities import AssessmentError, Feedback
from mlflow.exceptions import MlflowException
from mlflow.genai.scorers import Scorer, make_scorer_ensemble
from pydantic import PrivateAttr

from src.core.verdicts import ABSTAIN
from src.io.settings import TracesSettings
from src.io.traces import Skip, TraceMapping, candidate_of, evidence_of, question_of, to_item
from src.judges.cache import item_content_hash
from src.judges.frames import load_frames
from src.judges.runner import verdict_table
from src.mlops import traces as mt
from src.mlops.panels import load_panel
from src.mlops.serving import SCORED_CACHE, PanelModel

MLFLOW_VERSION = mlflow.__version__
CONTEXT_KEYS = ("context", "evidence", "documents", "retrieved_context")
UNMAPPABLE = "RAIM_UNMAPPABLE"
UNCACHED = "RAIM_NOT_CACHED"
_JUDGING = threading.Lock()


def item_from(inputs: Any, outputs: Any, trace: Any, mapping: TraceMapping, dataset: str) -> dict[str, Any] | Skip:
    """The item a scorer judges (module doc), or why there is none."""
    if trace is not None:
        view = mt.view(trace)
        got = to_item(view, mapping) if view.retrieved else None
        if isinstance(got, dict):
            if inputs is None and outputs is None:
                inputs, outputs = view.request, view.response
            item = {**got, "item_id": _given(inputs, "item_id") or got["item_id"]}
            return {**item, "dataset": _given(inputs, "dataset") or dataset, "frame": _given(inputs, "frame")}
        if got is not None and got.reason != "no_retriever_span":
            return got
        inputs = view.request if inputs is None else inputs
        outputs = view.response if outputs is None else outputs
    key = next((k for k in CONTEXT_KEYS if isinstance(inputs, Mapping) and k in inputs), None)
    if key is None:
        return Skip("no_retriever_span", f"no RETRIEVER span and no {'/'.join(CONTEXT_KEYS)} in the inputs")
    evidence, n = evidence_of([inputs[key]], mapping.document, mapping.separator) if inputs[key] else ("", 0)
    if not n and inputs[key] not in ("", None):
        return Skip("no_documents", f"the inputs' {key} holds no text under {mapping.document}")
    question = question_of({k: v for k, v in inputs.items() if k not in CONTEXT_KEYS}, mapping.question)
    candidate = candidate_of(outputs, mapping.candidate)
    if question is None or candidate is None:
        return Skip("no_question" if question is None else "non_text_output", "inputs or outputs without text")
    item = {"question": question, "evidence": evidence, "candidate": candidate}
    item_id = _given(inputs, "item_id") or f"item-{item_content_hash(item)}"
    return {
        **item,
        "item_id": item_id,
        "dataset": _given(inputs, "dataset") or dataset,
        "frame": _given(inputs, "frame"),
    }


def _given(inputs: Any, key: str) -> str | None:
    v = inputs.get(key) if isinstance(inputs, Mapping) else None
    return str(v) if v not in (None, "") else None


def _skipped(name: str, skip: Skip) -> Feedback:
    return Feedback(
        name=name, error=AssessmentError(error_code=UNMAPPABLE, error_message=f"{skip.reason}: {skip.detail}")
    )


# --------------------------------------------------------------------------------------------- members


class Votes:
    """A roster's votes on items through the verdict cache, remembered per item (the member scorers of one roster
    share it, so an item is read or judged once for all of them): :meth:`prefetch` reads many items in one pass."""

    def __init__(self, roster: Mapping, frames: Mapping[str, Any], default_frame: str, cache_dir: Path, compute: bool):
        self.roster, self.frames, self.default_frame = dict(roster), load_frames(dict(frames)), default_frame
        self.cache_dir, self.compute = Path(cache_dir), compute
        self.members = [m["name"] for m in self.roster["members"]]
        self.known: dict[tuple, dict[str, float | None]] = {}

    def key(self, item: Mapping[str, Any]) -> tuple:
        return (str(item["item_id"]), item_content_hash(item), item.get("frame") or self.default_frame)

    def prefetch(self, items: pd.DataFrame) -> None:
        """Read (or judge) every item's votes at once: one verdict table, remembered."""
        items = items.assign(
            frame=items["frame"].fillna(self.default_frame) if "frame" in items else self.default_frame
        )
        items = items.assign(cluster_id=items["item_id"])
        with _JUDGING:
            t = verdict_table(
                self.roster, items, self.frames, self.cache_dir, compute=self.compute, progress=False, allow_empty=True
            )
        cached = t.attrs["cached"]
        for i, rec in enumerate(items.to_dict("records")):
            self.known[self.key(rec)] = {
                m: (None if not cached[m][i] else (ABSTAIN if pd.isna(t[m].iloc[i]) else float(t[m].iloc[i])))
                for m in self.members
            }

    def of(self, item: Mapping[str, Any]) -> dict[str, float | None]:
        """Each member's vote on the item: 1.0, 0.0, 0.5 (abstained) or None (not cached, not computed)."""
        k = self.key(item)
        if k not in self.known:
            self.prefetch(pd.DataFrame([dict(item)]))
        return self.known[k]


class MemberScorer(Scorer):
    """One member's vote as a scorer: ``True`` = hallucinated; an abstention or a miss is an error feedback."""

    _member: str = PrivateAttr()
    _votes: Votes = PrivateAttr()
    _mapping: TraceMapping = PrivateAttr()
    _dataset: str = PrivateAttr()

    def __call__(self, *, inputs: Any = None, outputs: Any = None, trace: Any = None) -> Feedback:
        item = item_from(inputs, outputs, trace, self._mapping, self._dataset)
        if isinstance(item, Skip):
            return _skipped(self.name, item)
        v = self._votes.of(item)[self._member]
        if v is None:
            return Feedback(
                name=self.name,
                error=AssessmentError(error_code=UNCACHED, error_message=f"{self._member}: no cached verdict"),
            )
        if v == ABSTAIN:
            return Feedback(
                name=self.name,
                error=AssessmentError(error_code=mt.ABSTAINED, error_message=f"{self._member} abstained"),
            )
        return Feedback(
            name=self.name,
            value=bool(v == 1.0),
            rationale=f"{self._member} votes {'hallucinated' if v else 'supported'}",
        )


def member_scorers(votes: Votes, mapping: TraceMapping, dataset: str, prefix: str = "raim_") -> list[MemberScorer]:
    """One :class:`MemberScorer` per member of ``votes``' roster, named ``<prefix><member>``."""
    out = []
    for m in votes.members:
        s = MemberScorer(name=f"{prefix}{m}", timeout=0)  # 0: no timeout (a miss may load a judge)
        s._member, s._votes, s._mapping, s._dataset = m, votes, mapping, dataset
        out.append(s)
    return out


# ----------------------------------------------------------------------------------------------- panel


class PanelScorer(Scorer):
    """The stacked panel as a scorer: p(hallucinated) and the verdict (:func:`src.mlops.traces.feedback`)."""

    _model: PanelModel = PrivateAttr()
    _judge: mt.Judge = PrivateAttr()
    _mapping: TraceMapping = PrivateAttr()
    _dataset: str = PrivateAttr()
    _cache_dir: Path = PrivateAttr()
    _compute: bool = PrivateAttr()
    _frame: str = PrivateAttr()

    def __call__(self, *, inputs: Any = None, outputs: Any = None, trace: Any = None) -> Feedback:
        item = item_from(inputs, outputs, trace, self._mapping, self._dataset)
        if isinstance(item, Skip):
            return _skipped(self.name, item)
        row = {k: item[k] for k in ("item_id", "question", "evidence", "candidate", "dataset")}
        row["frame"] = item.get("frame") or self._frame
        with _JUDGING:
            out = self._model.predict(
                None, pd.DataFrame([row]), params={"cache_dir": str(self._cache_dir), "compute": self._compute}
            )
        rec = {**out.iloc[0].to_dict(), "frame": row["frame"]}
        if rec.get("uncached"):
            return Feedback(
                name=self.name,
                error=AssessmentError(error_code=UNCACHED, error_message=f"no cached verdict of {rec['uncached']}"),
            )
        members = [m["name"] for m in self._model.roster["members"]]
        return mt.feedback(rec, members, float(self._model.stacker.threshold), self._judge)


def raim_scorers(
    model_uri: str,
    roster: str | None = None,
    members: bool = True,
    cache_dir: str | Path | None = None,
    compute: bool = True,
    frame: str | None = None,
    settings: TracesSettings | None = None,
    dataset: str | None = None,
) -> list[Scorer]:
    """RAIM's scorers for ``mlflow.genai.evaluate``: the stacked panel of ``model_uri`` (a registered or logged RAIM
    stacker or panel model, read from its document; ``roster``: a stacker's roster when its run does not name one)
    and, with ``members``, each of its members. ``settings``: conf/traces (default: conf/traces/default.yaml);
    ``dataset``: the verdict cache's folder of the items (default ``traces.dataset``)."""
    s = settings or mt.settings()
    ds = dataset or s.dataset
    panel = load_panel(model_uri, roster)
    model: PanelModel = panel.model
    where = Path(cache_dir or panel.cache_dir or SCORED_CACHE)
    default = frame or panel.calibrated_frame or model.default_frame
    judge = mt.Judge(
        s.assessment.name,
        str(model.roster.get("name")),
        mt.identities(model.roster),
        model_uri,
        mt.registry_version(model_uri),
    )
    p = PanelScorer(name=s.assessment.name, timeout=0)
    p._model, p._judge, p._mapping, p._dataset = model, judge, s.mapping, ds
    p._cache_dir, p._compute, p._frame = where, compute, default
    if not members:
        return [p]
    votes = Votes(model.live_roster(), model.frames, default, where, compute)
    return [p, *member_scorers(votes, s.mapping, ds)]


# -------------------------------------------------------------------------------------------- ensembles


def ensemble_predictions(
    votes: Votes,
    items: pd.DataFrame,
    members: Sequence[str],
    ensembles: Sequence[str],
    mean_threshold: float,
    mapping: TraceMapping,
    dataset: str,
) -> tuple[dict[str, np.ndarray], dict[str, int], np.ndarray]:
    """MLflow's ``make_scorer_ensemble`` with each built-in of ``ensembles`` over ``members``' scorers, called on each
    item as ``mlflow.genai.evaluate`` calls a scorer: (each ensemble's prediction per item — 1, 0, or
    :data:`ABSTAIN` where MLflow's aggregation refused the item —, how many items each refused, the members' votes as
    the scorers saw them, items × members). ``mean``'s value (the share voting hallucinated) flags an item at
    ``mean_threshold`` or above."""
    votes.prefetch(items)
    subs = [s for s in member_scorers(votes, mapping, dataset) if s._member in members]
    ens = {n: make_scorer_ensemble(name=n, scorers=subs, ensemble_fn=n) for n in ensembles}
    preds = {n: np.full(len(items), ABSTAIN) for n in ensembles}
    refused = dict.fromkeys(ensembles, 0)
    seen = np.full((len(items), len(subs)), ABSTAIN)
    for i, rec in enumerate(items.to_dict("records")):
        inputs = {
            "question": rec.get("question") or "",
            "context": rec.get("evidence") or "",
            "item_id": rec["item_id"],
            "dataset": rec["dataset"],
            "frame": rec.get("frame"),
        }
        for j, s in enumerate(subs):
            fb = s(inputs=inputs, outputs=rec["candidate"])
            seen[i, j] = ABSTAIN if fb.error is not None else float(fb.value)
        for n, e in ens.items():
            try:
                value = e(inputs=inputs, outputs=rec["candidate"]).value
            except MlflowException:
                refused[n] += 1
                continue
            preds[n][i] = float(value >= mean_threshold) if n == "mean" else float(bool(value))
    return preds, refused, seen
