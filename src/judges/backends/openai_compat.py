"""Any OpenAI-compatible server (``vllm serve``, ``python -m llama_cpp.server``, ...).

``endpoint: completions`` (default) sends the prompt rendered with the member's chat template and asks for
one token with its top logprobs (``max_tokens=1, logprobs=k, temperature=0``): constrained scoring from the
top-k (verdict variants outside the top-k count 0 towards the mass).  ``endpoint: chat`` sends messages and
reads ``logprobs.content[0].top_logprobs``.  ``mode: generate`` asks for ``max_new_tokens`` and parses the
answer text.  Servers that share the prompt prefix (vLLM prefix caching, llama.cpp's slot cache) reuse the
document's KV cache because items arrive grouped by document.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

from ..frames import Frame
from ..scoring import ABSTAIN_ERROR, parse_free_text, verdict_from_token_logprobs
from .base import Backend, abstention, split_template


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
        self._http = None

    def _identity_extra(self) -> dict:
        d = {"model": self.model, "sha256": self.sha256, "revision": self.revision, "endpoint": self.endpoint,
             "top_logprobs": self.top_logprobs}
        if self.endpoint == "completions":
            d["template"] = self.template
        if self.mode == "generate":
            d["max_new_tokens"] = self.max_new_tokens
        return d

    def http(self):
        if self._http is None:
            import httpx

            self._http = httpx.Client(timeout=self.timeout, headers={"Authorization": f"Bearer {self.api_key}"})
        return self._http

    def _post(self, path: str, body: dict) -> dict:
        import httpx

        for attempt in range(self.max_retries + 1):
            try:
                r = self.http().post(self.base_url + path, json=body)
                if r.status_code in (429, 500, 502, 503, 504) and attempt < self.max_retries:
                    time.sleep(min(2**attempt, 30))
                    continue
                r.raise_for_status()
                return r.json()
            except httpx.TransportError:
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
        except Exception as e:  # noqa: BLE001
            import httpx

            # a request the server rejects (4xx, e.g. a prompt over its context) is a counted abstention;
            # transport failures and 5xx after retries raise, so nothing wrong is cached and a rerun resumes
            if not (isinstance(e, httpx.HTTPStatusError) and 400 <= e.response.status_code < 500):
                raise
            return abstention(ABSTAIN_ERROR, t0, error=repr(e)[:200])
        if gen:
            rec = parse_free_text(text, frame.supported_words, frame.hallucinated_words)
            rec["answer"] = text
        else:
            rec = verdict_from_token_logprobs(lp, frame.supported_words, frame.hallucinated_words, self.mass_floor)
        rec.update(truncated=False, n_prompt_tokens=usage.get("prompt_tokens"), seconds=time.perf_counter() - t0)
        return rec



    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
