"""The strict server: ``python -m src.serve model`` serves a RAIM model (:mod:`src.mlops.packaging`'s
:func:`~src.mlops.packaging.load_model`) behind MLflow's scoring server with strict inputs (:class:`StrictInputs`:
the request's rows, their text and the inference parameters checked, errors in one line) and the per-request limits
of :mod:`src.mlops.limits`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

import pandas as pd

from src.core.errors import ArgumentParser, RaimError, one_line, one_line_message
from src.core.priorshift import parse_setting
from src.core.textfiles import StrictJSONError, loads_strict
from src.io.votestore import DEFAULT_ON_FAILURE, FAILURE_ENV, ON_FAILURE, on_failure
from src.mlops.limits import MIB, Disconnected, Limits, RequestRefused, read_body, reply, timed_protocol
from src.mlops.packaging import load_model, pyfunc_model
from src.mlops.recording import monitor_health
from src.mlops.serving import PANEL_OPTIONAL, InputError, decision_warning, votes_from_rows

REQUEST_KEYS = ("dataframe_records", "dataframe_split", "inputs", "instances")


JSON_TYPE, CSV_TYPE, PARQUET_TYPE = "application/json", "text/csv", "application/vnd.apache.parquet"


def request_rows(body: bytes) -> list:
    """The rows of an MLflow JSON scoring request (``dataframe_records``, ``dataframe_split``, ``inputs`` /
    ``instances`` as records or columns). Anything else is an :class:`InputError`: a body that is not JSON (a bare
    ``NaN`` or ``Infinity`` included: it is no abstention), a key given twice, rows of unnamed values (a list of
    lists, a scalar), or none of those keys."""
    return checked_text(_rows(_payload(body)))


SURROGATE = re.compile("[\ud800-\udfff]")


def checked_text(rows: list) -> list:
    """``rows`` when no column name or text cell holds a lone surrogate (a JSON ``\\ud800`` escape of half a
    UTF-16 pair, which is no character: no judge, cache or store can encode it), else an :class:`InputError`
    naming the row and the column."""
    for r, row in enumerate(rows, 1):
        if not isinstance(row, Mapping):
            continue
        for key, value in row.items():
            for what, text in (("its name", key), ("its value", value)):
                found = SURROGATE.search(text) if isinstance(text, str) else None
                if found:
                    raise InputError(
                        f"row {r}: column {str(key)[:40]!r}: {what} holds a lone surrogate "
                        f"U+{ord(found.group()):04X} (half of a UTF-16 pair, not a character)"
                    )
    return rows


def _payload(body: bytes) -> dict:
    try:
        payload = loads_strict(body)
    except StrictJSONError as e:  # a key given twice, a bare NaN / Infinity, nesting too deep
        raise InputError(f"the request body: {e.msg}") from None
    except UnicodeDecodeError:
        raise InputError("the request body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise InputError(f"the request body is not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(payload, dict) or not any(k in payload for k in REQUEST_KEYS):
        raise InputError(
            f"a request is a JSON object with one of {list(REQUEST_KEYS)}, got "
            f"{'keys ' + str(sorted(payload))[:80] if isinstance(payload, dict) else type(payload).__name__}"
        )
    given = [k for k in payload if k in REQUEST_KEYS]
    unknown = [k for k in payload if k not in (*REQUEST_KEYS, "params")]
    if unknown or len(given) > 1:
        raise InputError(
            f"the request: {'unknown top-level key(s) ' + _shown(unknown) if unknown else 'rows given twice'} "
            f"({_shown(given + unknown)}); a request holds exactly one of {list(REQUEST_KEYS)} and optionally "
            "'params'"
        )
    return payload


def _shown(keys: list, most: int = 5) -> str:
    """Key names for a one-line message: each clipped, at most ``most`` of them."""
    names = [repr(str(k)[:40]) for k in keys[:most]]
    return "[" + ", ".join(names) + (f", … {len(keys) - most} more" if len(keys) > most else "") + "]"


def _rows(payload: dict) -> list:
    if "dataframe_records" in payload:
        rows = payload["dataframe_records"]
        return rows if isinstance(rows, list) else [rows]
    if "dataframe_split" in payload:
        split = payload["dataframe_split"]
        if not isinstance(split, dict) or not isinstance(split.get("data"), list):
            raise InputError("dataframe_split needs 'columns' and 'data' (a list of rows)")
        cols = list(split.get("columns") or [])
        twice = next((c for i, c in enumerate(cols) if c in cols[:i]), None)
        if twice is not None:
            at = [i + 1 for i, c in enumerate(cols) if c == twice]
            raise InputError(
                f"dataframe_split: column {str(twice)[:40]!r} appears {len(at)} times (columns "
                f"{', '.join(map(str, at))}): each column is named once"
            )
        for r, row in enumerate(split["data"], 1):
            if not isinstance(row, list) or len(row) != len(cols):
                raise InputError(
                    f"row {r}: {len(row) if isinstance(row, list) else 'no'} values for {len(cols)} columns {cols}"
                )
        return [dict(zip(cols, row)) for row in split["data"]]
    key = next(k for k in ("inputs", "instances") if k in payload)
    rows = payload[key]
    if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
        return rows
    if isinstance(rows, dict) and all(isinstance(v, list) for v in rows.values()):
        n = {len(v) for v in rows.values()}
        if len(n) > 1:
            raise InputError(f"{key}: columns of different lengths {sorted(n)}")
        return [dict(zip(rows, vals)) for vals in zip(*rows.values())]
    got = (
        next((type(r).__name__ for r in rows if not isinstance(r, dict)), "list")
        if isinstance(rows, list)
        else type(rows).__name__
    )
    raise InputError(
        f"{key}: rows must be objects naming their columns (or an object of column lists), got "
        f"{'a row that is a ' + got if isinstance(rows, list) else 'a ' + got}"
    )


def request_input(body: bytes, content_type: str | None, schema=None) -> tuple[list | None, dict]:
    """(rows, params) of a scoring request as MLflow's server would read it: JSON (:func:`request_rows`, and its
    ``params``), CSV or Parquet (parsed by MLflow's own readers, with the model's input ``schema``). Rows None: a
    content type MLflow refuses itself (415). A request with no content type is an :class:`InputError`."""
    from mlflow.pyfunc import scoring_server  # imported here, not at start-up: mlflow ~1.8 s

    if not content_type:
        raise InputError(f"the request has no Content-Type: send {JSON_TYPE} (or {CSV_TYPE})")
    mime = content_type.split(";")[0].strip().lower()
    if mime == JSON_TYPE:
        payload = _payload(body)
        params = payload.get("params") or {}
        return checked_text(_rows(payload)), params if isinstance(params, dict) else {"": params}
    if mime not in (CSV_TYPE, PARQUET_TYPE):
        return None, {}
    try:
        if mime == CSV_TYPE:
            frame = scoring_server.parse_csv_input(io.StringIO(body.decode("utf-8")), schema=schema)
        else:
            frame = scoring_server.parse_parquet_input(io.BytesIO(body))
    except UnicodeDecodeError:
        raise InputError("the request body is not UTF-8 text") from None
    except Exception as e:  # noqa: BLE001 - whatever the reader refuses is the request's fault
        if mime == CSV_TYPE:  # a cell the schema's types refuse: the rows as pandas reads them name it
            with contextlib.suppress(Exception):
                return pd.read_csv(io.BytesIO(body)).to_dict("records"), {}
        msg = re.sub(r"^Failed to parse input.*?Error: ", "", getattr(e, "message", None) or str(e), flags=re.S)
        raise InputError(f"the {mime} request body cannot be read ({' '.join(msg.split())[:200]})") from None
    return pd.DataFrame(frame).to_dict("records"), {}


def check_params(params: Mapping[str, Any]) -> None:
    """The inference parameters RAIM's models take (``prevalence``, :func:`inference_params`), checked as the
    model will read them."""
    if "" in params:
        raise InputError("params: expected an object of parameters")
    unknown = sorted(set(params) - {"prevalence"})
    if unknown:
        raise InputError(f"params: unknown parameter(s) {unknown}; a RAIM model takes 'prevalence'")
    parse_setting(params.get("prevalence"))


class StrictInputs:
    """ASGI wrapper of MLflow's scoring app: a request to ``/invocations`` whose rows (JSON, CSV or Parquet) or
    parameters break the model's input contract gets HTTP 400 with one line, before MLflow reads it (MLflow would
    drop an unknown column and answer 200). Every valid request goes to MLflow's app as sent (a numeric
    ``prevalence`` as its text: :func:`text_params`); an error it answers is cut to one line
    (:class:`_OneLineErrors`: no input dump, no stack trace in the answer).

    Every request's body is read within ``limits`` (:func:`src.mlops.limits.read_body`: 408 / 413, one line, the
    connection closed). ``GET /ping`` and ``/health`` answer the model's monitor (``health``: a function returning
    :meth:`MonitorHealth.doc`): ``/ping`` always 200 (the process answers), ``/health`` 503 while the last
    recording failed."""

    def __init__(self, app, check, schema=None, limits: Limits | None = None, health=None):
        self.app, self.check, self.schema = app, check, schema
        self.limits, self.health = limits or Limits(), health

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            body = await read_body(receive, scope.get("headers"), self.limits)
        except RequestRefused as e:
            return await reply(send, e.status, {"error_code": e.code, "message": e.message}, close=True)
        except Disconnected:
            return None
        if scope["method"] == "GET" and scope["path"] in ("/ping", "/health") and self.health is not None:
            doc = {"model": "loaded", "monitor": self.health()}
            degraded = doc["monitor"]["status"] == "degraded"
            return await reply(send, 503 if degraded and scope["path"] == "/health" else 200, doc)
        if scope["path"] == "/invocations" and scope["method"] == "POST":
            ctype = dict(scope.get("headers") or []).get(b"content-type", b"").decode("latin-1")
            try:
                rows, params = request_input(body, ctype, self.schema)
                if rows is not None:
                    self.check(rows)
                    check_params(params)
                    body = text_params(body, params)
            except RaimError as e:  # InputError, PrevalenceError
                return await reply(send, 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": one_line_message(e)})
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, _OneLineErrors(send))


def text_params(body: bytes, params: Mapping[str, Any]) -> bytes:
    """The JSON request ``body`` with a numeric ``prevalence`` written as its text: MLflow types the parameter as a
    string (:func:`inference_params`) and would refuse ``0.1`` with its own type error, where RAIM reads
    ``0.1`` and ``"0.1"`` alike (:func:`src.core.priorshift.parse_setting`, already checked). Any other body as
    sent."""
    value = params.get("prevalence")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return body
    payload = json.loads(body)
    payload["params"]["prevalence"] = repr(float(value))
    return json.dumps(payload).encode()


class _OneLineErrors:
    """``send`` for MLflow's app: an error answer (status ≥ 400, JSON) is rewritten to one line — MLflow wraps a
    model's own message as ``Failed to predict data '<the input>'. Error: <message>`` and attaches the stack
    trace of any other exception; the answer keeps the message (or the exception's last line), the server's log
    keeps the trace."""

    def __init__(self, send):
        self.send, self.start, self.body = send, None, b""

    async def __call__(self, message):
        if message["type"] == "http.response.start" and message.get("status", 200) >= 400:
            self.start = message
            return None
        if self.start is None or message["type"] != "http.response.body":
            return await self.send(message)
        self.body += message.get("body", b"")
        if message.get("more_body", False):
            return None
        try:
            doc = json.loads(self.body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            text = " ".join(self.body.decode("utf-8", "replace").split())[:400]
            doc = {"error_code": "BAD_REQUEST", "message": text}
        return await reply(self.send, self.start["status"], one_line_error(doc))


def one_line_error(doc: dict) -> dict:
    """MLflow's error answer ``doc`` as ``{error_code, message}`` with a one-line message (see :class:`_OneLineErrors`)."""
    msg = str(doc.get("message", ""))
    trace = doc.get("stack_trace")
    if trace:
        logging.getLogger("raim.serve").warning("scoring error: %s\n%s", msg, trace)
        last = [ln for ln in str(trace).strip().splitlines() if ln.strip()][-1:]
        if last and not msg.startswith("Failed to predict data '"):  # the exception's own line
            msg = last[0].split(": ", 1)[-1] if ": " in last[0] else last[0]
    if msg.startswith("Failed to predict data '") and "\nError: " in msg:
        msg = msg.rpartition("\nError: ")[2]
    msg = " ".join(msg.split())
    return {"error_code": str(doc.get("error_code", "BAD_REQUEST")), "message": msg[:500] or "scoring failed"}


def input_check(inner):
    """The row check of a loaded RAIM model (a stacker's votes, or a panel's item columns)."""
    kind = type(inner).__name__  # by name: under `python -m src.serve` this module is __main__, not src.serve
    if kind == "StackerModel":
        return lambda rows: votes_from_rows(rows, inner.columns, inner.stacker.n_votes)
    if kind == "PanelModel":
        return lambda rows: inner.items(pd.DataFrame(rows))
    raise RaimError(f"not a RAIM model ({type(inner).__name__}); serve it with `mlflow models serve`")


def serve_model(model_uri: str, host: str = "127.0.0.1", port: int = 5001, limits: Limits | None = None) -> None:
    """MLflow's scoring server (same routes and JSON) for a RAIM model, with :class:`StrictInputs` in front and
    uvicorn's protocol timing each request's headers (:mod:`src.mlops.limits`)."""
    import uvicorn  # imported here, not at start-up: the server stack

    limits = limits or Limits()
    inner = load_model(model_uri)  # its document, checked: nothing in the model folder is unpickled or imported
    app = strict_app(pyfunc_model(inner), limits)
    warning = decision_warning(getattr(inner, "decision", None))
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # bound and listening: the one line a user (or a script) waits for
                print(ready_line(model_uri, host, port, inner), flush=True)

    _Server(server_config(app, host, port, limits)).run()


def strict_app(model, limits: Limits | None = None) -> StrictInputs:
    """A loaded pyfunc ``model`` behind MLflow's scoring app and :class:`StrictInputs` (its input check, schema,
    ``limits`` and its monitor's health). The monitor's setting is checked here: a bad one stops the start."""
    from mlflow.pyfunc import scoring_server  # imported here, not at start-up: mlflow ~1.8 s

    inner = model.unwrap_python_model()
    config = getattr(inner, "config", None)
    on_failure(config)
    schema = model.metadata.get_input_schema() if model.metadata else None
    health = lambda: monitor_health(inner).doc(config)  # noqa: E731 - read at each request
    return StrictInputs(scoring_server.init(model), input_check(inner), schema, limits or Limits(), health)


def server_config(app, host: str, port: int, limits: Limits):
    """uvicorn's configuration for ``app``: the header-timed HTTP/1.1 protocol (:func:`src.mlops.limits.timed_protocol`)
    and no access log."""
    import uvicorn  # imported here, not at start-up: the server stack

    return uvicorn.Config(app, host=host, port=port, log_level="warning", http=timed_protocol(limits.header_timeout_s))


def ready_line(model_uri: str, host: str, port: int, inner) -> str:
    """The server's one start-up line: where it listens, what it serves and the input columns it takes."""
    kind = type(inner).__name__
    takes = (
        f"member columns {list(inner.columns)}"
        if kind == "StackerModel"
        else f"items: 'candidate' and optionally {list(PANEL_OPTIONAL)}"
    )
    return f"ready on http://{host}:{port}/invocations ({kind} {model_uri}; {takes}; Ctrl-C stops it)"


@one_line
def main(argv: list[str] | None = None) -> int:
    """``python -m src.serve model --model-uri models:/raim-stacker-wice@champion --port 5001`` (a panel model
    is logged with ``python -m src.registry log-panel``)."""
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s

    ap = ArgumentParser(prog="python -m src.serve", description="serve a RAIM model")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model", help="serve a stacker or panel model (MLflow's server, strict inputs)")
    m.add_argument("--model-uri", required=True)
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=5001)
    d = Limits()
    m.add_argument("--header-timeout", type=float, default=d.header_timeout_s, help="seconds to send the headers")
    m.add_argument("--body-timeout", type=float, default=d.body_timeout_s, help="seconds to send the body")
    m.add_argument("--max-body-mb", type=float, default=d.max_body_bytes / MIB, help="the largest body (MiB)")
    m.add_argument(
        "--monitor-on-failure",
        choices=ON_FAILURE,
        default=None,
        help=f"rows the monitor store could not record: answer (and say so) or refuse (503); default "
        f"${FAILURE_ENV}, else {DEFAULT_ON_FAILURE}",
    )
    a = ap.parse_args(argv)
    if a.monitor_on_failure:
        os.environ[FAILURE_ENV] = a.monitor_on_failure
    try:
        limits = Limits(a.header_timeout, a.body_timeout, int(a.max_body_mb * MIB))
    except ValueError as e:
        ap.error(str(e))
    try:
        serve_model(a.model_uri, a.host, a.port, limits)
        return 0
    except MlflowException as e:
        raise RaimError(f"{a.cmd}: {e.message}") from e


if __name__ == "__main__":
    raise SystemExit(main())
