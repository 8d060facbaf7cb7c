"""Benchmark: Dawid–Skene EM in numpy (src.core.aggregate.DawidSkene) against crowd-kit 1.4.2's, on the same tables.

Like for like: both sides run the same number of EM iterations from the same start (crowd-kit with
``tol=-inf``, so that its ELBO check never stops it; ours with ``tol=0``), and their posteriors, priors and
confusion matrices are checked equal (1e-8) before any time is printed. The two sides alternate (every
table on one side, then on the other), ``--repeats`` rounds (min and median of the rounds), on a quiet machine
(:func:`harness.settle`), its load and BLAS threads printed before and after. crowd-kit gets its
long-format input prepared outside the clock (ours: ``accelerate=False``, crowd-kit's iterates step for step).
Then, for information: our EM run to convergence, plain and SQUAREM-accelerated (the same verdicts asserted),
against crowd-kit with its defaults (it stops after a few iterations on its non-monotone ELBO check), and how far apart
their posteriors end.

Tables: the simulated suite (``--datasets`` × ``--items`` × ``--members``) and the committed ``cpu`` verdict
tables (``verdicts/tables/cpu/*.csv``, where present).

    python bench/bench_dawid_skene.py [--datasets 8 --items 2000 --members 10 --iters 50 --repeats 3]
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import interleaved, machine, ratio, settle, summary, workload_parser  # noqa: E402

from src.core import verdicts  # noqa: E402
from src.core.aggregate import DawidSkene, _long_format  # noqa: E402
from src.studies import simulate  # noqa: E402

warnings.filterwarnings("ignore", module="crowdkit")  # pandas FutureWarnings raised inside crowd-kit
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=ConvergenceWarning)  # tol=0 runs exactly --iters iterations


def crowdkit_fit(long, n_iter: int, tol: float):
    from crowdkit.aggregation import DawidSkene as CrowdKitDS

    return CrowdKitDS(n_iter=n_iter, tol=tol).fit(long)


def crowdkit_state(ck, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """crowd-kit's posteriors (n × 2), priors and confusion [j, t, o] as arrays (no vote: NaN / 0.5)."""
    probas = ck.probas_.reindex(range(n))[[0, 1]].to_numpy()
    conf = np.full((k, 2, 2), 0.5)
    for (j, o), row in ck.errors_.iterrows():
        conf[j, :, o] = [row[0], row[1]]
    return probas, ck.priors_[[0, 1]].to_numpy(), conf


def check_equal(ds: DawidSkene, ck, X: np.ndarray, name: str) -> None:
    probas, priors, conf = crowdkit_state(ck, *X.shape)
    voted = (X != verdicts.ABSTAIN).any(axis=1)
    said = np.stack([(X == o).any(axis=0) for o in (0, 1)], axis=1)  # [j, o]: member j gave label o
    for what, ours, theirs in [
        ("posteriors", ds.probas_[voted], probas[voted]),
        ("priors", ds.priors_, priors),
        ("confusion", ds.confusion_.transpose(0, 2, 1)[said], conf.transpose(0, 2, 1)[said]),
    ]:
        gap = float(np.abs(ours - theirs).max())
        assert gap < 1e-8, f"{name}: {what} differ from crowd-kit's by {gap:.2e}"


def tables(a) -> dict[str, np.ndarray]:
    suite = verdicts.validate(simulate.suite(a.datasets, a.items, a.members), frontier="frontier")
    out = {name: t.votes for name, t in suite.by_dataset().items()}
    for path in sorted((ROOT / "verdicts/tables/cpu").glob("*.csv")):
        if path.stem != "coverage":
            out[f"cpu/{path.stem}"] = verdicts.load(path).votes
    return out


def main() -> None:
    ap = workload_parser(__doc__, datasets=8, items=2000, members=10)
    ap.add_argument("--iters", type=int, default=50, help="EM iterations both sides run (like for like)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()

    data = tables(a)
    longs = {name: _long_format(X) for name, X in data.items()}
    settle()
    times, last = interleaved(
        {  # ours, then crowd-kit, every table, in turn
            "numpy": lambda: [DawidSkene(n_iter=a.iters, tol=0.0, accelerate=False).fit(X) for X in data.values()],
            "crowd-kit": lambda: [crowdkit_fit(longs[name], a.iters, -np.inf) for name in data],
        },
        a.repeats,
    )
    for (name, X), ds, ck in zip(data.items(), last["numpy"], last["crowd-kit"]):
        check_equal(ds, ck, X, name)
    n_votes = sum(len(v) for v in longs.values())
    print(
        f"{len(data)} tables ({n_votes} votes), {a.iters} EM iterations each; equal to crowd-kit within 1e-8 "
        f"(posteriors, priors, confusion)"
    )
    print(f"  numpy EM:  {summary(times['numpy'])}")
    print(f"  crowd-kit: {summary(times['crowd-kit'])}")
    print(f"  speed-up: {ratio(times['crowd-kit'], times['numpy'])}")

    print(
        "to convergence (ours, tol 1e-10: plain EM steps, then SQUAREM-accelerated, same verdicts asserted) vs "
        "crowd-kit's defaults (n_iter=100, tol=1e-5), one run each:"
    )
    for name, X in data.items():
        t0 = time.perf_counter()
        plain = DawidSkene(accelerate=False).fit(X)
        t_plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        ds = DawidSkene().fit(X)
        t_ours = time.perf_counter() - t0
        assert np.array_equal(ds.predict(X), plain.predict(X)), f"{name}: accelerated verdicts differ"
        t0 = time.perf_counter()
        ck = crowdkit_fit(longs[name], 100, 1e-5)
        t_ck = time.perf_counter() - t0
        voted = (X != verdicts.ABSTAIN).any(axis=1)
        gap = np.abs(ds.probas_[voted] - crowdkit_state(ck, *X.shape)[0][voted]).max()
        print(
            f"  {name:16s} plain {plain.n_iter_:6d} it {t_plain:6.3f} s; accelerated {ds.n_iter_:5d} it "
            f"{t_ours:6.3f} s (converged {ds.converged_}); crowd-kit {len(ck.loss_history_):3d} it {t_ck:6.3f} s; "
            f"max posterior gap {gap:.3f}"
        )
    print(f"after: {machine()}")


if __name__ == "__main__":
    main()
