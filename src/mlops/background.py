"""Tracking beside the analysis: a forked worker process that loads MLflow while ``python -m src.run`` analyses.

Importing MLflow, its SQLAlchemy store and the pyfunc flavour, and opening the store, was most of what tracking
added to a run (a profile: ~5 s of ~6 s here); a thread cannot overlap it with the analysis (both hold the GIL),
a second process can, on the machine's other core. ``python -m src.run`` calls :meth:`TrackingWorker.start` once
the analysis's libraries are imported (scikit-learn, SciPy, pandas: the pickled analysis needs them too), so the
child inherits them: it imports only MLflow and the tracking modules (~1.6 s less CPU than importing everything
a second time, on a machine whose two cores both work), opens the store, then waits. :meth:`log` sends it
the analysis (pickled through a pipe) and waits for the run id: the child calls
:func:`src.mlops.tracking.log_analysis` exactly as the run would have, so what is logged is the same. A failure
there comes back as the same one-line :class:`RaimError` and results.json is not written (the caller writes it
only after :meth:`log` returns). Where ``os.fork`` does not exist, :meth:`start` returns None and the caller logs
in its own process.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import traceback
from typing import Any

from src.core.errors import RaimError
from src.io.settings import Settings

# MLflow and RAIM's tracking module first (the store is opened next), then the rest logging and the analysis's
# pickles need
WARM = ("mlflow", "mlflow.store.tracking.sqlalchemy_store", "src.mlops.tracking")
WARM_AFTER = ("mlflow.pyfunc", "src.mlops.packaging")


def _read(fd: int) -> Any:
    with os.fdopen(fd, "rb") as fh:
        return pickle.load(fh)


def _write(fd: int, obj: Any) -> None:
    with os.fdopen(fd, "wb") as fh:
        pickle.dump(obj, fh, protocol=pickle.HIGHEST_PROTOCOL)


def _warm(cfg: Settings) -> RaimError | None:
    """Import what logging needs and open the store; a store that fails to open is its one line (returned, so
    that the run is told at once instead of the store being tried twice)."""
    for name in WARM:
        importlib.import_module(name)
    from src.mlops import store, tracking  # imported here, not at start-up: the worker's warm-up, mlflow ~3.5 s

    try:
        with store.quiet_mlflow():
            store.setup(cfg.tracking)
    except RaimError as e:  # the store's own one line (src.mlops.store.store_errors)
        return e
    except Exception as e:
        err = tracking.tracking_failure(cfg, e)
        if err is None:
            raise
        return err
    for name in WARM_AFTER:
        importlib.import_module(name)
    return None


def _child(cfg: Settings, inbox: int, outbox: int) -> None:
    """The worker: warm up, wait for the analysis, log it, answer ("ok", run id) / ("error", line) /
    ("crash", traceback); a closed pipe (the run failed before logging) ends it without a word."""
    failed = _warm(cfg)
    try:
        payload = _read(inbox)
    except (EOFError, pickle.UnpicklingError):
        return
    from src.mlops import tracking  # imported here, not at start-up: mlflow ~3.5 s (loaded by the warm-up)

    try:
        if failed is not None:
            raise failed
        answer: tuple[str, str] = ("ok", tracking.log_analysis(cfg, *payload))
    except RaimError as e:
        answer = ("error", str(e))
    except BaseException:
        answer = ("crash", traceback.format_exc())
    _write(outbox, answer)


class TrackingWorker:
    """A forked process that logs one analysis (see the module doc)."""

    def __init__(self, pid: int, to_child: int, from_child: int):
        self.pid, self.to_child, self.from_child = pid, to_child, from_child

    @classmethod
    def start(cls, cfg: Settings) -> TrackingWorker | None:
        if not hasattr(os, "fork"):
            return None
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            code = 0
            try:
                os.close(down_w)
                os.close(up_r)
                _child(cfg, down_r, up_w)
            except BaseException:
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(down_r)
        os.close(up_w)
        return cls(pid, down_w, up_r)

    def log(self, table, results: dict, doc: dict) -> str:
        """Log the analysis in the worker; its run id, or the worker's one-line error raised here."""
        try:
            _write(self.to_child, (table, results, doc))
            kind, text = _read(self.from_child)
        except (EOFError, BrokenPipeError, pickle.UnpicklingError):
            kind, text = "error", "the tracking worker process ended before it logged the run"
        finally:
            _, status = os.waitpid(self.pid, 0)
        if kind == "ok":
            return text
        if kind == "crash":
            raise RuntimeError(f"the tracking worker failed:\n{text}")
        raise RaimError(text if status == 0 else f"{text} (worker exit status {os.waitstatus_to_exitcode(status)})")

    def cancel(self) -> None:
        """The run ended before logging: close the pipes, so the worker exits, and reap it."""
        for fd in (self.to_child, self.from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        os.waitpid(self.pid, 0)
