"""What a served model's HTTP server grants one client: time to send its headers, time to send its body, and the
body's size. Past any of them the client gets one line of JSON — 408 (too slow) or 413 (too large) — and its
connection is closed, so a client that sends ``Content-Length: 100`` and then one byte, or a 150 MB body, holds
neither a descriptor nor the server's CPU for longer than the limit.

* the **headers**: :func:`timed_protocol` (uvicorn's HTTP/1.1 protocol with a timer from the first byte of a
  request, or from the connection, until its headers are complete; the ASGI app is called only after that);
* the **body**: :func:`read_body` (in the app, :class:`src.mlops.server.StrictInputs`): the whole body within
  ``body_timeout_s`` of the headers, at most ``max_body_bytes`` (a declared ``Content-Length`` over it is refused
  before a byte of the body is read).

The defaults (:class:`Limits`) are generous for RAIM's requests (a request of 1,000 panel items of 2 kB each is
about 2 MB) and ``python -m src.serve model`` sets each (``--header-timeout``, ``--body-timeout``,
``--max-body-mb``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Per request: seconds to send the headers, seconds to send the body once the headers are in, and the most
    bytes a body may hold."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_body_bytes: int = 16 * MIB

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "max_body_bytes"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name}={value!r}: must be a positive number")


class RequestRefused(Exception):
    """A request refused before the model sees it: ``status`` (408, 413, 400) and the one line that says why."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Disconnected(Exception):
    """The client went away before its body was complete: nobody to answer."""


def declared_length(headers: list[tuple[bytes, bytes]] | None) -> int | None:
    """The request's ``Content-Length`` (None when it declares none)."""
    for k, v in headers or []:
        if k.lower() == b"content-length":
            try:
                return int(v)
            except ValueError:
                raise RequestRefused(400, "BAD_REQUEST", f"Content-Length {v[:20]!r} is not a number") from None
    return None


def too_large(limits: Limits) -> RequestRefused:
    return RequestRefused(
        413,
        "REQUEST_TOO_LARGE",
        f"the request body is larger than {limits.max_body_bytes / MIB:.3g} MiB, the server's limit "
        "(--max-body-mb): send fewer rows per request",
    )


async def read_body(receive: Callable[[], Awaitable[dict]], headers: list, limits: Limits) -> bytes:
    """The whole request body, within ``limits``: a declared length over the limit is refused before reading, a
    body that grows past it when it does, one that is not complete ``body_timeout_s`` after the headers is a 408."""
    declared = declared_length(headers)
    if declared is not None and declared > limits.max_body_bytes:
        raise too_large(limits)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.body_timeout_s
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        try:
            message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
        except TimeoutError:
            raise RequestRefused(
                408,
                "REQUEST_TIMEOUT",
                f"the request body was not complete within {limits.body_timeout_s:g} s of its headers "
                f"({size} byte(s) of {declared if declared is not None else 'an undeclared length'} arrived; "
                "--body-timeout)",
            ) from None
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise too_large(limits)
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def json_answer(status: int, doc: dict, close: bool = False) -> tuple[dict, dict]:
    """The ASGI messages of a JSON answer (``close``: the connection is closed after it)."""
    data = json.dumps(doc).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    return (
        {"type": "http.response.start", "status": status, "headers": headers},
        {"type": "http.response.body", "body": data},
    )


async def reply(send: Callable[[dict], Awaitable[None]], status: int, doc: dict, close: bool = False) -> None:
    """Answer ``doc`` as JSON with ``status`` (see :func:`json_answer`)."""
    for message in json_answer(status, doc, close):
        await send(message)


def header_timeout_bytes(seconds: float) -> bytes:
    """The raw HTTP/1.1 answer to a client whose headers did not arrive in time: 408, one line of JSON, close."""
    data = json.dumps(
        {
            "error_code": "REQUEST_TIMEOUT",
            "message": f"the request headers were not complete within {seconds:g} s (--header-timeout)",
        }
    ).encode()
    head = (
        f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + data


def timed_protocol(header_timeout_s: float) -> type:
    """uvicorn's h11 protocol with a header timer: armed when a connection opens and when the first bytes of a
    next request arrive, cancelled once the request's headers are complete; when it fires the client gets
    :func:`header_timeout_bytes` and the connection is closed (uvicorn itself waits for headers for ever)."""
    import h11  # imported here, not at start-up: the server stack
    from uvicorn.protocols.http.h11_impl import H11Protocol  # imported here, not at start-up: the server stack

    class TimedH11Protocol(H11Protocol):
        header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE:
                self._arm()
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self.header_timer is None:
                self.header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def _headers_too_slow(self) -> None:
            self.header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.cycle is None or self.cycle.response_complete:  # nothing of ours is in flight on it
                self.transport.write(header_timeout_bytes(header_timeout_s))
            self.transport.close()

    return TimedH11Protocol
