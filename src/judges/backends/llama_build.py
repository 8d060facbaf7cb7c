"""Whether the installed llama.cpp build runs on this CPU: one forward pass in a child process, once per build.

pip caches the wheel it compiles from llama-cpp-python's sdist by version, not by CPU or flags, and a native
build may use instructions a CPU reports but traps: inside some VMs the CPU reports AMX tiles, and the first
tile instruction of ggml's AMX matmul dies (SIGILL / SIGSEGV in ``decode``, measured). In-process that kills the
command at its first judged item with no message. ``scripts/setup.sh`` builds with the flags of
``llama_build.cmake`` (beside this module: no AMX, no unused libraries) and probes; a plain ``pip install
.[llama]`` builds natively and does not. So before a llama.cpp judge loads its model, :func:`check` runs one
forward pass of that model in a child process; a child that dies is one line naming the fix (the rebuild with the
same flags), and a child that succeeds is remembered for this build on this CPU (:func:`fingerprint`) under the
user's cache folder, so the probe runs once per build, not once per command.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

from src.core.errors import RaimError

BUILD_CMAKE = Path(__file__).with_name("llama_build.cmake")  # setup.sh's flags, shipped with the package
PROBE_TIMEOUT_S = 300
_CHILD = """
import sys
from llama_cpp import Llama
m = Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
m.eval(m.tokenize(b"Is Paris in France?"))
"""
_checked: set[str] = set()  # fingerprints this process has found good


class LlamaBuildError(RaimError):
    """The installed llama.cpp build dies on this CPU; the message names the rebuild that fixes it."""


def fingerprint() -> str | None:
    """What a probe's result holds for: llama.cpp's libraries as installed (name, size, mtime) and this CPU (its
    model name and flags); None when llama-cpp-python is not installed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0])
    h = hashlib.sha256(importlib.metadata.version("llama-cpp-python").encode())
    for lib in sorted(p for p in folder.rglob("*.so*") if p.is_file()):
        st = lib.stat()
        h.update(f"{lib.relative_to(folder)} {st.st_size} {st.st_mtime_ns}\n".encode())
    h.update(cpu_signature().encode())
    return h.hexdigest()[:24]


def cpu_signature() -> str:
    """The CPU's model name and flags (/proc/cpuinfo's first processor), or what Python knows of the machine."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux
        return f"{platform.machine()} {platform.processor()}"
    first = text.split("\n\n", 1)[0]
    return "\n".join(ln for ln in first.splitlines() if ln.startswith(("model name", "flags", "Features", "isa")))


def marker(key: str) -> Path:
    """Where a good probe of build ``key`` is remembered: ``$XDG_CACHE_HOME/raim/llama-build/<key>.ok``."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "raim" / "llama-build" / f"{key}.ok"


def fix_command() -> str:
    """The rebuild with scripts/setup.sh's flags, for the installed llama-cpp-python version."""
    version = importlib.metadata.version("llama-cpp-python")
    return (
        f'CMAKE_ARGS="-DLLAVA_BUILD=OFF -DCMAKE_PROJECT_INCLUDE={BUILD_CMAKE}" pip install --no-cache-dir '
        f'--force-reinstall --no-deps "llama-cpp-python[server]=={version}"'
    )


def probe(model_path: str | Path, child: str = _CHILD) -> str | None:
    """One forward pass of ``model_path`` in a child process: None when it runs, else why it did not."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", child, str(model_path)], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return f"no answer in {PROBE_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        return f"killed by {signal.Signals(-done.returncode).name}"
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return f"exit {done.returncode}: {tail[:200]}"


def check(model_path: str | Path, child: str = _CHILD) -> None:
    """Raise :class:`LlamaBuildError` (one line naming the rebuild) when this llama.cpp build cannot run a forward
    pass here; a build found good once (this process, or a marker from an earlier one) is not probed again."""
    key = fingerprint()
    if key is None or key in _checked:
        return
    if marker(key).exists():
        _checked.add(key)
        return
    why = probe(model_path, child)
    if why is not None:
        raise LlamaBuildError(
            f"llama.cpp's build cannot run on this CPU (one forward pass of {Path(model_path).name} in a child "
            f"process: {why}); rebuild it without AMX and unused libraries, as scripts/setup.sh does: {fix_command()}"
        )
    _checked.add(key)
    try:
        marker(key).parent.mkdir(parents=True, exist_ok=True)
        marker(key).write_text(f"{model_path}\n", encoding="utf-8")
    except OSError:  # an unwritable cache folder: probed again by the next process, nothing worse
        pass
