"""Traces in, assessments out (src/traces.py, src/mlops/traces.py, src/mlops/assessing.py, src/io/traces.py,
src/mlops/scorers.py): the mapping from a trace to an item and every reason a trace is not one; a real sqlite MLflow
store holding traces written with mlflow.tracing (CHAIN root, RETRIEVER spans), judged by a real panel model (the
lexical judge, stacked) through the verdict cache; assessments written once, overridden by another model, read back
by src.rate with the people's labels; RAIM as scorers of mlflow.genai.evaluate and inside MLflow's
make_scorer_ensemble."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import one_worker_at_a_time
from test_track import tracking_store

from src.io.traces import SKIP_REASONS, Skip, TraceMapping, TraceView, candidate_of, question_of, to_item
from src.mlops import assessing
from src.mlops import traces as mt

ROOT = Path(__file__).resolve().parents[1]
MAPPING = TraceMapping(
    question=["question", "query", "input", "prompt", "messages"],
    candidate=["answer", "response", "output", "content", "text"],
    document=["page_content", "content", "text"],
    separator="\n\n",
    item_id="client_request_id",
    max_evidence_chars=200,
    max_candidate_chars=100,
)
DOC = {"page_content": "Paris is the capital of France.", "metadata": {"doc_uri": "d1"}, "id": "1"}


def view(**kw) -> TraceView:
    base = {
        "trace_id": "tr-1",
        "timestamp_ms": 1_700_000_000_000,
        "state": "OK",
        "request": {"question": "What is the capital of France?"},
        "response": "Paris.",
        "retrieved": [[DOC]],
    }
    return TraceView(**{**base, **kw})


# ------------------------------------------------------------------------------------------------- mapping


def test_a_rag_trace_is_an_item():
    item = to_item(view(client_request_id="req-7"), MAPPING)
    assert item == {
        "item_id": "req-7",
        "question": "What is the capital of France?",
        "evidence": "Paris is the capital of France.",
        "candidate": "Paris.",
        "trace_id": "tr-1",
        "ts": 1_700_000_000.0,
    }
    assert to_item(view(), MAPPING)["item_id"] == "tr-1"  # no client request id: the trace's own


@pytest.mark.parametrize(
    "kw, reason",
    [
        ({"state": "IN_PROGRESS"}, "not_finished"),
        ({"state": "ERROR"}, "failed"),
        ({"retrieved": None}, "no_retriever_span"),
        ({"retrieved": [[]]}, "no_documents"),
        ({"retrieved": [[{"metadata": {"doc_uri": "x"}}]]}, "no_documents"),
        ({"retrieved": [[{"page_content": "x" * 201}]]}, "evidence_too_long"),
        ({"request": {"temperature": 0.2}}, "no_question"),
        ({"response": None}, "no_output"),
        ({"response": ""}, "no_output"),
        ({"response": {"score": 3}}, "non_text_output"),
        ({"response": 42}, "non_text_output"),
        ({"response": "y" * 101}, "candidate_too_long"),
    ],
)
def test_every_trace_that_is_not_an_item_says_why(kw, reason):
    got = to_item(view(**kw), MAPPING)
    assert isinstance(got, Skip) and got.reason == reason and reason in SKIP_REASONS, got


def test_item_id_from_a_tag_or_metadata_key_and_its_absence():
    tagged = view(tags={"conversation": "c-9"}, metadata={"user": "u-1"})
    by_tag = dataclasses.replace(MAPPING, item_id="tag:conversation")
    assert to_item(tagged, by_tag)["item_id"] == "c-9"
    assert to_item(tagged, dataclasses.replace(MAPPING, item_id="metadata:user"))["item_id"] == "u-1"
    missing = to_item(view(), by_tag)
    assert isinstance(missing, Skip) and missing.reason == "no_item_id"


def test_the_layouts_a_traced_app_writes():
    # requests: a string, a chat request (the last message), JSON text as MLflow stores span inputs
    assert question_of("Why?", MAPPING.question) == "Why?"
    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]}
    assert question_of(chat, MAPPING.question) == "Why?"
    assert question_of(json.dumps({"query": "Where?"}), MAPPING.question) == "Where?"
    assert question_of(None, MAPPING.question) == ""  # no request: an item without a question
    assert question_of({"question": "", "k": 1}, MAPPING.question) == ""  # a claim dataset's item: no question
    # text that happens to be JSON stays text: an answer "1889", a question "42"
    assert candidate_of("1889", MAPPING.candidate) == "1889" and question_of("42", MAPPING.question) == "42"
    # responses: a string, an OpenAI chat completion, a dict's key, a pyfunc's list
    completion = {"choices": [{"message": {"role": "assistant", "content": "Because."}}]}
    assert candidate_of(completion, MAPPING.candidate) == "Because."
    assert candidate_of({"answer": "Yes.", "sources": [1]}, MAPPING.candidate) == "Yes."
    assert candidate_of(["First.", "Second."], MAPPING.candidate) == "First."
    # documents: several RETRIEVER spans in order, strings or dicts, a repeated text once
    retrieved = [[DOC, "Lyon is a city."], json.dumps([{"content": "Paris is the capital of France."}])]
    item = to_item(view(retrieved=retrieved), MAPPING)
    assert item["evidence"] == "Paris is the capital of France.\n\nLyon is a city."


def test_time_bounds_and_filters():
    now = 1_700_000_000.0
    assert mt.parse_time("24h", now, "--since") == int((now - 86400) * 1000)
    assert mt.parse_time("2023-11-14T22:13:20", now, "--since") == int(now * 1000)  # UTC when no zone is given
    assert mt.parse_time("1700000000", now, "--since") == int(now * 1000)
    with pytest.raises(mt.TraceError, match="--until 'yesterday': not a time"):
        mt.parse_time("yesterday", now, "--until")
    f = mt.search_filter("tags.env = 'prod'", 5, 9)
    assert f == "tags.env = 'prod' AND trace.timestamp_ms >= 5 AND trace.timestamp_ms < 9"
    assert mt.search_filter(None, None, None) is None


def test_labels_read_as_gold_and_a_bad_one_is_one_line():
    for v, g in [(True, 1), (False, 0), (1, 1), (0.0, 0), ("yes", 1), ("No", 0), ("hallucinated", 1)]:
        assert mt.gold_value(v, "x") == g
    with pytest.raises(mt.TraceError, match="trace tr-1: value 'maybe' is not a label"):
        mt.gold_value("maybe", "trace tr-1")


def test_items_of_one_client_request_are_scored_in_separate_batches():
    items = [{"item_id": i} for i in ("a", "b", "a", "c", "a")]
    assert assessing.unique_batches(items) == [[0, 1, 3], [2], [4]]


# ---------------------------------------------------------------------------------------- a real store

ROSTER = {
    "name": "nonllm",
    "members": [
        {
            "name": "lexical",
            "family": "lexical-support",
            "backend": {"_target_": "src.judges.backends.nonllm.LexicalSupportBackend", "threshold": 0.6},
        },
        {
            "name": "minilm",
            "family": "MiniLM-similarity",
            "backend": {
                "_target_": "src.judges.backends.nonllm.MiniLMSimilarityBackend",
                "model": "all-minilm-l6-v2",
                "threshold": {"def_on": 0.75, "claim": 0.6},
                "window": 2,
            },
        },
    ],
}
NAMES = ["lexical", "minilm"]
FACTS = [
    ("What is the capital of France?", "Paris is the capital and largest city of France.", "The capital is Paris."),
    (
        "When was the Eiffel Tower completed?",
        "The Eiffel Tower in Paris was completed in 1889.",
        "It was completed in 1889.",
    ),
    (
        "What does aspirin treat?",
        "Aspirin reduces fever and mild pain in adults.",
        "Quantum tunnelling cures cats overnight.",
    ),
    ("Where is Lyon?", "Lyon is a city in the east of France on the Rhône.", "Lyon lies in southern Norway."),
]


def fitted(seed: int = 0):
    from src.core.aggregate import StackedLogit

    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, 300)
    X = np.column_stack([np.where(rng.random(300) < q, gold, 1 - gold) for q in (0.8, 0.7)]).astype(float)
    return StackedLogit(n_votes=2).fit(X, gold)


def write_traces(experiment: str) -> dict[str, str]:
    """A traced RAG app's requests (mlflow.tracing, as an application writes them): four answered from retrieved
    documents, and one of each kind RAIM cannot judge. Returns {what: trace id}."""
    import mlflow
    from mlflow.entities import Document, SpanType

    from src.mlops.store import artifact_root

    if mlflow.get_experiment_by_name(experiment) is None:  # its artifacts beside the store, not in the checkout
        mlflow.create_experiment(experiment, artifact_location=artifact_root(mlflow.get_tracking_uri(), experiment))
    mlflow.set_experiment(experiment)
    ids: dict[str, str] = {}

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(query: str, docs: list[str]) -> list[Document]:
        return [Document(page_content=d, metadata={"doc_uri": f"doc-{i}"}) for i, d in enumerate(docs)]

    @mlflow.trace(span_type=SpanType.CHAIN)
    def rag(question: str, docs: list[str], answer, request_id: str | None = None):
        if request_id:
            mlflow.update_current_trace(client_request_id=request_id)
        retrieve(question, docs)
        if answer == "boom":
            raise RuntimeError("the app failed")
        return answer

    @mlflow.trace(span_type=SpanType.CHAIN)
    def chat(question: str) -> str:
        return "Hello!"

    for k, (q, ev, cand) in enumerate(FACTS):
        rag(q, [ev], cand, request_id=f"req-{k}")
        ids[f"good{k}"] = mlflow.get_last_active_trace_id()
    chat("hi")
    ids["no_retriever_span"] = mlflow.get_last_active_trace_id()
    rag("Anything?", [], "Nothing found.")
    ids["no_documents"] = mlflow.get_last_active_trace_id()
    rag("Score?", ["A document."], {"score": 3})
    ids["non_text_output"] = mlflow.get_last_active_trace_id()
    with pytest.raises(RuntimeError):
        rag("Crash?", ["A document."], "boom")
    ids["failed"] = mlflow.get_last_active_trace_id()
    mlflow.flush_trace_async_logging()
    return ids


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A sqlite store: a panel model (lexical + MiniLM, stacked) registered as raim-panel-test@champion, a second
    panel model (another stacker), and an experiment `app` of traces."""
    import mlflow
    from mlflow import MlflowClient

    from src.mlops import packaging
    from src.mlops.store import artifact_root

    tmp = tmp_path_factory.mktemp("traces")
    with tracking_store(tmp) as uri:  # every experiment's artifacts beside the store, none in the checkout
        mlflow.set_experiment(
            experiment_id=mlflow.create_experiment("models", artifact_location=artifact_root(uri, "m"))
        )
        with mlflow.start_run():
            info = packaging.log_panel(ROSTER, fitted(0), NAMES, default_frame="def_on", cache_dir=tmp / "cache")
        mv = mlflow.register_model(info.model_uri, "raim-panel-test")
        MlflowClient().set_registered_model_alias("raim-panel-test", "champion", mv.version)
        with mlflow.start_run():
            other = packaging.log_panel(ROSTER, fitted(1), NAMES, default_frame="def_on", cache_dir=tmp / "cache")
        ids = write_traces("app")
        yield {
            "uri": uri,
            "tmp": tmp,
            "ids": ids,
            "model": "models:/raim-panel-test@champion",
            "other": other.model_uri,
        }


