"""Run one llama.cpp forward pass on SmolLM2-135M in a child process; exit non-zero if the build cannot run here.

A native llama.cpp wheel taken from pip's cache may carry instructions this CPU (or its VM) traps; the child dies
with SIGILL and this script says so in one line instead of the test suite crashing later.
"""

from __future__ import annotations

import subprocess
import sys

_CHILD = """
from llama_cpp import Llama
from src.judges.weights import resolve
m = Llama(model_path=str(resolve("smollm2-135m")), n_ctx=64, n_threads=1, verbose=False)
m.eval(m.tokenize(b"Is Paris in France?"))
"""


def main() -> int:
    """Return 0 when a forward pass runs, 1 (with the reason on stderr) when it does not."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return 0  # the llama extra is not installed: nothing to probe
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True)
    if done.returncode == 0:
        return 0
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    print(f"llama.cpp probe failed (exit {done.returncode}): {tail}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
