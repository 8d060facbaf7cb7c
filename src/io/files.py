"""Small file helpers shared by the stages: atomic writes (a crash never leaves a partial file) and JSON-clean
values (NaN → null, never an invalid ``NaN`` token)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write via a temporary file in the same folder and rename; the old file survives any failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are shared data
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def jsonable(x):
    """Plain Python numbers/lists/dicts, NaN and ±inf → None (JSON null)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return None if not np.isfinite(x) else float(x)
    if isinstance(x, np.generic):
        return x.item()
    return x


def to_json(obj, indent: int = 2, default=None) -> str:
    """A JSON document (trailing newline) of :func:`jsonable` ``obj``: strict JSON, no ``NaN`` token ever.
    ``default`` converts other objects (``str`` for free-form logs; None raises on anything unexpected)."""
    return json.dumps(jsonable(obj), indent=indent, default=default, allow_nan=False) + "\n"
