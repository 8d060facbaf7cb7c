"""Tuning the monitor's alarm rule: false alarms per stable item against detection delay, on tuning seeds only.

    python bench/tune_monitor.py [--stable 100 --seeds 10 --out bench/results/monitor_tuning.json]

For each false-alarm target (alarms per stable item; ``monitor.alpha: auto`` turns it into the window level
α = target·step/2, :func:`src.monitor.design_alpha`) and each run length ``consecutive``, on the replay of
``conf/monitor/default.yaml``:

* **false alarms** on ``--stable`` stable streams (scenario ``none``, seeds from 50,000), per 100,000 items with an
  exact Poisson interval;
* **detection delay** of each degrading scenario on ``--seeds`` streams (scenario i: seeds from 1000·(i + 1)), the
  median and the share detected within ``evaluation.max_delay`` items.

Every stream is scored once; the flags of each (α, consecutive) are taken again from its windows' p-values
(:meth:`src.monitor.DriftMonitor.alarms`). None of these seeds is one of the evaluation's (scenario blocks from
``evaluation.first_seed`` = 100, stable streams from 10,000), so the pipeline's figures are measured on streams the
tuning never saw. The target
is the user's choice; for each target the run length chosen is the one with the shortest mean median delay among
those whose tuning false-alarm rate is within the target (the share detected within the stated delay is printed
beside it). The grid and the choices are printed and written to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import machine  # noqa: E402

from src import monitor  # noqa: E402
from src.core.aggregate import StackedLogit  # noqa: E402

TARGETS = (1e-4, 3e-5, 1e-5, 3e-6)
RUNS = (1, 2, 3)
DEGRADING = ("accuracy", "correlated", "abstain", "prevalence")


def scored(node: dict, scenario: str, seed: int, stacker):
    r = monitor.replay(node["replay"], scenario, seed, stacker)
    mon = monitor.make_monitor(node, r.members).fit(r.cal_votes, r.cal_gold)
    return r, mon, mon.windows(r.votes, r.p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stable", type=int, default=100, help="stable tuning streams")
    ap.add_argument("--seeds", type=int, default=10, help="tuning streams per degrading scenario")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "monitor_tuning.json"))
    args = ap.parse_args()
    node = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "monitor" / "default.yaml"), resolve=True)
    node["alpha"] = max(monitor.design_alpha(t, node["step"]) for t in TARGETS)  # scoring level: flags taken again
    stacker, max_delay = StackedLogit(), int(node["evaluation"]["max_delay"])
    print(f"-- {machine()}")
    t0 = time.perf_counter()
    stable = [scored(node, "none", 50_000 + seed, stacker) for seed in range(args.stable)]
    changed = {
        s: [scored(node, s, 1000 * (i + 1) + k, stacker) for k in range(args.seeds)] for i, s in enumerate(DEGRADING)
    }
    items = sum(len(r.votes) for r, _, _ in stable)
    grid = []
    for target in TARGETS:
        alpha = monitor.design_alpha(target, node["step"])
        for run in RUNS:
            fa = sum(len(a) for r, mon, fr in stable for a in mon.alarms(fr, alpha, run).values())
            row = {
                "target_per_100k": target * 1e5,
                "alpha": alpha,
                "consecutive": run,
                "stable_items": items,
                "false_alarms": fa,
                "per_100k": fa / items * 1e5,
                "per_100k_ci": [v * 1e5 for v in monitor.rate_interval(fa, items)],
                "scenarios": {},
            }
            for s, streams in changed.items():
                delays = [
                    monitor.score_alarms(mon.alarms(fr, alpha, run), r.change, s)["delay"] for r, mon, fr in streams
                ]
                got = [d for d in delays if d is not None]
                row["scenarios"][s] = {
                    "detected_within": sum(d <= max_delay for d in got) / len(delays),
                    "delay_median": float(np.median(got)) if got else None,
                }
            grid.append(row)
    chosen = {}
    for target in TARGETS:
        ok = [r for r in grid if r["target_per_100k"] == target * 1e5 and r["per_100k"] <= r["target_per_100k"]]
        best = min(ok, key=lambda r: np.mean([v["delay_median"] for v in r["scenarios"].values()])) if ok else None
        chosen[f"{target:g}"] = None if best is None else best["consecutive"]
    print(
        f"{args.stable} stable tuning streams ({items} items), {args.seeds} per degrading scenario, "
        f"{time.perf_counter() - t0:.1f} s"
    )
    print(
        f"{'target/100k':>11} {'alpha':>9} {'run':>3} {'FA/100k [95% CI]':>22}  "
        + "  ".join(f"{s:>18}" for s in DEGRADING)
    )
    for r in grid:
        ci = r["per_100k_ci"]
        cells = "  ".join(
            f"{100 * v['detected_within']:5.0f}% med {v['delay_median'] if v['delay_median'] is not None else '-':>5}"
            for v in r["scenarios"].values()
        )
        print(
            f"{r['target_per_100k']:11.2f} {r['alpha']:9.2e} {r['consecutive']:3d} "
            f"{r['per_100k']:6.2f} [{ci[0]:5.2f}, {ci[1]:6.2f}]  {cells}"
        )
    print("run length chosen per target (alarms per item):", chosen)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "stable_streams": args.stable,
                "seeds_per_scenario": args.seeds,
                "max_delay": max_delay,
                "grid": grid,
                "consecutive_per_target": chosen,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"-- {machine()}")


if __name__ == "__main__":
    main()
