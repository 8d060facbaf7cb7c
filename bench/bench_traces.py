"""Throughput of traces in, assessments out against MLflow's sqlite store, and how it grows with the store's size.

    python bench/bench_traces.py --build --sizes 1000 10000 100000      # once: the stores (nice -n 19, resumable)
    python bench/bench_traces.py --sizes 1000 10000 100000 --sample 1000

For each size N, a sqlite store (``--store-dir``/N/mlflow.db) holds N traces of a RAG application: 1,000 written
with ``mlflow.tracing`` as an application writes them (a CHAIN root span, the question in and the answer out, a
RETRIEVER span returning one ~700-character document; ~25 traces/s into sqlite on two cores, so 100k would take an
hour), repeated under new trace ids up to N (:func:`replicate`: every row of each trace copied with its new id).
Measured, on the quiet machine (bench/harness.py), each side in turn:

* **read**: every trace of the experiment through :func:`src.mlops.traces.pages` (``traces.page_size`` per page,
  spans included), each seen (:func:`src.mlops.traces.view`) and mapped to an item (:func:`src.io.traces.to_item`)
  — what ``python -m src.traces judge`` does before it judges — in traces per second; and the same pages without
  spans (what ``src.rate``'s ``traces:`` pools read);
* **write**: ``--sample`` assessments (:func:`src.mlops.traces.feedback`, one :func:`src.mlops.traces.write` each:
  one store transaction) on the newest traces, in assessments per second (each side's assessments are deleted
  after it, so every size and repeat writes into the same store);
* the baselines of the same run: the same items read from a JSON Lines file (``src.predict``'s input,
  :func:`src.predict.read_items`) and the same number of verdict-cache records appended (one fsynced line each,
  :class:`src.judges.cache.VerdictCache`), so the store's cost is a ratio against RAIM's own file paths.

Prints per size: traces read / s (with and without spans), assessments written / s, their ratios to the baselines
and to the smallest store (how the per-trace cost grows), then the time a judging pass over the largest store would
spend reading and writing. A benchmark, not a test: the counts are asserted, no speed is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# each trace written before the next: MLflow's background export queue drops traces when it is full (1,000 traces
# written at full speed into sqlite: 255 dropped, measured with this script)
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")

EXPERIMENT = "bench-app"
DOC = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after the "
    "engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. Locally nicknamed "
    "'La dame de fer', it was constructed as the centrepiece of the 1889 World's Fair, and to crown the centennial "
    "anniversary of the French Revolution. Although initially criticised by some of France's leading artists and "
    "intellectuals for its design, it has since become a global cultural icon of France and one of the most "
    "recognisable structures in the world. The tower received 5,889,000 visitors in 2022."
)


def store_uri(root: Path, n: int) -> str:
    return f"sqlite:///{root / str(n) / 'mlflow.db'}"


BASE = 1000  # traces the application writes; larger stores repeat them under new ids (replicate)


def write_app_traces(uri: str, n: int) -> None:
    """``n`` traces written by a RAG application with mlflow.tracing (resumable); prints the write rate."""
    import mlflow
    from mlflow.entities import Document, SpanType

    from src.mlops.store import artifact_root

    mlflow.set_tracking_uri(uri)
    if mlflow.get_experiment_by_name(EXPERIMENT) is None:  # its artifacts beside the store
        mlflow.create_experiment(EXPERIMENT, artifact_location=artifact_root(uri, EXPERIMENT))
    exp = mlflow.set_experiment(EXPERIMENT).experiment_id
    have = len(mlflow.search_traces(locations=[exp], include_spans=False, return_type="list"))

    @mlflow.trace(span_type=SpanType.RETRIEVER)
    def retrieve(query: str) -> list[Document]:
        return [Document(page_content=DOC, metadata={"doc_uri": "eiffel"})]

    @mlflow.trace(span_type=SpanType.CHAIN)
    def rag(question: str, k: int) -> str:
        mlflow.update_current_trace(client_request_id=f"req-{k}")
        retrieve(question)
        return f"The tower was completed in {1880 + k % 20}."

    t0 = time.perf_counter()
    for k in range(have, n):
        rag(f"When was the Eiffel Tower completed? ({k})", k)
    dt = time.perf_counter() - t0
    if n > have:
        print(f"the app wrote {n - have} traces into {uri} in {dt:.0f} s ({(n - have) / dt:.0f} traces/s)")


def replicate(base_db: Path, db: Path, n: int) -> None:
    """A store of ``n`` traces: the base store's file, its traces repeated under new trace ids (every row of a trace
    — its info, tags, metadata and spans, the ids inside the spans' JSON too — copied with the new id, one
    millisecond apart), so that the store reads as an application's ``n`` traces would."""
    import base64
    import shutil
    import sqlite3
    import uuid

    shutil.copyfile(base_db, db)
    con = sqlite3.connect(db)
    info_cols = [r[1] for r in con.execute("PRAGMA table_info(trace_info)")]
    infos = con.execute(f"SELECT {', '.join(info_cols)} FROM trace_info ORDER BY timestamp_ms").fetchall()
    spans_cols = [r[1] for r in con.execute("PRAGMA table_info(spans)")]
    by_trace = {}
    for row in con.execute(f"SELECT {', '.join(spans_cols)} FROM spans"):
        by_trace.setdefault(row[0], []).append(row)
    kv = {t: {} for t in ("trace_tags", "trace_request_metadata")}
    for table in kv:
        for key, value, rid in con.execute(f"SELECT key, value, request_id FROM {table}"):
            kv[table].setdefault(rid, []).append((key, value))
    last = max(r[info_cols.index("timestamp_ms")] for r in infos)
    t0 = time.perf_counter()
    rows: dict[str, list] = {"trace_info": [], "spans": [], "trace_tags": [], "trace_request_metadata": []}
    for j in range(len(infos), n):
        src = infos[j % len(infos)]
        old = src[0]
        new_hex = uuid.uuid4().hex
        new = f"tr-{new_hex}"
        old_b64 = base64.b64encode(bytes.fromhex(old[3:])).decode()
        new_b64 = base64.b64encode(bytes.fromhex(new_hex)).decode()
        info = dict(zip(info_cols, src))
        info.update(request_id=new, timestamp_ms=last + 1 + j, client_request_id=f"req-{j}")
        rows["trace_info"].append([info[c] for c in info_cols])
        for sp in by_trace[old]:
            d = dict(zip(spans_cols, sp))
            d.update(trace_id=new, content=d["content"].replace(old, new).replace(old_b64, new_b64))
            rows["spans"].append([d[c] for c in spans_cols])
        for table in kv:
            rows[table] += [(k, v.replace(old, new), new) for k, v in kv[table].get(old, [])]
        if len(rows["trace_info"]) >= 10_000 or j == n - 1:
            with con:
                con.executemany(
                    f"INSERT INTO trace_info ({', '.join(info_cols)}) VALUES ({', '.join('?' * len(info_cols))})",
                    rows["trace_info"],
                )
                con.executemany(
                    f"INSERT INTO spans ({', '.join(spans_cols)}) VALUES ({', '.join('?' * len(spans_cols))})",
                    rows["spans"],
                )
                for table in kv:
                    con.executemany(f"INSERT INTO {table} (key, value, request_id) VALUES (?, ?, ?)", rows[table])
            rows = {k: [] for k in rows}
    con.close()
    print(f"replicated to {n} traces in {db} in {time.perf_counter() - t0:.0f} s")


