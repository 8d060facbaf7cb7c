"""A traced request as an item RAIM judges (beyond the paper): the mapping from what an application traced with
MLflow records — its root span's inputs and outputs, its RETRIEVER spans' documents — to the (question, evidence,
candidate) item of §2, and the reasons a trace cannot be one.

Pure: :class:`TraceView` is what :mod:`src.mlops.traces` reads off an MLflow trace; :func:`to_item` maps it.

The default mapping (``conf/traces/default.yaml``, ``mapping``) fits a RAG application traced as MLflow documents:

* **question**: the root span's inputs — a string is the question; an object gives the first of
  ``mapping.question`` that holds a string (``messages`` — a chat request — gives its last message's
  ``content``); an empty or absent request, or one whose question key is empty, is an item without a question
  (judged under the ``claim`` frame unless a frame is given);
* **evidence**: the documents of the top-level RETRIEVER spans (a RETRIEVER span inside another is the
  same retrieval, as MLflow's own judges read it), in span order, each document's text the first of
  ``mapping.document`` it holds (a document that is a string is its own text), repeated texts once, joined by
  ``mapping.separator``;
* **candidate**: the root span's outputs — a string, the first of ``mapping.candidate`` that holds a string, an
  OpenAI-style ``choices[0].message.content`` or the last of ``messages``, or the first element of a list;
* **item id**: the id the verdict cache keys the item by (with its content): ``client_request_id`` (the
  application's own request id, else the trace id), ``trace_id``, ``tag:<key>`` or ``metadata:<key>``.

A trace that cannot be an item is never dropped in silence: :func:`to_item` returns one of :data:`SKIP_REASONS`
with a detail, and the command counts and reports each reason."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from src.io.config import ConfigError

SKIP_REASONS: dict[str, str] = {
    "not_finished": "the trace is still in progress",
    "failed": "the application's request failed (trace state ERROR)",
    "no_retriever_span": "no RETRIEVER span: nothing retrieved to judge the answer against",
    "no_documents": "the RETRIEVER spans returned no document with text",
    "evidence_too_long": "the retrieved documents are longer than mapping.max_evidence_chars",
    "no_question": "the request holds no text under the mapping's question keys",
    "no_output": "the trace has no response",
    "non_text_output": "the response holds no text under the mapping's candidate keys",
    "candidate_too_long": "the response is longer than mapping.max_candidate_chars",
    "no_item_id": "the tag or metadata key the mapping reads the item id from is absent",
}
"""Why a trace is not judged, each with what it means (the command's report counts every one)."""

ITEM_ID_SOURCES = ("client_request_id", "trace_id")


@dataclass(frozen=True)
class TraceMapping:
    """``conf/traces/default.yaml``'s ``mapping``: where a trace's question, evidence, candidate and item id are."""

    question: list[str]
    candidate: list[str]
    document: list[str]
    separator: str
    item_id: str
    max_evidence_chars: int
    max_candidate_chars: int


@dataclass(frozen=True)
class TraceView:
    """What RAIM reads of one trace: its ids, time (ms since the epoch), state (``OK``, ``ERROR``,
    ``IN_PROGRESS``), tags and metadata, its root span's inputs (``request``) and outputs (``response``), parsed,
    and the outputs of each top-level RETRIEVER span (``retrieved``; None when it has none)."""

    trace_id: str
    timestamp_ms: int
    state: str
    client_request_id: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)
    request: Any = None
    response: Any = None
    retrieved: list[Any] | None = None


@dataclass(frozen=True)
class Skip:
    """A trace that is not an item: one of :data:`SKIP_REASONS` and what was found."""

    reason: str
    detail: str


def check_mapping(m: TraceMapping, where: str) -> None:
    """The mapping's values that its types do not hold: an item id source, positive bounds, non-empty key lists."""
    ok = m.item_id in ITEM_ID_SOURCES or (m.item_id.split(":", 1)[0] in ("tag", "metadata") and ":" in m.item_id)
    if not ok:
        raise ConfigError(
            f"{where}: mapping.item_id {m.item_id!r}: one of {', '.join(ITEM_ID_SOURCES)}, tag:<key> or metadata:<key>"
        )
    for key in ("max_evidence_chars", "max_candidate_chars"):
        if getattr(m, key) < 1:
            raise ConfigError(f"{where}: mapping.{key}: {getattr(m, key)!r} is not a positive number of characters")
    for key in ("candidate", "document"):
        if not getattr(m, key):
            raise ConfigError(f"{where}: mapping.{key}: empty (name the keys that hold the text)")


