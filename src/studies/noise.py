"""Noisy calibration labels (beyond the paper): TRIVIA+'s four noise types, measured and resisted.

RAIM's stacker, its admissibility test (§3.3) and its CV-best single selection (§2) all learn from a few hundred
labelled calibration items. TRIVIA+ (Chen et al. 2026, "Rethinking Evaluation for LLM Hallucination Detection",
arXiv 2605.11330, seed 002; noisy columns in its DATA_DETAILS.md) ships four noisy versions of its labels, all at
15 %: Weak Supervision (WS, an LLM-as-a-judge's labels), Dissenting Worker (DW, an annotator with a systematic
bias), Dissenting Label (DL, random disagreement among annotators, sample-dependent) and Random Flip (RF, the
sample-independent control). Its DW and DL are derived from per-annotator votes, which no other set has, so
RAIM's injectors imitate them from what every verdict table has (the members' votes and gold):

* **RF** — ``round(rate·n)`` items drawn uniformly, their label flipped (exact realised rate).
* **DW** — a biased annotator: a share ``bias`` of the flips (default 0.8) hide a hallucination (1 → 0), the rest
  invent one (0 → 1), and within each class an item is drawn with weight ``floor`` + its *hardness*, the share of
  the members that voted on it and got it wrong: the annotator errs in one direction, mostly where the task is
  hard.
* **DL** — random disagreement: flips in both classes alike, an item drawn with weight ``floor`` + its
  *disagreement*, 2·min(p, 1 − p) with p the share of its voting members saying "hallucinated" (label-free; 1 on
  an even split or when nobody voted, 0 when unanimous).
* **WS** — an LLM judge's labels: the judge column is the table's frontier judge when it has one; otherwise (the
  ``cpu`` roster) the member a user without clean labels would take for the strongest, the one Dawid–Skene rates
  most accurate on the votes alone (:func:`ws_judge`), **which is then also a panel member, so its label errors are
  exactly its vote errors and correlated with the panel**.
  An abstention of the judge is a seeded coin. At rate r the labels are gold except on ``round(r·n)`` items drawn
  uniformly among the judge's errors; the realised rate is capped at the judge's own error rate
  (``realised_rate``).

Weighted draws are without replacement (``numpy.random.Generator.choice`` with ``p``), so every injector flips
exactly its share and an item's chance rises with its weight. When the table carries TRIVIA+'s own columns
(``noisy_ws/dw/dl/rf``, from the dataset's jsonl, or as columns of a bring-your-own table) those labels are used
instead, at their own realised rate.

The study, per dataset and on a simulated panel in the admissible regime (:mod:`src.studies.simulate`), for each type and
rate and ``draws`` seeded draws: **training** on noisy labels — cross-fitted on cluster folds stratified on those
noisy labels (:func:`src.core.ladderbase.checked_folds`, as a user who has only them would), scored on clean gold:
stacked κ of each configured stacker, the CV-best single (chosen on the noisy labels), the selected member, and
the ladder's call (§2) with the oracle re-taken on every draw; paired cluster-bootstrap
Δκ (:class:`src.core.evaluate.ClusterBootstrap`) of the noisy fit against the clean-label fit, averaged over the
noise draws on the same bootstrap draws. **Measuring** with noisy labels — the admissibility coordinates (member κ,
φ̄, §3.3) and the call estimated from noisy labels, the clean-trained stacker's and CV-best single's measured κ
against their true κ (TRIVIA+ Table 5's question). The robust stacker is
:class:`src.core.aggregate.NoiseRobustStackedLogit` (``stacker=logreg_robust``).

``python -m src.noise`` writes ``noise.output`` (results/noise.json) and ``noise.figure`` and logs an MLflow run of
kind ``noise``.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.base import clone
from threadpoolctl import threadpool_limits

from src.core import admissibility
from src.core.aggregate import BestSingle, DawidSkene, crossfit, eligible
from src.core.errors import RaimError
from src.core.evaluate import ClusterBootstrap, best_single_call, kappa, paired_delta
from src.core.ladderbase import (
    AnalysisError,
    active_members,
    check_settings,
    checked_folds,
    design_matrix,
    single_judge_eligibility,
)
from src.core.names import metric_name
from src.core.verdicts import ABSTAIN, VerdictTable
from src.io.config import composed_option, conf_file, plain
from src.io.datasets import read_items
from src.io.settings import Settings
from src.judges import tables
from src.studies import simulate
from src.studies.checked import analysis_from, stacker_from
from src.studies.suite.reference import rng_for

log = logging.getLogger("raim.noise")

TYPES = ("ws", "dw", "dl", "rf")
NATIVE_PREFIX = "noisy_"


class NoiseError(RaimError, ValueError):
    """Bad noise settings or a bad native noisy-label column (the message names the record and the field)."""


# --------------------------------------------------------------------------------------------- item features


def disagreement(votes: np.ndarray) -> np.ndarray:
    """Label-free member disagreement per item: 2·min(p, 1 − p), p = share of voting members saying 1 (1 when
    nobody voted)."""
    voted = votes != ABSTAIN
    n = voted.sum(axis=1)
    p = np.where(n > 0, ((votes == 1) & voted).sum(axis=1) / np.maximum(n, 1), 0.5)
    return 2 * np.minimum(p, 1 - p)


def hardness(gold: np.ndarray, votes: np.ndarray) -> np.ndarray:
    """Share of the voting members wrong on each item (0.5 when nobody voted)."""
    voted = votes != ABSTAIN
    n = voted.sum(axis=1)
    wrong = ((votes != np.asarray(gold)[:, None]) & voted).sum(axis=1)
    return np.where(n > 0, wrong / np.maximum(n, 1), 0.5)


# ------------------------------------------------------------------------------------------------ injectors


def _check_rate(rate: float) -> None:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 0.5:
        raise NoiseError(f"noise rate {rate!r}: must be a number in [0, 0.5)")


def _draw(weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` distinct indices, each drawn with probability proportional to its weight (without replacement)."""
    k = min(int(k), int(np.count_nonzero(weights)))
    if k <= 0:
        return np.empty(0, int)
    return rng.choice(len(weights), size=k, replace=False, p=weights / weights.sum())


