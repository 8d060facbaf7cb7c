"""Benchmark: the ladder engine against the straightforward implementation, and ``python -m src.run`` end to end.

    python bench/bench_engine.py [--datasets 8 --items 2000 --members 10 --boot 2000 --baseline-boot 40
                                 --today ../main --repeats 3 --load 1]

Three parts, each side of a comparison interleaved with the other and repeated (min and median printed), the
machine's load and thread settings printed before and after:

1. **Paired cluster bootstrap** (the ladder's predictions and members of every dataset, B draws): the engine's
   one matrix product per chunk of draws against a per-draw numpy loop (each draw's item multiplicities times the
   per-item confusion indicators, built once) on the *same* draws, built once outside both clocks. The two must
   give the same counts before the ratio is printed.
2. **Whole analysis** (``ladder.analyze``): the engine against the same ladder run the straightforward way —
   scikit-learn's ``StratifiedGroupKFold``, statsmodels' Holm, the per-draw bootstrap of part 1 (same draws),
   Dawid–Skene's plain EM steps to the same tolerance, and the refit bootstrap's stackers refitted by a per-draw,
   per-fold loop of scikit-learn ``LogisticRegression`` fits on the training items repeated by their multiplicity
   (solved tightly: ``newton-cholesky``, tol 1e-12), on ``--baseline-boot`` draws (the same on both sides: a
   reduced workload, never a timing scaled up). The two results.json documents must be identical before the ratio
   is printed. Then, with ``--today DIR`` (a checkout of the code to compare with, e.g. the main branch), the
   engine at the full workload (B = ``--boot``) against that checkout's, each in a fresh process, interleaved;
   their results.json documents must agree to 1e-6 (the fits may move last bits) before the ratio is printed.
   Then the engine under a competing CPU load (``--load`` busy single-threaded numpy processes) against its
   quiet time, with BLAS held to one thread (as it runs) and with BLAS left to its default threads (what the
   hold is for).
3. **``python -m src.run``** on the committed verdict caches (a fresh process each time: imports counted), without
   tracking, with MLflow tracking into an existing store and into a new one, and each tracked side's ratio to the
   untracked one; then the same under the load.
4. **Start-up** (``--parts startup``): ``python -m src.run --help`` and the main job without tracking, each its
   wall time and its imports' time by ``-X importtime`` (the sum of the top-level imports), and the main job's
   import share.
5. **Profile** (``--parts profile``, not among the defaults): the whole analysis (B = ``--boot``) under cProfile,
   where its time goes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedGroupKFold
from statsmodels.stats.multitest import multipletests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import (  # noqa: E402
    competing_load,
    cpu,
    import_seconds,
    interleaved,
    machine,
    paired,
    profiled,
    ratio,
    settle,
    summary,
    workload_parser,
)

from src.core import ladder, ladderbase, verdicts  # noqa: E402
from src.core.aggregate import DawidSkene, StackedLogit  # noqa: E402
from src.core.evaluate import ClusterBootstrap, indicators  # noqa: E402
from src.studies import simulate  # noqa: E402

# ------------------------------------------------------------------------------- the straightforward side


def loop_counts(boot: ClusterBootstrap, gold: np.ndarray, preds: np.ndarray) -> np.ndarray:
    """Per draw: the items' multiplicities, then one weighted sum of the per-item indicators (B × P × 6)."""
    preds = np.atleast_2d(np.asarray(preds, dtype=float).T).T
    ind = indicators(gold, preds).reshape(len(gold), -1)
    W = boot.weights
    out = np.empty((len(W), ind.shape[1]))
    for b in range(len(W)):
        out[b] = W[b, boot.item_cluster] @ ind
    return out.reshape(len(W), preds.shape[1], 6)


def sklearn_folds(y, clusters, n_splits=5, seed=0):
    n_clusters = len(np.unique(clusters))
    if n_clusters < n_splits:
        raise ValueError(f"cross-fitting needs at least {n_splits} clusters, got {n_clusters}")
    cv = StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
    return list(cv.split(np.zeros(len(y)), y, groups=clusters))


def statsmodels_holm(pvalues):
    return [float(p) for p in multipletests(pvalues, method="holm")[1]] if pvalues else []