def parsed(value: Any) -> Any:
    """A span's inputs or outputs as data: an object or a list kept as JSON text is decoded; any other string is
    itself (an answer "1889" is text, not a number)."""
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _last_content(messages: Any) -> str | None:
    if isinstance(messages, list) and messages and isinstance(messages[-1], Mapping):
        return _text(messages[-1].get("content"))
    return None


def question_of(request: Any, keys: Sequence[str]) -> str | None:
    """The question of a request (module doc); "" for an empty one; None when a request holds no text there."""
    request = parsed(request)
    if request is None or request in ("", {}, []):
        return ""
    if isinstance(request, str):
        return request
    if isinstance(request, Mapping):
        for k in keys:
            v = request.get(k)
            found = _last_content(v) if k == "messages" else _text(v)
            if found is not None:
                return found
        if any(request.get(k) == "" for k in keys):
            return ""  # a question key given empty: an item without a question
    return None


def candidate_of(response: Any, keys: Sequence[str]) -> str | None:
    """The candidate of a response (module doc); None when it holds no text there."""
    response = parsed(response)
    if isinstance(response, str):
        return response
    if isinstance(response, list):
        return candidate_of(response[0], keys) if response else None
    if not isinstance(response, Mapping):
        return None
    for k in keys:
        if _text(response.get(k)) is not None:
            return response[k]
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        message = choices[0].get("message")
        if isinstance(message, Mapping) and _text(message.get("content")) is not None:
            return message["content"]
    return _last_content(response.get("messages"))


def document_text(doc: Any, keys: Sequence[str]) -> str | None:
    """One retrieved document's text: itself when it is a string, else the first of ``keys`` it holds."""
    if isinstance(doc, str):
        return _text(doc)
    if isinstance(doc, Mapping):
        for k in keys:
            if _text(doc.get(k)) is not None:
                return doc[k]
    return None


def evidence_of(retrieved: list[Any], keys: Sequence[str], separator: str) -> tuple[str, int]:
    """The retrieved documents' texts, in order, each once, joined; and how many documents had text."""
    texts: list[str] = []
    for out in retrieved:
        docs = parsed(out)
        for doc in docs if isinstance(docs, list) else [docs]:
            t = document_text(doc, keys)
            if t is not None and t not in texts:
                texts.append(t)
    return separator.join(texts), len(texts)


def item_id_of(view: TraceView, source: str) -> str | None:
    """The item id the mapping names (``client_request_id`` falls back to the trace id)."""
    if source == "trace_id":
        return view.trace_id
    if source == "client_request_id":
        return view.client_request_id or view.trace_id
    kind, key = source.split(":", 1)
    value = (view.tags if kind == "tag" else view.metadata).get(key)
    return str(value) if value not in (None, "") else None


def to_item(view: TraceView, m: TraceMapping) -> dict[str, Any] | Skip:
    """The item of one trace (``item_id``, ``question``, ``evidence``, ``candidate``, ``trace_id``, ``ts`` in
    seconds), or the :class:`Skip` that says why it is none."""
    if view.state == "IN_PROGRESS":
        return Skip("not_finished", view.state)
    if view.state == "ERROR":
        return Skip("failed", view.state)
    if not view.retrieved:
        return Skip("no_retriever_span", "no span of type RETRIEVER")
    evidence, n_docs = evidence_of(view.retrieved, m.document, m.separator)
    if not n_docs:
        return Skip("no_documents", f"{len(view.retrieved)} RETRIEVER span(s), no document text under {m.document}")
    if len(evidence) > m.max_evidence_chars:
        return Skip("evidence_too_long", f"{len(evidence)} characters in {n_docs} document(s)")
    question = question_of(view.request, m.question)
    if question is None:
        return Skip("no_question", f"request {_shape(view.request)} has none of {m.question}")
    if view.response is None or parsed(view.response) in ("", {}, []):
        return Skip("no_output", "empty response")
    candidate = candidate_of(view.response, m.candidate)
    if candidate is None:
        return Skip("non_text_output", f"response {_shape(view.response)} has none of {m.candidate}")
    if len(candidate) > m.max_candidate_chars:
        return Skip("candidate_too_long", f"{len(candidate)} characters")
    item_id = item_id_of(view, m.item_id)
    if item_id is None:
        return Skip("no_item_id", f"{m.item_id} absent")
    return {
        "item_id": item_id,
        "question": question,
        "evidence": evidence,
        "candidate": candidate,
        "trace_id": view.trace_id,
        "ts": view.timestamp_ms / 1000.0,
    }


def _shape(value: Any) -> str:
    """A short description of a request or response for a skip's detail (its type and keys, never its text)."""
    value = parsed(value)
    if isinstance(value, Mapping):
        return f"with keys {sorted(map(str, value))[:8]}"
    return f"of type {type(value).__name__}"
