"""Benchmark: the analysis suite on 8 datasets × 2000 items × 10 judges (simulated verdicts).

    python bench/bench_suite.py [--datasets 8 --items 2000 --members 10 --repeats 3 --load 1 --loop-frac 0.1]

1. **The whole suite** (:func:`src.studies.suite.run_suite`, the default settings of ``conf/suite/default.yaml``),
   repeated; then under a competing CPU load (``--load`` busy numpy processes) against its quiet time.
2. **Its heavy parts against the loops a careful engineer would write** (:mod:`src.studies.suite.loops`: one
   scikit-learn stacker fit per draw, budget and fold or per (sub-)panel and fold, one ``admissibility.test`` per
   calibration sample, each dataset's bootstrap drawn once and scored per sub-panel / member). Both sides run the
   *same* reduced workload — ``--loop-frac`` of the draws and sub-panels, the same generators — interleaved and
   repeated; their results must agree (to 1e-12) before the ratio is printed. Nothing is extrapolated: the ratio is
   that of the workload both sides ran. The loops' scikit-learn fits are solved as tightly as the batched Newton
   (``tol=1e-12``; at its default 1e-4 a few near-threshold predictions of small budgets move, and κ means with
   them by 1e-4).

``--parts profile`` runs the whole suite once under cProfile instead (where its time goes).

``--today DIR`` runs this script and the one of the checkout at DIR (e.g. the main branch's) in turn with the same
arguments, each in a fresh process, and prints the ratio of the whole suite's minima (use ``--parts suite``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf
from sklearn.linear_model import LogisticRegression

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import (  # noqa: E402
    against,
    competing_load,
    cpu,
    interleaved,
    machine,
    profiled,
    ratio,
    settle,
    summary,
    workload_parser,
)

from src.core import ladderbase, verdicts  # noqa: E402
from src.core.aggregate import StackedLogit  # noqa: E402
from src.studies import simulate  # noqa: E402
from src.studies.suite import budget, loops, mechanism, panel, run_suite  # noqa: E402
from src.studies.suite.reference import references, rng_for  # noqa: E402


class PreciseStacker(StackedLogit):
    """The stacker solved to the batched Newton's precision (the loops' yardstick)."""

    def logistic_regression(self) -> LogisticRegression:
        return LogisticRegression(C=self.C, solver="newton-cholesky", max_iter=self.max_iter, tol=1e-12)


def suite_cfg() -> dict:
    """The default suite settings (conf/suite/default.yaml)."""
    return OmegaConf.to_container(OmegaConf.load(ROOT / "conf/suite/default.yaml"), resolve=True)


def fresh(refs: dict) -> dict:
    """The references with no bootstrap drawn yet (each side draws its own, once per call)."""
    for r in refs.values():
        r.boots.clear()
    return refs


def part_sides(refs, stacker, s, cfg, frac: float) -> dict[str, tuple]:
    """Per heavy part: (vectorised call, loop call, agreement check) on the same reduced workload."""
    b, p, m = cfg["budget"], cfg["panel"], cfg["mechanism"]
    R6, R7 = max(1, round(b["draws"] * frac)), max(1, round(b["curve_draws"] * frac))
    K = len(next(iter(refs.values())).table.members)
    subs = mechanism.draw_subpanels(K, int(m["subpanels"]), int(m["subpanel_min_size"]), rng_for(0, "subpanels"))
    subs = subs[: max(2, round(len(subs) * frac))]
    nb, sb = int(p["n_boot"]), int(m["subpanel_boot"])
    orders = {n: panel.greedy_order(r.member_kappa, r.phi) for n, r in refs.items()}

    def each(fn):
        return lambda: {n: fn(n, r) for n, r in fresh(refs).items()}

    def close(a, b_):
        return np.allclose(np.asarray(a, float), np.asarray(b_, float), atol=1e-12, rtol=0, equal_nan=True)

    return {
        f"regime_recovery (R={R6})": (
            each(lambda n, r: budget.regime_recovery(r, b["budgets"], R6, rng_for(0, "r", n), s.kappa0, s.c, s.phi0)),
            each(lambda n, r: loops.regime_recovery(r, b["budgets"], R6, rng_for(0, "r", n), s.kappa0, s.c, s.phi0)),
            lambda v, lp: all(
                v[n]["budgets"][k] is None if lp[n][k] is None else close(v[n]["budgets"][k]["p_match"], lp[n][k])
                for n in v
                for k in lp[n]
            ),
        ),
        f"learning_curve (R={R7})": (
            each(lambda n, r: budget.learning_curve(r, b["curve_budgets"], R7, rng_for(0, "c", n))),
            each(lambda n, r: loops.learning_curve(r, stacker, [], b["curve_budgets"], R7, rng_for(0, "c", n))),
            lambda v, lp: all(close(v[n]["budgets"][k]["mean"], lp[n][k]) for n in v for k in lp[n]),
        ),
        "size_curve": (
            each(lambda n, r: panel.size_curve(r)["stacked"]),
            each(lambda n, r: [loops.stacked_kappa(r, stacker, orders[n][:k])[0] for k in range(1, K + 1)]),
            lambda v, lp: all(close(v[n], lp[n]) for n in v),
        ),
        f"leave_one_out (B={nb})": (
            each(lambda n, r: panel.leave_one_out(r, nb, 0, s.level)["members"]),
            each(lambda n, r: loops.leave_one_out(r, stacker, nb, 0, s.level)),
            lambda v, lp: all(
                close([v[n][j]["estimate"], *v[n][j]["ci"]], [lp[n][j]["estimate"], *lp[n][j]["ci"]])
                for n in v
                for j in v[n]
            ),
        ),
        f"subpanels ({len(subs)}, B={sb})": (
            each(lambda n, r: mechanism.subpanels(r, subs, sb, 0, s.level, s.min_coverage)),
            each(lambda n, r: loops.subpanels(r, stacker, subs, sb, 0, s.level)),
            lambda v, lp: all(
                close(v[n]["stacked"], lp[n]["stacked"])
                and close(v[n]["best_cv"], lp[n]["best_cv"])
                and close(v[n]["delta_ci"][:, 0], lp[n]["delta_lo"])
                for n in v
            ),
        ),
    }


def main() -> None:
    ap = workload_parser(__doc__, datasets=8, items=2000, members=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load", type=int, default=1, help="busy processes for the loaded measurement (0: none)")
    ap.add_argument("--loop-frac", type=float, default=0.1, help="share of draws / sub-panels both sides run")
    ap.add_argument("--parts", default="suite,loops")
    ap.add_argument("--today", help="a checkout to compare the suite with (its bench/bench_suite.py, --parts suite)")
    a = ap.parse_args()
    if a.today:
        argv = [x for x in sys.argv[1:] if x not in ("--today", a.today) and not x.startswith("--today=")]
        got = against(a.today, "bench_suite.py", argv, {"s": r"whole suite .*: min ([\d.]+) s"}, a.repeats)
        new, old = min(got["this code"]["s"]), min(got["today"]["s"])
        print(f"suite: this code {new:.1f} s, today {old:.1f} s (minima): {new / old:.2f}x [{cpu()}]")
        return

    table = verdicts.validate(simulate.suite(a.datasets, a.items, a.members), frontier="frontier")
    s = ladderbase.LadderSettings(core=[f"sim{i}" for i in range(min(4, a.datasets))])
    cfg, stacker = suite_cfg(), StackedLogit()
    print(
        f"{a.datasets} datasets × {a.items} items × {a.members} judges; {machine()}; BLAS held to one thread "
        f"inside the suite"
    )
    if "profile" in a.parts:
        profiled("the whole suite", lambda: run_suite(table, stacker, s, cfg))
    if "suite" in a.parts:
        settle()  # 1-min load < 1.2 before the clocks start
        times, last = interleaved({"suite": lambda: run_suite(table, stacker, s, cfg)}, a.repeats)
        print(f"1. whole suite (run_suite, default settings): {summary(times['suite'])}")
        print("   parts (last run): " + ", ".join(f"{k} {v:.2f} s" for k, v in last["suite"]["timings"].items()))
        if a.load:
            with competing_load(a.load):
                print(f"   under {a.load} busy process(es): {machine()}")
                busy, _ = interleaved({"suite": lambda: run_suite(table, stacker, s, cfg)}, a.repeats)
            print(
                f"   under load: {summary(busy['suite'])}; {min(busy['suite']) / min(times['suite']):.2f}x "
                f"its quiet minimum"
            )
    if "loops" in a.parts:
        refs = references(table, stacker, s)
        settle()
        print(
            f"2. heavy parts, vectorised against the loops on the same {a.loop_frac:.0%} of draws / sub-panels "
            f"(results agree to 1e-12)"
        )
        tot = {"vectorised": [], "loops": []}
        for name, (vec, loop, agree) in part_sides(refs, PreciseStacker(), s, cfg, a.loop_frac).items():
            times, last = interleaved({"vectorised": vec, "loops": loop}, a.repeats)
            assert agree(last["vectorised"], last["loops"]), f"{name}: vectorised and loops disagree"
            print(
                f"   {name:28s} vectorised {summary(times['vectorised'])}; loops {summary(times['loops'])}; "
                f"{ratio(times['loops'], times['vectorised'])}"
            )
            for k in tot:
                tot[k].append(times[k])
        sums = {k: [sum(r) for r in zip(*v)] for k, v in tot.items()}  # per round, over the parts
        print(
            f"   all five parts: vectorised {summary(sums['vectorised'])}; loops {summary(sums['loops'])}; "
            f"{ratio(sums['loops'], sums['vectorised'])}"
        )
    print(f"after: {machine()}")


if __name__ == "__main__":
    main()