@contextlib.contextmanager
def blas_unlimited():
    """The engine with its one-thread BLAS hold lifted (threadpoolctl's limit made a no-op)."""
    import threadpoolctl

    saved = threadpoolctl.threadpool_limits
    threadpoolctl.threadpool_limits = lambda *a, **k: contextlib.nullcontext()
    try:
        yield
    finally:
        threadpoolctl.threadpool_limits = saved


def plain_dawid_skene(**kw) -> DawidSkene:
    """Dawid–Skene EM step after step to the same tolerance, without the SQUAREM extrapolation."""
    return DawidSkene(accelerate=False, **kw)


class LoopStacker(StackedLogit):
    """The stacker fitted by scikit-learn's ``LogisticRegression`` solved tightly (``newton-cholesky``, tol 1e-12):
    the refit bootstrap refits it by its own fit, draw by draw and fold by fold (:func:`src.core.logitfit.loop_proba`),
    where the engine batches Newton's steps over the draws."""

    def logistic_regression(self) -> LogisticRegression:
        return LogisticRegression(C=self.C, solver="newton-cholesky", tol=1e-12, max_iter=self.max_iter)


def loop_stacked_rung(refit, stacker: StackedLogit, X: np.ndarray):
    """:func:`src.core.ladder.stacked_rung` as a loop of scikit-learn fits, one per draw and fold."""
    return refit.stacked_loop(LoopStacker(**stacker.get_params()), X)


@contextlib.contextmanager
def straightforward():
    """The ladder with library folds and Holm, the per-draw bootstrap, plain Dawid–Skene EM and the refit
    bootstrap's stackers fitted by scikit-learn draw by draw and fold by fold (the engine's code otherwise)."""
    saved = ladderbase.cluster_folds, ladder.holm, ladder.DawidSkene, ClusterBootstrap.counts, ladder.stacked_rung
    ladderbase.cluster_folds, ladder.holm, ladder.DawidSkene = sklearn_folds, statsmodels_holm, plain_dawid_skene
    ClusterBootstrap.counts = lambda self, gold, preds: loop_counts(self, gold, preds)
    ladder.stacked_rung = loop_stacked_rung
    try:
        yield
    finally:
        (ladderbase.cluster_folds, ladder.holm, ladder.DawidSkene, ClusterBootstrap.counts, ladder.stacked_rung) = saved


TIMED = """
import json, sys, time
sys.path.insert(0, {root!r})
from src.core import ladder, ladderbase, verdicts
from src.core.aggregate import StackedLogit
from src.studies import simulate
table = verdicts.validate(simulate.suite({datasets}, {items}, {members}), frontier="frontier")
s = ladderbase.LadderSettings(n_boot={boot}, core={core!r})
t = time.perf_counter()
doc = ladder.to_json(ladder.analyze(table, StackedLogit(), s), s)
print(json.dumps({{"seconds": time.perf_counter() - t, "doc": doc}}))
"""


def timed_analysis(root: Path, a, core: list[str]) -> tuple[float, dict]:
    """(seconds, results.json document) of ``ladder.analyze`` on the benchmark's workload by the code at ``root``,
    in a fresh process (its imports and the table's simulation outside the clock)."""
    code = TIMED.format(root=str(root), datasets=a.datasets, items=a.items, members=a.members, boot=a.boot, core=core)
    out = subprocess.run([sys.executable, "-c", code], cwd=root, check=True, capture_output=True, text=True)
    got = json.loads(out.stdout.splitlines()[-1])
    return got["seconds"], got["doc"]


def max_difference(x, y, path: str = "") -> float:
    """The largest absolute difference between two JSON documents' numbers; anything else must be equal."""
    if isinstance(x, dict):
        assert isinstance(y, dict) and x.keys() == y.keys(), f"{path}: keys differ"
        return max((max_difference(x[k], y[k], f"{path}/{k}") for k in x), default=0.0)
    if isinstance(x, list):
        assert isinstance(y, list) and len(x) == len(y), f"{path}: lengths differ"
        return max((max_difference(u, v, f"{path}[{i}]") for i, (u, v) in enumerate(zip(x, y))), default=0.0)
    if isinstance(x, float | int) and not isinstance(x, bool) and isinstance(y, float | int):
        return abs(float(x) - float(y))
    assert x == y, f"{path}: {x!r} != {y!r}"
    return 0.0


# ----------------------------------------------------------------------------------------------- parts


