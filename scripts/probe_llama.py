"""Run one llama.cpp forward pass on SmolLM2-135M in a child process; exit non-zero if the build cannot run here.

A native llama.cpp wheel taken from pip's cache may carry instructions this CPU (or its VM) traps; the child dies
with SIGILL and this script says so in one line instead of the test suite crashing later. The probe is the one a
llama.cpp judge runs before its first model (:mod:`src.judges.backends.llama_build`): a build found good here is
not probed again by the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from the checkout: the package beside it

from src.judges.backends import llama_build  # noqa: E402
from src.judges.weights import resolve  # noqa: E402


def main() -> int:
    """Return 0 when a forward pass runs (or the llama extra is not installed), 1 with the reason on stderr."""
    if llama_build.fingerprint() is None:
        return 0  # the llama extra is not installed: nothing to probe
    try:
        llama_build.check(resolve("smollm2-135m"))
    except llama_build.LlamaBuildError as e:
        print(f"llama.cpp probe failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