def _flipped(gold: np.ndarray, idx: np.ndarray) -> np.ndarray:
    out = np.asarray(gold).astype(int).copy()
    out[idx] = 1 - out[idx]
    return out


def random_flip(gold: np.ndarray, rate: float = 0.15, rng: np.random.Generator | None = None) -> np.ndarray:
    """RF: ``round(rate·n)`` labels flipped, drawn uniformly (sample-independent)."""
    _check_rate(rate)
    rng = rng or np.random.default_rng(0)
    return _flipped(gold, _draw(np.ones(len(gold)), round(rate * len(gold)), rng))


def dissenting_worker(
    gold: np.ndarray,
    votes: np.ndarray,
    rate: float = 0.15,
    rng: np.random.Generator | None = None,
    bias: float = 0.8,
    floor: float = 0.05,
) -> np.ndarray:
    """DW: a share ``bias`` of the ``round(rate·n)`` flips turn hallucinated items to supported, the rest the
    other way; within a class an item's weight is ``floor`` + :func:`hardness`."""
    _check_rate(rate)
    if not 0 <= bias <= 1:
        raise NoiseError(f"noise.dw.bias={bias!r}: must be in [0, 1]")
    rng = rng or np.random.default_rng(0)
    gold = np.asarray(gold).astype(int)
    k = round(rate * len(gold))
    w = floor + hardness(gold, votes)
    k1 = min(round(bias * k), int(np.sum(gold == 1)))
    idx = [np.flatnonzero(gold == c)[_draw(w[gold == c], kc, rng)] for c, kc in ((1, k1), (0, k - k1))]
    return _flipped(gold, np.concatenate(idx))


def dissenting_label(
    gold: np.ndarray, votes: np.ndarray, rate: float = 0.15, rng: np.random.Generator | None = None, floor: float = 0.05
) -> np.ndarray:
    """DL: ``round(rate·n)`` flips in either class, an item's weight ``floor`` + :func:`disagreement`."""
    _check_rate(rate)
    rng = rng or np.random.default_rng(0)
    return _flipped(gold, _draw(floor + disagreement(votes), round(rate * len(gold)), rng))


