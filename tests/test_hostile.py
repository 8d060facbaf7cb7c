"""The scoring server under hostile clients (src/mlops/server.py, src/mlops/limits.py): headers or a body that never
end, bodies over the limit, unknown top-level keys, lone surrogates, a column named twice, a numeric prevalence;
and a monitor store that cannot be written. RAIM's strict app over MLflow's own scoring app, in process
(``_asgi``) or behind the real uvicorn server on 127.0.0.1 (``running``), for models saved and loaded through
MLflow (``test_boundary.saved_models``)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from test_boundary import _asgi, _one_line_400, saved_models
from test_track import free_port

from src.io import votestore
from src.mlops import server as strict_server
from src.mlops.limits import MIB, Limits

ROW = {"m0": 1, "m1": 0, "m2": 1}
FAST = Limits(header_timeout_s=0.5, body_timeout_s=0.5, max_body_bytes=MIB)


@pytest.fixture(scope="module")
def apps(tmp_path_factory):
    """The strict apps of :func:`test_boundary.saved_models` under the default limits."""
    return {name: strict_server.strict_app(m) for name, m in saved_models(tmp_path_factory.mktemp("apps")).items()}


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    """The strict app of :func:`test_boundary.saved_models`' stacker under :data:`FAST` limits."""
    return strict_server.strict_app(saved_models(tmp_path_factory.mktemp("fast"))["stacker"], FAST)


@contextlib.contextmanager
def running(app, limits: Limits):
    """``app`` behind uvicorn with RAIM's server configuration (:func:`src.mlops.server.server_config`), in a
    thread; yields its port."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(strict_server.server_config(app, "127.0.0.1", port, limits))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert time.time() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(15)


def raw(port: int, data: bytes, wait: float = 10.0) -> tuple[bytes, float]:
    """Send ``data`` and read until the server closes the connection: (everything it answered, seconds taken)."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        if data:
            s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return got, time.perf_counter() - t0


def one_line_answer(got: bytes, status: int, needle: str) -> dict:
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), got[:200]
    assert b"connection: close" in head.lower(), head
    doc = json.loads(body)
    assert set(doc) == {"error_code", "message"} and "\n" not in doc["message"] and needle in doc["message"], doc
    return doc


def post(port: int, payload: dict, path: str = "/invocations") -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# ------------------------------------------------------------------------------- slow and large clients


