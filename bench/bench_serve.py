"""Load test: the scoring server's normal requests alone, and among N slow clients, on 127.0.0.1.

    python bench/bench_serve.py [--slow 200] [--seconds 40] [--threads 4] [--rounds 2] [--json out.json]

``python -m src.serve model`` (RAIM's strict server, its default limits unless ``--header-timeout`` /
``--body-timeout`` say otherwise) serves a stacker over 6 members (a StackedLogit fitted on a simulated panel, saved
as an MLflow model). Normal traffic: ``--threads`` clients each POSTing 10-row ``dataframe_records`` requests, one
connection per request, for ``--seconds`` per phase; every answer must be a 200 with 10 predictions. Each round
runs two phases back to back: *alone*, then *among N slow clients* — a separate process holding ``--slow``
connections open, half of them sending the headers with ``Content-Length: 100`` then one byte (a body that never
ends), half sending half a header line (headers that never end); a connection the server closes (408) is opened
again at once, so N stay open throughout. The default 40 s outlast both timeouts (10 s, 30 s): every slow client
is answered and comes back at least once while the normal requests are measured. Printed: p50 / p99 / max latency of the normal requests per phase and
their ratio (among / alone), failures, and how many 408s the slow clients got. Run it under the shared lock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from harness import cpu, machine, settle  # noqa: E402

MEMBERS = [f"m{j}" for j in range(6)]
SLOW_BODY = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
SLOW_HEAD = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Ty"


def saved_stacker(folder: Path) -> Path:
    """A stacker over :data:`MEMBERS` fitted on a simulated panel, saved as a model folder in ``folder``."""
    from src.core.aggregate import StackedLogit
    from src.mlops import packaging, serving

    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 2000)
    X = np.column_stack([np.where(rng.random(2000) < 0.75, gold, 1 - gold) for _ in MEMBERS]).astype(float)
    return packaging.save_model(serving.StackerModel(StackedLogit(n_votes=len(MEMBERS)).fit(X, gold), MEMBERS), folder)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, port: int, extra: list[str]) -> subprocess.Popen:
    args = [sys.executable, "-m", "src.serve", "model", "--model-uri", str(model), "--port", str(port), *extra]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line.startswith("ready on"):
        raise RuntimeError(f"the server did not start: {line!r}")
    return proc


def body(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    rows = [{m: int(v) for m, v in zip(MEMBERS, r)} for r in rng.integers(0, 2, (10, len(MEMBERS)))]
    return json.dumps({"dataframe_records": rows}).encode()


def normal_traffic(port: int, seconds: float, threads: int) -> tuple[list[float], int]:
    """Latencies (s) of the requests ``threads`` clients send one after another for ``seconds``, and how many
    failed."""
    url = f"http://127.0.0.1:{port}/invocations"
    lat: list[float] = []
    failed = [0]
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client(k: int) -> None:
        i = 0
        while time.perf_counter() < deadline:
            i += 1
            req = urllib.request.Request(url, data=body(k * 100000 + i), headers={"Content-Type": "application/json"})
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    ok = r.status == 200 and len(json.loads(r.read())["predictions"]) == 10
            except OSError:
                ok = False
            dt = time.perf_counter() - t0
            with lock:
                if ok:
                    lat.append(dt)
                else:
                    failed[0] += 1

    workers = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return lat, failed[0]


async def _hold(port: int, data: bytes, stop: asyncio.Event, counts: dict) -> None:
    """One slow client: send ``data``, wait for the server to answer (408) and close, open again; until ``stop``."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(data)
            await writer.drain()
            counts["open"] += 1
            answer = await reader.read()
            counts["408"] += answer.startswith(b"HTTP/1.1 408 ")
            counts["open"] -= 1
            writer.close()
        except OSError:
            counts["errors"] += 1
            await asyncio.sleep(0.05)


def slow_clients(port: int, n: int, ready, done, out) -> None:
    """The slow-client process: ``n`` connections held (:func:`_hold`) until ``done`` is set; ``out`` gets counts."""

    async def main() -> None:
        stop, counts = asyncio.Event(), {"open": 0, "408": 0, "errors": 0}
        tasks = [asyncio.create_task(_hold(port, SLOW_BODY if i % 2 else SLOW_HEAD, stop, counts)) for i in range(n)]
        while counts["open"] < n:
            await asyncio.sleep(0.05)
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.1)
        out.put({"held": counts["open"], "answered_408": counts["408"], "errors": counts["errors"]})
        stop.set()
        for t in tasks:
            t.cancel()

    asyncio.run(main())


def stats(lat: list[float]) -> dict:
    q = np.percentile(lat, [50, 99]) if lat else [float("nan")] * 2
    return {"n": len(lat), "p50_ms": 1e3 * q[0], "p99_ms": 1e3 * q[1], "max_ms": 1e3 * max(lat, default=float("nan"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", type=int, default=200, help="slow clients held open during the loaded phase")
    ap.add_argument("--seconds", type=float, default=40.0, help="seconds of normal traffic per phase")
    ap.add_argument("--threads", type=int, default=4, help="normal clients")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--header-timeout", type=float, default=None)
    ap.add_argument("--body-timeout", type=float, default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    extra = [f"--{k}={v}" for k, v in (("header-timeout", a.header_timeout), ("body-timeout", a.body_timeout)) if v]
    settle()
    doc: dict = {"cpu": cpu(), "slow": a.slow, "seconds": a.seconds, "threads": a.threads, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="raim-serve-bench-") as t:
        port = free_port()
        server = start_server(saved_stacker(Path(t) / "stacker"), port, extra)
        try:
            normal_traffic(port, 2.0, a.threads)  # warm-up
            for r in range(a.rounds):
                alone, failed_alone = normal_traffic(port, a.seconds, a.threads)
                ctx = multiprocessing.get_context("spawn")
                ready, done, out = ctx.Event(), ctx.Event(), ctx.Queue()
                p = ctx.Process(target=slow_clients, args=(port, a.slow, ready, done, out))
                p.start()
                if not ready.wait(120):
                    raise RuntimeError(f"the {a.slow} slow clients did not all connect")
                among, failed_among = normal_traffic(port, a.seconds, a.threads)
                done.set()
                slow = out.get(timeout=60)
                p.join(30)
                row = {
                    "alone": {**stats(alone), "failed": failed_alone},
                    "among_slow": {**stats(among), "failed": failed_among},
                    "slow_clients": slow,
                }
                doc["rounds"].append(row)
                print(f"round {r + 1}: {json.dumps(row)}")
        finally:
            server.terminate()
            server.wait(30)
    for phase in ("alone", "among_slow"):
        doc[phase] = {k: statistics.median(x[phase][k] for x in doc["rounds"]) for k in ("p50_ms", "p99_ms")}
    doc["ratio_p50"] = doc["among_slow"]["p50_ms"] / doc["alone"]["p50_ms"]
    doc["ratio_p99"] = doc["among_slow"]["p99_ms"] / doc["alone"]["p99_ms"]
    print(
        f"normal requests (median of {a.rounds} rounds): alone p50 {doc['alone']['p50_ms']:.1f} ms, p99 "
        f"{doc['alone']['p99_ms']:.1f} ms; among {a.slow} slow clients p50 {doc['among_slow']['p50_ms']:.1f} ms, "
        f"p99 {doc['among_slow']['p99_ms']:.1f} ms ({doc['ratio_p50']:.2f}x / {doc['ratio_p99']:.2f}x) [{cpu()}]"
    )
    print(f"-- {machine()}")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
