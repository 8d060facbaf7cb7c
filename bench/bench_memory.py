"""Benchmark: the ladder on a 1M-row verdict table (4 datasets × 250,000 items × 8 judges, B=2000) in bounded
memory.

    python bench/bench_memory.py [--datasets 4 --items 250000 --members 8 --boot 2000 --max-weight-mb 32]
                                 [--today DIR]

Kept whole in float64, each dataset's bootstrap weights are B × clusters × 8 B (2000 × 125,000: 1.9 GB, plus the
generator's int64 copy while drawing). The engine stores them in float32 (whole numbers under 2²⁴: exact), keeps
them only under ``--max-weight-mb`` (:data:`src.core.evaluate.MAX_WEIGHT_BYTES`) and otherwise draws them again, chunk
by chunk of draws, on its single pass over the draws (the same draws: one generator, consumed in draw order).
Prints the resident memory after building the table, the peak over the analysis, and the wall time;
``--max-weight-mb 4096`` keeps the weights whole, for comparison. ``--today DIR`` runs this script and the one of the
checkout at DIR (e.g. the main branch's) in turn, each in a fresh process, and prints the ratio of their times and
both peaks. ``--peaks N`` also samples the resident size every 20 ms during the analysis and prints where the main
thread was at its last N new highs (the call stack's innermost frames): where the peak is.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from harness import against, cpu, machine, settle, workload_parser  # noqa: E402

from src.core import evaluate, ladder, ladderbase, verdicts  # noqa: E402
from src.core.aggregate import StackedLogit  # noqa: E402
from src.studies import simulate  # noqa: E402


def rss_mb() -> float:
    """Current resident set size (MB)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb() -> float:
    """Peak resident set size of this process so far (MB; Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextlib.contextmanager
def peak_stacks(keep: int):
    """Sample the resident size every 20 ms in a thread; on exit, print where the main thread was at each of the last
    ``keep`` new highs (5 MB or more above the one before)."""
    main_id, seen, done = threading.main_thread().ident, [], threading.Event()

    def sample():
        high = 0.0
        while not done.wait(0.02):
            now = rss_mb()
            if now > high + 5:
                high = now
                frames = traceback.extract_stack(sys._current_frames()[main_id])[-7:]
                seen.append((now, " > ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames)))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        print(f"where the resident size reached its last {keep} highs (innermost frames last):")
        for mb, where in seen[-keep:]:
            print(f"  {mb:6.0f} MB  {where}")


def main() -> None:
    ap = workload_parser(__doc__, datasets=4, items=250_000, members=8)
    ap.add_argument("--boot", type=int, default=2000)
    ap.add_argument("--max-weight-mb", type=float, default=evaluate.MAX_WEIGHT_BYTES / 2**20)
    ap.add_argument("--today", help="a checkout to compare with (its bench/bench_memory.py, the same arguments)")
    ap.add_argument("--peaks", type=int, default=0, help="print where the analysis reached its last N memory highs")
    a = ap.parse_args()
    if a.today:
        argv = [x for x in sys.argv[1:] if x not in ("--today", a.today) and not x.startswith("--today=")]
        got = against(a.today, "bench_memory.py", argv, {"s": r"\): ([\d.]+) s; RSS", "peak": r"peak (\d+) MB \("})
        new, old = got["this code"], got["today"]
        print(
            f"this code {new['s'][0]:.1f} s, peak {new['peak'][0]:.0f} MB; today {old['s'][0]:.1f} s, peak "
            f"{old['peak'][0]:.0f} MB: {new['s'][0] / old['s'][0]:.2f}x the time [{cpu()}]"
        )
        return
    evaluate.MAX_WEIGHT_BYTES = int(a.max_weight_mb * 2**20)

    print(machine())
    t0 = time.perf_counter()
    table = verdicts.validate(simulate.suite(a.datasets, a.items, a.members), frontier="frontier")
    clusters = {n: len(set(t.clusters)) for n, t in table.by_dataset().items()}
    print(
        f"table: {len(table.gold):,} rows ({a.datasets} datasets × {a.items:,} items, {a.members} judges), built in "
        f"{time.perf_counter() - t0:.1f} s; RSS {rss_mb():.0f} MB, peak so far {peak_mb():.0f} MB"
    )
    nc = max(clusters.values())
    boot = evaluate.ClusterBootstrap(np.arange(nc), a.boot, 0)  # a dataset's worth of clusters: its layout
    size = np.dtype(boot.dtype).itemsize
    print(
        f"bootstrap weights per dataset: {a.boot} × {nc:,} clusters = {a.boot * nc * 8 / 2**20:,.0f} MB in float64, "
        f"{a.boot * nc * size / 2**20:,.0f} MB in {np.dtype(boot.dtype).name}; "
        + (
            "kept whole"
            if boot._weights is not None
            else f"drawn in chunks of {boot.chunk} draws ({boot.chunk * nc * size / 2**20:.0f} MB)"
        )
    )
    del boot
    s = ladderbase.LadderSettings(n_boot=a.boot, core=list(clusters))
    settle()
    before = rss_mb()
    t0 = time.perf_counter()
    with peak_stacks(a.peaks) if a.peaks else contextlib.nullcontext():
        doc = ladder.to_json(ladder.analyze(table, StackedLogit(), s), s)
    dt = time.perf_counter() - t0
    print(
        f"analysis (ladder.analyze, B={a.boot}): {dt:.1f} s; RSS before {before:.0f} MB, peak {peak_mb():.0f} MB "
        f"(+{peak_mb() - before:.0f} MB over the table)"
    )
    for name, d in doc["datasets"].items():
        k = d["comparators"]["stacked"]["kappa"]
        print(f"  {name}: stacked κ {k['estimate']:.3f} [{k['ci'][0]:.3f}, {k['ci'][1]:.3f}]")
    print(f"after: {machine()}")


if __name__ == "__main__":
    main()