def build(root: Path, n: int) -> None:
    """The store of size ``n``: the application's first :data:`BASE` traces (written once), then replicated."""
    base = root / "base" / "mlflow.db"
    base.parent.mkdir(parents=True, exist_ok=True)
    write_app_traces(f"sqlite:///{base}", min(BASE, n) if n < BASE else BASE)
    (root / str(n)).mkdir(parents=True, exist_ok=True)
    replicate(base, root / str(n) / "mlflow.db", n)


def read_traces(experiment: str, page_size: int, spans: bool, mapping) -> int:
    """Every trace read, page by page; with spans, each seen and mapped to an item. Returns the items mapped."""
    from src.io.traces import to_item
    from src.mlops import traces as mt

    n = 0
    for page in mt.pages(experiment, None, page_size, include_spans=spans):
        for t in page:
            n += isinstance(to_item(mt.view(t), mapping), dict) if spans else 1
    return n


def write_assessments(traces: list, who) -> list[str]:
    """One RAIM assessment per trace (one transaction each); returns their ids."""
    from src.mlops import traces as mt

    row = {"item_id": "x", "label": "supported", "p_hallucinated": 0.21, "lexical": 0, "minilm": 1}
    ids = []
    for t in traces:
        fb = mt.feedback(row, ["lexical", "minilm"], 0.5, who)
        mt.write(t, fb)
        ids.append(fb.assessment_id)
    return ids


def baseline_read(path: Path) -> int:
    from src.predict import read_items

    return len(read_items(path).frame)