def judged(capsys, store, *extra: str, experiment: str = "app") -> str:
    """``python -m src.traces judge`` on an experiment (`app`) with the champion, into the store's cache; its
    stdout."""
    from src import traces

    code, out, err = run(
        capsys,
        traces,
        "judge",
        "--experiment",
        experiment,
        "--model-uri",
        store["model"],
        "--no-progress",
        "--cache-dir",
        str(store["tmp"] / "cache"),
        *extra,
    )
    assert code == 0, err
    return out


def run(capsys, module, *args: str) -> tuple[int, str, str]:
    try:
        code = module.cli(list(args))
    except SystemExit as e:
        code = e.code
    got = capsys.readouterr()
    return code, got.out, got.err


def traces_of(experiment: str = "app") -> dict:
    import mlflow

    exp = mlflow.get_experiment_by_name(experiment).experiment_id
    return {t.info.trace_id: t for t in mlflow.search_traces(locations=[exp], return_type="list", include_spans=False)}


def test_judge_writes_one_assessment_per_trace_and_reports_the_others(store, capsys, tmp_path):
    report = tmp_path / "report.json"
    out = judged(capsys, store, "--page-size", "3", "--report", str(report), "--out", str(tmp_path / "scored.jsonl"))
    doc = json.loads(report.read_text())
    assert doc["read"] == 8 and doc["assessed"] == 4 and doc["already_assessed"] == 0
    assert {k: v["count"] for k, v in doc["skipped"].items()} == {
        "no_retriever_span": 1,
        "no_documents": 1,
        "non_text_output": 1,
        "failed": 1,
    }
    for reason, r in doc["skipped"].items():
        assert r["first"] == [store["ids"][reason]] and r["meaning"] == SKIP_REASONS[reason]
    assert "8 trace(s) read: 4 assessed, 0 already assessed by this model, 4 not judged" in out
    got = traces_of()
    scored = pd.read_json(tmp_path / "scored.jsonl", lines=True).set_index("item_id")
    for k in range(4):
        t = got[store["ids"][f"good{k}"]]
        (a,) = [a for a in t.info.assessments if a.name == "raim_hallucination"]
        assert a.source.source_type == "LLM_JUDGE" and a.source.source_id == "raim/nonllm"
        assert a.value == pytest.approx(scored.loc[t.info.trace_id, "p_hallucinated"], abs=1e-6)
        meta = a.metadata
        assert meta["model"] == f"{store['model']} (version 1)" and meta["item_id"] == f"req-{k}"
        assert meta["frame"] == "def_on" and meta["roster"] == "nonllm" and meta["injection_flag"] == "false"
        assert set(dict(kv.split("=") for kv in meta["judges"].split(","))) == set(NAMES)
        assert meta["verdict"] in a.rationale and "lexical " in a.rationale and "minilm " in a.rationale
    for reason in ("no_retriever_span", "no_documents", "non_text_output", "failed"):
        assert not got[store["ids"][reason]].info.assessments
    # the verdicts are in the verdict cache's traces folder, keyed by the client request ids
    cached = [json.loads(line) for p in (store["tmp"] / "cache" / "traces").rglob("*.jsonl") for line in p.open()]
    assert sorted({r["item_id"] for r in cached}) == [f"req-{k}" for k in range(4)]


