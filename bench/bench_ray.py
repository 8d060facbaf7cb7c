"""Throughput of ``judge.engine=ray`` against the single-process runner, same items, same weights, same threads.

    python bench/bench_ray.py --dataset truthfulqa --n 96 --repeats 2     # ~2 min on two cores

Both sides are :func:`src.judges.runner.verdict_table` on the `tiny` roster (SmolLM2-135M via llama.cpp + the
lexical judge) into a fresh verdict cache each time, end to end (backend build, model load, scoring, one fsynced
record per verdict): ``local`` in this process, ``ray`` through :class:`src.judges.ray_engine.RayEngine` on a
local Ray cluster with one actor per member holding all ``--threads`` CPUs (the cluster is started once, before the
clocks: a long-lived cluster's cost). The sides run in turn (bench/harness.py), their tables are asserted equal
(every vote; log-odds to 1e-6), then the Ray overhead is printed as a ratio of medians and of minima.

The scaling model for N GPU workers is then written from measured costs: the per-item judge cost ``t_item`` (the
records' own ``seconds``), the Ray path's fixed cost per member (pool start + model load, from one-cluster runs
of each side, interleaved with the others), its per-item overhead, and the driver's serial cost per record
(unpickle, ``finish_record``, one fsynced ``VerdictCache.put``), which bounds the throughput of any cluster size.
``--threads`` defaults to 1: each side gets one core of the two, so the driver and Ray's daemons have the other
(two llama.cpp threads on two shared cores measure the contention, not the engine). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]


def judge(roster, items, frames, engine=None):
    """One end-to-end run into a fresh cache: the verdict table (cache report attached)."""
    from src.judges.runner import verdict_table

    with tempfile.TemporaryDirectory() as d:
        return verdict_table(roster, items, frames, Path(d), compute=True, progress=False, engine=engine)


def assert_agree(a, b, members: list[str]) -> None:
    """Every vote equal; continuous scores equal to 1e-6."""
    import numpy as np

    for m in members:
        assert a[m].tolist() == b[m].tolist(), f"{m}: votes differ between the engines"
        x, y = (t[f"{m}@logodds"].to_numpy(dtype=float, na_value=np.nan) for t in (a, b))
        assert np.allclose(x, y, atol=1e-6, equal_nan=True), f"{m}: log-odds differ between the engines"


def driver_cost(frame, item: dict, n: int = 300) -> float:
    """Seconds per record of the driver's serial work in the Ray path: unpickle the record a worker sent,
    :func:`~src.judges.runner.finish_record`, :meth:`VerdictCache.put` (one fsynced line)."""
    import pickle

    from src.judges.cache import VerdictCache
    from src.judges.runner import finish_record

    raw = pickle.dumps(
        {
            "vote": 1,
            "p_hal": 0.7,
            "logodds": 0.85,
            "mass": 0.9,
            "abstain": None,
            "truncated": False,
            "n_prompt_tokens": 300,
            "seconds": 0.1,
        }
    )
    with tempfile.TemporaryDirectory() as d:
        cache = VerdictCache(d, "bench", {"backend": "bench"})
        t0 = time.perf_counter()
        for i in range(n):
            cache.put(finish_record(pickle.loads(raw), f"k{i}", "bench", item, frame, cache.identity_hash))
        return (time.perf_counter() - t0) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="truthfulqa", help="a built dataset under datasets/")
    ap.add_argument("--n", type=int, default=48, help="items (whole clusters, seed 0)")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads on both sides (= the actor's CPUs)")
    ap.add_argument("--batch-size", type=int, default=16, help="judge.ray.batch_size")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of (local, ray), interleaved")
    a = ap.parse_args(argv)
    os.environ["RAIM_THREADS"] = str(a.threads)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    import ray
    from harness import interleaved, machine, settle, summary

    from src.io.datasets import read_dataset
    from src.judges.config import load_frame_cfgs, load_roster
    from src.judges.frames import load_frames
    from src.judges.ray_engine import RayEngine, RaySettings
    from src.judges.runner import cluster_subsample, member_names

    items = cluster_subsample(read_dataset(REPO / "datasets", a.dataset), a.n, seed=0)
    roster, frames = load_roster("tiny"), load_frame_cfgs()
    members = member_names(roster)
    t0 = time.perf_counter()
    ray.init(num_cpus=a.threads, include_dashboard=False, logging_level="WARNING")
    t_cluster = time.perf_counter() - t0
    settings = RaySettings(actors_per_member=1, batch_size=a.batch_size, num_cpus_per_actor=a.threads)

    one = items[items["cluster_id"] == items["cluster_id"].iloc[0]]  # fixed costs: a one-cluster run of each side
    sides = {
        "local": lambda: judge(roster, items, frames),
        "ray": lambda: judge(roster, items, frames, RayEngine(settings)),
        "local@1": lambda: judge(roster, one, frames),
        "ray@1": lambda: judge(roster, one, frames, RayEngine(settings)),
    }
    print(
        f"{len(items)} items of {a.dataset} ({items['cluster_id'].nunique()} clusters), roster tiny {members}, "
        f"{a.threads} threads, Ray batch {a.batch_size}; local Ray cluster started in {t_cluster:.1f} s"
    )
    sides["local@1"](), sides["ray@1"]()  # warm-up: the weights in the page cache, Ray's worker pool started
    settle(timeout_s=20)
    times, last = interleaved(sides, a.repeats)
    assert_agree(last["local"], last["ray"], members)
    assert_agree(last["local@1"], last["ray@1"], members)
    t_fixed = {side: min(times[f"{side}@1"]) for side in ("local", "ray")}
    n = len(items)
    print(f"{'local (single process)':24s}: {summary(times['local'])} ({min(times['local']) / n:.4f} s/item at best)")
    print(f"{'ray (1 actor/member)':24s}: {summary(times['ray'])} ({min(times['ray']) / n:.4f} s/item at best)")
    med = statistics.median(times["ray"]) / statistics.median(times["local"]) - 1
    best = min(times["ray"]) / min(times["local"]) - 1
    print(
        f"Ray overhead at 1 worker: {med:+.1%} (medians), {best:+.1%} (minima); target <= +15%; "
        f"tables equal ({n} items x {len(members)} members)"
    )
    # the scaling model's inputs
    rep = last["local"].attrs["report"]
    t_item = {m: rep[m]["seconds_per_item"] or 0.0 for m in members}
    d_fixed = t_fixed["ray"] - t_fixed["local"]
    d_item = (min(times["ray"]) - min(times["local"]) - d_fixed) / (n - len(one))
    print("per-item judge cost t_item: " + ", ".join(f"{m} {v:.4f} s" for m, v in t_item.items()))
    print(
        f"fixed cost: a {len(one)}-item run (all members, min of {a.repeats}): local {t_fixed['local']:.2f} s, ray "
        f"{t_fixed['ray']:.2f} s -> Ray's extra fixed cost {d_fixed:.2f} s for {len(members)} member pools "
        f"({d_fixed / len(members):.2f} s each)"
    )
    t_drv = driver_cost(load_frames(frames)[items["frame"].iloc[0]], items.iloc[0].to_dict())
    print(
        f"Ray's extra cost per item at 1 worker (d_item: batching, pickling, transfer, the driver sharing the "
        f"2 cores): {d_item * 1e3:+.2f} ms; the driver's serial cost per record (t_drv: unpickle, finish_record, "
        f"fsynced VerdictCache.put): {t_drv * 1e3:.2f} ms (ceiling {1 / t_drv:,.0f} records/s)"
    )
    c_local = (min(times["local"]) - t_fixed["local"]) / (n - len(one))  # the local run's cost per item

    def overhead(k: int) -> float:  # the fitted lines: Ray's extra time over the local run's, at k items
        return (d_fixed + (k - len(one)) * d_item) / (t_fixed["local"] + (k - len(one)) * c_local)

    print(
        "overhead model (fixed + per item, fitted on this run): "
        + ", ".join(f"{overhead(k):+.1%} at {k} items" for k in (100, 200, 1000, 10000))
        + (f"; <= 15% from {int(d_fixed / (0.15 * c_local - d_item)) + 1} items on" if 0.15 * c_local > d_item else "")
    )
    print(
        "scaling model, one member on N actors (one per GPU): T(n) ~ F + n * max((t_item + d_item) / N, t_drv), "
        "i.e. min(N / (t_item + d_item), 1 / t_drv) items/s; members run one after another"
    )
    for nw in (1, 2, 4, 8, 16):
        rate = {m: min(nw / max(t + d_item, t_drv), 1 / t_drv) for m, t in t_item.items()}
        print(f"  N={nw:2d}: " + ", ".join(f"{m} {v:,.0f} items/s" for m, v in rate.items()))
    print(f"after: {machine()}")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
