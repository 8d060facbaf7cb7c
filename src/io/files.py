"""Small file helpers shared by the stages: atomic writes (a crash never leaves a partial file), JSON-clean
values (NaN → null, never an invalid ``NaN`` token), file hashes, and the one inter-process lock helper."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from filelock import FileLock, Timeout

from src.core.errors import RaimError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO): reading it would wait for a writer"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_regular(path: str | Path, what: str = "a file") -> None:
    """That ``path`` (a link followed) is a regular file, else a :class:`RaimError` saying what it is instead: a
    FIFO would block a reader forever, a device such as ``/dev/zero`` would be read until memory runs out. A
    missing file is left to the caller (its own message)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
        raise RaimError(f"{path}: is {kind}, not {what}")


class CannotWrite(RaimError, OSError):
    """A write that failed without naming its file, named (:func:`writing`); an ``OSError`` still, for a caller
    that catches one."""


_NO_ROOM = {
    errno.ENOSPC: "the disk is full",
    errno.EFBIG: "the file would pass the file-size limit (ulimit -f)",
    errno.EDQUOT: "the disk quota is used up",
}


@contextlib.contextmanager
def writing(path: str | Path, kept: str = "") -> Iterator[None]:
    """Name ``path`` in an operating-system error of the block that names no file: a write that finds no room
    says only ``[Errno 28] No space left on device`` or ``[Errno 27] File too large``. It becomes one line
    ``<path>: cannot be written (<why>)`` plus ``kept`` (what is left as it was); an error naming its file is
    raised as it is."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        why = _NO_ROOM.get(e.errno or 0, e.strerror or type(e).__name__)
        raise CannotWrite(f"{path}: cannot be written ({why}){kept}") from e


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix) for a writer that takes a path (``savefig``, a CSV writer);
    renamed onto ``path`` when the block ends, removed if it fails, so the old file survives any failure (one
    that names no file names ``path``: :func:`writing`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    try:
        with writing(path, "; the file there before, if any, is as it was"):
            yield Path(tmp)
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are shared data
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write via a temporary file in the same folder and rename; the old file survives any failure."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
    return Path(path)


@contextlib.contextmanager
def file_lock(path: str | Path, what: str, timeout_s: float = 600.0) -> Iterator[None]:
    """An exclusive inter-process lock on the lock file ``path`` (``filelock``: portable, released when the
    process dies), waited for at most ``timeout_s``; past that, one line naming ``what`` was waited for."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(path), timeout=timeout_s):
            yield
    except Timeout:
        raise RaimError(f"{what}: {path} stayed locked for {timeout_s:.0f} s (another process holds it)") from None


def jsonable(x):
    """Plain Python numbers/lists/dicts, NaN and ±inf → None (JSON null). numpy's values are converted when numpy
    is loaded (a numpy value cannot exist before): writing a document does not import numpy (~0.2 s of start-up)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, bool) or (np is not None and isinstance(x, np.bool_)):
        return bool(x)
    if np is not None and isinstance(x, np.integer):
        return int(x)
    if isinstance(x, float) or (np is not None and isinstance(x, np.floating)):
        return None if not math.isfinite(x) else float(x)
    if np is not None and isinstance(x, np.generic):
        return x.item()
    return x


SIGNIFICANT_DIGITS = 7
"""The significant digits a written float keeps (:func:`written_float`)."""

DECIMALS = 9
"""The last decimal a written float keeps (:func:`written_float`): anything under half of ``10**-DECIMALS`` in
size is written 0."""


def written_float(x: float) -> float:
    """``x`` as RAIM writes it into a JSON result: rounded to :data:`SIGNIFICANT_DIGITS` significant digits, but
    never finer than the :data:`DECIMALS`-th decimal (so rounding noise such as 1e-16 is written 0), −0 written 0.

    A statistic's last bits follow the BLAS kernel (another order of a sum: ~1e-16 absolute, ~1e-15 relative); the
    written figure does not, unless the value lies within that noise of a rounding boundary (the table-maker's
    dilemma), which a step of at least 1e-7 of the value and at least 1e-9 makes a chance of at most ~1e-7 per
    value (docs/data.md, *Byte-identical outputs*). The figures RAIM prints keep 4 decimals fewer."""
    if x == 0 or not math.isfinite(x):
        return x + 0.0 if x == 0 else x
    digits = min(SIGNIFICANT_DIGITS, DECIMALS + 1 + math.floor(math.log10(abs(x))))
    return (float(f"{x:.{digits}g}") if digits > 0 else round(x, DECIMALS)) + 0.0


def written(x):
    """A :func:`jsonable` value with every float as :func:`written_float` (dicts and lists walked)."""
    if isinstance(x, dict):
        return {k: written(v) for k, v in x.items()}
    if isinstance(x, list):
        return [written(v) for v in x]
    return written_float(x) if isinstance(x, float) else x


def to_json(obj, indent: int = 2, default=None) -> str:
    """A JSON document (trailing newline) of :func:`jsonable` ``obj``: strict JSON, no ``NaN`` token ever, every
    float as :func:`written_float` (so a result's bytes do not depend on the machine's floating-point path).
    ``default`` converts other objects (``str`` for free-form logs; None raises on anything unexpected)."""
    return json.dumps(written(jsonable(obj)), indent=indent, default=default, allow_nan=False) + "\n"


def write_json(doc: dict, path: str | Path) -> Path:
    """Write atomically (temp file then rename), so a crash never leaves a truncated results.json."""
    return atomic_write_text(path, to_json(doc))


def check_output(path: str | Path) -> None:
    """Fail before any work when results.json could not be written (a directory, an uncreatable folder)."""
    p = Path(path)
    if p.is_dir():
        raise RaimError(f"output={path}: is a directory (give a file path, e.g. {p / 'results.json'})")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RaimError(f"output={path}: cannot create {p.parent} ({e.strerror})") from None


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether paths ``a`` and ``b`` name one file: the same file through a link or another spelling of its path
    (``./x``, ``d/../x``), or one path whose file does not exist yet."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): the same path once every link and '..' is resolved
        return Path(a).resolve() == Path(b).resolve()


def check_not_an_input(flag: str, out: str | Path, inputs: Mapping[str, str | Path | None], output: str) -> None:
    """Refuse, before any work, an output path that names one of the command's inputs (through a link or another
    spelling of its path too): writing ``output`` there would replace that input. ``flag`` is how the command line
    names the output (``--out``, ``output=``), ``inputs`` maps what each input is to its path (None: not given)."""
    for what, path in inputs.items():
        if path is not None and same_file(out, path):
            raise RaimError(f"{flag} {out}: is the {what} {path} itself; {output} would replace it: name another file")


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_tree(paths: Iterable[str | Path]) -> str | None:
    """One hash over files (directories walked in sorted order): relative path and content of each."""
    h, seen = hashlib.sha256(), False
    for root in paths:
        root = Path(root)
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root] * root.is_file()
        for f in files:
            seen = True
            h.update(str(f.relative_to(root.parent)).encode() + b"\0" + sha256_file(f).encode() + b"\n")
    return h.hexdigest() if seen else None