def test_headers_that_never_end_get_a_one_line_408_and_the_connection_is_closed(fast):
    with running(fast, FAST) as port:
        got, took = raw(port, b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        one_line_answer(got, 408, "the request headers were not complete within 0.5 s")
        assert took < 5
        got, took = raw(port, b"")  # a connection that sends nothing at all
        one_line_answer(got, 408, "--header-timeout")
        assert took < 5


def test_a_body_that_never_ends_gets_a_one_line_408_while_others_are_answered(fast):
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    with running(fast, FAST) as port:
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        for s in slow:
            s.sendall(head + b"{")
        status, body = post(port, {"dataframe_records": [ROW]})  # a normal request among 20 stalled ones
        assert status == 200 and len(body["predictions"]) == 1
        got, took = raw(port, head + b"{")
        one_line_answer(got, 408, "the request body was not complete within 0.5 s of its headers (1 byte(s) of 100")
        assert took < 5
        for s in slow:
            s.settimeout(5)
            assert s.recv(65536).startswith(b"HTTP/1.1 408 ")
            s.close()


def test_a_body_over_the_limit_is_a_one_line_413_declared_or_not(fast):
    with running(fast, FAST) as port:
        declared = (
            b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 150000000\r\n\r\n"
        )
        got, took = raw(port, declared)  # refused before a byte of the body is sent
        one_line_answer(got, 413, "larger than 1 MiB")
        assert took < 2
        chunk = b"x" * (256 * 1024)
        chunked = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        chunked += b"Transfer-Encoding: chunked\r\n\r\n" + (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") * 5
        got, _ = raw(port, chunked)
        one_line_answer(got, 413, "--max-body-mb")


# ------------------------------------------------------------------------------------- malformed requests


@pytest.mark.parametrize(
    "app, payload, needle",
    [
        ("stacker", {"dataframe_records": [ROW], "padding": "x" * 1000}, "unknown top-level key(s) ['padding']"),
        ("stacker", {"dataframe_records": [ROW], "inputs": [ROW]}, "rows given twice"),
        (
            "stacker",
            {"dataframe_split": {"columns": ["m0", "m1", "m2", "m2"], "data": [[1, 0, 1, 0]]}},
            "dataframe_split: column 'm2' appears 2 times (columns 3, 4)",
        ),
        ("panel", {"dataframe_records": [{"candidate": "a \ud800 b"}]}, "row 1: column 'candidate': its value holds"),
        ("panel", {"dataframe_records": [{"candidate": "a", "evidence": "\udfff"}]}, "lone surrogate U+DFFF"),
        ("stacker", {"dataframe_records": [{"m0": 1, "m1": 0, "m2\ud800": 1}]}, "its name holds a lone surrogate"),
        ("stacker", {"dataframe_records": [ROW], "params": {"prevalence": 2}}, "parameter 'prevalence': 2"),
        ("stacker", {"dataframe_records": [ROW], "params": {"prevalence": True}}, "parameter 'prevalence': True"),
    ],
)
def test_a_malformed_request_is_a_one_line_400_never_a_500(apps, app, payload, needle):
    _one_line_400(*_asgi(apps[app], json.dumps(payload).encode()), needle)


def test_a_numeric_prevalence_is_read_as_its_text(apps):
    answers = [
        _asgi(apps["stacker"], json.dumps({"dataframe_records": [ROW], "params": {"prevalence": v}}).encode())
        for v in (0.2, "0.2")
    ]
    assert answers[0][0] == 200 and answers[0] == answers[1]
    assert answers[0][1]["predictions"][0]["train_prevalence"] == pytest.approx(0.2)


# ------------------------------------------------------------------------------------- the monitor store


def test_a_store_that_cannot_be_written_is_visible_in_the_answer_the_health_and_the_counts(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # a file where the store's folder should be: nothing can be created there
    monkeypatch.setenv(votestore.STORE_ENV, str(blocker / "votes.sqlite"))
    monkeypatch.delenv(votestore.FAILURE_ENV, raising=False)
    app = strict_server.strict_app(saved_models(tmp_path)["stacker"], FAST)
    with running(app, FAST) as port:
        status, health = get(port, "/health")
        assert status == 200 and health["monitor"]["status"] == "ok" and health["monitor"]["unrecorded_rows"] == 0
        for _ in range(3):
            status, body = post(port, {"dataframe_records": [ROW, ROW]})
            assert status == 200 and all(p["monitor"].startswith("not recorded: ") for p in body["predictions"])
        status, health = get(port, "/health")
        assert status == 503 and health["monitor"]["status"] == "degraded"
        assert health["monitor"]["unrecorded_rows"] == 6 and health["monitor"]["failed_requests"] == 3
        assert health["monitor"]["recorded_rows"] == 0 and health["monitor"]["on_failure"] == "answer"
        assert get(port, "/ping")[0] == 200  # the process answers: liveness stays up
        monkeypatch.setenv(votestore.FAILURE_ENV, "refuse")  # fail closed
        status, body = post(port, {"dataframe_records": [ROW]})
        assert status == 503 and set(body) == {"error_code", "message"} and "\n" not in body["message"]
        assert body["message"].startswith(f"monitor store {blocker / 'votes.sqlite'}: the 1 row(s) of this request")
        monkeypatch.setenv(votestore.STORE_ENV, str(tmp_path / "ok" / "votes.sqlite"))  # the store is back
        status, body = post(port, {"dataframe_records": [ROW]})
        assert status == 200 and "monitor" not in body["predictions"][0]
        status, health = get(port, "/health")
        assert status == 200 and health["monitor"]["status"] == "ok"
        assert health["monitor"]["recorded_rows"] == 1 and health["monitor"]["unrecorded_rows"] == 7


def test_an_unknown_monitor_setting_stops_the_server_at_start(tmp_path, monkeypatch):
    monkeypatch.setenv(votestore.FAILURE_ENV, "maybe")
    with pytest.raises(votestore.MonitorError, match="'maybe' is not one of \\['answer', 'refuse'\\]"):
        strict_server.strict_app(saved_models(tmp_path)["stacker"])


def test_the_command_line_s_limits_reach_the_server(tmp_path):
    """``python -m src.serve model --header-timeout … --body-timeout … --max-body-mb …``: each limit is the one the
    running server applies (not the default)."""
    import os
    import subprocess
    import sys

    saved_models(tmp_path)
    port = free_port()
    args = [sys.executable, "-m", "src.serve", "model", "--model-uri", str(tmp_path / "stacker"), "--port", str(port)]
    limits = ["--header-timeout", "0.5", "--body-timeout", "0.5", "--max-body-mb", "0.01"]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.Popen([*args, *limits], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().startswith("ready on")
        head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        got, took = raw(port, head + b"Content-Length: 100\r\n\r\n{")
        one_line_answer(got, 408, "within 0.5 s of its headers")
        assert took < 5
        got, _ = raw(port, head + b"Content-Length: 20000\r\n\r\n")
        one_line_answer(got, 413, "larger than 0.01 MiB")
        got, _ = raw(port, head)
        one_line_answer(got, 408, "within 0.5 s (--header-timeout)")
    finally:
        proc.terminate()
        proc.wait(30)
