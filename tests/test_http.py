"""The one retry policy of the judges behind HTTP (src/judges/http.py): ``Retry-After`` honoured, back-off jittered,
every request and retry counted and reported by the verdict run; against stand-in servers on 127.0.0.1 that answer
a fixed script and stop by themselves."""

from __future__ import annotations

import email.utils
import json
import random
import socket
import threading
import time
import urllib.error
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from src.core.errors import RaimError
from src.judges.backends.openai_compat import OpenAICompatBackend
from src.judges.frames import load_frame
from src.judges.http import RETRYABLE, RetryPolicy, retry_after
from src.judges.runner import verdict_table

ITEMS = pd.DataFrame(
    {
        "item_id": ["pos"],
        "cluster_id": ["c"],
        "dataset": ["t"],
        "gold": [0],
        "frame": ["claim"],
        "question": [""],
        "evidence": ["Paris is the capital and largest city of France."],
        "candidate": ["The capital of France is Paris."],
    }
)


# ------------------------------------------------------------------------------------------------ the policy
def test_retry_after_reads_seconds_dates_and_milliseconds():
    assert retry_after({"retry-after": "7"}) == 7.0
    assert retry_after({"Retry-After": " 2.5 "}) == 2.5
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after({"retry-after": date}, now=now) == pytest.approx(30, abs=1.0)
    assert retry_after({"retry-after": email.utils.formatdate(now - 60, usegmt=True)}, now=now) == 0.0
    assert retry_after({"retry-after": "soon"}) is None and retry_after({}) is None and retry_after(None) is None


def test_delay_honours_the_server_then_jitters_the_back_off():
    p = RetryPolicy(max_retries=5, backoff_base=1.0, backoff_max=8.0, rng=random.Random(0))
    asked = [p.delay(0, 3.0) for _ in range(200)]
    assert min(asked) >= 3.0 and max(asked) <= 3.3  # never earlier than asked, at most 10 % later
    for attempt, full in ((0, 1.0), (2, 4.0), (6, 8.0)):  # base·2^attempt, capped at backoff_max
        d = [p.delay(attempt, None) for _ in range(200)]
        assert full * 0.5 <= min(d) and max(d) < full and len(set(d)) > 100  # jittered in [½, 1) of the step
    assert p.delay(0, 9.0) is None  # asks for longer than backoff_max: not waited for


def test_call_counts_retries_and_stops_at_the_first_permanent_error():
    waits: list[float] = []
    p = RetryPolicy(max_retries=3, backoff_base=0.5, sleep=waits.append, rng=random.Random(1))
    script = [("t", 2.0), ("t", None)]

    def request():
        if script:
            raise ValueError(script.pop(0))
        return "ok"

    def transient(err):
        kind, asked = err.args[0]
        return kind == "t", asked

    assert p.call(request, transient) == "ok"
    assert p.counts["requests"] == 3 and p.counts["retries"] == 2 and p.counts["retry_after"] == 1
    assert 2.0 <= waits[0] <= 2.2 and 0.5 <= waits[1] < 1.0 and p.counts["waited_s"] == pytest.approx(sum(waits))
    script[:] = [("permanent", None), ("t", None)]
    with pytest.raises(ValueError):
        p.call(request, transient)
    assert p.counts["requests"] == 4 and p.counts["retries"] == 2  # no retry of a permanent error
    script[:] = [("t", None)] * 5
    with pytest.raises(ValueError):
        p.call(request, transient)
    assert p.counts["requests"] == 8 and p.counts["retries"] == 5  # 1 + max_retries attempts, then raised