def judge_labels(judge: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A judge column as labels: its votes, an abstention replaced by a seeded fair coin."""
    judge = np.asarray(judge, dtype=float)
    coin = rng.integers(0, 2, len(judge))
    return np.where(judge == ABSTAIN, coin, judge).astype(int)


def weak_supervision(
    gold: np.ndarray, judge: np.ndarray, rate: float = 0.15, rng: np.random.Generator | None = None
) -> np.ndarray:
    """WS: gold, except on ``round(rate·n)`` items drawn uniformly among those where the judge's label (an
    abstention a coin) is wrong: the judge's own errors, thinned to the rate (capped at its error rate)."""
    _check_rate(rate)
    rng = rng or np.random.default_rng(0)
    gold = np.asarray(gold).astype(int)
    wrong = (judge_labels(judge, rng) != gold).astype(float)
    return _flipped(gold, _draw(wrong, round(rate * len(gold)), rng))


def inject(
    kind: str,
    gold: np.ndarray,
    votes: np.ndarray,
    judge: np.ndarray | None,
    rate: float,
    rng: np.random.Generator,
    dw: dict | None = None,
    dl: dict | None = None,
) -> np.ndarray:
    """Noisy labels of one type (``ws``, ``dw``, ``dl``, ``rf``) at ``rate``."""
    if kind == "rf":
        return random_flip(gold, rate, rng)
    if kind == "dw":
        return dissenting_worker(gold, votes, rate, rng, **(dw or {}))
    if kind == "dl":
        return dissenting_label(gold, votes, rate, rng, **(dl or {}))
    if kind == "ws":
        if judge is None:
            raise NoiseError("noise type 'ws' needs a judge column")
        return weak_supervision(gold, judge, rate, rng)
    raise NoiseError(f"noise type {kind!r}: must be one of {list(TYPES)}")


# ------------------------------------------------------------------------------- native (TRIVIA+) columns


def _native_values(values, item_ids, source: str, col: str) -> np.ndarray:
    """0/1 labels of a native column; an empty or other cell is an error naming the item and the field."""
    out = np.empty(len(values))
    for i, (v, item) in enumerate(zip(values, item_ids)):
        try:
            ok = v is not None and float(v) in (0.0, 1.0)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise NoiseError(f"{source}: item_id={item!r}: field {col!r}: value {v!r} not in {{0, 1}}")
        out[i] = float(v)
    return out


def _jsonl_native(path: Path, item_ids: np.ndarray) -> dict[str, np.ndarray]:
    """TRIVIA+'s noisy columns of a dataset's jsonl (:func:`src.io.datasets.read_items`), aligned on ``item_ids``."""
    if not path.is_file():
        return {}
    items = read_items(path).set_index("item_id")  # the one reader of a dataset's items
    if not any(str(k).startswith(NATIVE_PREFIX) for k in items.columns):
        return {}
    out = {}
    for col in [c for c in items.columns if c.startswith(NATIVE_PREFIX) and c[len(NATIVE_PREFIX) :] in TYPES]:
        missing = [i for i in item_ids if i not in items.index]
        if missing:
            raise NoiseError(f"{path}: item_id={missing[0]!r}: not in the dataset file (field {col!r})")
        out[col[len(NATIVE_PREFIX) :]] = _native_values(items.loc[item_ids, col].tolist(), item_ids, str(path), col)
    return out


def native_labels(table: VerdictTable, datasets_dir: str | Path | None) -> tuple[VerdictTable, dict]:
    """TRIVIA+'s own noisy labels, when present: {dataset: {type: labels}}, and the table without them.

    A bring-your-own table carries them as columns ``noisy_<type>`` (read as judge columns: taken out of the
    panel here); a cached table gets them from ``datasets_dir/<dataset>.jsonl`` (the TRIVIA+ builder keeps them)."""
    cols = [m for m in table.members if m.startswith(NATIVE_PREFIX) and m[len(NATIVE_PREFIX) :] in TYPES]
    out: dict[str, dict[str, np.ndarray]] = {}
    if cols:
        ids = table.items["item_id"].to_numpy()
        vals = {c: table.votes[:, table.members.index(c)] for c in cols}
        for c, v in vals.items():
            _native_values([None if x == ABSTAIN else x for x in v], ids, table.source, c)
        ds = table.items["dataset"].to_numpy()
        out = {d: {c[len(NATIVE_PREFIX) :]: v[ds == d] for c, v in vals.items()} for d in table.datasets}
        table = table.subset(np.ones(len(ids), bool), [m for m in table.members if m not in cols])
    elif datasets_dir is not None:
        for d, part in table.by_dataset().items():
            found = _jsonl_native(Path(datasets_dir) / f"{d}.jsonl", part.items["item_id"].to_numpy())
            if found:
                out[d] = found
    return table, out