def ladder_predictions(table, s: ladderbase.LadderSettings) -> list[tuple]:
    """Per dataset: (bootstrap, gold, every prediction vector the ladder scores)."""
    out = []
    for name, res in ladder.analyze(table, StackedLogit(), s).items():
        t = table.by_dataset()[name]
        P = np.column_stack(list(res.predictions.values()) + [t.votes])
        out.append((ClusterBootstrap(t.clusters, s.n_boot, s.seed), t.gold, P))
    return out


def bootstrap_part(table, s, repeats: int) -> None:
    from threadpoolctl import threadpool_limits

    work = ladder_predictions(table, s)
    with threadpool_limits(1):  # as inside the analysis; both sides alike
        times, last = interleaved(
            {
                "engine": lambda: [b.counts(g, P) for b, g, P in work],
                "loop": lambda: [loop_counts(b, g, P) for b, g, P in work],
            },
            repeats,
        )
    assert all(np.array_equal(a, b) for a, b in zip(last["engine"], last["loop"])), "bootstrap counts differ"
    print(
        f"1. paired cluster bootstrap, {len(work)} datasets × {work[0][2].shape[1]} prediction vectors, "
        f"B={s.n_boot} (same draws on both sides; counts equal)"
    )
    print(f"   engine (one product per chunk of draws): {summary(times['engine'])}")
    print(f"   per-draw numpy loop:                     {summary(times['loop'])}")
    print(f"   speed-up: {ratio(times['loop'], times['engine'])}")


def analysis_part(table, s, repeats: int, load: int, baseline_boot: int) -> None:
    reduced = dataclasses.replace(s, n_boot=baseline_boot)

    def engine(settings=s):
        return json.dumps(ladder.to_json(ladder.analyze(table, StackedLogit(), settings), settings))

    def baseline():
        with straightforward():
            return engine(reduced)

    def unlimited():
        with blas_unlimited():
            return engine()

    times, last = interleaved({"engine": lambda: engine(reduced), "baseline": baseline}, repeats)
    assert last["engine"] == last["baseline"], "the two analyses disagree"
    print(f"2. whole analysis (ladder.analyze) on B={baseline_boot} draws (results.json identical on both sides)")
    print(f"   engine:                   {summary(times['engine'])}")
    print(f"   straightforward baseline: {summary(times['baseline'])} (scikit-learn fits per draw and fold)")
    print(f"   speed-up: {ratio(times['baseline'], times['engine'])}")
    if load:
        settle()
        quiet, _ = interleaved({"engine": engine, "unlimited": unlimited}, repeats)
        with competing_load(load):
            print(f"   under {load} busy process(es): {machine()}")
            busy, _ = interleaved({"engine": engine, "unlimited": unlimited}, repeats)
        for k, name in (("engine", "engine (BLAS 1 thread)"), ("unlimited", "BLAS default threads")):
            print(
                f"   {name:24s} quiet {summary(quiet[k])}; under load {summary(busy[k])}: {min(busy[k]) / min(quiet[k]):.2f}x"
            )


def today_part(a, core: list[str]) -> None:
    """The engine against the code at ``a.today`` on the full workload, each in a fresh process, interleaved."""
    today = Path(a.today).resolve()
    times: dict[str, list[float]] = {"this code": [], "today": []}
    docs = {}
    for _ in range(a.repeats):
        for name, root in (("this code", ROOT), ("today", today)):
            seconds, docs[name] = timed_analysis(root, a, core)
            times[name].append(seconds)
    diff = max_difference(docs["this code"], docs["today"])
    assert diff <= 1e-6, f"the analyses disagree by {diff:.3g}"
    print(f"2b. whole analysis, B={a.boot}, against {today} (fresh processes; results.json within {diff:.2g})")
    print(f"   this code: {summary(times['this code'])}")
    print(f"   today:     {summary(times['today'])}")
    print(f"   this code / today: {min(times['this code']) / min(times['today']):.2f}x (minima) [{cpu()}]")