# ------------------------------------------------------------------------------------------ a stand-in server
class Scripted(BaseHTTPRequestHandler):
    """Answers each POST with the next (status, headers) of ``script``, then a chat completion ("Yes" likely)."""

    script: list[tuple[int, dict]] = []
    seen: list[float] = []

    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["content-length"]))
        type(self).seen.append(time.monotonic())
        status, headers = type(self).script.pop(0) if type(self).script else (200, {})
        if status == 200:
            top = [{"token": "Yes", "logprob": -0.1}, {"token": "No", "logprob": -3.0}]
            doc = {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Yes"},
                        "logprobs": {"content": [{**top[0], "top_logprobs": top}]},
                    }
                ],
                "usage": {"prompt_tokens": 42},
            }
        else:
            doc = {"error": {"message": "scripted", "code": status}}
        payload = json.dumps(doc).encode()
        self.send_response(status)
        for k, v in {"content-type": "application/json", "content-length": str(len(payload)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)


@contextmanager
def bounded_server(handler: type, seconds: float = 30.0):
    """``handler`` served on 127.0.0.1 in a thread that polls every 0.1 s and stops by itself after ``seconds`` (or
    when the block ends); yields the port."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.timeout = 0.1
    stop, deadline = threading.Event(), time.monotonic() + seconds

    def serve():
        while not stop.is_set() and time.monotonic() < deadline:
            srv.handle_request()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        yield srv.server_address[1]
    finally:
        stop.set()
        th.join(timeout=5)
        srv.server_close()


@contextmanager
def scripted_server(script: list[tuple[int, dict]]):
    """:class:`Scripted` answering ``script``, then successes; its OpenAI-compatible base URL."""
    Scripted.script, Scripted.seen = list(script), []
    with bounded_server(Scripted) as port:
        yield f"http://127.0.0.1:{port}/v1"


def _backend(url: str, **kw) -> tuple[OpenAICompatBackend, list[float]]:
    be = OpenAICompatBackend(
        base_url=url, model="m", endpoint="chat", api_key="k", timeout=10, mass_floor=0.05, backoff_base=0.05, **kw
    )
    waits: list[float] = []
    real = be.retry.sleep
    be.retry.sleep = lambda s: (waits.append(s), real(s))[1]  # recorded, and really waited
    return be, waits


def test_openai_backend_waits_what_retry_after_asks_and_counts_it():
    with scripted_server([(429, {"Retry-After": "1"}), (503, {}), (200, {})]) as url:
        be, waits = _backend(url, max_retries=4)
        rec = be.score(load_frame("claim"), ITEMS.to_dict("records"))[0]
    assert rec["vote"] == 0 and rec["n_prompt_tokens"] == 42
    assert 1.0 <= waits[0] <= 1.1  # the server's Retry-After, plus at most 10 % jitter
    assert 0.05 <= waits[1] < 0.1  # no header: base·2¹ × [½, 1)
    assert Scripted.seen[1] - Scripted.seen[0] >= 1.0  # the second request really came a second later
    assert be.retry.counts == {
        "requests": 3,
        "retries": 2,
        "retry_after": 1,
        "gave_up": 0,
        "waited_s": pytest.approx(sum(waits)),
    }


def test_openai_backend_gives_up_when_the_server_asks_for_too_long():
    with scripted_server([(503, {"Retry-After": "3600"})]) as url:
        be, waits = _backend(url, max_retries=4, backoff_max=30)
        with pytest.raises(urllib.error.HTTPError):
            be.score(load_frame("claim"), ITEMS.to_dict("records"))
    assert waits == [] and be.retry.counts["gave_up"] == 1 and be.retry.counts["requests"] == 1


def test_a_rejected_request_is_an_abstention_and_a_transient_one_is_not():
    assert 408 in RETRYABLE and 429 in RETRYABLE and 400 not in RETRYABLE
    with scripted_server([(400, {}), (408, {}), (408, {})]) as url:
        be, _ = _backend(url, max_retries=1)
        frame = load_frame("claim")
        rec = be.score(frame, ITEMS.to_dict("records"))[0]
        assert rec["vote"] is None and rec["abstain"] == "error"  # a 400 is not retried: counted abstention
        with pytest.raises(urllib.error.HTTPError):  # 408 twice: retried once, then raised (nothing cached)
            be.score(frame, ITEMS.to_dict("records"))
    assert be.retry.counts["requests"] == 3 and be.retry.counts["retries"] == 1


def served_roster(url: str, **backend) -> dict:
    """A roster of one member, ``served``: an OpenAI-compatible server at ``url`` (``backend``: its settings)."""
    target = "src.judges.backends.openai_compat.OpenAICompatBackend"
    member = {"name": "served", "backend": {"_target_": target, "base_url": url, "api_key": "k", **backend}}
    return {"name": "t", "members": [member]}


def test_the_verdict_run_reports_each_http_judge_s_retries(tmp_path):
    with scripted_server([(429, {"retry-after": "0"}), (200, {})]) as url:
        roster = served_roster(url, model="m", endpoint="chat", backoff_base=0.01, timeout=10)
        t = verdict_table(roster, ITEMS, None, tmp_path, compute=True, progress=False)
    rep = t.attrs["report"]["served"]
    assert rep["computed"] == 1 and rep["http"]["requests"] == 2 and rep["http"]["retries"] == 1
    assert rep["http"]["retry_after"] == 1
    lexical = {
        "name": "t",
        "members": [
            {
                "name": "lexical",
                "backend": {"_target_": "src.judges.backends.nonllm.LexicalSupportBackend", "threshold": 0.6},
            }
        ],
    }
    assert (
        "http"
        not in verdict_table(lexical, ITEMS, None, tmp_path, compute=True, progress=False).attrs["report"]["lexical"]
    )  # a local judge's report is as before


def test_a_judge_server_that_refuses_the_connection_is_named_with_its_url(tmp_path):
    with socket.socket() as s:  # a port where nothing listens once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    roster = served_roster(url, max_retries=0)
    with pytest.raises(RaimError) as e:
        verdict_table(roster, ITEMS, None, tmp_path, compute=True, progress=False)
    msg = str(e.value)
    assert msg.startswith(f"judge served: its server {url} could not be reached (connection refused)")
    assert "urlopen" not in msg and "\n" not in msg


def test_anthropic_backend_uses_the_same_policy():
    from test_judges_servers import MessagesAPI

    from src.judges.backends.anthropic_api import AnthropicBackend

    class OnceOverloaded(MessagesAPI):
        pass

    OnceOverloaded.script, OnceOverloaded.seen = [529], []
    with bounded_server(OnceOverloaded) as port:
        be = AnthropicBackend(
            base_url=f"http://127.0.0.1:{port}", api_key="k", requests_per_minute=0, backoff_base=0.01
        )
        assert isinstance(be.retry, RetryPolicy) and be.retry.counts is be.usage
        waits: list[float] = []
        be.retry.sleep = waits.append
        rec = be.score(load_frame("claim"), ITEMS.to_dict("records"))[0]
    assert rec["vote"] == 0  # "Yes."
    assert be.usage["requests"] == 2 and be.usage["retries"] == 1 and be.usage["retry_after"] == 1
    assert waits == [0.0]  # the stand-in answers retry-after: 0
