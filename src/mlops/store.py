"""The MLflow store RAIM tracks into: its URI (``tracking.uri``, default ``sqlite:///mlflow.db`` in the project
folder; ``MLFLOW_TRACKING_URI`` wins; a relative sqlite path is made absolute against the project folder, so a
run launched from anywhere — a DVC temp workspace, a Hydra job — lands in the same database), its artifact root
(``mlruns/`` beside the sqlite file), the lock under which a new store is created, and the experiment."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sqlite3
import sys
import urllib.parse
import warnings
from collections.abc import Iterator
from pathlib import Path

from src.core.errors import RaimError, debug
from src.io.files import file_lock
from src.io.paths import ROOT
from src.io.settings import TrackingSettings

DEFAULT_URI = "sqlite:///mlflow.db"


def tracking_uri(tracking: TrackingSettings | None = None) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else ``tracking.uri``; a relative sqlite path is made absolute
    against the repository root (never against the current directory)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or (tracking.uri if tracking is not None else None) or DEFAULT_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rel = uri[len("sqlite:///") :]
        if rel and rel != ":memory:":
            return "sqlite:///" + str((ROOT / rel).resolve())
    if "://" not in uri and not uri.startswith("databricks"):
        return Path(uri).resolve().as_uri() if not Path(uri).is_absolute() else Path(uri).as_uri()
    return uri


def artifact_root(uri: str, experiment: str = "raim") -> str | None:
    """``mlruns/<experiment>`` beside the sqlite database (None for a server: it decides)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///") :]).parent / "mlruns" / re.sub(r"[^\w.-]", "_", experiment)).as_uri()
    return None


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for an in-memory database or another store)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextlib.contextmanager
def store_lock(uri: str, timeout_s: float = 600.0) -> Iterator[None]:
    """An exclusive lock on ``mlruns/.<db>.lock`` beside a sqlite store (``mlruns/`` is git-ignored), held while
    one process creates (and migrates) the store and its experiment: two first runs on a new ``mlflow.db``
    otherwise race in MLflow's alembic migration and in creating the experiment. Other stores: no lock."""
    db = _sqlite_file(uri)
    if db is None:
        yield
        return
    with file_lock(db.parent / "mlruns" / f".{db.name}.lock", f"MLflow store {uri}", timeout_s):
        yield


def _experiment_id(name: str, uri: str) -> str:
    """The experiment's id, created if missing. The first MLflow call opens (creates, migrates) the store: run it
    under :func:`store_lock`."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    exp = mlflow.get_experiment_by_name(name)
    if exp is None:
        try:
            return mlflow.create_experiment(name, artifact_location=artifact_root(uri, name))
        except Exception:  # another process created it meanwhile (a server store: no lock)
            exp = mlflow.get_experiment_by_name(name)
            if exp is None:
                raise
    return exp.experiment_id


_SET_UP: dict[tuple[str, str], str] = {}  # (store URI, experiment) → id, while a run set up there is active


def setup(tracking: TrackingSettings | None = None) -> str:
    """Point MLflow at the configured store and experiment; returns the experiment id. Safe when several
    processes start on a new sqlite store at once (:func:`store_lock`). Done once per run: while a run set up on
    the same store and experiment is active (its nested dataset runs), the id is reused without asking the
    store again."""
    import mlflow  # imported here, not at start-up: mlflow ~1.8 s

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    uri = tracking_uri(tracking)
    check_server(uri)
    name = (tracking.experiment if tracking is not None else None) or "raim"
    active = mlflow.active_run()
    if (
        active is not None
        and _SET_UP.get((uri, name)) == active.info.experiment_id
        and mlflow.get_tracking_uri() == uri
    ):
        return active.info.experiment_id
    mlflow.set_tracking_uri(uri)
    with store_lock(uri), store_errors(uri):
        exp_id = _experiment_id(name, uri)
    mlflow.set_experiment(experiment_id=exp_id)
    _SET_UP.clear()
    _SET_UP[(uri, name)] = exp_id
    return exp_id


SERVER_TIMEOUT_S = 10.0  # how long a tracking server may take to accept a connection
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}  # MLflow's: 7 and 120 s


def check_server(uri: str, timeout_s: float = SERVER_TIMEOUT_S) -> None:
    """For a tracking server (``http(s)://``): that it accepts a connection within ``timeout_s``, else a
    :class:`RaimError` naming it (MLflow itself retries a refused connection with back-off for minutes, saying
    nothing); and MLflow's own retries and request timeout bounded (:data:`HTTP_LIMITS`, unless set). Any other
    store: nothing to check."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return
    for k, v in HTTP_LIMITS.items():
        os.environ.setdefault(k, v)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise RaimError(f"MLflow tracking server {uri}: not a valid address (bad port)") from None
    try:
        socket.create_connection((parts.hostname or "localhost", port), timeout=timeout_s).close()
    except OSError as e:
        why = (
            f"no answer within {timeout_s:g} s"
            if isinstance(e, TimeoutError)
            else (e.strerror or type(e).__name__).lower()
        )
        raise RaimError(
            f"MLflow tracking server {uri}: {why} (is the server running? --tracking-uri or "
            f"MLFLOW_TRACKING_URI names the store)"
        ) from None


def store_failure(e: BaseException) -> str | None:
    """Why the tracking store failed, in one line without the SQL statement (a read-only, corrupt or locked
    sqlite file, a failed migration, an MLflow error); None when ``e`` is not an error of the store."""
    from mlflow.exceptions import MlflowException  # imported here, not at start-up: mlflow ~1.8 s

    if type(e).__module__.split(".")[0] not in ("sqlalchemy", "alembic", "sqlite3") and not isinstance(
        e, (MlflowException, sqlite3.Error)
    ):
        return None
    msg = getattr(e, "message", None) or str(e) or type(e).__name__
    msg = re.split(r"\[SQL: |\(Background on this error at", msg)[0]
    msg = re.sub(r"^\s*\(raised as a result of Query-invoked autoflush;[^)]*\)\s*", "", msg)  # SQLAlchemy's advice
    return " ".join(msg.split())[:300] or type(e).__name__


SQL_ERROR_LOGGER = "mlflow.store.db.utils"  # logs a failed statement, its traceback and SQL, then re-raises it


@contextlib.contextmanager
def store_errors(uri: str) -> Iterator[None]:
    """An error of the tracking store at ``uri`` inside the block (:func:`store_failure`) becomes one
    :class:`RaimError` line naming the store; MLflow's own log of it (the traceback and the SQL statement, on
    :data:`SQL_ERROR_LOGGER`) is kept out of the output unless tracebacks are asked for (``RAIM_DEBUG=1``)."""
    logger = logging.getLogger(SQL_ERROR_LOGGER)
    level = logger.level
    if not debug():
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    except RaimError:
        raise
    except Exception as e:
        why = store_failure(e)
        if why is None:
            raise
        raise RaimError(f"MLflow tracking store {uri}: {why}") from e
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def quiet_mlflow() -> Iterator[None]:
    """MLflow's INFO/WARNING chatter (store creation, CloudPickle advice, example validation) kept out of the
    run's output; RAIM checks the logged models itself (:func:`src.mlops.packaging.log_stacker`). Errors still show."""

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # "Downloading artifacts" bars
    loggers = {name: logging.getLogger(name) for name in ("mlflow", "alembic")}
    levels = {name: lg.level for name, lg in loggers.items()}
    try:
        for lg in loggers.values():
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"mlflow(\..*)?")
            yield
    finally:
        for name, lg in loggers.items():
            lg.setLevel(levels[name])


