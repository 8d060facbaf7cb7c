"""conf/roster/openai_server.yaml: a roster on the user's own OpenAI-compatible server, configured from the
environment (base URL, model, key), composed by Hydra; its served judge scores through the chat endpoint of a
local stand-in server here (and of a real llama-cpp-python server in the slow test), and src.predict runs on it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_judges_servers import llama_server, reply_json  # noqa: F401  (llama_server: a real llama-cpp-python server)

from src.judges.frames import load_frame
from src.judges.runner import build_backend, roster_judges, verdict_table
from src.mlops import redact

ROOT = Path(__file__).resolve().parents[1]
ENV = ("RAIM_OPENAI_BASE_URL", "RAIM_OPENAI_MODEL", "RAIM_OPENAI_API_KEY", "RAIM_OPENAI_REVISION", "OPENAI_API_KEY")
KEY = "tok-" + "q7Z" * 8  # a fake key: it goes to the server, never into a config file or a cache key
ITEMS = pd.DataFrame(
    {
        "item_id": ["pos", "neg"],
        "cluster_id": ["c", "c"],
        "dataset": ["t", "t"],
        "gold": [0, 1],
        "frame": ["claim", "claim"],
        "question": ["", ""],
        "evidence": ["Paris is the capital and largest city of France."] * 2,
        "candidate": ["The capital of France is Paris.", "Lyon hosts a yearly quantum tunnelling festival."],
    }
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for k in ENV:
        monkeypatch.delenv(k, raising=False)


def roster(compose_cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose_cfg("roster=openai_server").roster, resolve=True)


class ChatAPI(BaseHTTPRequestHandler):
    """A minimal OpenAI-compatible chat endpoint: 'No' is likely when the claim says Lyon, 'Yes' otherwise."""

    seen: list[dict] = []

    def log_message(self, *a):  # quiet
        pass

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).seen.append({"path": self.path, "auth": self.headers.get("authorization"), "body": body})
        no = "Lyon" in body["messages"][-1]["content"]
        top = [{"token": "No", "logprob": -0.1 if no else -3.0}, {"token": "Yes", "logprob": -3.0 if no else -0.1}]
        reply_json(
            self,
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": top[0]["token"]},
                        "logprobs": {"content": [{**top[0], "top_logprobs": top}]},
                        "finish_reason": "length",
                    }
                ],
                "usage": {"prompt_tokens": 50, "completion_tokens": 1},
            },
        )


@pytest.fixture()
def chat_api():
    ChatAPI.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), ChatAPI)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_composes_with_defaults_and_builds_without_network(compose_cfg):
    r = roster(compose_cfg)
    assert r["name"] == "openai_server" and [m["name"] for m in r["members"]] == ["served", "lexical"]
    judges = roster_judges(r)
    served = build_backend(judges[0][1])  # no request: the port below is closed
    assert served.base_url == "http://localhost:8000/v1" and served.model == "default"
    assert served.endpoint == "chat" and served.api_key == "none"
    assert served.identity() == {
        "backend": "openai_compat",
        "mode": "constrained",
        "mass_floor": 0.05,
        "model": "default",
        "sha256": "",
        "revision": "",
        "endpoint": "chat",
        "top_logprobs": 20,
    }
    assert build_backend(judges[1][1]).identity()["backend"] == "lexical"


def test_server_model_and_key_come_from_the_environment_only(compose_cfg, monkeypatch):

    text = (ROOT / "conf" / "roster" / "openai_server.yaml").read_text()
    assert "${oc.env:RAIM_OPENAI_API_KEY,null}" in text and "tok-" not in text and "sk-" not in text
    monkeypatch.setenv("OPENAI_API_KEY", "fallback-key")
    assert build_backend(roster(compose_cfg)["members"][0]["backend"]).api_key == "fallback-key"
    monkeypatch.setenv("RAIM_OPENAI_BASE_URL", "http://gpu-box:9000/v1/")
    monkeypatch.setenv("RAIM_OPENAI_MODEL", "Qwen/Qwen2.5-7B-Instruct")
    monkeypatch.setenv("RAIM_OPENAI_REVISION", "a09a3545")
    monkeypatch.setenv("RAIM_OPENAI_API_KEY", KEY)
    node = roster(compose_cfg)["members"][0]["backend"]
    be = build_backend(node)
    assert (be.base_url, be.model, be.api_key) == ("http://gpu-box:9000/v1", "Qwen/Qwen2.5-7B-Instruct", KEY)
    assert be.identity()["revision"] == "a09a3545" and KEY not in json.dumps(be.identity())  # not a cache key
    assert redact.scrub(node)["api_key"] == "***"  # what RAIM logs of the config


def test_a_judge_of_this_roster_gets_verdicts_from_the_server(compose_cfg, chat_api, monkeypatch, tmp_path):
    monkeypatch.setenv("RAIM_OPENAI_BASE_URL", chat_api)
    monkeypatch.setenv("RAIM_OPENAI_MODEL", "my-model")
    monkeypatch.setenv("RAIM_OPENAI_API_KEY", KEY)
    t = verdict_table(roster(compose_cfg), ITEMS, None, tmp_path, compute=True, progress=False)
    assert t["served"].tolist() == [0, 1] and t["lexical"].tolist() == [0, 1]
    assert t["served@logodds"].to_numpy(dtype=float) == pytest.approx([-2.9, 2.9])
    assert len(ChatAPI.seen) == 2
    req = ChatAPI.seen[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == f"Bearer {KEY}"
    body = req["body"]
    assert body["model"] == "my-model" and body["logprobs"] is True and body["top_logprobs"] == 20
    assert body["max_tokens"] == 1 and body["temperature"] == 0.0
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "Paris is the capital" in body["messages"][1]["content"]
    # a second table is read from the cache: no request
    verdict_table(roster(compose_cfg), ITEMS, None, tmp_path, compute=True, progress=False)
    assert len(ChatAPI.seen) == 2


@pytest.mark.slow
def test_predict_runs_a_stacker_of_this_roster_against_the_server(compose_cfg, chat_api, monkeypatch, tmp_path, capsys):
    import mlflow
    from test_track import tracking_store

    from src import predict
    from src.core.aggregate import StackedLogit
    from src.mlops import packaging

    monkeypatch.setenv("RAIM_OPENAI_BASE_URL", chat_api)
    monkeypatch.setenv("RAIM_OPENAI_MODEL", "my-model")
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 200)
    X = np.column_stack([np.where(rng.random(200) < 0.85, gold, 1 - gold) for _ in range(2)]).astype(float)
    stacker = StackedLogit(n_votes=2).fit(X, gold)
    items = tmp_path / "items.csv"
    ITEMS[["item_id", "evidence", "candidate", "gold"]].to_csv(items, index=False)
    with tracking_store(tmp_path):
        with mlflow.start_run(tags={"roster": "openai_server", "frame": "claim"}):
            uri = packaging.log_stacker(stacker, ["served", "lexical"]).model_uri
        code = predict.main(
            [
                str(items),
                "--model-uri",
                uri,
                "--cache-dir",
                str(tmp_path / "cache"),
                "--out",
                str(tmp_path / "out.jsonl"),
                "--no-progress",
            ]
        )
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r["served"], r["lexical"], r["label"]) for r in rows] == [(0, 0, "supported"), (1, 1, "hallucinated")]
    assert [r["p_hallucinated"] for r in rows] == pytest.approx(stacker.predict_proba([[0, 0], [1, 1]])[:, 1])
    assert len(ChatAPI.seen) == 2


@pytest.mark.slow
def test_the_served_judge_against_a_real_llama_cpp_server(compose_cfg, llama_server, monkeypatch):  # noqa: F811
    monkeypatch.setenv("RAIM_OPENAI_BASE_URL", llama_server)
    monkeypatch.setenv("RAIM_OPENAI_MODEL", "smollm2")
    be = build_backend(roster(compose_cfg)["members"][0]["backend"])
    recs = be.score(load_frame("claim"), ITEMS.to_dict("records"))
    for r in recs:  # llama-cpp-python's server returns chat logprobs: a verdict read off them
        assert r["abstain"] is None and r["vote"] in (0, 1) and 0 < r["mass"] <= 1 and r["n_prompt_tokens"] > 0


def test_a_user_and_password_in_the_base_url_are_sent_as_basic_authorization(
    compose_cfg, chat_api, monkeypatch, tmp_path
):
    """``RAIM_OPENAI_BASE_URL=http://user:pass@host/v1``: the request goes to ``host`` with HTTP Basic
    authorization (the standard library would take ``user:pass@host`` for the host name and resolve it)."""
    import base64

    from src.core.errors import RaimError

    host = chat_api.split("//", 1)[1]
    monkeypatch.setenv("RAIM_OPENAI_BASE_URL", f"http://bob:p%40ss-{KEY}@{host}")
    monkeypatch.setenv("OPENAI_API_KEY", "an-unrelated-key")  # the URL's credentials win over this fallback
    be = build_backend(roster(compose_cfg)["members"][0]["backend"])
    assert be.base_url == chat_api and KEY not in be.base_url
    t = verdict_table(roster(compose_cfg), ITEMS, None, tmp_path, compute=True, progress=False)
    assert t["served"].tolist() == [0, 1]
    assert ChatAPI.seen[0]["auth"] == "Basic " + base64.b64encode(f"bob:p@ss-{KEY}".encode()).decode()
    monkeypatch.setenv("RAIM_OPENAI_API_KEY", KEY)  # two credentials: refused, the password not in the line
    be = build_backend(roster(compose_cfg)["members"][0]["backend"])
    with pytest.raises(RaimError, match="carries a user:password and api_key is set as well") as e:
        be.score_one(load_frame("claim"), ITEMS.iloc[0].to_dict())
    assert KEY not in str(e.value) and "\n" not in str(e.value) and len(ChatAPI.seen) == 2  # nothing sent