def cli(env: dict, out: Path) -> float:
    """One ``python -m src.run``; returns its CPU seconds (user + system, the forked tracking worker's included)."""
    cmd = [
        sys.executable,
        "-m",
        "src.run",
        "--config-dir",
        ".",
        "--config-name",
        "params",
        "judge.compute=false",
        "judge.missing=skip",
        f"output={out / 'r.json'}",
        f"hydra.run.dir={out / 'hydra'}",
    ]
    if "MLFLOW_TRACKING_URI" not in env:
        cmd.append("tracking.enabled=false")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cli_part(repeats: int, load: int) -> None:
    base = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    base.pop("MLFLOW_TRACKING_URI", None)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        existing = {**base, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/existing/m.db"}
        (tmp / "existing").mkdir()
        cli(existing, tmp)  # the existing store: created once, before the clocks
        fresh = iter(range(10**6))
        cpu_s: dict[str, list[float]] = {"no tracking": [], "existing store": [], "new store": []}

        def new_store():
            d = tmp / f"new{next(fresh)}"
            d.mkdir()
            cpu_s["new store"].append(cli({**base, "MLFLOW_TRACKING_URI": f"sqlite:///{d}/m.db"}, tmp))

        sides = {
            "no tracking": lambda: cpu_s["no tracking"].append(cli(base, tmp)),
            "existing store": lambda: cpu_s["existing store"].append(cli(existing, tmp)),
            "new store": new_store,
        }
        print("3. python -m src.run on the committed verdict caches, end to end (a new process: imports counted)")
        times, _ = interleaved(sides, repeats)
        for k, v in times.items():
            print(f"   {k:15s} {summary(v)}; CPU {summary(cpu_s[k])}")
        untracked = times["no tracking"]
        for k in ("existing store", "new store"):
            print(
                f"   {k} / no tracking: {min(times[k]) / min(untracked):.2f}x (minima), {paired(times[k], untracked)}; "
                f"CPU {statistics.median(cpu_s[k]) / statistics.median(cpu_s['no tracking']):.2f}x (medians) [{cpu()}]"
            )
        if load:
            with competing_load(load):
                print(f"   under {load} busy process(es): {machine()}")
                busy, _ = interleaved(sides, repeats)
            for k, v in busy.items():
                print(f"   {k:15s} under load: {summary(v)}; {min(v) / min(times[k]):.2f}x its quiet minimum")


def startup_part(repeats: int) -> None:
    """``--help`` and the untracked main job: wall time and the imports' share of it (min of ``repeats``)."""
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "--help": ["--help"],
            "main job, no tracking": ["tracking.enabled=false", f"hydra.run.dir={tmp}/hydra"],
        }
        print("4. start-up: wall time and the imports' time (-X importtime), min of the repeats")
        for name, args in cases.items():
            walls, imports = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = subprocess.run(
                    [sys.executable, "-X", "importtime", "-m", "src.run", *args],
                    cwd=ROOT,
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                walls.append(time.perf_counter() - t0)
                imports.append(import_seconds(r.stderr))
            print(
                f"   {name:22s} wall {min(walls):.2f} s, imports {min(imports):.2f} s "
                f"({100 * min(imports) / min(walls):.0f} % of the wall) [{cpu()}]"
            )


def main() -> None:
    ap = workload_parser(__doc__, datasets=8, items=2000, members=10)
    ap.add_argument("--boot", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load", type=int, default=1, help="busy processes for the loaded measurements (0: none)")
    ap.add_argument("--baseline-boot", type=int, default=40, help="draws of the straightforward comparison")
    ap.add_argument("--today", help="a checkout of the code to compare the whole analysis with (e.g. main's)")
    ap.add_argument("--parts", default="bootstrap,analysis,today,cli,startup")
    a = ap.parse_args()

    table = verdicts.validate(simulate.suite(a.datasets, a.items, a.members), frontier="frontier")
    core = [f"sim{i}" for i in range(min(4, a.datasets))]
    s = ladderbase.LadderSettings(n_boot=a.boot, core=core)
    print(f"{a.datasets} datasets × {a.items} items × {a.members} judges, B={a.boot}; {machine()}")
    parts = a.parts.split(",")
    for name, run in (
        ("bootstrap", lambda: bootstrap_part(table, s, a.repeats)),
        ("analysis", lambda: analysis_part(table, s, a.repeats, a.load, a.baseline_boot)),
        ("today", lambda: today_part(a, core) if a.today else print("2b. skipped: no --today checkout")),
        ("cli", lambda: cli_part(a.repeats, a.load)),
        ("startup", lambda: startup_part(a.repeats)),
        ("profile", lambda: profiled("5. whole analysis", lambda: ladder.analyze(table, StackedLogit(), s))),
    ):
        if name in parts:
            settle()  # each part starts on a quiet machine (1-min load < 1.2)
            run()
    print(f"after: {machine()}")


if __name__ == "__main__":
    main()