# --------------------------------------------------------------------------------------------------- study


def settings_from(cfg: dict) -> dict:
    """The study's settings (conf/noise), checked: a bad value is one line naming the key."""
    s = dict(cfg)
    bad = [t for t in s["types"] if t not in TYPES]
    if bad:
        raise NoiseError(f"noise.types: {bad} not in {list(TYPES)}")
    for r in s["rates"]:
        try:
            _check_rate(r)
        except NoiseError as e:
            raise NoiseError(f"noise.rates: {e}") from None
    for key in ("draws", "n_boot"):
        if isinstance(s[key], bool) or not isinstance(s[key], int) or s[key] < 1:
            raise NoiseError(f"noise.{key}={s[key]!r}: must be an integer ≥ 1")
    if "default_rate" in s and s["default_rate"] not in s["rates"]:  # the headline is read at that rate
        raise NoiseError(f"noise.default_rate={s['default_rate']!r}: must be one of noise.rates {s['rates']}")
    return s


def ws_judge(t: VerdictTable, min_coverage: float) -> dict:
    """The WS label source: the frontier column when it has votes, else the member a user without clean labels
    would take for the strongest — the one Dawid–Skene (fitted on the votes alone) rates most accurate, its
    balanced accuracy ½·(P(1 | 1) + P(0 | 0)), among the members answering ``min_coverage`` of the items (then
    also a panel member). No gold is read."""
    if t.has_frontier:
        return {"name": t.frontier_name, "member": False, "votes": t.frontier}
    conf = DawidSkene().fit(t.votes).confusion_
    rated = 0.5 * (conf[:, 1, 1] + conf[:, 0, 0])
    j = int(np.argmax(np.where(eligible(t.votes, min_coverage), rated, -np.inf)))
    return {"name": t.members[j], "member": True, "votes": t.votes[:, j]}


@dataclass
class _Scored:
    """One dataset's prediction columns scored on gold: full-sample κ and the bootstrap's B × P κ."""

    y: np.ndarray
    P: np.ndarray
    idx: dict[str, int]
    members: list[str]
    ok: np.ndarray  # members eligible as a single judge
    boot: ClusterBootstrap
    level: float

    def __post_init__(self):
        self.kb = self.boot.metrics(self.y, self.P)["kappa"]
        self.full = {k: kappa(self.y, self.P[:, i]) for k, i in self.idx.items()}
        self.oracle = self.oracle_on(self.y, self.kb[:, [self.idx[f"member|{m}"] for m in self.members]])

    def col(self, key: str) -> np.ndarray:
        return self.P[:, self.idx[key]]

    def oracle_on(self, gold: np.ndarray, member_kb: np.ndarray) -> tuple[np.ndarray, float]:
        """The oracle best single among the eligible members (§2): on each bootstrap draw, and on the sample."""
        full = np.array([kappa(gold, self.col(f"member|{m}")) for m in self.members])
        return (
            np.where(self.ok[None, :], member_kb, -np.inf).max(axis=1),
            float(np.max(np.where(self.ok, full, -np.inf))),
        )

    def delta(self, a: str, b: str):
        return paired_delta(self.full[a] - self.full[b], self.kb[:, self.idx[a]] - self.kb[:, self.idx[b]], self.level)

    def _call(self, k_st: float, k_cv: float, kb_st: np.ndarray, kb_cv: np.ndarray, oracle: tuple) -> str:
        d_cv = paired_delta(k_st - k_cv, kb_st - kb_cv, self.level)
        d_or = paired_delta(k_st - oracle[1], kb_st - oracle[0], self.level)
        return best_single_call(d_cv, d_or)

    def call(self, stacked: str, cv: str) -> str:
        """The ladder's call (§2) of ``stacked`` against the CV-best single ``cv``, on gold."""
        return self._call(
            self.full[stacked], self.full[cv], self.kb[:, self.idx[stacked]], self.kb[:, self.idx[cv]], self.oracle
        )

    def measured_call(self, labels: np.ndarray, stacked: str, cv: str) -> str:
        """The same call as measured when the evaluation labels are ``labels`` (same bootstrap draws)."""
        cols = [self.idx[stacked], self.idx[cv]] + [self.idx[f"member|{m}"] for m in self.members]
        kb = self.boot.metrics(labels, self.P[:, cols])["kappa"]
        return self._call(
            kappa(labels, self.col(stacked)),
            kappa(labels, self.col(cv)),
            kb[:, 0],
            kb[:, 1],
            self.oracle_on(labels, kb[:, 2:]),
        )