def test_rerunning_adds_nothing_and_another_model_overrides(store, capsys, tmp_path):
    from src import traces

    base = [
        "judge",
        "--experiment",
        "app",
        "--no-progress",
        "--report",
        str(tmp_path / "r.json"),
        "--cache-dir",
        str(store["tmp"] / "cache"),
    ]
    code, out, err = run(capsys, traces, *base, "--model-uri", store["model"])
    assert code == 0, err
    assert json.loads((tmp_path / "r.json").read_text())["already_assessed"] == 4
    before = {i: len(t.info.assessments) for i, t in traces_of().items()}
    code, out, err = run(capsys, traces, *base, "--model-uri", store["other"], "--no-compute")
    assert code == 0, err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["overrode"] == 4 and doc["logged"] == 0  # every verdict was cached: --no-compute judged them all
    for i, t in traces_of().items():
        mine = [a for a in t.info.assessments if a.name == "raim_hallucination"]
        assert len(mine) == before[i] + (1 if mine else 0)
        if mine:
            assert [a.metadata["model"] for a in mine if a.valid is not False] == [store["other"]]


def test_people_label_traces_and_src_rate_reads_them(store, capsys, tmp_path):
    import mlflow
    from mlflow.entities import AssessmentSource

    from src import rate, traces

    proposal = tmp_path / "first.json"
    code, out, err = run(capsys, rate, "propose", "traces:app", "2", "--proposal", str(proposal), "--tag-traces")
    assert code == 0, err
    proposed = json.loads(proposal.read_text())["proposed"]
    tagged = [i for i, t in traces_of().items() if t.info.tags.get("raim.label_request") == "first"]
    assert sorted(tagged) == sorted(proposed) and "tags.`raim.label_request` = 'first'" in out
    # a person labels the tagged traces (HUMAN feedback, as the trace view writes it)
    gold = {store["ids"][f"good{k}"]: int(k >= 2) for k in range(4)}
    human = AssessmentSource(source_type="HUMAN", source_id="reviewer@example.com")
    for t in tagged:
        mlflow.log_feedback(trace_id=t, name="hallucinated", value=bool(gold[t]), source=human)
    code, out, err = run(
        capsys,
        traces,
        "labels",
        "--experiment",
        "app",
        "--out",
        str(tmp_path / "gold.csv"),
        "--table",
        str(tmp_path / "table.csv"),
        "--cache-dir",
        str(store["tmp"] / "cache"),
    )
    assert code == 0, err
    got = pd.read_csv(tmp_path / "gold.csv")
    assert dict(zip(got["item_id"], got["gold"])) == {t: gold[t] for t in tagged}
    table = pd.read_csv(tmp_path / "table.csv")
    assert list(table.columns[:4]) == ["item_id", "cluster_id", "dataset", "gold"] and set(NAMES) <= set(table.columns)
    assert sorted(table["item_id"]) == sorted(tagged)
    code, out, err = run(
        capsys,
        rate,
        "estimate",
        "traces:app",
        "--labels",
        "traces",
        "--proposal",
        str(proposal),
        "--min-labels",
        "1",
        "--out",
        str(tmp_path / "rate.json"),
    )
    assert code == 0, err
    doc = json.loads((tmp_path / "rate.json").read_text())
    assert doc["pool"]["items"] == 4 and doc["segments"]["all"]["labels"] == len(tagged)
    assert doc["design"] == "active (proposal)"


