"""Any OpenAI-compatible server (``vllm serve``, ``python -m llama_cpp.server``, ...).

``endpoint: completions`` (default) sends the prompt rendered with the member's chat template and asks for
one token with its top logprobs (``max_tokens=1, logprobs=k, temperature=0``): constrained scoring from the
top-k (verdict variants outside the top-k count 0 towards the mass).  ``endpoint: chat`` sends messages and
reads ``logprobs.content[0].top_logprobs``.  ``mode: generate`` asks for ``max_new_tokens`` and parses the
answer text.  Special-token strings inside the item's text (``<|im_end|>``, ``<start_of_turn>``, ``[INST]``, …)
are defanged before they are sent (:func:`src.core.injection.escape_special_tokens`): a server parses special
tokens in the text it tokenizes, in a completions prompt and in chat messages alike.  Servers that share the
prompt prefix (vLLM prefix caching, llama.cpp's slot cache) reuse the document's KV cache because items arrive
grouped by document.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from src.core.errors import RaimError
from src.core.injection import escape_special_tokens
from src.judges.backends.base import Backend, abstention, split_template
from src.judges.frames import Frame
from src.judges.http import RETRYABLE, RetryPolicy, retry_after
from src.judges.scoring import ABSTAIN_ERROR, parse_free_text, verdict_from_token_logprobs


def url_credentials(url: str) -> tuple[str, str | None]:
    """A base URL without its userinfo, and that userinfo as an HTTP Basic ``Authorization`` value (None when
    there is none): ``http://user:pass@host/v1`` → (``http://host/v1``, ``Basic dXNlcjpwYXNz``). The standard
    library would take ``user:pass@host`` for the host name and hand it to the system resolver."""
    parts = urlsplit(str(url).strip())
    if "@" not in parts.netloc:
        return str(url).strip().rstrip("/"), None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return urlunsplit(parts._replace(netloc=host)).rstrip("/"), f"Basic {token}"


def _transient(err: BaseException) -> tuple[bool, float | None]:
    """(retry?, seconds the server asked): a retryable status, or a refused/dropped connection or a timeout."""
    if isinstance(err, urllib.error.HTTPError):
        return err.code in RETRYABLE, retry_after(err.headers)
    return isinstance(err, (urllib.error.URLError, ConnectionError, TimeoutError)), None


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
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
    ):
        super().__init__(mass_floor=mass_floor, mode=mode)
        self.base_url, url_auth = url_credentials(base_url)
        self.refused = (
            f"openai_compat: base_url {self.base_url!r} carries a user:password and api_key is set as "
            f"well: give one of them"
            if url_auth and api_key
            else None
        )  # said at the first request
        self.model = model
        self.sha256 = sha256 or ""
        self.revision = revision or ""
        self.endpoint = endpoint
        self.template = template
        self.top_logprobs = int(top_logprobs)
        self.max_new_tokens = int(max_new_tokens)
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY", "none")
        self.authorization = url_auth or f"Bearer {self.api_key}"
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.retry = RetryPolicy(max_retries, backoff_base, backoff_max)

    def _identity_extra(self) -> dict:
        d = {
            "model": self.model,
            "sha256": self.sha256,
            "revision": self.revision,
            "endpoint": self.endpoint,
            "top_logprobs": self.top_logprobs,
        }
        if self.endpoint == "completions":
            d["template"] = self.template
        if self.mode == "generate":
            d["max_new_tokens"] = self.max_new_tokens
        return d

    def _post(self, path: str, body: dict) -> dict:
        """POST JSON with the standard library (no extra dependency), through the retry policy of
        :mod:`src.judges.http` (429/5xx honouring ``Retry-After``, connection errors, timeouts)."""

        if self.refused:
            raise RaimError(self.refused)
        data = json.dumps(body).encode()

        def once() -> dict:
            req = urllib.request.Request(
                self.base_url + path,
                data=data,
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": self.authorization},
            )
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read())

        return self.retry.call(once, _transient)

    def score_one(self, frame: Frame, item: Mapping[str, Any]) -> dict:
        t0 = time.perf_counter()
        r = frame.render(item)
        user = escape_special_tokens(r.user)  # the server parses special tokens in the text it tokenizes
        gen = self.mode == "generate"
        n = self.max_new_tokens if gen else 1
        try:
            if self.endpoint == "chat":
                body = {
                    "model": self.model,
                    "temperature": 0.0,
                    "max_tokens": n,
                    "messages": [{"role": "system", "content": r.system}, {"role": "user", "content": user}],
                }
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
                body = {"model": self.model, "prompt": head + user + tail, "temperature": 0.0, "max_tokens": n}
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
            if not 400 <= e.code < 500 or e.code in RETRYABLE:
                raise
            return abstention(ABSTAIN_ERROR, t0, error=repr(e)[:200])
        if gen:
            rec = parse_free_text(text, frame.supported_words, frame.hallucinated_words)
            rec["answer"] = text
        else:
            rec = verdict_from_token_logprobs(lp, frame.supported_words, frame.hallucinated_words, self.mass_floor)
        rec.update(truncated=False, n_prompt_tokens=usage.get("prompt_tokens"), seconds=time.perf_counter() - t0)
        return rec