def study_dataset(name: str, t: VerdictTable, stackers: dict, s: dict, ladder, native: dict | None = None) -> dict:
    """The whole study on one dataset (module doc). ``stackers``: {name: estimator}, the first is the one whose
    calls are reported; ``ladder``: :class:`src.core.ladderbase.LadderSettings`; ``native``: {type: labels} of TRIVIA+."""

    t, excluded = active_members(t)
    y, votes = t.gold, t.votes
    ok, _ = single_judge_eligibility(t, ladder.min_coverage)
    X, _ = design_matrix(t, list(ladder.features))
    stackers = {k: clone(v).set_params(n_votes=votes.shape[1]) for k, v in stackers.items()}
    judge = ws_judge(t, ladder.min_coverage)
    native = native or {}
    cols: dict[str, np.ndarray] = {f"clean|{k}": p for k, p in _fits(X, votes, y, t.clusters, stackers, ladder).items()}
    cols.update({f"member|{m}": votes[:, j] for j, m in enumerate(t.members)})
    noisy: dict[tuple, list[np.ndarray]] = {}
    for kind in s["types"]:
        plan = [("native", 1)] if kind in native else [(r, s["draws"]) for r in s["rates"] if r > 0]
        for rate, n_draws in plan:
            for d in range(n_draws):
                yn = (
                    np.asarray(native[kind]).astype(int)
                    if rate == "native"
                    else inject(
                        kind,
                        y,
                        votes,
                        judge["votes"],
                        rate,
                        rng_for(s["seed"], "noise", name, kind, f"{rate:g}", d),
                        s.get("dw"),
                        s.get("dl"),
                    )
                )
                noisy.setdefault((kind, rate), []).append(yn)
                cols.update(
                    {f"{kind}|{rate}|{d}|{k}": p for k, p in _fits(X, votes, yn, t.clusters, stackers, ladder).items()}
                )
    sc = _Scored(
        y,
        np.column_stack(list(cols.values())),
        {k: i for i, k in enumerate(cols)},
        list(t.members),
        ok,
        ClusterBootstrap(t.clusters, s["n_boot"], s["seed"]),
        ladder.level,
    )
    first = next(iter(stackers))
    clean_adm = admissibility.test(y, votes, ladder.kappa0, ladder.c, ladder.phi0)
    clean = {
        "stacked": {k: sc.full[f"clean|{k}"] for k in stackers},
        "best_cv": sc.full["clean|best_cv"],
        "stacked_minus_best_cv": {k: sc.delta(f"clean|{k}", "clean|best_cv").as_dict() for k in stackers},
        "call": sc.call(f"clean|{first}", "clean|best_cv"),
        "calls": {k: sc.call(f"clean|{k}", "clean|best_cv") for k in stackers},
        "admissible": bool(clean_adm.admissible),
        "phi_bar": clean_adm.phi_bar,
        "members_at_kappa0": clean_adm.members_at_kappa0,
        "selected": t.members[BestSingle(min_coverage=ladder.min_coverage).fit(votes, y).best_],
    }
    points = [
        _point(kind, rate, labels, sc, list(stackers), clean, ladder, votes) for (kind, rate), labels in noisy.items()
    ]
    ws_error = float(np.mean(judge_labels(judge["votes"], np.random.default_rng(s["seed"])) != y))
    return {
        "n": int(len(y)),
        "n_clusters": int(len(np.unique(t.clusters))),
        "members": list(t.members),
        "excluded_members": excluded,
        "source": {k: ("native" if k in native else "injected") for k in s["types"]},
        "ws_judge": {"name": judge["name"], "member": judge["member"], "error_rate": ws_error},
        "clean": clean,
        "points": points,
    }