def baseline_write(cache_dir: Path, n: int) -> int:
    from src.judges.cache import VerdictCache

    c = VerdictCache(cache_dir, "lexical", {"bench": time.time_ns()})
    c.open_for_append()
    for k in range(n):
        c.put({"key": f"k{k}", "vote": k % 2, "logodds": 0.1, "mass": None, "item_id": f"req-{k}"})
    return len(c)


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def measure(root: Path, n: int, sample: int, repeats: int, page_size: int) -> dict:
    import mlflow
    from mlflow import MlflowClient

    from src.mlops import traces as mt

    s = mt.settings()
    mlflow.set_tracking_uri(store_uri(root, n))
    exp = mt.experiment_id(EXPERIMENT)
    newest = MlflowClient().search_traces(locations=[exp], max_results=sample, order_by=["timestamp_ms DESC"])
    who = mt.Judge(s.assessment.name, "bench", {"lexical": "0" * 16, "minilm": "1" * 16}, "models:/bench@x", "1")
    with tempfile.TemporaryDirectory() as tmp:
        items = Path(tmp) / "items.jsonl"
        items.write_text(
            "".join(
                json.dumps({"item_id": f"req-{k}", "question": "When?", "evidence": DOC, "candidate": "In 1889."})
                + "\n"
                for k in range(n)
            )
        )
        times: dict[str, list[float]] = {k: [] for k in ("read", "read_nospans", "write", "jsonl", "cache")}
        for r in range(repeats):  # each side in turn, never all of one then all of the other
            dt, got = timed(read_traces, exp, page_size, True, s.mapping)
            assert got == n, f"{got} of {n} traces mapped"
            times["read"].append(dt)
            dt, got = timed(read_traces, exp, page_size, False, s.mapping)
            assert got == n
            times["read_nospans"].append(dt)
            dt, got = timed(baseline_read, items)
            assert got == n
            times["jsonl"].append(dt)
            dt, ids = timed(write_assessments, newest, who)
            assert len(ids) == len(newest)
            times["write"].append(dt)
            for t, a in zip(newest, ids):
                mlflow.delete_assessment(trace_id=t.info.trace_id, assessment_id=a)
            dt, got = timed(baseline_write, Path(tmp) / f"cache{r}", len(newest))
            assert got == len(newest)
            times["cache"].append(dt)
    best = {k: min(v) for k, v in times.items()}
    return {
        "traces": n,
        "sample": len(newest),
        "read_per_s": n / best["read"],
        "read_nospans_per_s": n / best["read_nospans"],
        "write_per_s": len(newest) / best["write"],
        "jsonl_per_s": n / best["jsonl"],
        "cache_per_s": len(newest) / best["cache"],
        "medians_s": {k: statistics.median(v) for k, v in times.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--store-dir", type=Path, default=Path(tempfile.gettempdir()) / "raim-bench-traces")
    ap.add_argument("--build", action="store_true", help="write the stores' traces (resumable), then stop")
    ap.add_argument("--sample", type=int, default=1000, help="assessments written per size and repeat")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--page-size", type=int, default=None, help="default traces.page_size")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    if a.build:
        for n in a.sizes:
            build(a.store_dir, n)
        return 0
    from harness import machine, settle

    from src.mlops import traces as mt

    page = a.page_size or mt.settings().page_size
    settle()
    rows = [measure(a.store_dir, n, a.sample, a.repeats, page) for n in a.sizes]
    print(machine())
    base = rows[0]
    print(f"page size {page}; best of {a.repeats}; write sample {a.sample} assessments per size")
    print(
        "traces   read/s (spans)  read/s (no spans)  ×JSONL   assess/s  ×cache   read cost ×smallest  "
        "write cost ×smallest"
    )
    for r in rows:
        print(
            f"{r['traces']:>7}  {r['read_per_s']:>13.0f}  {r['read_nospans_per_s']:>16.0f}  "
            f"{r['read_per_s'] / r['jsonl_per_s']:>6.3f}  {r['write_per_s']:>8.0f}  "
            f"{r['write_per_s'] / r['cache_per_s']:>6.3f}  {base['read_per_s'] / r['read_per_s']:>18.2f}  "
            f"{base['write_per_s'] / r['write_per_s']:>19.2f}"
        )
    big = rows[-1]
    total = big["traces"] / big["read_per_s"] + big["traces"] / big["write_per_s"]
    print(
        f"a judging pass over {big['traces']} traces (cached verdicts): ~{big['traces'] / big['read_per_s']:.0f} s "
        f"reading + ~{big['traces'] / big['write_per_s']:.0f} s writing = ~{total / 60:.1f} min of store time"
    )
    if a.json:
        a.json.write_text(json.dumps({"machine": machine(), "page_size": page, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
