"""Which numbers of two runs' JSON results differ, and how likely the written rule is to flip one of them.

    python scripts/last_bits.py RUN_A RUN_B [--files results/suite.json ...]

RUN_A and RUN_B are two folders holding the same outputs computed on different floating-point paths (say, `dvc
repro` in two copies of the repository under ``OPENBLAS_CORETYPE=Haswell`` and ``SkylakeX``). For each JSON file
it prints the floats that differ (their count, the largest absolute and relative difference) and, over all of
them, the expected number of figures that :func:`src.io.files.written_float` writes differently: a value flips
when a rounding boundary falls between the two, a chance of |a − b| / step, the step being the written figure's
last unit (docs/data.md, *Byte-identical outputs*). With ``--digits``/``--decimals`` it counts for another rule.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from src.io.files import DECIMALS, SIGNIFICANT_DIGITS  # noqa: E402  (the checkout's package)


def float_pairs(a, b) -> Iterator[tuple[float, float]]:
    """The (a, b) leaves of two documents of one shape where both are floats and differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in a.keys() & b.keys():
            yield from float_pairs(a[k], b[k])
    elif isinstance(a, list) and isinstance(b, list):
        for x, y in zip(a, b):
            yield from float_pairs(x, y)
    elif isinstance(a, float) and isinstance(b, float) and a != b:
        yield a, b


def step(x: float, digits: int, decimals: int) -> float:
    """The last unit of ``x`` written with ``digits`` significant digits, never finer than ``decimals``."""
    if abs(x) < 10.0**-decimals:
        return 10.0**-decimals
    return max(10.0 ** (math.floor(math.log10(abs(x))) - digits + 1), 10.0**-decimals)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--files", nargs="*", help="JSON files relative to each run (default: every results/*.json)")
    ap.add_argument("--digits", type=int, default=SIGNIFICANT_DIGITS)
    ap.add_argument("--decimals", type=int, default=DECIMALS)
    a = ap.parse_args(argv)
    names = a.files or sorted(str(p.relative_to(a.run_a)) for p in (a.run_a / "results").glob("*.json"))
    expected, total = 0.0, 0
    for name in names:
        pa, pb = a.run_a / name, a.run_b / name
        if not pb.is_file():
            print(f"{name}: not in {a.run_b}")
            continue
        pairs = list(float_pairs(json.loads(pa.read_text()), json.loads(pb.read_text())))
        if not pairs:
            continue
        total += len(pairs)
        expected += sum(min(1.0, abs(x - y) / step(max(abs(x), abs(y)), a.digits, a.decimals)) for x, y in pairs)
        rel = max(abs(x - y) / max(abs(x), abs(y)) for x, y in pairs if abs(x) > 1e-12 or abs(y) > 1e-12)
        print(
            f"{name}: {len(pairs)} floats differ, largest by {max(abs(x - y) for x, y in pairs):.1e} ({rel:.1e} relative)"
        )
    print(
        f"{total} floats differ; expected written figures flipped ({a.digits} digits, {a.decimals} decimals): {expected:.2g}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
