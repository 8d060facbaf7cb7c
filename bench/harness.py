"""What every benchmark of ``bench/`` shares: the machine's state, interleaved repeated timing, a competing load.

* :func:`machine` — the CPU model and cores (:func:`cpu`, also printed by :func:`ratio` beside every ratio), load
  average and BLAS/OpenMP thread settings, printed before and after each benchmark
  (a figure measured at load 3 on two cores is not a quiet figure); :func:`settle` waits for the 1-minute load
  to fall under a threshold before the clocks start;
* :func:`interleaved` — both sides of a comparison run in turn, ``repeats`` times (A B A B …, never all of A then
  all of B), each side's times kept; :func:`summary` prints their min and median;
* :func:`competing_load` — ``n`` busy processes (numpy matrix products, one BLAS thread each: ``n`` cores' worth of
  competing work) started for the duration of a block and stopped after it (by their own process ids).

Benchmarks are not tests: nothing here asserts a speed; each benchmark asserts that its two sides agree before
it prints their ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

BUSY = "import numpy as np\na = np.random.default_rng(0).random((400, 400))\nwhile True:\n    a @ a\n"


def workload_parser(doc: str, datasets: int, items: int, members: int) -> argparse.ArgumentParser:
    """The simulated verdict table every benchmark measures on: datasets × items × members."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=datasets)
    ap.add_argument("--items", type=int, default=items)
    ap.add_argument("--members", type=int, default=members)
    return ap


def cpu() -> str:
    """The CPU model and the cores this process may use (``/proc/cpuinfo``; the platform's name elsewhere): printed
    beside every ratio, so that figures from two machines are not read as a regression."""
    import platform

    model = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
        model = names[0] if names else model
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores"


def machine() -> str:
    """One line: the CPU (:func:`cpu`), 1/5/15-min load, BLAS pools and their threads, thread environment
    variables."""
    from threadpoolctl import threadpool_info

    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"] * 3
    pools = ", ".join(f"{p['internal_api']} {p['num_threads']} threads" for p in threadpool_info()) or "none loaded"
    env = (
        " ".join(
            f"{k}={os.environ[k]}"
            for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
            if k in os.environ
        )
        or "no thread variables set"
    )
    return f"{cpu()}; load {'/'.join(load)} (1/5/15 min); BLAS: {pools}; {env}"


def busy_elsewhere() -> bool:
    """A test run (pytest) is going on somewhere on the machine."""
    try:
        return subprocess.run(["pgrep", "-f", "pytest"], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


def settle(below: float = 1.2, timeout_s: float | None = None) -> None:
    """Wait until no test run is going on and the 1-minute load average is under ``below`` (at most
    ``timeout_s``; then say so), and print the machine's state."""
    if timeout_s is None:  # BENCH_SETTLE_S: how long to wait (900 s unless set)
        timeout_s = float(os.environ.get("BENCH_SETTLE_S", "900"))
    deadline = time.monotonic() + timeout_s
    while busy_elsewhere() or (
        os.path.exists("/proc/loadavg") and float(open("/proc/loadavg").read().split()[0]) >= below
    ):
        if time.monotonic() > deadline:
            print(f"(a test run or a load ≥ {below} lasted {timeout_s:.0f} s: measuring anyway)")
            break
        time.sleep(5)
    print(f"-- {machine()}")


def interleaved(sides: dict[str, Callable[[], object]], repeats: int = 3) -> tuple[dict[str, list[float]], dict]:
    """Each side's wall times over ``repeats`` rounds (every round runs every side once, in turn), and each
    side's last result (for the agreement check)."""
    times: dict[str, list[float]] = {k: [] for k in sides}
    last: dict[str, object] = {}
    for _ in range(repeats):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            last[name] = fn()
            times[name].append(time.perf_counter() - t0)
    return times, last


def summary(times: list[float]) -> str:
    return f"min {min(times):.3f} s, median {statistics.median(times):.3f} s over {len(times)}"


def paired(slow: list[float], fast: list[float]) -> str:
    """The median of the rounds' ratios slow / fast (each round runs both sides back to back, so a busy spell
    slows both) and their range."""
    r = sorted(a / b for a, b in zip(slow, fast))
    return f"{statistics.median(r):.2f}x (median of {len(r)} rounds' ratios, {r[0]:.2f}–{r[-1]:.2f})"


def import_seconds(stderr: str) -> float:
    """The total of a ``-X importtime`` report: the cumulative times of its top-level imports, in seconds."""
    rows = [ln.split("|") for ln in stderr.splitlines() if ln.startswith("import time:") and "cumulative" not in ln]
    return sum(int(r[1]) for r in rows if len(r[2]) - len(r[2].lstrip()) == 1) / 1e6


def ratio(slow: list[float], fast: list[float]) -> str:
    """Speed-up of the medians and of the minima, and the machine they were measured on (:func:`cpu`)."""
    return (
        f"{statistics.median(slow) / statistics.median(fast):.1f}x (medians), "
        f"{min(slow) / min(fast):.1f}x (minima) [{cpu()}]"
    )


@contextlib.contextmanager
def competing_load(n: int) -> Iterator[None]:
    """``n`` busy single-threaded numpy processes for the duration of the block (none when ``n`` is 0)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", BUSY], env=env) for _ in range(n)]
    try:
        if procs:
            time.sleep(2.0)  # let them reach their loop
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def against(today: str, script: str, argv: list[str], patterns: dict[str, str], repeats: int = 1) -> dict:
    """This checkout's ``bench/<script>`` and the same script of the checkout at ``today`` (e.g. the main branch's)
    with the same arguments, each in a fresh process, in turn, ``repeats`` times: each run's figures read from its
    output by ``patterns`` (name → a regular expression with one group, a number), as {side: {name: [values]}};
    each run's output is printed. Both scripts import this checkout's harness (the same waits for a quiet
    machine), each its own checkout's code."""
    import re
    from pathlib import Path

    here = Path(__file__).resolve().parents[1]
    sides = {"this code": here, "today": Path(today).resolve()}
    got: dict[str, dict[str, list[float]]] = {k: {n: [] for n in patterns} for k in sides}
    for _ in range(repeats):
        for side, root in sides.items():
            run = (  # both scripts on this checkout's harness (its waits and its printing)
                f"import runpy, sys; sys.path.insert(0, {str(here / 'bench')!r}); "
                f"sys.argv = {[script, *argv]!r}; runpy.run_path({str(root / 'bench' / script)!r}, run_name='__main__')"
            )
            out = subprocess.run([sys.executable, "-c", run], cwd=root, capture_output=True, text=True)
            print(f"--- {side} ({root}):\n{out.stdout}{out.stderr[-2000:] if out.returncode else ''}")
            out.check_returncode()
            for name, pattern in patterns.items():
                got[side][name].append(float(re.findall(pattern, out.stdout)[-1]))
    return got


def profiled(label: str, fn, top: int = 30) -> None:
    """``fn()`` under cProfile on a quiet machine: its wall time under the profiler, then the ``top`` entries by
    cumulative and by own time (where the time goes: docs/benchmarks.md quotes these)."""
    import cProfile
    import pstats

    settle()
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.runcall(fn)
    print(f"{label} under cProfile: {time.perf_counter() - t:.1f} s [{cpu()}]")
    for order in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=sys.stdout).sort_stats(order).print_stats(top)