def _fits(
    X: np.ndarray, votes: np.ndarray, y_train: np.ndarray, clusters: np.ndarray, stackers: dict, ladder
) -> dict[str, np.ndarray]:
    """Out-of-fold predictions of every stacker and of the CV-best single, trained on ``y_train`` on cluster folds
    stratified on ``y_train`` (:func:`src.core.ladderbase.checked_folds`): a user with noisy labels has no other labels to
    stratify on or to pick the CV-best single with."""
    folds = checked_folds(y_train, clusters, ladder)
    out = {name: crossfit(est, X, y_train, folds).pred for name, est in stackers.items()}
    out["best_cv"] = crossfit(BestSingle(min_coverage=ladder.min_coverage), votes, y_train, folds).pred
    return out


def _point(
    kind: str, rate, labels: list[np.ndarray], sc: _Scored, stackers: list[str], clean: dict, ladder, votes: np.ndarray
) -> dict:
    """One (type, rate) over its draws: training on noisy labels (scored on gold), measuring with them."""
    y, first, n = sc.y, stackers[0], len(labels)
    train = {}
    for k in [*stackers, "best_cv"]:
        keys = [f"{kind}|{rate}|{d}|{k}" for d in range(n)]
        est = float(np.mean([sc.full[c] for c in keys]))
        draws = sc.kb[:, [sc.idx[c] for c in keys]].mean(axis=1) - sc.kb[:, sc.idx[f"clean|{k}"]]
        train[k] = {
            "kappa": est,
            "delta_vs_clean": paired_delta(est - sc.full[f"clean|{k}"], draws, sc.level).as_dict(),
        }
    calls = {k: [sc.call(f"{kind}|{rate}|{d}|{k}", f"{kind}|{rate}|{d}|best_cv") for d in range(n)] for k in stackers}
    sel = [sc.members[BestSingle(min_coverage=ladder.min_coverage).fit(votes, yn).best_] for yn in labels]
    adms = [admissibility.test(yn, votes, ladder.kappa0, ladder.c, ladder.phi0) for yn in labels]
    m_calls = [sc.measured_call(yn, f"clean|{first}", "clean|best_cv") for yn in labels]
    measured = {k: float(np.mean([kappa(yn, sc.col(f"clean|{k}")) for yn in labels])) for k in [first, "best_cv"]}
    return {
        "type": kind,
        "rate": rate,
        "draws": n,
        "realised_rate": float(np.mean([np.mean(yn != y) for yn in labels])),
        "train": {
            **train,
            "calls": {k: dict(Counter(c)) for k, c in calls.items()},
            "call_same": {k: _share(c, clean["calls"][k]) for k, c in calls.items()},
            "selected": dict(Counter(sel)),
            "selected_same": _share(sel, clean["selected"]),
        },
        "measure": {
            "kappa": measured,
            "bias": {k: v - (clean["stacked"][k] if k != "best_cv" else clean["best_cv"]) for k, v in measured.items()},
            "calls": dict(Counter(m_calls)),
            "call_same": _share(m_calls, clean["call"]),
            "admissible_same": _share([bool(a.admissible) for a in adms], clean["admissible"]),
            "phi_bar": _mean([a.phi_bar for a in adms]),
            "members_at_kappa0": float(np.mean([a.members_at_kappa0 for a in adms])),
        },
    }


def _share(values: list, target) -> float:
    return float(np.mean([v == target for v in values]))


def _mean(vals: list) -> float | None:
    vals = [v for v in vals if v is not None]
    return float(np.mean(vals)) if vals else None


# ------------------------------------------------------------------------------------------ the whole study


def stacker_option(name: str) -> dict:
    """conf/stacker/<name>.yaml as Hydra composes it (:func:`src.io.config.composed_option`), as plain data."""

    return plain(composed_option("stacker", name), False)


