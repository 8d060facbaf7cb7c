"""Any OpenAI-compatible server (``vllm serve``, ``python -m llama_cpp.server``, ...).

``endpoint: completions`` (default) sends the prompt rendered with the member's chat template and asks for
one token with its top logprobs (``max_tokens=1, logprobs=k, temperature=0``): constrained scoring from the
top-k (verdict variants outside the top-k count 0 towards the mass).  ``endpoint: chat`` sends messages and
reads ``logprobs.content[0].top_logprobs``.  ``mode: generate`` asks for ``max_new_tokens`` and parses the
answer text.  Servers that share the prompt prefix (vLLM prefix caching, llama.cpp's slot cache) reuse the
document's KV cache because items arrive grouped by document.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from src.judges.backends.base import Backend, abstention, split_template
from src.judges.frames import Frame
from src.judges.scoring import ABSTAIN_ERROR, parse_free_text, verdict_from_token_logprobs


class OpenAICompatBackend(Backend):
    kind = "openai_compat"

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000/v1",
        model: str = "default",
        sha256: str | None = None,
        revision: str | None = None,
        endpoint: str = "completions",
        template: str = "chatml",
        top_logprobs: int = 20,
        mass_floor: float = 0.1,
        mode: str = "constrained",
        max_new_tokens: int = 8,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 4,
        **kw: Any,
    ):
        super().__init__(mass_floor=mass_floor, mode=mode)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.sha256 = sha256 or ""
        self.revision = revision or ""
        self.endpoint = endpoint
        self.template = template
        self.top_logprobs = int(top_logprobs)
        self.max_new_tokens = int(max_new_tokens)
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY", "none")
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)

    def _identity_extra(self) -> dict:
        d = {"model": self.model, "sha256": self.sha256, "revision": self.revision, "endpoint": self.endpoint,
             "top_logprobs": self.top_logprobs}
        if self.endpoint == "completions":
            d["template"] = self.template
        if self.mode == "generate":
            d["max_new_tokens"] = self.max_new_tokens
        return d

    def _post(self, path: str, body: dict) -> dict:
        """POST JSON with the standard library (no extra dependency); retries 429/5xx and connection errors."""

        data = json.dumps(body).encode()
        for attempt in range(self.max_retries + 1):
            req = urllib.request.Request(
                self.base_url + path, data=data, method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                if e.code in (429, 500, 502, 503, 504) and attempt < self.max_retries:
                    time.sleep(min(2**attempt, 30))
                    continue
                raise
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if attempt == self.max_retries:
                    raise
                time.sleep(min(2**attempt, 30))
        raise RuntimeError("unreachable")

    def score_one(self, frame: Frame, item: Mapping[str, Any]) -> dict:
        t0 = time.perf_counter()
        r = frame.render(item)
        gen = self.mode == "generate"
        n = self.max_new_tokens if gen else 1
        try:
            if self.endpoint == "chat":
                body = {"model": self.model, "temperature": 0.0, "max_tokens": n,
                        "messages": [{"role": "system", "content": r.system}, {"role": "user", "content": r.user}]}
                if not gen:
                    body.update(logprobs=True, top_logprobs=self.top_logprobs)
                out = self._post("/chat/completions", body)
                ch = out["choices"][0]
                text = ch["message"].get("content") or ""
                lp = {}
                if not gen:
                    content = (ch.get("logprobs") or {}).get("content") or []
                    if content:
                        lp = {t["token"]: t["logprob"] for t in content[0].get("top_logprobs", [])}
            else:
                head, tail = split_template(self.template, r.system)
                body = {"model": self.model, "prompt": head + r.user + tail, "temperature": 0.0, "max_tokens": n}
                if not gen:
                    body["logprobs"] = self.top_logprobs
                out = self._post("/completions", body)
                ch = out["choices"][0]
                text = ch.get("text") or ""
                lp = {}
                if not gen:
                    tl = (ch.get("logprobs") or {}).get("top_logprobs") or []
                    if tl:
                        lp = dict(tl[0])
            usage = out.get("usage") or {}
        except urllib.error.HTTPError as e:
            # a request the server rejects (4xx, e.g. a prompt over its context) is a counted abstention;
            # transport failures and 5xx after retries raise, so nothing wrong is cached and a rerun resumes
            if not 400 <= e.code < 500 or e.code == 429:
                raise
            return abstention(ABSTAIN_ERROR, t0, error=repr(e)[:200])
        if gen:
            rec = parse_free_text(text, frame.supported_words, frame.hallucinated_words)
            rec["answer"] = text
        else:
            rec = verdict_from_token_logprobs(lp, frame.supported_words, frame.hallucinated_words, self.mass_floor)
        rec.update(truncated=False, n_prompt_tokens=usage.get("prompt_tokens"), seconds=time.perf_counter() - t0)
        return rec