def test_bad_requests_are_one_line(store, capsys, tmp_path):
    from src import rate, traces

    code, _, err = run(capsys, traces, "judge", "--experiment", "nosuch", "--model-uri", store["model"])
    assert code == 2 and err.strip() == f"error: --experiment 'nosuch': no such experiment in {store['uri']}"
    code, _, err = run(capsys, traces, "judge", "--experiment", "app", "--model-uri", store["model"], "--since", "soon")
    assert code == 2 and "--since 'soon': not a time" in err
    code, _, err = run(
        capsys, traces, "judge", "--experiment", "app", "--model-uri", store["model"], "--filter", "tags.x ~ 1"
    )
    assert code == 2 and err.startswith("error: search_traces (filter 'tags.x ~ 1')") and len(err.splitlines()) == 1
    code, _, err = run(capsys, rate, "estimate", "scored.csv", "--labels", "traces")
    assert code == 2 and "error:" in err


def test_raim_in_one_line_of_mlflow_genai_evaluate(store, capsys):
    """The stacked panel and each member as scorers: on the experiment's traces (evidence from the RETRIEVER spans)
    and on plain rows (evidence from the inputs' context); p equals the panel model's own on the same item. Its
    traces are its own: evaluate writes each scorer's feedback on them (a second RAIM assessment where the command
    wrote one), and the module's `app` traces keep the assessments the other tests expect."""
    import mlflow

    from src.mlops.panels import load_panel
    from src.mlops.scorers import raim_scorers

    before = {i: len(t.info.assessments) for i, t in traces_of().items()}
    ids = write_traces("evaluate-app")  # its experiment set: evaluate copies another experiment's traces (ids lost)
    # the traces judged and cached by the command; the scorers then only read the cache
    judged(capsys, store, experiment="evaluate-app")
    scorers = raim_scorers(store["model"], cache_dir=store["tmp"] / "cache", compute=False)
    assert [s.name for s in scorers] == ["raim_hallucination", "raim_lexical", "raim_minilm"]
    exp = mlflow.get_experiment_by_name("evaluate-app").experiment_id
    result = mlflow.genai.evaluate(data=mlflow.search_traces(locations=[exp]), scorers=scorers)
    rows = result.result_df.set_index("trace_id")
    panel = load_panel(store["model"]).model
    for k, (q, ev, cand) in enumerate(FACTS):
        tid = ids[f"good{k}"]
        item = {"item_id": f"req-{k}", "question": q, "evidence": ev, "candidate": cand, "dataset": "traces"}
        want = panel.predict(
            None, pd.DataFrame([{**item, "frame": "def_on"}]), {"cache_dir": str(store["tmp"] / "cache")}
        )
        assert rows.loc[tid, "raim_hallucination/value"] == pytest.approx(want["p_hallucinated"].iloc[0], abs=1e-6)
        for m in NAMES:
            assert rows.loc[tid, f"raim_{m}/value"] == bool(want[m].iloc[0])
    for reason in ("no_retriever_span", "no_documents", "non_text_output"):
        assert reason in rows.loc[ids[reason], "raim_hallucination/error_message"]
    plain = [{"inputs": {"question": FACTS[2][0], "context": FACTS[2][1]}, "outputs": FACTS[2][2]}]
    fresh = raim_scorers(store["model"], cache_dir=store["tmp"] / "cache", members=False)  # judges the miss
    got = mlflow.genai.evaluate(data=plain, scorers=fresh).result_df
    assert 0.5 < got["raim_hallucination/value"].iloc[0] <= 1  # the aspirin answer has no support in its evidence
    assert {i: len(t.info.assessments) for i, t in traces_of().items()} == before