def headline(ds: dict, rate: float) -> dict:
    """Per type at ``rate`` (or the native point): stacked κ lost to the noise by each stacker (Δκ vs its clean
    fit) and the share of the plain stacker's loss the others recover."""
    out = {}
    stackers = list(ds["clean"]["stacked"])
    for p in ds["points"]:
        if p["rate"] not in (rate, "native"):
            continue
        plain = ds["clean"]["stacked"][stackers[0]] - p["train"][stackers[0]]["kappa"]
        row = {
            "rate": p["rate"],
            "realised_rate": p["realised_rate"],
            **{f"delta_{k}": p["train"][k]["delta_vs_clean"]["estimate"] for k in stackers},
        }
        for k in stackers[1:]:
            row[f"recovered_{k}"] = (
                (p["train"][k]["kappa"] - p["train"][stackers[0]]["kappa"]) / plain if plain > 0.01 else None
            )
        out[p["type"]] = row
    return out


def study(table: VerdictTable, stackers: dict, s: dict, ladder, native: dict | None = None) -> dict:
    """The study on every dataset of the table and on the simulated admissible panel (``noise.simulation``)."""
    from tqdm import tqdm  # imported here, not at start-up: tqdm

    check_settings(ladder, next(iter(stackers.values())))

    parts = dict(table.by_dataset())
    sim = s.get("simulation") or {}
    if sim.get("enabled"):
        parts["simulation"] = simulate.table("simulation", **{k: v for k, v in sim.items() if k != "enabled"})
    out = {}
    with threadpool_limits(1):
        for name, part in tqdm(parts.items(), desc="noise study", unit="dataset"):
            try:
                out[name] = study_dataset(name, part, stackers, s, ladder, (native or {}).get(name))
            except AnalysisError as e:
                raise AnalysisError(f"{part.source}: dataset {name!r}: {e}") from e
    doc = {"datasets": {k: v for k, v in out.items() if k != "simulation"}, "simulation": out.get("simulation")}
    if doc["simulation"]:
        c = doc["simulation"]["clean"]
        doc["simulation"]["check"] = {
            "stacker_wins_with_clean_labels": c["call"] in ("win", "clean win"),
            "admissible": c["admissible"],
        }
    doc["headline"] = {k: headline(v, s["default_rate"]) for k, v in out.items()}
    return doc


def compute(cfg: Settings) -> dict:
    """noise.json for the configured verdict table (``python -m src.run``'s table, :func:`src.judges.tables.load_table`)."""

    s = settings_from(cfg.node("noise"))
    ladder = analysis_from(cfg.analysis)
    stackers = {n: stacker_from(stacker_option(n), conf_file("stacker", n)) for n in s["stackers"]}
    table = tables.load_table(cfg)
    native = {}
    if s["native"]:
        table, native = native_labels(table, None if cfg.verdicts else cfg.paths.datasets_dir)
    doc = study(table, stackers, s, ladder, native)
    doc["settings"] = s
    doc["meta"] = {"verdicts": table.source, "members": table.members, "frontier": table.frontier_name}
    return doc


def parts(doc: dict) -> dict[str, dict]:
    """noise.json's studied tables by name: each dataset, then the simulated panel when it ran."""
    return {**doc["datasets"], **({"simulation": doc["simulation"]} if doc.get("simulation") else {})}


def flat_metrics(doc: dict) -> dict[str, float]:
    """Headline numbers of noise.json as MLflow metrics."""

    out: dict[str, float] = {}
    for name, ds in parts(doc).items():
        for k, v in ds["clean"]["stacked"].items():
            out[metric_name("noise", name, "clean", f"kappa_{k}")] = v
        for p in ds["points"]:
            rate = p["rate"] if p["rate"] == "native" else f"{100 * p['rate']:g}pct"
            base = ("noise", name, p["type"], rate)
            for k in ds["clean"]["stacked"]:
                out[metric_name(*base, f"kappa_{k}")] = p["train"][k]["kappa"]
            for k, v in p["train"]["call_same"].items():
                out[metric_name(*base, f"call_same_{k}")] = v
            out[metric_name(*base, "admissible_same")] = p["measure"]["admissible_same"]
            out[metric_name(*base, "measured_bias")] = next(iter(p["measure"]["bias"].values()))
    return out
