"""One retry policy for every judge behind HTTP (the OpenAI-compatible client and the Anthropic frontier judge).

A request that fails transiently (a status of :data:`RETRYABLE`, a refused or dropped connection, a timeout) is
tried again up to ``max_retries`` times. Before each retry the policy waits what the server asked in
``Retry-After`` (seconds or an HTTP date, RFC 9110 §10.2.3; also ``retry-after-ms``) plus up to 10 % jitter, or,
when it asked nothing, an exponential back-off with "equal jitter" (``base · 2^attempt``, capped at
``backoff_max``, times a uniform factor in [0.5, 1)), so that many clients do not retry in step. A server that
asks for a longer wait than ``backoff_max`` is not waited for: its error is raised (nothing is cached; a rerun
resumes). Every request, retry and second waited is counted in :attr:`RetryPolicy.counts`, which the verdict
run reports per judge (``report[<judge>]["http"]``).
"""

from __future__ import annotations

import email.utils
import random
import time
import urllib.error
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from src.core.errors import RaimError

T = TypeVar("T")

RETRYABLE = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
"""Statuses retried: request timeout, conflict, too many requests, server errors, overloaded (Anthropic's 529)."""


def retry_after(headers: Mapping[str, Any] | None, now: float | None = None) -> float | None:
    """The seconds a response asks the client to wait before retrying, or None when it asks nothing readable:
    ``retry-after-ms`` (milliseconds), else ``Retry-After`` as delay-seconds or an HTTP date."""
    if not headers:
        return None
    get = getattr(headers, "get", None)
    if get is None:
        return None
    ms = get("retry-after-ms")
    if ms is not None:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except (TypeError, ValueError):
            pass
    value = get("retry-after")
    if value is None:
        value = get("Retry-After")
    if value is None:
        return None
    text = str(value).strip()
    try:
        return max(float(text), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


class RetryPolicy:
    """Retries of one HTTP client: :meth:`call` runs one request function until it succeeds, the error is not
    transient, or the retries are spent (see the module docstring for the waits)."""

    def __init__(
        self,
        max_retries: int = 4,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        counts: dict | None = None,
    ):
        if max_retries < 0 or backoff_base < 0 or backoff_max < 0:
            raise ValueError(
                f"max_retries={max_retries}, backoff_base={backoff_base}, backoff_max={backoff_max}: must be ≥ 0"
            )
        self.max_retries = int(max_retries)
        self.backoff_base = float(backoff_base)
        self.backoff_max = float(backoff_max)
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.counts = counts if counts is not None else {}
        for k in ("requests", "retries", "retry_after", "gave_up"):
            self.counts.setdefault(k, 0)
        self.counts.setdefault("waited_s", 0.0)

    def delay(self, attempt: int, asked: float | None) -> float | None:
        """Seconds to wait before retry ``attempt + 1`` (``attempt`` counts from 0); None: the server asked for
        longer than ``backoff_max``, so no retry."""
        if asked is not None:
            if asked > self.backoff_max:
                return None
            return asked * (1.0 + 0.1 * self.rng.random())
        return min(self.backoff_base * 2.0**attempt, self.backoff_max) * (0.5 + 0.5 * self.rng.random())

    def call(self, request: Callable[[], T], transient: Callable[[BaseException], tuple[bool, float | None]]) -> T:
        """``request()``'s result. ``transient(error) -> (retry?, seconds the server asked or None)`` classifies
        each error; a non-transient one, or the last, is raised as it is."""
        for attempt in range(self.max_retries + 1):
            self.counts["requests"] += 1
            try:
                return request()
            except Exception as err:  # noqa: BLE001 - classified by `transient`, re-raised unless retried
                retry, asked = transient(err)
                if not retry or attempt == self.max_retries:
                    raise
                wait = self.delay(attempt, asked)
                if wait is None:
                    self.counts["gave_up"] += 1
                    raise
                self.counts["retries"] += 1
                self.counts["retry_after"] += int(asked is not None)
                self.counts["waited_s"] += wait
                self.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


CONNECTION_ERRORS = ("APIConnectionError", "APITimeoutError")  # the Anthropic client's, by name (imported lazily)


def unreachable(member: str, backend: Any, err: BaseException) -> RaimError | None:
    """One line naming the judge ``member`` and the URL its ``backend`` sends to when ``err`` says the server could
    not be reached (a refused or dropped connection, a timeout, a name that does not resolve), after the retries;
    None for any other error. The standard library's own line (``<urlopen error [Errno 111] Connection
    refused>``) names neither."""
    reason: Any = (
        err.reason if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError) else err
    )
    if isinstance(err, urllib.error.HTTPError) or not (
        isinstance(err, (urllib.error.URLError, ConnectionError, TimeoutError))
        or type(err).__name__ in CONNECTION_ERRORS
    ):
        return None
    url = getattr(backend, "base_url", None) or "(the client's default URL)"
    if isinstance(reason, TimeoutError) or "Timeout" in type(reason).__name__:
        why = "did not answer in time"
    elif isinstance(reason, OSError) and reason.strerror:
        why = reason.strerror.lower()
    else:
        why = " ".join(str(reason).split())[:120] or type(reason).__name__
    return RaimError(
        f"judge {member}: its server {url} could not be reached ({why}); is the server running, and does the "
        f"member's base_url name it? (the verdicts already computed are kept in the cache)"
    )
