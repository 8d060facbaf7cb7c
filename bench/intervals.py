"""Coverage of the ladder's 95 % intervals on simulated panels with known truth.

    python bench/intervals.py truth                       # the regimes' population values (once, ~1 min)
    python bench/intervals.py timing [--reps 3]           # seconds per analysis, per interval, at B = 2000
    python bench/intervals.py run --reps 200 --boot 1000  # the coverage cells, resumable (appends per cell)
    python bench/intervals.py cascade --reps 1000         # the cascade's per-share intervals, refit and fixed
    python bench/intervals.py decisions --sizes 200 800   # does the decision deploy the better arm? (resumable)
    python bench/intervals.py report [--decisions]        # the markdown tables of docs/intervals.md

Each replicate draws a panel from one regime (:data:`REGIMES`, :func:`generator` says each in words: the Gaussian
copula of :mod:`src.studies.simulate`, five members, 2 % abstentions unless a member has its own rate, two items per
cluster one of each class — or :func:`src.studies.simulate.draw_clustered`'s clusters of 2–5 with correlated gold,
or members that are noisy copies of one judge) at n items, runs the ladder on it
(:func:`src.core.ladder.analyze_dataset`, the same call ``python -m src.run`` makes; Table 23's contrast off) and
records, for four statistics — Δκ (stacked − CV-best as deployed, the decision's), Δκ (stacked − CV-best, §2's),
Δκ (stacked − majority) and the stacked κ — the fixed-prediction interval (``deltas_fixed`` / ``ci_fixed``, the
paper's) and the refit interval the calls read (``deltas`` / ``ci``), with each Δ's discordant items and whether
the discordance floor set its width. An interval *covers* when it holds the regime's population value. Every cell
records the intervals it measured (:data:`INTERVAL`); cells of earlier intervals are neither read nor resumed.

The population value (``truth``): a statistic's value for the procedure fitted on the whole population. It is
approximated by a sample of ``TRUTH_N`` items from the regime: the stacker (``StackedLogit``, C = 1) fitted on
one half, the CV-best single judge chosen by κ on that half, both scored on the other half, majority on it too;
the Δκ are read paired on the same half, so their Monte Carlo error is a few 1e-3 at most (``truth`` prints it).

The null (``null`` cells): the regime's panel with its gold permuted across items, so that every member, every
aggregate and every difference has population κ = 0; a *false win* is a refit (or fixed) Δκ-vs-CV-best interval
whose lower bound exceeds 0 (nominal 2.5 %), an *exclusion* one that leaves out 0 (nominal 5 %).

The decisions (``decisions`` cells, :data:`ALL_REGIMES`: the four and two of eight members): each replicate is
analysed as ``python -m src.run`` does (:func:`src.core.ladder.analyze`) and decided by
:func:`src.core.decide.decide` at κ_min = 0.40 under each floor rule (``estimate``, ``lower_bound``). The truth: the
*better arm*, the one of higher population κ — the stacked panel or the CV-best single judge — when it reaches
κ_min, else ``none``; beside it the *rule's arm*, what the rule of §3.3 deploys on the population values (an
inadmissible panel never). Per cell: how often the better arm is deployed, the other one, nothing although an arm
reaches κ_min, and a win the admissibility rule vetoes (``bench/results/decisions.jsonl``, ``decisions_truth.json``).

Results: one JSON line per finished cell (regime, n, kind) in ``bench/results/coverage.jsonl``, with every
replicate's estimates and intervals, so that ``run`` resumes where it stopped and ``report`` recomputes any figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import beta as beta_dist
from scipy.stats import norm
from sklearn.metrics import cohen_kappa_score
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from src.core import admissibility, ladder, ladderbase, verdicts  # noqa: E402
from src.core.aggregate import BestSingle, MajorityVote, StackedLogit  # noqa: E402
from src.core.decide import FLOOR_RULES, WINS, decide, reaches  # noqa: E402
from src.core.evaluate import ClusterBootstrap, deployed, from_counts, indicators  # noqa: E402
from src.core.refit import RefitBootstrap  # noqa: E402
from src.core.verdicts import ABSTAIN  # noqa: E402
from src.studies import simulate  # noqa: E402

RESULTS = ROOT / "bench" / "results"
OUT = RESULTS / "coverage.jsonl"
TRUTH = RESULTS / "coverage_truth.json"
TRUTH_N = 1_000_000  # items per population sample (two halves of 500,000)
ABSTAIN_RATE = 0.02
PER_CLUSTER = 2

# the regimes: five members (odd, so that majority has no ties but through abstentions). A regime is the
# Gaussian copula of src.studies.simulate with its members' accuracies and ρ, every member abstaining on
# ABSTAIN_RATE of the items (or on its own rate: "abstain"), in clusters of two items, one of each class — or, with
# "clusters", simulate.draw_clustered's generator (cluster sizes, prevalence, gold and difficulty shared within a
# cluster, members that are noisy copies of member 0).
STRONG_WEAK = [0.95, 0.625, 0.60, 0.60, 0.575]  # κ 0.90 among four of κ 0.15–0.25
REGIMES: dict[str, dict] = {
    "independent": {"accuracies": [0.76, 0.73, 0.70, 0.68, 0.65], "rho": 0.0},
    "correlated": {"accuracies": [0.76, 0.73, 0.70, 0.68, 0.65], "rho": 0.6},
    "dominant": {"accuracies": [0.88, 0.64, 0.62, 0.61, 0.60], "rho": 0.3},
    "weak": {"accuracies": [0.62, 0.60, 0.59, 0.58, 0.57], "rho": 0.2},
    # one strong member that abstains where the four weak ones, strongly correlated, must answer for it
    "dominant_abstain_1": {"accuracies": STRONG_WEAK, "rho": 0.6, "abstain": [0.01] + [ABSTAIN_RATE] * 4},
    "dominant_abstain_4": {"accuracies": STRONG_WEAK, "rho": 0.6, "abstain": [0.04] + [ABSTAIN_RATE] * 4},
    # clusters of 2–5 items, gold correlated within a cluster, one hallucinated item to two supported, errors
    # concentrated on hard clusters
    "clustered": {
        "accuracies": [0.76, 0.73, 0.70, 0.68, 0.65],
        "rho": 0.3,
        "clusters": {"sizes": (2, 5), "prevalence": 1 / 3, "gold_icc": 0.5, "difficulty_icc": 0.5},
    },
    # four members that are noisy copies of the first (each verdict flipped with its probability)
    "copies": {
        "accuracies": [0.80],
        "rho": 0.0,
        "clusters": {"sizes": (2, 2), "copies": [0.05, 0.10, 0.15, 0.20]},
    },
}
# two more for the decision cells: eight members, one strong among seven that sit just under κ₀ (the admissibility
# rule, §3.3, counts fewer than half of them competent) or clearly over it (admissible)
DECISION_REGIMES: dict[str, dict] = {
    "strong_weak": {"accuracies": [0.85] + [0.64] * 7, "rho": 0.0},
    "strong_fair": {"accuracies": [0.85] + [0.70] * 7, "rho": 0.0},
}
ALL_REGIMES = {**REGIMES, **DECISION_REGIMES}
SIZES = (100, 200, 800)
# the intervals the cells measure: each cell records it, and a cell of other intervals is not read (nor resumed)
INTERVAL = "refit_corrected+discordance_floor"
STATS = ("d_deploy", "d_best_cv", "d_majority", "stacked")
STAT_NAMES = {
    "d_deploy": "Δκ stacked − CV-best as deployed (its abstentions answered; the decision's)",
    "d_best_cv": "Δκ stacked − CV-best (§2: its κ on the items it answers; the paper's call)",
    "d_majority": "Δκ stacked − majority",
    "stacked": "stacked κ",
}


def wilson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of a binomial proportion k / n."""
    if n == 0:
        return (0.0, 1.0)
    z = norm.ppf(0.5 + level / 2)
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (float(max(0.0, mid - half)), float(min(1.0, mid + half)))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    a = 1 - level
    lo = 0.0 if k == 0 else float(beta_dist.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta_dist.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def seed_of(regime: str, n: int, kind: str, rep: int) -> int:
    return int.from_bytes(f"{regime}|{n}|{kind}".encode(), "little") % 2**31 + 7919 * rep


def generate(regime: str, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The regime's gold, votes and clusters for n items (see :data:`REGIMES`)."""
    r = ALL_REGIMES[regime]
    abstain = r.get("abstain", ABSTAIN_RATE)
    if "clusters" in r:
        return simulate.draw_clustered(rng, n, r["accuracies"], r["rho"], abstain, **r["clusters"])
    y, v = simulate.draw(rng, n // PER_CLUSTER, PER_CLUSTER, np.asarray(r["accuracies"]), r["rho"], abstain)
    return y, v, np.arange(len(y)) // PER_CLUSTER


def generator(regime: str) -> str:
    """The regime's generator in words: the members, their correlation, abstentions and clusters."""
    r = ALL_REGIMES[regime]
    c = r.get("clusters")
    if c and "copies" in c:
        members = f"{r['accuracies'][0]:.2f} and copies flipping {', '.join(f'{f:g}' for f in c['copies'])}"
    else:
        members = ", ".join(f"{a:.3g}" for a in r["accuracies"]) + f"; ρ = {r['rho']}"
    ab = r.get("abstain", ABSTAIN_RATE)
    ab_text = f"{100 * ab:g} % each" if np.isscalar(ab) else " / ".join(f"{100 * a:g}" for a in ab) + " %"
    if not c:
        return f"{members}; abstain {ab_text}; pairs (one of each class)"
    sizes = c["sizes"]
    cl = f"clusters of {sizes[0]}–{sizes[1]}" if sizes[0] != sizes[1] else f"clusters of {sizes[0]}"
    extra = [f"prevalence {c.get('prevalence', 0.5):.2g}"]
    extra += [f"{k.split('_')[0]} ICC {c[k]:g}" for k in ("gold_icc", "difficulty_icc") if c.get(k)]
    return f"{members}; abstain {ab_text}; {cl}, " + ", ".join(extra)


def sample(regime: str, n: int, seed: int, null: bool = False) -> verdicts.VerdictTable:
    """One simulated panel of n items from the regime's generator (:func:`generate`), its gold permuted when
    ``null``. The regimes of clusters of two draw as :func:`src.studies.simulate.panel` does (same seeds, same
    panels)."""
    y, v, clusters = generate(regime, np.random.default_rng(seed), n)
    df = simulate.frame(y, v, clusters, regime)
    if null:
        df["gold"] = np.random.default_rng(seed + 1).permutation(df["gold"].to_numpy())
    return verdicts.validate(df)


def kappa_of(y: np.ndarray, pred: np.ndarray) -> float:
    """κ as the paper reads it (from_counts: on the voted items), checked against scikit-learn's."""
    k = float(from_counts(indicators(y, pred).sum(axis=0))["kappa"])
    voted = pred != ABSTAIN
    k_sk = cohen_kappa_score(y[voted], pred[voted].astype(int))
    assert abs(k - k_sk) < 1e-9, (k, k_sk)
    return k


# ------------------------------------------------------------------------------------------------ truth


def population(regime: str, seed: int = 12345, n_items: int = TRUTH_N) -> dict:
    """The regime's population values from a sample of ``n_items`` (see the module's docstring); the admissibility
    coordinates (§3.3) on the scored half."""
    y, v, _ = generate(regime, np.random.default_rng(seed), n_items)
    a, b = slice(0, n_items // 2), slice(n_items // 2, None)
    st = StackedLogit().set_params(n_votes=v.shape[1]).fit(v[a], y[a])
    best = BestSingle(min_coverage=0.5).fit(v[a], y[a])
    p_st = st.predict(v[b]).astype(float)
    p_cv = v[b][:, best.best_]
    p_dep = deployed(p_cv)
    p_mj = MajorityVote().fit(v[b]).predict(v[b]).astype(float)
    yb = y[b]
    k = {
        "stacked": kappa_of(yb, p_st),
        "best_cv": kappa_of(yb, p_cv),
        "deployed": kappa_of(yb, p_dep),
        "majority": kappa_of(yb, p_mj),
    }
    members = [kappa_of(yb, v[b][:, j]) for j in range(v.shape[1])]

    def paired_se(p1, p2):  # a cluster bootstrap-free approximation: the delta's SE over 50 blocks of the half
        blocks = np.array_split(np.arange(len(yb)), 50)
        d = [kappa_of(yb[i], p1[i]) - kappa_of(yb[i], p2[i]) for i in blocks]
        return float(np.std(d, ddof=1) / np.sqrt(len(blocks)))

    op = ladderbase.LadderSettings()  # the operating point (κ₀, c, φ₀) of conf/analysis
    adm = admissibility.test(yb, v[b], op.kappa0, op.c, op.phi0)
    return {
        "stacked": k["stacked"],
        "d_deploy": k["stacked"] - k["deployed"],
        "d_best_cv": k["stacked"] - k["best_cv"],
        "d_majority": k["stacked"] - k["majority"],
        "best_cv_member": int(best.best_),
        "members_kappa": members,
        "kappa_best_cv": k["best_cv"],
        "kappa_best_cv_deployed": k["deployed"],
        "kappa_majority": k["majority"],
        "discordance": {
            "d_deploy": float(np.mean(p_st != p_dep)),
            "d_best_cv": float(np.mean(p_st != p_cv)),
            "d_majority": float(np.mean(p_st != p_mj)),
        },
        "mc_se": {
            "d_deploy": paired_se(p_st, p_dep),
            "d_best_cv": paired_se(p_st, p_cv),
            "d_majority": paired_se(p_st, p_mj),
        },
        "phi_bar": adm.phi_bar,
        "members_at_kappa0": adm.members_at_kappa0,
        "admissible": adm.admissible,
        "n_items": n_items,
        "seed": seed,
    }


def cmd_truth(args) -> None:
    out = {}
    for regime in REGIMES:
        t0 = time.perf_counter()
        out[regime] = population(regime)
        print(
            regime,
            json.dumps(
                {
                    k: (round(v, 4) if isinstance(v, float) else v)
                    for k, v in out[regime].items()
                    if k != "members_kappa"
                }
            ),
            f"{time.perf_counter() - t0:.1f}s",
            flush=True,
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    TRUTH.write_text(json.dumps(out, indent=1) + "\n")


# ------------------------------------------------------------------------------------------------ one analysis


def analyse(table: verdicts.VerdictTable, n_boot: int) -> dict:
    """The ladder on one panel: each statistic's estimate, refit interval and fixed-prediction interval."""
    s = ladderbase.LadderSettings(n_boot=n_boot, abstention_contrast=False)
    with threadpool_limits(1):
        r = ladder.analyze_dataset(table, StackedLogit(), s, None).summary
    d, f, c = r["deltas"], r["deltas_fixed"], r["comparators"]["stacked"]["kappa"]
    rungs = {"d_deploy": "best_cv_deployed", "d_best_cv": "best_cv", "d_majority": "majority"}
    out = {k: _r6([d[v]["kappa"]["estimate"], *d[v]["kappa"]["ci"], *f[v]["kappa"]["ci"]]) for k, v in rungs.items()}
    return {
        **out,
        "stacked": _r6([c["estimate"], *c["ci"], *c["ci_fixed"]]),
        "call": d["best_cv"]["kappa"]["call"],
        "call_fixed": f["best_cv"]["kappa"]["call"],
        "call_deploy": d["best_cv_deployed"]["kappa"]["call"],
        # the evidence: discordant items, and whether the discordance floor set the refit interval's variance
        "discordant": {k: d[v]["kappa"]["discordant"] for k, v in rungs.items()},
        "floored": {k: d[v]["kappa"]["floored"] for k, v in rungs.items()},
    }


def _r6(values: list[float]) -> list[float]:
    """Rounded to 1e-6 (far under any width read; the cells' files stay small)."""
    return [round(float(v), 6) for v in values]


def cmd_timing(args) -> None:
    """CPU seconds (``time.process_time``: the cores are shared, wall time measures the neighbours) per analysis at
    n = ``--n``, B = ``--boot``: the whole ladder call; the fixed-prediction draws alone
    (ClusterBootstrap.metrics on the ladder's prediction matrix); the refit draws alone (ladder.refit_draws)."""
    rows = []
    for rep in range(args.reps):
        t = sample("independent", args.n, seed_of("timing", args.n, "t", rep))
        t0 = time.process_time()
        analyse(t, args.boot)
        whole = time.process_time() - t0
        y, cl, v = t.gold, t.clusters, t.votes
        s = ladderbase.LadderSettings(n_boot=args.boot)
        folds = ladderbase.checked_folds(y, cl, s)
        res = ladder.analyze_dataset(
            t, StackedLogit(), ladderbase.LadderSettings(n_boot=10, abstention_contrast=False), None
        )
        P = np.column_stack(list(res.predictions.values()) + [v])
        with threadpool_limits(1):
            t0 = time.process_time()
            boot = ClusterBootstrap(cl, args.boot, 0)
            boot.metrics(y, P)
            fixed = time.process_time() - t0
            full = {
                k: indicators(y, res.predictions[k]).sum(0)
                for k in ("stacked", "best_cv", "best_cv_deployed", "acc_weighted", "logodds_weighted")
            }
            st = StackedLogit().set_params(n_votes=v.shape[1])
            t0 = time.process_time()
            ladder.refit_draws(RefitBootstrap(y, folds, ClusterBootstrap(cl, args.boot, 0)), st, v, v, 0.5, full)
            refit = time.process_time() - t0
        rows.append((whole, fixed, refit))
        print(
            f"rep {rep}: ladder call {whole:.2f}s, fixed-prediction draws {fixed:.3f}s, refit draws {refit:.2f}s",
            flush=True,
        )
    m = np.median(np.array(rows), axis=0)
    line = {
        "kind": "timing",
        "n": args.n,
        "n_boot": args.boot,
        "reps": args.reps,
        "ladder_s": float(m[0]),
        "fixed_s": float(m[1]),
        "refit_s": float(m[2]),
        "cpu": os.cpu_count(),
    }
    print(json.dumps(line))
    with open(RESULTS / "coverage_timing.jsonl", "a") as fh:
        fh.write(json.dumps(line) + "\n")


# ------------------------------------------------------------------------------------------------ the cells


def done_cells() -> set[tuple]:
    """The coverage and null cells measured with the current intervals (:data:`INTERVAL`)."""
    return {
        (c["regime"], c["n"], c["kind"], c["reps"], c["n_boot"])
        for c in _cells()
        if c.get("kind") in ("coverage", "null")
    }


def cmd_run(args) -> None:
    done = done_cells()
    cells = [(rg, n, "coverage") for n in args.sizes for rg in args.regimes]
    if args.null:
        cells += [(rg, n, "null") for n in args.null_sizes for rg in args.null_regimes]
    todo = [c for c in cells if (*c, args.reps, args.boot) not in done]
    print(f"{len(todo)} of {len(cells)} cells to run, R = {args.reps}, B = {args.boot}", flush=True)
    for regime, n, kind in todo:
        line = run_cell(
            OUT,
            {"regime": regime, "n": n, "kind": kind},
            lambda rep, regime=regime, n=n, kind=kind: analyse(
                sample(regime, n, seed_of(regime, n, kind, rep), null=kind == "null"), args.boot
            ),
            args.reps,
            args.boot,
        )
        print(summary_line(line, json.loads(TRUTH.read_text())), flush=True)


def run_cell(path: Path, key: dict, one_rep, reps: int, boot: int) -> dict:
    """One cell: ``one_rep(r)`` for r < ``reps`` (a progress bar), appended to ``path`` as one JSON line (the
    cell's ``key``, R, B, its seconds and the replicates' results), so that an interrupted run resumes by cell."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    desc = " ".join(f"{v}" if k != "n" else f"n={v}" for k, v in key.items())
    results = [one_rep(r) for r in tqdm(range(reps), desc=desc, mininterval=10, file=sys.stdout)]
    line = {
        **key,
        "interval": INTERVAL,
        "reps": reps,
        "n_boot": boot,
        "seconds": time.perf_counter() - t0,
        "results": results,
    }
    with open(path, "a") as fh:
        fh.write(json.dumps(line) + "\n")
    return line


# ------------------------------------------------------------------------------------------------ the report


def covered(rows, stat, truth):
    a = np.array([r[stat] for r in rows])
    return ((a[:, 1] <= truth) & (truth <= a[:, 2])).sum(), ((a[:, 3] <= truth) & (truth <= a[:, 4])).sum()


def summary_line(cell, truth) -> str:
    rows, R = cell["results"], cell["reps"]
    if cell["kind"] == "null":
        parts = [f"{s} false win refit {np.mean(_a(rows, s)[:, 1] > 0):.3f}" for s in ("d_deploy", "d_best_cv")]
        return f"{cell['regime']} n={cell['n']} null: " + "; ".join(parts) + f" ({cell['seconds']:.0f}s)"
    tr = truth[cell["regime"]]
    parts = [
        f"{s} refit {covered(rows, s, tr[s])[0] / R:.3f} fixed {covered(rows, s, tr[s])[1] / R:.3f}" for s in STATS
    ]
    return f"{cell['regime']} n={cell['n']}: " + "; ".join(parts) + f" ({cell['seconds']:.0f}s)"


def _a(rows: list[dict], stat: str) -> np.ndarray:
    """The replicates' [estimate, refit lo, refit hi, fixed lo, fixed hi] of one statistic."""
    return np.array([r[stat] for r in rows])


def fmt(k, R):
    lo, hi = wilson(int(k), R)
    return f"{100 * k / R:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def order(cell: dict) -> tuple:
    return (list(ALL_REGIMES).index(cell["regime"]), cell["n"])


def cmd_report(args) -> None:
    if args.decisions:
        return report_decisions()
    truth = json.loads(TRUTH.read_text())
    cells = list({(c["kind"], c["regime"], c["n"]): c for c in _cells()}.values())  # the latest line of each cell
    cov = sorted((c for c in cells if c["kind"] == "coverage"), key=order)
    null = sorted((c for c in cells if c["kind"] == "null"), key=order)
    print(f"Population values (TRUTH_N = {TRUTH_N} items per regime, half to fit, half to score):\n")
    print(
        "| regime | generator: members' accuracies, correlation, abstentions, clusters | κ stacked | κ CV-best "
        "(answered / deployed) | κ majority | Δκ vs CV-best deployed | Δκ vs CV-best (§2) | Δκ vs majority "
        "| discordant items, % (deployed / §2 / majority) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for rg, t in truth.items():
        se, dr = t["mc_se"], t["discordance"]
        print(
            f"| {rg} | {generator(rg)} | {t['stacked']:.3f} | {t['kappa_best_cv']:.3f} / "
            f"{t['kappa_best_cv_deployed']:.3f} | {t['kappa_majority']:.3f} | "
            + " | ".join(f"{t[k]:+.3f} (±{se[k]:.3f})" for k in ("d_deploy", "d_best_cv", "d_majority"))
            + f" | {100 * dr['d_deploy']:.2g} / {100 * dr['d_best_cv']:.2g} / {100 * dr['d_majority']:.2g} |"
        )
    for s in STATS:
        delta = s != "stacked"
        print(f"\nCoverage (%) of the 95 % interval of {STAT_NAMES[s]}, refit / fixed [Wilson 95 %]:\n")
        extra = " | discordant items: median [min, max] | floor set the width, %" if delta else ""
        print("| regime | n | R | B | refit (calls) | fixed (paper) | mean width refit / fixed" + extra + " |")
        print("|---|---|---|---|---|---|---|" + ("---|---|" if delta else ""))
        for c in cov:
            R, rows = c["reps"], c["results"]
            k_r, k_f = covered(rows, s, truth[c["regime"]][s])
            a = _a(rows, s)
            row = (
                f"| {c['regime']} | {c['n']} | {R} | {c['n_boot']} | {fmt(k_r, R)} | {fmt(k_f, R)} | "
                f"{np.mean(a[:, 2] - a[:, 1]):.3f} / {np.mean(a[:, 4] - a[:, 3]):.3f}"
            )
            if delta:
                D = np.array([r["discordant"][s] for r in rows])
                floored = np.mean([r["floored"][s] for r in rows])
                row += f" | {np.median(D):g} [{D.min()}, {D.max()}] | {100 * floored:.1f}"
            print(row + " |")
    if null:
        print("\nShuffled gold (population Δκ = 0): Δκ interval vs the CV-best single, % of runs [Wilson 95 %]:\n")
        print(
            "| regime | n | R | B | false win, deployed (refit) | false win, §2 refit / fixed | excludes 0, "
            "deployed (refit) | excludes 0, §2 refit / fixed | stacked κ excludes 0, refit / fixed |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for c in null:
            rows, R = c["results"], c["reps"]
            dep, a, k = _a(rows, "d_deploy"), _a(rows, "d_best_cv"), _a(rows, "stacked")

            def excl(x, lo):
                return ((x[:, lo] > 0) | (x[:, lo + 1] < 0)).sum()

            print(
                f"| {c['regime']} | {c['n']} | {R} | {c['n_boot']} | {fmt((dep[:, 1] > 0).sum(), R)} | "
                f"{fmt((a[:, 1] > 0).sum(), R)} / {fmt((a[:, 3] > 0).sum(), R)} | {fmt(excl(dep, 1), R)} | "
                f"{fmt(excl(a, 1), R)} / {fmt(excl(a, 3), R)} | {fmt(excl(k, 1), R)} / {fmt(excl(k, 3), R)} |"
            )
    report_cascade(cells)
    tf = RESULTS / "coverage_timing.jsonl"
    if tf.exists():
        rows = {(t["n"], t["n_boot"]): t for t in map(json.loads, tf.read_text().splitlines())}
        print("\nCost per analysis, CPU seconds (median of the reps, one thread):\n")
        print("| n | B | ladder call (all of it) | fixed-prediction draws | refit draws (+ correction) |")
        print("|---|---|---|---|---|")
        for (n, b), t in sorted(rows.items()):
            print(f"| {n} | {b} | {t['ladder_s']:.2f} | {t['fixed_s']:.3f} | {t['refit_s']:.2f} |")


# ------------------------------------------------------------------------------------------------ the cascade

CASCADE_SHARES = (0.1, 0.3, 0.5, 0.7, 0.9, 0.95)
FRONTIER_ACCURACY = 0.85  # the expensive judge: errs independently of the panel's shared difficulty


def cascade_population(regime: str, seed: int = 54321, n_items: int = TRUTH_N) -> dict:
    """κ of the cascade at each target share, its band and stacker fitted on one half of a large sample and
    applied to the other (the expensive judge: the simulator's ``frontier`` column, accuracy FRONTIER_ACCURACY), and
    the expensive judge's κ on the same half (Δκ paired on its items)."""
    from src.studies.suite.escalation import Cascade, merge

    r = REGIMES[regime]
    rng = np.random.default_rng(seed)
    y, v = simulate.draw(rng, n_items // PER_CLUSTER, PER_CLUSTER, np.asarray(r["accuracies"]), r["rho"], ABSTAIN_RATE)
    fr = np.where(rng.random(len(y)) > FRONTIER_ACCURACY, 1 - y, y).astype(float)
    a, b = slice(0, n_items // 2), slice(n_items // 2, None)
    c = Cascade(StackedLogit().set_params(n_votes=v.shape[1]), CASCADE_SHARES).fit(v[a], y[a])
    out = merge(c.stacker_.predict(v[b]).astype(float), fr[b], c.escalate(v[b]))
    return {
        "kappa": [kappa_of(y[b], out[i]) for i in range(len(CASCADE_SHARES))],
        "kappa_expensive": kappa_of(y[b], fr[b]),
    }


def cascade_rep(regime: str, n: int, seed: int, n_boot: int) -> dict:
    """One panel analysed by the suite's own call (:func:`src.studies.suite.cascade.dataset`, the frontier column as
    the expensive judge, B = ``n_boot``): per share, [κ, refit interval, fixed-prediction interval] and the same for
    Δκ (cascade − expensive judge); the CPU seconds of that call, and of the fixed-prediction analysis alone (the
    cross-fitted cascade and its percentile draws, the analysis before the refit)."""
    from src.studies.suite import cascade, escalation
    from src.studies.suite.reference import reference

    r = REGIMES[regime]
    t = simulate.table(
        regime,
        n_clusters=n // PER_CLUSTER,
        per_cluster=PER_CLUSTER,
        accuracies=r["accuracies"],
        rho=r["rho"],
        abstain_rate=ABSTAIN_RATE,
        dataset=regime,
        seed=seed,
        frontier_accuracy=FRONTIER_ACCURACY,
    )
    s = ladderbase.LadderSettings(n_boot=n_boot)
    cfg = {
        "enabled": True,
        "expensive": "frontier",
        "operating_points": list(CASCADE_SHARES),
        "budgets": [],
        "grid_step": 1.0,
        "margin": 0.05,
        "random_draws": 0,
        "injection_defence": "escalate",  # simulated panels have no text: nothing is flagged
    }
    with threadpool_limits(1):
        ref = reference(regime, t, StackedLogit(), s)
        t0 = time.process_time()
        d = cascade.dataset(ref, StackedLogit(), s, "frontier", np.array(CASCADE_SHARES), cfg, (0.0, 0.0), seed)
        t1 = time.process_time()
        est = escalation.Cascade(StackedLogit().set_params(n_votes=len(t.members)), CASCADE_SHARES)
        cf = cascade.crossfit_cascade(t.votes, t.gold, t.frontier, ref.design.folds, est, np.random.default_rng(seed))
        ClusterBootstrap(t.clusters, n_boot, 0).metrics(t.gold, np.vstack([cf["verdicts"], t.frontier]).T)
        t2 = time.process_time()

    def row(x: dict) -> list[float]:
        return [round(float(v), 6) for v in (x["estimate"], *x["ci"], *(x.get("ci_fixed") or []))]

    pts = d["points"]
    return {
        "kappa": [row(p["kappa"]) for p in pts],
        "delta": [row(p["delta_expensive"])[:3] + [round(v, 6) for v in p["delta_expensive_fixed"]["ci"]] for p in pts],
        "cpu_s": round(t1 - t0, 4),
        "cpu_fixed_s": round(t2 - t1, 4),
    }


def cascade_cells(cells: list[dict]) -> list[dict]:
    """The latest refit cascade cell per (regime, n)."""
    return list({(c["regime"], c["n"]): c for c in cells if c["kind"] == "cascade_refit"}.values())


def cascade_covered(cell: dict) -> dict[str, np.ndarray]:
    """Per share, how many runs' intervals hold the population value: κ and Δκ, refit and fixed; and how many put the
    population Δκ under the lower bound (the side the non-inferiority headline errs on; nominal 2.5 %)."""
    k, dk = np.array([r["kappa"] for r in cell["results"]]), np.array([r["delta"] for r in cell["results"]])
    tk = np.array(cell["truth"]["kappa"])
    td = tk - cell["truth"]["kappa_expensive"]

    def inside(a, t, lo):
        return ((a[:, :, lo] <= t) & (t <= a[:, :, lo + 1])).sum(axis=0)

    return {
        "kappa_refit": inside(k, tk, 1),
        "kappa_fixed": inside(k, tk, 3),
        "delta_refit": inside(dk, td, 1),
        "delta_fixed": inside(dk, td, 3),
        "delta_over_refit": (dk[:, :, 1] > td).sum(axis=0),
        "delta_over_fixed": (dk[:, :, 3] > td).sum(axis=0),
        "width_refit": (k[:, :, 2] - k[:, :, 1]).mean(axis=0),
        "width_fixed": (k[:, :, 4] - k[:, :, 3]).mean(axis=0),
    }


def cmd_cascade(args) -> None:
    """The refit cascade cells (``cascade_refit``), one per regime, resumable rep by rep (a partial file per cell)."""
    from tqdm import tqdm

    done = {(c["regime"], c["n"], c["reps"], c["n_boot"]) for c in cascade_cells(_cells())}
    for regime in args.regimes:
        if (regime, args.n, args.reps, args.boot) in done:
            continue
        part = RESULTS / f"cascade_{regime}_{args.n}_{args.reps}_{args.boot}.partial.jsonl"
        reps = [json.loads(x) for x in part.read_text().splitlines()] if part.exists() else []
        truth = cascade_population(regime)
        t0 = time.perf_counter()
        for r in tqdm(
            range(len(reps), args.reps), desc=f"cascade {regime} n={args.n}", mininterval=10, file=sys.stdout
        ):
            reps.append(cascade_rep(regime, args.n, seed_of(regime, args.n, "cascade", r), args.boot))
            with open(part, "a") as fh:
                fh.write(json.dumps(reps[-1]) + "\n")
        line = {
            "kind": "cascade_refit",
            "regime": regime,
            "n": args.n,
            "reps": args.reps,
            "n_boot": args.boot,
            "shares": list(CASCADE_SHARES),
            "truth": truth,
            "seconds": time.perf_counter() - t0,
            "results": reps,
        }
        with open(OUT, "a") as fh:
            fh.write(json.dumps(line) + "\n")
        part.unlink()
        cov = cascade_covered(line)
        print(regime, {k: (v / args.reps).round(3).tolist() for k, v in cov.items() if "width" not in k}, flush=True)


def _cells() -> list[dict]:
    """The cells of :data:`OUT`: the cascade's, and the coverage and null cells of the current intervals
    (:data:`INTERVAL`; those of earlier ones stay in git's history)."""
    cells = [json.loads(x) for x in OUT.read_text().splitlines()] if OUT.exists() else []
    return [c for c in cells if c["kind"] not in ("coverage", "null") or c.get("interval") == INTERVAL]


def report_cascade(cells: list[dict]) -> None:
    """The cascade's tables of docs/intervals.md: per share, coverage of the refit and fixed κ and Δκ intervals."""
    casc = sorted(cascade_cells(cells), key=lambda c: (list(REGIMES).index(c["regime"]), c["n"]))
    if not casc:
        return
    shares = casc[0]["shares"]
    head = "| regime | n | R | B | " + " | ".join(f"share {s:g}" for s in shares) + " |"
    rule = "|---|---|---|---|" + "---|" * len(shares)
    parts = [
        ("κ interval", "kappa", "κ"),
        ("Δκ (cascade − expensive judge) interval, the non-inferiority headline's", "delta", "Δκ"),
    ]
    for title, key, sym in parts:
        print(f"\nThe cascade's per-share {title}, coverage %, refit / fixed [Wilson 95 % of the refit]:\n")
        print(head)
        print(rule)
        for c in casc:
            cov, R = cascade_covered(c), c["reps"]
            truth = np.array(c["truth"]["kappa"]) - (c["truth"]["kappa_expensive"] if key == "delta" else 0.0)
            cellv = [
                f"{fmt(a, R)} / {100 * b / R:.1f} ({sym} {t:+.3f})"
                if key == "delta"
                else f"{fmt(a, R)} / {100 * b / R:.1f} ({sym} {t:.3f})"
                for a, b, t in zip(cov[f"{key}_refit"], cov[f"{key}_fixed"], truth)
            ]
            print(f"| {c['regime']} | {c['n']} | {R} | {c['n_boot']} | " + " | ".join(cellv) + " |")
    print(
        "\nThe population Δκ under the refit / fixed lower bound (a non-inferiority claimed too high; nominal 2.5 %), %:\n"
    )
    print(head)
    print(rule)
    for c in casc:
        cov, R = cascade_covered(c), c["reps"]
        cellv = [
            f"{100 * a / R:.1f} / {100 * b / R:.1f}" for a, b in zip(cov["delta_over_refit"], cov["delta_over_fixed"])
        ]
        print(f"| {c['regime']} | {c['n']} | {R} | {c['n_boot']} | " + " | ".join(cellv) + " |")
    print("\nMean width of the κ interval, refit / fixed; CPU seconds per analysis (median, one thread):\n")
    print(
        "| regime | n | B | " + " | ".join(f"share {s:g}" for s in shares) + " | refit analysis | fixed-only analysis |"
    )
    print("|---|---|---|" + "---|" * (len(shares) + 2))
    for c in casc:
        cov = cascade_covered(c)
        cpu = np.median([r["cpu_s"] for r in c["results"]]), np.median([r["cpu_fixed_s"] for r in c["results"]])
        widths = " | ".join(f"{a:.3f} / {b:.3f}" for a, b in zip(cov["width_refit"], cov["width_fixed"]))
        print(f"| {c['regime']} | {c['n']} | {c['n_boot']} | {widths} | {cpu[0]:.2f} | {cpu[1]:.3f} |")


# ------------------------------------------------------------------------------------------------ the decisions

DECISIONS = RESULTS / "decisions.jsonl"
DECISION_TRUTH = RESULTS / "decisions_truth.json"
KAPPA_FLOOR = ladderbase.LadderSettings().kappa_floor  # 0.40, conf/analysis's kappa_floor


def better_arm(kappa_panel: float, kappa_single: float, floor: float = KAPPA_FLOOR) -> str:
    """The arm with the higher population κ — ``panel`` (the stacker) or ``single`` (the CV-best single judge as
    deployed: its abstentions answered, every item scored) — when it reaches the floor; ``none`` when neither
    does."""
    arm, k = ("panel", kappa_panel) if kappa_panel > kappa_single else ("single", kappa_single)
    return arm if reaches(k, floor) else "none"


def rule_arm(t: dict, floor: float = KAPPA_FLOOR) -> str:
    """What the decision rule (:mod:`src.core.decide`, §3.3) deploys on population values: the panel when it is
    admissible, beats the CV-best single and reaches the floor; else the single judge at the floor; else none."""
    if t["admissible"] and t["d_deploy"] > 0 and reaches(t["stacked"], floor):
        return "panel"
    return "single" if reaches(t["kappa_best_cv_deployed"], floor) else "none"


def decision_truth(regime: str, n_items: int = TRUTH_N) -> dict:
    """The regime's population values (:func:`population`) with its better arm and the rule's arm."""
    t = population(regime, n_items=n_items)
    return {**t, "better": better_arm(t["stacked"], t["kappa_best_cv_deployed"]), "rule": rule_arm(t)}


def decision_rep(regime: str, n: int, seed: int, n_boot: int) -> dict:
    """One panel analysed as ``python -m src.run`` does (:func:`src.core.ladder.analyze`, the abstention contrast
    off) and decided (:func:`src.core.decide.decide`) at κ_min = :data:`KAPPA_FLOOR` under each floor rule."""
    s = ladderbase.LadderSettings(n_boot=n_boot, abstention_contrast=False)
    (summary,) = [r.summary for r in ladder.analyze(sample(regime, n, seed), StackedLogit(), s).values()]
    ds = {rule: decide(summary, KAPPA_FLOOR, rule) for rule in FLOOR_RULES}
    d = ds["estimate"]  # the call, admissibility and veto do not depend on the floor rule
    return {
        "action": {rule: x.action for rule, x in ds.items()},
        "vetoed": d.vetoed_win,
        "call": d.call,
        "admissible": d.admissible,
        "admitted_share": d.admitted_share,
        "kappa_stacked": summary["comparators"]["stacked"]["kappa"]["estimate"],
        "kappa_single": summary["comparators"]["best_cv_deployed"]["kappa"]["estimate"],
        "call_paper": d.call_paper,
        "discordant": d.discordant,
    }


def tally(runs: list[dict], floor_rule: str, better: str, rule: str) -> dict[str, int]:
    """Counts over the runs (:func:`decision_rep`) under one floor rule: the better arm deployed; the other arm (for
    ``none``: any arm) deployed; nothing deployed although an arm reaches the floor; the rule's population arm
    deployed; and, whatever the floor rule, a win shown vs the CV-best single, the panel admissible on the sample,
    a win the admissibility rule vetoed."""
    a = np.array([r["action"][floor_rule] for r in runs])
    return {
        "reps": len(a),
        "better": int(np.sum(a == better)),
        "other": int(np.sum((a != better) & (a != "none"))),
        "nothing": int(np.sum(a == "none")) if better != "none" else 0,
        "as_rule": int(np.sum(a == rule)),
        "win": sum(r["call"] in WINS for r in runs),
        "admissible": sum(bool(r["admissible"]) for r in runs),
        "vetoed": sum(bool(r["vetoed"]) for r in runs),
    }


def load_decision_truth(regimes: list[str]) -> dict:
    """The regimes' decision truths, computed (and saved) for any not yet in :data:`DECISION_TRUTH` (or there without
    the deployed comparison the decision reads)."""
    truth = json.loads(DECISION_TRUTH.read_text()) if DECISION_TRUTH.exists() else {}
    for regime in [r for r in regimes if "d_deploy" not in truth.get(r, {})]:
        truth[regime] = decision_truth(regime)
        RESULTS.mkdir(parents=True, exist_ok=True)
        DECISION_TRUTH.write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def decision_line(cell: dict, t: dict) -> str:
    parts = []
    for rule in FLOOR_RULES:
        c = tally(cell["results"], rule, t["better"], t["rule"])
        parts.append(
            f"{rule}: better {c['better'] / c['reps']:.3f} other {c['other'] / c['reps']:.3f} "
            f"nothing {c['nothing'] / c['reps']:.3f}"
        )
    vetoed = np.mean([r["vetoed"] for r in cell["results"]])
    return f"{cell['regime']} n={cell['n']} (better: {t['better']}): " + "; ".join(parts) + f"; vetoed {vetoed:.3f}"


def decision_cells() -> list[dict]:
    """The decision cells of :data:`DECISIONS` decided by the current rule on the current intervals
    (:data:`INTERVAL`; earlier ones stay in git's history)."""
    cells = [json.loads(x) for x in DECISIONS.read_text().splitlines()] if DECISIONS.exists() else []
    return [c for c in cells if c.get("interval") == INTERVAL]


def report_decisions() -> None:
    """The decision tables of docs/intervals.md: each regime's population arms, then how often the decision deploys
    the better one, per regime × n × floor rule."""
    truth = json.loads(DECISION_TRUTH.read_text())
    cells = {(c["regime"], c["n"]): c for c in decision_cells()}  # the latest line of each cell
    print(f"The decision's arms on the population (TRUTH_N = {TRUTH_N} items; κ_min = {KAPPA_FLOOR:g}):\n")
    print(
        "| regime | generator | κ panel (stacked) | κ CV-best single as deployed (§2: answered items) | Δκ deployed "
        "| members at κ₀ | φ̄ | admissible | better arm | the rule's arm |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rg, t in sorted(truth.items(), key=lambda kv: list(ALL_REGIMES).index(kv[0])):
        print(
            f"| {rg} | {generator(rg)} | {t['stacked']:.3f} | {t['kappa_best_cv_deployed']:.3f} "
            f"({t['kappa_best_cv']:.3f}) | {t['d_deploy']:+.3f} (±{t['mc_se']['d_deploy']:.3f}) | "
            f"{t['members_at_kappa0']}/{len(t['members_kappa'])} | {t['phi_bar']:.3f} | "
            f"{'yes' if t['admissible'] else 'no'} | {t['better']} | {t['rule']} |"
        )
    print("\nThe decision per run, % of runs [Wilson 95 %]:\n")
    print(
        "| regime (better arm) | n | R | B | floor rule | deploys the better arm | deploys the other arm "
        "| deploys nothing, an arm at the floor | = the rule's arm | win shown | admissible | vetoed win |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (rg, n), c in sorted(cells.items(), key=lambda kv: (list(ALL_REGIMES).index(kv[0][0]), kv[0][1])):
        t, R = truth[rg], c["reps"]
        for rule in FLOOR_RULES:
            k = tally(c["results"], rule, t["better"], t["rule"])
            nothing = "—" if t["better"] == "none" else fmt(k["nothing"], R)
            print(
                f"| {rg} ({t['better']}) | {n} | {R} | {c['n_boot']} | {rule} | {fmt(k['better'], R)} | "
                f"{fmt(k['other'], R)} | {nothing} | {fmt(k['as_rule'], R)} | {fmt(k['win'], R)} | "
                f"{fmt(k['admissible'], R)} | {fmt(k['vetoed'], R)} |"
            )
    print(
        "\nThe vetoed wins: how often the bootstrap draws admit the panel (`admitted_share`), over the vetoed runs:\n"
    )
    print("| regime | n | vetoed runs | admitted share: median [min, max] |")
    print("|---|---|---|---|")
    for (rg, n), c in sorted(cells.items(), key=lambda kv: (list(ALL_REGIMES).index(kv[0][0]), kv[0][1])):
        a = np.array([x["admitted_share"] for x in c["results"] if x["vetoed"]])
        if len(a):
            print(f"| {rg} | {n} | {len(a)} | {np.median(a):.3f} [{a.min():.3f}, {a.max():.3f}] |")


def cmd_decisions(args) -> None:
    truth = load_decision_truth(args.regimes)
    done = {(c["regime"], c["n"], c["reps"], c["n_boot"]) for c in decision_cells()}
    todo = [(rg, n) for n in args.sizes for rg in args.regimes if (rg, n, args.reps, args.boot) not in done]
    print(f"{len(todo)} decision cells to run, R = {args.reps}, B = {args.boot}", flush=True)
    for regime, n in todo:
        line = run_cell(
            DECISIONS,
            {"kind": "decision", "regime": regime, "n": n},
            lambda r, regime=regime, n=n: decision_rep(regime, n, seed_of(regime, n, "decision", r), args.boot),
            args.reps,
            args.boot,
        )
        print(decision_line(line, truth[regime]), f"({line['seconds']:.0f}s)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("truth")
    t = sub.add_parser("timing")
    t.add_argument("--reps", type=int, default=3)
    t.add_argument("--boot", type=int, default=2000)
    t.add_argument("--n", type=int, default=200)
    r = sub.add_parser("run")
    r.add_argument("--reps", type=int, default=500)
    r.add_argument("--boot", type=int, default=2000)
    r.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    r.add_argument("--regimes", nargs="+", default=list(REGIMES))
    r.add_argument("--null", action="store_true", help="also the shuffled-gold cells")
    r.add_argument("--null-sizes", type=int, nargs="+", default=[200])
    r.add_argument("--null-regimes", nargs="+", default=["independent"])
    c = sub.add_parser("cascade")
    c.add_argument("--reps", type=int, default=400)
    c.add_argument("--boot", type=int, default=1000)
    c.add_argument("--n", type=int, default=200)
    c.add_argument("--regimes", nargs="+", default=["independent", "weak"])
    d = sub.add_parser("decisions")
    d.add_argument("--reps", type=int, default=500)
    d.add_argument("--boot", type=int, default=2000)
    d.add_argument("--sizes", type=int, nargs="+", default=[200])
    d.add_argument("--regimes", nargs="+", default=list(ALL_REGIMES))
    rp = sub.add_parser("report")
    rp.add_argument("--decisions", action="store_true", help="the decision tables (else the coverage tables)")
    args = p.parse_args()
    cmds = {"truth": cmd_truth, "timing": cmd_timing, "run": cmd_run, "cascade": cmd_cascade}
    {**cmds, "decisions": cmd_decisions, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    main()
