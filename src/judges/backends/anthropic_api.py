"""The frontier judge: Anthropic's Messages API through the official SDK (``claude-sonnet-4-6``, temperature 0).

The verdict is parsed from the model's answer (free generation; the API exposes no logprobs), an unparseable
answer is a counted abstention.  Retries through the one policy of :mod:`src.judges.http` (honouring
``retry-after``, jittered, counted) on 429, 5xx, 529 and connection errors; a client-side rate limit (requests
per minute); token and cost accounting in ``self.usage`` and in each record.  ``base_url`` (or
``ANTHROPIC_BASE_URL``) points the SDK at another endpoint that speaks the Messages API (the tests use a local one).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from src.judges.backends.base import Backend, abstention
from src.judges.frames import Frame
from src.judges.http import RETRYABLE, RetryPolicy, retry_after
from src.judges.scoring import ABSTAIN_ERROR, parse_free_text


def _transient(err: BaseException) -> tuple[bool, float | None]:
    """(retry?, seconds the server asked): a retryable status, a connection error or a timeout of the SDK."""
    import anthropic  # imported here, not at start-up: the anthropic client ~0.5 s

    if isinstance(err, anthropic.APIStatusError):
        return err.status_code in RETRYABLE, retry_after(getattr(err.response, "headers", None))
    return isinstance(err, (anthropic.APIConnectionError, anthropic.APITimeoutError)), None


class RateLimiter:
    def __init__(self, per_minute: float):
        self.interval = 60.0 / per_minute if per_minute and per_minute > 0 else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        if not self.interval:
            return
        with self._lock:
            now = time.monotonic()
            delay = self._next - now
            self._next = max(now, self._next) + self.interval
        if delay > 0:
            time.sleep(delay)


class AnthropicBackend(Backend):
    kind = "anthropic"

    def __init__(
        self,
        model: str = "claude-sonnet-4-6",
        temperature: float | None = 0.0,
        max_tokens: int = 5,
        requests_per_minute: float = 50,
        max_retries: int = 6,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        timeout: float = 60.0,
        base_url: str | None = None,
        api_key: str | None = None,
        usd_per_mtok_in: float = 3.0,
        usd_per_mtok_out: float = 15.0,
    ):
        super().__init__(mass_floor=0.0, mode="generate")
        self.model = model
        self.temperature = None if temperature is None else float(temperature)
        self.max_tokens = int(max_tokens)
        self.max_retries = int(max_retries)
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        self.timeout = float(timeout)
        self.base_url = base_url
        self.api_key = api_key
        self.price_in = float(usd_per_mtok_in)
        self.price_out = float(usd_per_mtok_out)
        self.limiter = RateLimiter(requests_per_minute)
        self.client = None
        self.usage = {"requests": 0, "retries": 0, "input_tokens": 0, "output_tokens": 0, "usd": 0.0, "errors": 0}
        self.retry = RetryPolicy(max_retries, backoff_base, backoff_max, counts=self.usage)

    def _identity_extra(self) -> dict:
        return {"model": self.model, "temperature": self.temperature, "max_tokens": self.max_tokens}

    def load(self):
        if self.client is None:
            import anthropic  # imported here, not at start-up: the anthropic client ~0.5 s

            key = self.api_key or os.environ.get("ANTHROPIC_API_KEY")
            if not key:
                raise RuntimeError("the frontier judge needs ANTHROPIC_API_KEY (or `api_key`)")
            self.client = anthropic.Anthropic(
                api_key=key,
                base_url=self.base_url or os.environ.get("ANTHROPIC_BASE_URL") or None,
                max_retries=0,  # retries are ours: counted, with back-off and rate limit
                timeout=self.timeout,
            )
        return self.client

    def request(self, system: str, user: str):
        """One Messages API call, through the retry policy of :mod:`src.judges.http` and the rate limit."""
        client = self.load()
        kw: dict[str, Any] = {}
        if self.temperature is not None:
            # SDK 2.x has no `temperature` argument any more; the Messages API field goes in the body
            kw["extra_body"] = {"temperature": self.temperature}

        def once():
            self.limiter.wait()
            return client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                system=system,
                messages=[{"role": "user", "content": user}],
                **kw,
            )

        return self.retry.call(once, _transient)

    def score_one(self, frame: Frame, item: Mapping[str, Any]) -> dict:
        import anthropic  # imported here, not at start-up: the anthropic client ~0.5 s

        t0 = time.perf_counter()
        r = frame.render(item)
        try:
            resp = self.request(r.system, r.user)
        except anthropic.APIStatusError as e:
            # a request the API rejects for its content (400, 413, 422) is a counted abstention; auth errors,
            # and 429/5xx once the retries are spent, raise so that nothing transient is cached
            if e.status_code in (401, 403) or e.status_code in RETRYABLE or e.status_code >= 500:
                raise
            self.usage["errors"] += 1
            return abstention(ABSTAIN_ERROR, t0, error=str(e.status_code))
        text = "".join(getattr(b, "text", "") for b in resp.content if getattr(b, "type", "") == "text")
        rec = parse_free_text(text, frame.supported_words, frame.hallucinated_words)
        tin = int(getattr(resp.usage, "input_tokens", 0) or 0)
        tout = int(getattr(resp.usage, "output_tokens", 0) or 0)
        usd = tin * self.price_in / 1e6 + tout * self.price_out / 1e6
        self.usage["input_tokens"] += tin
        self.usage["output_tokens"] += tout
        self.usage["usd"] += usd
        rec.update(
            answer=text,
            input_tokens=tin,
            output_tokens=tout,
            usd=usd,
            truncated=False,
            n_prompt_tokens=tin,
            seconds=time.perf_counter() - t0,
        )
        return rec