def ui_command(tracking: TrackingSettings | None = None) -> str:
    """The ``mlflow ui`` command that opens this store (README: compare runs)."""
    uri = tracking_uri(tracking)
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000 --workers 1"


# ------------------------------------------------------------------------------------- runs left RUNNING

PROCESS_TAG = "raim_process"  # host:pid:start of the process a run was opened in (start: /proc's clock ticks)


def _process_start(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot (Linux's ``/proc/<pid>/stat``, field 22); "" where
    that cannot be read (another system, the process gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else ""


def process_tag(pid: int | None = None) -> str:
    """The :data:`PROCESS_TAG` value of this process (or ``pid``): ``<host>:<pid>:<start>``."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_process_start(pid)}"


def process_gone(tag: str) -> bool:
    """Whether the process a :func:`process_tag` names is certainly gone: it ran on this host and its pid is no
    longer alive, or now belongs to a process that started at another time (a pid used again). A process of
    another host, or a tag that cannot be read, is not known to be gone."""
    try:
        host, pid_text, start = tag.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    return bool(start) and _process_start(pid) not in ("", start)


_CLOSED: set[str] = set()  # the stores this process has already looked at


def close_orphans(uri: str) -> list[str]:
    """Close the runs of the store at ``uri`` left ``RUNNING`` by a process that is gone (killed, or its machine
    restarted): each is marked ``KILLED`` with a tag saying why, and one line on stderr says how many. Done once
    per process and store, before its first run; a run whose process is alive, on another host, or not recorded
    (:data:`PROCESS_TAG`; a run not opened by RAIM) is left as it is. Returns the ids closed."""
    from mlflow.tracking import MlflowClient  # imported here, not at start-up: mlflow ~1.8 s

    if uri in _CLOSED:
        return []
    _CLOSED.add(uri)
    client = MlflowClient(uri)
    exp_ids = [e.experiment_id for e in client.search_experiments()]
    running = client.search_runs(exp_ids, "attributes.status = 'RUNNING'", max_results=1000) if exp_ids else []
    gone = [r for r in running if process_gone(r.data.tags.get(PROCESS_TAG, ""))]
    for r in gone:
        client.set_tag(r.info.run_id, "raim_closed", f"its process ({r.data.tags[PROCESS_TAG]}) was gone")
        client.set_terminated(r.info.run_id, "KILLED")
    if gone:
        shown = ", ".join(r.info.run_id[:12] for r in gone[:5]) + (" …" if len(gone) > 5 else "")
        print(
            f"note: closed {len(gone)} MLflow run(s) left RUNNING by a process that is gone, as KILLED ({shown})",
            file=sys.stderr,
            flush=True,
        )
    return [r.info.run_id for r in gone]