@pytest.mark.slow
def test_a_person_sees_raims_assessment_in_the_mlflow_trace_view(store, capsys, tmp_path):
    """`mlflow server` on the store and headless Chromium (Debian's package) on the trace view: the assessments pane,
    opened as a person opens it, shows RAIM's assessment, its value and its rationale; the screenshot is kept
    (scripts/trace_view.py)."""
    import os
    import shutil
    import subprocess
    import sys

    if shutil.which("chromium") is None:
        if os.environ.get("RAIM_REQUIRE_BROWSER"):
            pytest.fail("no chromium on PATH (.ci/run installs Debian's package)")
        pytest.skip("no chromium on PATH: apt-get install -y chromium")
    judged(capsys, store)
    tid = store["ids"]["good2"]
    (a,) = [a for a in traces_of()[tid].info.assessments if a.name == "raim_hallucination" and a.valid is not False]
    shot = tmp_path / "trace.png"
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "trace_view.py"),
        "--tracking-uri",
        store["uri"],
        "--experiment",
        "app",
        "--trace-id",
        tid,
        "--out",
        str(shot),
        "--expect",
        f"{a.value:g}",
        "--expect",
        "Votes: lexical",  # the rationale, unfolded as a person unfolds it
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    assert p.stdout.startswith("Assessments\n") and "raim_hallucination" in p.stdout
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


