"""Benchmark: the whole analysis under OpenBLAS's AVX2 (Haswell) kernels, its AVX-512 (SkylakeX) ones and its own
choice — what pinning a kernel costs, and that the results do not depend on it.

    python bench/bench_kernels.py [--datasets 8 --items 2000 --members 10 --boot 2000 --repeats 3]

Each measurement is a fresh process (``OPENBLAS_CORETYPE`` is read when numpy loads OpenBLAS) that builds the
simulated table of ``bench_engine.py``'s whole-analysis part and times ``ladder.analyze`` with its results
document, rounds interleaved (every round runs every kernel once, in turn). Printed per kernel: the kernel
OpenBLAS reports, min and median; then each kernel's ratio to OpenBLAS's own choice (minima) and whether every run
wrote the same results document (md5 of ``to_json``)."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import machine, workload_parser  # noqa: E402

KERNELS = {"Haswell (AVX2)": "Haswell", "SkylakeX (AVX-512)": "SkylakeX", "OpenBLAS's own choice": None}


def child(a) -> None:
    """One timed analysis in this process; prints {seconds, md5, kernel} as JSON."""
    from threadpoolctl import threadpool_info

    from src.core import ladder, ladderbase, verdicts
    from src.core.aggregate import StackedLogit
    from src.io.files import to_json
    from src.studies import simulate

    table = verdicts.validate(simulate.suite(a.datasets, a.items, a.members), frontier="frontier")
    s = ladderbase.LadderSettings(n_boot=a.boot, core=[f"sim{i}" for i in range(min(4, a.datasets))])
    t0 = time.perf_counter()
    doc = ladder.to_json(ladder.analyze(table, StackedLogit(), s), s)
    seconds = time.perf_counter() - t0
    kernel = next((p.get("architecture") for p in threadpool_info() if p["internal_api"] == "openblas"), "?")
    md5 = hashlib.md5(to_json(doc).encode()).hexdigest()
    print(json.dumps({"seconds": seconds, "md5": md5, "kernel": kernel}))


def main() -> None:
    ap = workload_parser(__doc__, datasets=8, items=2000, members=10)
    ap.add_argument("--boot", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", action="store_true", help="internal: one timed analysis in this process")
    a = ap.parse_args()
    if a.child:
        return child(a)
    print(f"{a.datasets} datasets × {a.items} items × {a.members} judges, B={a.boot}; {machine()}")
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    args = [f"--datasets={a.datasets}", f"--items={a.items}", f"--members={a.members}", f"--boot={a.boot}"]
    runs: dict[str, list[dict]] = {k: [] for k in KERNELS}
    for _ in range(a.repeats):
        for name, core in KERNELS.items():
            env = {**base, **({"OPENBLAS_CORETYPE": core} if core else {})}
            out = subprocess.run(
                [sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True, check=True
            )
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    own = min(r["seconds"] for r in runs["OpenBLAS's own choice"])
    for name, rs in runs.items():
        t = [r["seconds"] for r in rs]
        print(
            f"{name:22s} kernel {rs[0]['kernel']}: min {min(t):.2f} s, median {statistics.median(t):.2f} s over "
            f"{len(t)}; {min(t) / own:.3f}x its own choice (minima)"
        )
    same = len({r["md5"] for rs in runs.values() for r in rs}) == 1
    print(f"results document the same bytes in every run: {'yes' if same else 'NO'}")
    print(f"after: {machine()}")


if __name__ == "__main__":
    main()
