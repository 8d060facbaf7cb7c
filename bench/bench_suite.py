"""Benchmark: the analysis suite (issue 5) on 8 datasets × 2000 items × 10 judges (simulated verdicts).

Times :func:`src.analyses.run_suite` with the default suite settings (Table 6: 5 budgets × R=200; Table 7:
7 budgets × R=100 × 5 folds; Fig. 5/6a refits; 236 (sub-)panels per dataset for Appendix C), and the
straightforward loop implementations of its heavy parts (:mod:`src.analyses.loops`: one scikit-learn fit per
draw, budget and fold, one ``admissibility.test`` per calibration sample, one crossfit and bootstrap per
sub-panel), measured in this run. Loops are timed on a fraction of their draws / sub-panels and scaled
linearly (their cost is linear in those); ``--loop-frac 1`` times them in full. Parts that are the same code
on both sides (per-dataset references, transfer, Table 4/5, Table 17, cost) count once on each side.

    python bench/bench_suite.py [--datasets 8 --items 2000 --members 10 --loop-frac 0.1]
"""

from __future__ import annotations

import argparse
import time

from omegaconf import OmegaConf

from src import ladder, simulate, verdicts
from src.aggregate import StackedLogit
from src.analyses import loops, mechanism, run_suite
from src.analyses.reference import references, rng_for


def suite_cfg() -> dict:
    """The default suite settings (conf/suite/default.yaml)."""
    return OmegaConf.to_container(OmegaConf.load("conf/suite/default.yaml"), resolve=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=8)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--loop-frac", type=float, default=0.1, help="share of draws/sub-panels the loops run")
    a = ap.parse_args()

    table = verdicts.validate(simulate.suite(a.datasets, a.items, a.members), frontier="frontier")
    s = ladder.LadderSettings(core=[f"sim{i}" for i in range(min(4, a.datasets))])
    cfg = suite_cfg()
    stacker = StackedLogit()

    t0 = time.perf_counter()
    doc = run_suite(table, stacker, s, cfg)
    vec = time.perf_counter() - t0
    tm = doc["timings"]
    print(f"suite, vectorised: {a.datasets} datasets × {a.items} items × {a.members} judges: {vec:.1f} s "
          f"(target: a few minutes on two cores)")
    for k, v in tm.items():
        print(f"  {k:16s} {v:7.2f} s")

    b, m = cfg["budget"], cfg["mechanism"]
    frac = a.loop_frac
    refs = references(table, stacker, s)
    subsets = mechanism.draw_subpanels(a.members, int(m["subpanels"]), int(m["subpanel_min_size"]),
                                       rng_for(0, "subpanels"))
    loop = {}

    def clock(key, fn, scale):
        t = time.perf_counter()
        fn()
        loop[key] = loop.get(key, 0.0) + (time.perf_counter() - t) * scale

    R6 = max(1, int(round(b["draws"] * frac)))
    R7 = max(1, int(round(b["curve_draws"] * frac)))
    S = max(1, int(round(len(subsets) * frac)))
    for name, ref in refs.items():
        clock("regime_recovery", lambda: loops.regime_recovery(ref, b["budgets"], R6, rng_for(0, "r", name),
                                                               s.kappa0, s.c, s.phi0), b["draws"] / R6)
        clock("learning_curve", lambda: loops.learning_curve(ref, stacker, [], b["curve_budgets"], R7,
                                                             rng_for(0, "c", name)), b["curve_draws"] / R7)
        K = len(ref.table.members)
        clock("size_curve", lambda: [loops.stacked_kappa(ref, stacker, list(range(k))) for k in range(1, K + 1)], 1)
        clock("leave_one_out", lambda: loops.leave_one_out(ref, stacker), 1)
        clock("subpanels", lambda: loops.subpanels(ref, stacker, subsets[:S], int(m["subpanel_boot"]), 0, s.level),
              len(subsets) / S)
    same = sum(v for k, v in tm.items() if k not in loop)
    loop_total = sum(loop.values()) + same
    print(f"straightforward loops (timed on {frac:.0%} of draws / sub-panels, scaled): {loop_total:.1f} s")
    for k, v in loop.items():
        print(f"  {k:16s} {v:7.1f} s   vectorised {tm[k]:6.2f} s   {v / max(tm[k], 1e-9):6.1f}x")
    print(f"  shared parts     {same:7.1f} s")
    print(f"speed-up of the whole suite: {loop_total / vec:.1f}x; of its vectorised parts: "
          f"{sum(loop.values()) / max(sum(tm[k] for k in loop), 1e-9):.1f}x")


if __name__ == "__main__":
    main()