@pytest.mark.slow
def test_the_misses_are_judged_on_ray_where_it_is_configured(store, capsys, tmp_path, tmp_path_factory):
    """`--engine ray` (judge.engine): the traces' misses judged by Ray actors, the driver writing the cache; the
    assessments equal a local run's."""
    import os

    ray = pytest.importorskip("ray")
    from src import traces

    write_traces("ray-app")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with one_worker_at_a_time(tmp_path_factory, "ray"):  # one local cluster at a time under `pytest -n 2`
        _judge_on_ray_and_locally(ray, traces, store, capsys, tmp_path)


def _judge_on_ray_and_locally(ray, traces, store, capsys, tmp_path) -> None:
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        address = ray.get_runtime_context().gcs_address
        outs = {}
        for engine in ("ray", "local"):
            out = tmp_path / f"{engine}.jsonl"
            code, _, err = run(
                capsys,
                traces,
                "judge",
                "--experiment",
                "ray-app",
                "--model-uri",
                store["model"],
                "--no-progress",
                "--cache-dir",
                str(tmp_path / engine),
                "--out",
                str(out),
                "--engine",
                engine,
                *(["--ray-address", address, "--ray-cpus", "1"] if engine == "ray" else []),
            )
            assert code == 0, err
            outs[engine] = pd.read_json(out, lines=True) if out.stat().st_size else pd.DataFrame()
            if engine == "ray":  # the local run below re-judges the same traces: assessed, so nothing to write
                assert len(outs["ray"]) == 4
                ids = list(outs["ray"]["item_id"])
                for t in traces_of("ray-app").values():
                    if t.info.trace_id in ids:
                        mlflow_delete_raim(t)
        assert outs["ray"]["p_hallucinated"].tolist() == pytest.approx(outs["local"]["p_hallucinated"].tolist())
        cached = [json.loads(x) for p in (tmp_path / "ray" / "traces").rglob("*.jsonl") for x in p.open()]
        assert len(cached) == 8  # 4 items × 2 members, judged by the actors, written once by the driver
    finally:
        ray.shutdown()


