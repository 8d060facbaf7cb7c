"""A tiny RAG application traced with MLflow, with no generator model: it retrieves one passage over a shipped
benchmark's documents (TF-IDF, k = 1) and answers with that benchmark's candidate for the request. Each request is
one MLflow trace: a CHAIN root span (the question in, the answer out) and a RETRIEVER span (the documents).

    python examples/traces/rag_app.py --experiment raim-rag-demo [--dataset medhallu] [--tracking-uri URI]

The requests are the items of the dataset's judged subsample (`judge.per_dataset`, the items the committed `cpu`
verdict cache holds), each sent with its benchmark id as the trace's client request id; a correctly retrieved
request is then exactly a benchmark item, whose verdicts are already in the verdict cache. A few requests show
what RAIM cannot judge: small talk that retrieves nothing (no RETRIEVER span), a search with no hit (no document),
and a request the application fails on (trace state ERROR).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# MLflow exports traces on a background queue that drops traces when it is full (measured: 255 of 1,000 traces
# written at full speed into a sqlite store were dropped): this demo writes each trace before the next request
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")

import mlflow  # noqa: E402
import numpy as np  # noqa: E402
from mlflow.entities import Document, SpanType  # noqa: E402
from sklearn.feature_extraction.text import TfidfVectorizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout's RAIM, for the benchmark's judged subsample

from src.io.datasets import read_items  # noqa: E402
from src.judges.runner import cluster_subsample  # noqa: E402
from src.mlops.store import artifact_root  # noqa: E402


class App:
    """Retrieval over the benchmark's evidence passages; the answer is the benchmark's candidate."""

    def __init__(self, items):
        self.answers = dict(zip(items["item_id"], items["candidate"]))  # the "generator": the benchmark's answer
        self.passages = list(dict.fromkeys(items["evidence"]))
        self.tfidf = TfidfVectorizer(stop_words="english").fit(self.passages)
        self.index = self.tfidf.transform(self.passages)

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(self, query: str, k: int = 1) -> list[Document]:
        scores = (self.index @ self.tfidf.transform([query]).T).toarray().ravel()
        top = [int(i) for i in np.argsort(-scores)[:k] if scores[i] > 0]
        return [Document(page_content=self.passages[i], metadata={"doc_uri": f"passage-{i}"}, id=str(i)) for i in top]

    @mlflow.trace(span_type=SpanType.CHAIN)
    def answer(self, question: str, request_id: str) -> str:
        mlflow.update_current_trace(client_request_id=request_id, tags={"app": "raim-rag-demo"})
        docs = self.retrieve(question)
        if not docs:
            return "I could not find anything about that."
        return self.answers[request_id]

    @mlflow.trace(span_type=SpanType.CHAIN)
    def chat(self, question: str, request_id: str) -> str:
        mlflow.update_current_trace(client_request_id=request_id, tags={"app": "raim-rag-demo"})
        if "crash" in question:
            raise RuntimeError("the application failed on this request")
        return "Hello! Ask me a medical question."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiment", default="raim-rag-demo")
    ap.add_argument("--dataset", default="medhallu")
    ap.add_argument("--per-dataset", type=int, default=200, help="judge.per_dataset: the judged subsample")
    ap.add_argument("--tracking-uri", default=None)
    a = ap.parse_args()
    if a.tracking_uri:
        mlflow.set_tracking_uri(a.tracking_uri)
    if mlflow.get_experiment_by_name(a.experiment) is None:  # its artifacts beside a sqlite store
        mlflow.create_experiment(a.experiment, artifact_location=artifact_root(mlflow.get_tracking_uri(), a.experiment))
    mlflow.set_experiment(a.experiment)
    items = cluster_subsample(read_items(ROOT / "datasets" / f"{a.dataset}.jsonl"), a.per_dataset, seed=0)
    app = App(items)
    for rec in items.to_dict("records"):
        app.answer(rec["question"], rec["item_id"])
    app.answer("zzzz qqqq xxxx", "no-hit-1")  # the retriever finds nothing
    app.chat("hi there", "small-talk-1")  # no retrieval at all
    try:
        app.chat("please crash", "crash-1")
    except RuntimeError:
        pass
    mlflow.flush_trace_async_logging()
    print(f"{len(items) + 3} requests traced into experiment {a.experiment!r} ({mlflow.get_tracking_uri()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