def mlflow_delete_raim(trace) -> None:
    import mlflow

    for a in trace.info.assessments:
        if a.name == "raim_hallucination":
            mlflow.delete_assessment(trace_id=trace.info.trace_id, assessment_id=a.assessment_id)


def test_a_run_that_dies_keeps_what_it_wrote_and_the_next_finishes_it(store, capsys, monkeypatch):
    """The store fails on the third assessment: the two written stay, the command stops; the re-run writes the
    other two and nothing twice."""
    from src import traces
    from src.mlops import assessing

    ids = write_traces("crash-app")
    real, calls = assessing.write, []

    def failing(trace, fb):
        calls.append(trace.info.trace_id)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(trace, fb)

    monkeypatch.setattr(assessing, "write", failing)
    base = ["judge", "--experiment", "crash-app", "--model-uri", store["model"], "--no-progress", "--page-size", "2"]
    code, _, err = run(capsys, traces, *base, "--cache-dir", str(store["tmp"] / "cache"))
    assert code == 2 and "disk full" in err
    monkeypatch.setattr(assessing, "write", real)
    code, out, err = run(capsys, traces, *base, "--cache-dir", str(store["tmp"] / "cache"))
    assert code == 0, err
    assert "2 assessed, 2 already assessed by this model" in out
    got = traces_of("crash-app")
    for k in range(4):
        mine = [a for a in got[ids[f"good{k}"]].info.assessments if a.name == "raim_hallucination"]
        assert len(mine) == 1


def test_without_compute_a_trace_with_a_missing_verdict_waits(store, capsys, tmp_path):
    """--no-compute on an empty cache: nothing is assessed on partial information, every judgeable trace is counted
    not_cached, and the scored pool holds only what reached the traces (nothing)."""
    from src import traces

    ids = write_traces("nocache-app")
    out = tmp_path / "scored.csv"
    code, stdout, err = run(
        capsys,
        traces,
        "judge",
        "--experiment",
        "nocache-app",
        "--model-uri",
        store["model"],
        "--no-progress",
        "--no-compute",
        "--cache-dir",
        str(tmp_path / "empty"),
        "--out",
        str(out),
    )
    assert code == 0, err
    assert "0 assessed" in stdout and "not_cached 4" in stdout
    assert len(pd.read_csv(out)) == 0 and out.read_text().startswith("item_id,ts,p_hallucinated")
    assert not any(traces_of("nocache-app")[ids[f"good{k}"]].info.assessments for k in range(4))
