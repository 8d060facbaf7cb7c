"""How much of my traffic hallucinates? Rates with valid intervals on a scored pool, and the study that checks them.

The application (``python -m src.rate estimate | propose | plan``):

* a **pool** of N scored items — a ``src.predict`` output, any CSV / JSON Lines / Parquet file with ``item_id`` and
  ``p_hallucinated`` (optional ``cluster_id``, a segment column, ``ts``, ``train_prevalence``), or a served model's
  monitoring store (:mod:`src.studies.monitor`) — and **gold** for some of its items (``item_id, gold`` with gold 0 / 1,
  from people or from a frontier judge) give the rate per segment by every method of :mod:`src.core.rates`, and
  the label-free EM prevalence of :func:`src.core.priorshift.estimate` (its interval from the observed information,
  :func:`src.studies.monitor.prevalence_se`: valid only under a pure prior shift with a calibrated stacker, so flagged);
* **which items to label**: :func:`propose` draws the next items from the unlabelled pool with the active
  sampling probabilities (:func:`src.core.rates.sampling_probabilities`, seeded) and records every pool item's
  probability with a fingerprint of the pool, so that labels read back against the proposal give the
  active-inference rate (Zrnic & Candès 2024) and a proposal from another pool is refused;
* :func:`plan_labels`: how many labels a target half-width needs on this pool — from the labels in hand when
  there are enough, else from the stacker's posteriors under a prior shift (:func:`src.core.priorshift.adjust`);
* **a frontier judge as the labeller**: its verdicts are read as gold; the rate then estimates *what that judge
  would say*, not gold (:func:`estimate`'s ``labeller``).

The study (:func:`study`, ``python -m src.rate`` / the ``rate`` DVC stage): pools of ``pool`` items of simulated
traffic from panels in several regimes — admissible, weak, correlated, anti-correlated (members that err on most
traffic items after being calibrated where they were competent: p falls as the truth rises), and clustered
traffic (items in conversations that share their hallucination and difficulty) — and the committed verdict
tables' cross-fitted posteriors resampled to the deployment prevalences (each item's class drawn at π, then an
item of that class with replacement: the traffic is i.i.d. from the set's class-conditional posteriors, so π is
the truth), also with the roster's most expensive member (or the frontier column) as the labeller and the
other members as the panel. Per regime × prevalence × labels, ``replicates`` pools, each labelled by a uniform
draw of n items (classical, PPI++) and by an active draw of n expected items (active inference); per method the
coverage of θ (and of the pool's own share), the median width, its ratio to the classical width, the median
effective labels and their multiplier over n. Side by side on the same replicates: ``ppi_py.ppi_mean_ci`` (the
same estimator: equal to rounding where items are not clustered) and ``cje-eval``'s calibrated mean
(``cje.calibrated_mean_ci``, isotonic judge calibration on the labelled slice, cluster-robust interval).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import logging
import sqlite3
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import norm
from sklearn.base import clone
from tqdm import tqdm

from src.core import drift, priorshift, rates
from src.core.evaluate import kappa
from src.core.ladder import dataset_folds
from src.core.rates import RateError
from src.core.textfiles import normal_id
from src.core.verdicts import ABSTAIN
from src.io import votestore
from src.io.files import atomic_write_text, to_json
from src.io.raw import RawRecordError, Rec, read_csv, read_jsonl, read_parquet
from src.studies import prevalence, simulate

log = logging.getLogger("raim.rate")

PROPOSAL_KIND = "raim-rate-proposal"
PROPOSAL_VERSION = 1
TABLE_SUFFIXES = (".csv", ".jsonl", ".parquet")
STORE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
P_COLUMN = "p_hallucinated"
IMPUTED_P = 0.5  # the predictor's value on an item the panel did not score (every member abstained)
FEW_POSITIVES = 5  # fewer labelled items of a class than this: the normal intervals may undercover (the study)
ESTIMAND = (
    "θ = the share of hallucinated items in the traffic the pool was drawn from (the pool's own share "
    "lies inside the interval at least as often)"
)
NO_CLUSTERS = (
    "the pool has no cluster_id: every item is taken as its own cluster; items that share a conversation or a "
    "document make the intervals too narrow then (carry cluster_id in the pool: src.predict copies an items "
    "file's cluster_id to its output)"
)
STATUS = ("not drawn", "proposed", "labelled")  # a pool item's place in a proposal; "labelled" = π 1


# ---------------------------------------------------------------------------------------------- the pool


@dataclass
class Pool:
    """The scored items: ids, p(hallucinated), cluster ids (None: one item per cluster), a segment per item (None:
    one segment), the stacker's training prevalence (None: unknown, no EM estimate)."""

    source: str
    item_ids: np.ndarray
    p: np.ndarray
    clusters: np.ndarray | None = None
    segments: np.ndarray | None = None
    segment_by: str | None = None
    train_prevalence: float | None = None
    imputed: int = 0

    def __post_init__(self) -> None:
        self.index = {str(k): i for i, k in enumerate(self.item_ids)}

    def __len__(self) -> int:
        return len(self.item_ids)

    def fingerprint(self) -> str:
        """sha256 of the sorted item ids (one per line): which pool a proposal was drawn from."""
        return hashlib.sha256("\n".join(sorted(map(str, self.item_ids))).encode()).hexdigest()


def _records(path: Path, required: tuple[str, ...]) -> list[Rec]:
    if path.suffix not in TABLE_SUFFIXES:
        raise RateError(f"{path}: a table is CSV, JSON Lines or Parquet ({', '.join(TABLE_SUFFIXES)})")
    if not path.exists():
        raise RateError(f"{path}: file not found")
    if path.suffix == ".csv":
        return read_csv(path, Path.cwd(), required)
    return read_jsonl(path, Path.cwd()) if path.suffix == ".jsonl" else read_parquet(path, Path.cwd())


def _blank(v: Any) -> bool:
    return (
        v is None
        or (isinstance(v, float) and v != v)
        or (isinstance(v, str) and v.strip().lower() in ("", "nan", "null", "none", "<na>"))
    )


def _prob(rec: Rec, key: str) -> float | None:
    v = rec.raw(key)
    if _blank(v):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise RawRecordError(rec.where, key, f"{v!r} is not a probability in [0, 1]") from None
    if not 0.0 <= x <= 1.0:
        raise RawRecordError(rec.where, key, f"{v!r} is not a probability in [0, 1]")
    return x


def _item_id(rec: Rec) -> str:
    return rec.ident("item_id")


def read_pool(
    path: str | Path,
    segment: str | None = None,
    window: float | None = None,
    train_prevalence: float | None = None,
    model: str | None = None,
) -> Pool:
    """A scored pool (module docstring): a table, or a monitoring store (``model``: one served model's rows).
    ``segment``: a column to report by; ``window``: seconds per time window over ``ts`` (the store's timestamps).
    A missing p (every member abstained) is imputed as 0.5 — a fixed predictor value, so every estimate stays
    valid — and counted."""
    path = Path(path)
    if path.suffix in STORE_SUFFIXES:
        ids, p, clusters, seg, ts, tp = _store_columns(path, model)
        if segment is not None:
            raise RateError(f"--segment {segment}: a monitoring store has no columns; segment it by --window")
    else:
        ids, p, clusters, seg, ts, tp = _table_columns(path, segment, window is not None)
    return pool_of(str(path), ids, p, clusters, seg, ts, tp, segment, window, train_prevalence)


def pool_of(
    source: str,
    ids: Any,
    p: np.ndarray,
    clusters: np.ndarray | None,
    seg: np.ndarray | None,
    ts: np.ndarray,
    tp: float | None,
    segment: str | None = None,
    window: float | None = None,
    train_prevalence: float | None = None,
) -> Pool:
    """A pool from its columns (:func:`read_pool`'s, or the assessed traces of an MLflow experiment): the missing
    p imputed and counted, the segments by ``window`` seconds over ``ts`` when asked, ``train_prevalence`` over
    the recorded one."""
    if train_prevalence is not None:
        tp = priorshift.check_prevalence(train_prevalence, "--train-prevalence")
    missing = np.isnan(p)
    p = np.where(missing, IMPUTED_P, p)
    by = segment
    if window is not None:
        if not (window > 0):
            raise RateError(f"--window {window!r}: must be a positive number of seconds")
        start = np.floor((ts - np.nanmin(ts)) / window) * window + np.nanmin(ts)
        seg = np.array(
            [dt.datetime.fromtimestamp(s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") for s in start], dtype=object
        )
        by = f"window of {window:g} s"
    return Pool(source, np.asarray(ids, dtype=object), p, clusters, seg, by, tp, int(missing.sum()))


def _table_columns(path: Path, segment: str | None, need_ts: bool):
    recs = _records(path, ("item_id", P_COLUMN))
    head = recs[0].data
    ids, p, clusters, seg, ts, tps = [], [], [], [], [], []
    where: dict[str, str] = {}
    has_cluster, has_tp = "cluster_id" in head, "train_prevalence" in head
    if segment is not None and segment not in head:
        raise RateError(f"{path}: --segment {segment}: no such column (columns: {', '.join(map(str, head))})")
    if need_ts and "ts" not in head:
        raise RateError(f"{path}: --window needs a 'ts' column (seconds since the epoch)")
    for rec in recs:
        i = _item_id(rec)
        if where.setdefault(i, rec.where) != rec.where:
            raise RawRecordError(rec.where, "item_id", f"{i!r} repeats {where[i]} (item ids must be unique)")
        ids.append(i)
        v = _prob(rec, P_COLUMN)
        p.append(np.nan if v is None else v)
        if has_cluster:
            c = rec.raw("cluster_id")
            clusters.append(f"item:{i}" if _blank(c) else normal_id(str(c)))
        if segment is not None:
            s = rec.raw(segment)
            seg.append("(none)" if _blank(s) else str(s))
        if need_ts:
            try:
                ts.append(float(rec.raw("ts")))
            except (TypeError, ValueError):
                raise RawRecordError(rec.where, "ts", f"{rec.raw('ts')!r} is not a time in seconds") from None
        if has_tp:
            t = _prob(rec, "train_prevalence")
            if t is not None:
                tps.append(t)
    return (
        ids,
        np.asarray(p, dtype=float),
        np.asarray(clusters, dtype=object) if has_cluster else None,
        np.asarray(seg, dtype=object) if segment is not None else None,
        np.asarray(ts, dtype=float),
        one_prevalence(path, tps, "items", "pass the stacker's with --train-prevalence"),
    )


def one_prevalence(path: Path | str, recorded, what: str, hint: str) -> float | None:
    """The one training prevalence a pool's ``what`` (items, rows) recorded, ignoring the ones that recorded none
    (None when none did); values that disagree come from several stackers: an error with ``hint``."""
    known = [float(t) for t in recorded if t is not None and np.isfinite(t)]
    if not known:
        return None
    if max(known) - min(known) > 1e-9:
        raise RateError(
            f"{path}: field 'train_prevalence': the {what} disagree ({min(known):g}…{max(known):g}); {hint}"
        )
    return priorshift.check_prevalence(known[0], f"{path}: field 'train_prevalence'")


def _store_columns(path: Path, model: str | None):
    """The store's rows (:func:`src.studies.monitor.read_store`, members read off its first row): ids (``#<row>`` for a
    row recorded without one), p, timestamps."""
    if not path.is_file():
        raise RateError(f"{path}: no monitoring store there")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    try:
        first = con.execute(
            "SELECT votes FROM votes" + (" WHERE model = ?" if model else "") + " ORDER BY seq LIMIT 1",
            (model,) if model else (),
        ).fetchone()
    except sqlite3.DatabaseError as e:
        raise RateError(f"{path}: not a readable monitoring store ({e})") from None
    finally:
        con.close()
    if first is None:
        raise RateError(f"{path}: no recorded items" + (f" of model {model!r}" if model else ""))
    try:
        members = list(json.loads(first[0]))
    except (ValueError, TypeError):
        raise RateError(f"{path}: first row: field 'votes': not a JSON object") from None
    stream = votestore.read_store(path, members, model)
    ids = [f"#{k}" if i is None else normal_id(str(i)) for k, i in enumerate(stream.item_ids)]
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise RateError(f"{path}: item_id {i!r} was recorded twice (a rate counts each item once)")
        seen.add(i)
    tps = [] if stream.train_prevalence is None else stream.train_prevalence
    hint = "read one model's rows, or pass the stacker's with --train-prevalence"
    return ids, stream.p, None, None, stream.ts, one_prevalence(path, tps, "rows", hint)


def read_labels(path: str | Path, pool: Pool, column: str = "gold") -> tuple[np.ndarray, np.ndarray]:
    """(labelled mask, gold with NaN elsewhere) aligned with the pool; a label for an item the pool does not hold,
    a gold that is not 0 / 1, or two different golds for one item is an error naming the record and field."""
    path = Path(path)
    recs = _records(path, ("item_id", column))
    lab = np.zeros(len(pool), bool)
    y = np.full(len(pool), np.nan)
    for rec in recs:
        i = _item_id(rec)
        k = pool.index.get(i)
        if k is None:
            unknown = sum(_item_id(r) not in pool.index for r in recs)
            raise RawRecordError(
                rec.where,
                "item_id",
                f"{i!r} is not an item of the pool {pool.source} ({unknown} labelled item(s) are not in it)",
            )
        g = _gold(rec, column)
        if lab[k] and y[k] != g:
            raise RawRecordError(rec.where, column, f"{i!r} was labelled {int(y[k])} before, now {g}")
        lab[k], y[k] = True, g
    return lab, y


def _gold(rec: Rec, column: str) -> int:
    v = rec.raw(column)
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float, np.integer, np.floating)) and v in (0, 1):
        return int(v)
    if isinstance(v, str) and v.strip() in ("0", "1", "0.0", "1.0"):
        return int(float(v))
    raise RawRecordError(rec.where, column, f"{v!r} is not 0 (supported) or 1 (hallucinated)")


# ---------------------------------------------------------------------------------------------- proposals


def propose(pool: Pool, budget: int, seed: int = 0, tau: float = 0.5, labelled: np.ndarray | None = None) -> dict:
    """The next items to label: each unlabelled item drawn independently with its active sampling probability
    (expected count ``budget``; already-labelled items are in the sample for certain), seeded; the document
    records every item's probability and status and the pool's fingerprint."""
    if isinstance(budget, bool) or int(budget) != budget or budget < 1:
        raise RateError(f"propose: budget {budget!r} (the number of items to label, after POOL) is not an integer ≥ 1")
    lab = np.zeros(len(pool), bool) if labelled is None else np.asarray(labelled, bool)
    pi = rates.sampling_probabilities(pool.p, int(budget), tau, ~lab)[0]
    take = rates.draw(pi, np.random.default_rng(seed), ~lab)[0]
    status = np.where(lab, 2, np.where(take, 1, 0))
    return {
        "kind": PROPOSAL_KIND,
        "version": PROPOSAL_VERSION,
        "pool": {"source": pool.source, "n": len(pool), "fingerprint": pool.fingerprint()},
        "design": {
            "rule": "Poisson sampling, π ∝ (1 − τ)·√(p(1 − p))/mean + τ, Σπ = budget, π ≤ 1 (Zrnic & Candès 2024)",
            "budget": int(budget),
            "tau": float(tau),
            "seed": int(seed),
        },
        "proposed": [str(i) for i in pool.item_ids[take]],
        "already_labelled": int(lab.sum()),
        "items": {
            "item_id": [str(i) for i in pool.item_ids],
            "pi": [float(v) for v in pi],
            "status": [STATUS[s] for s in status],
        },
    }


def write_proposal(doc: dict, path: str | Path) -> tuple[Path, Path]:
    """The proposal (JSON) and, beside it, ``<name>.labels.csv``: the proposed items with an empty gold column to
    fill in and read back with ``--labels``."""
    path = Path(path)
    if path.suffix != ".json":
        raise RateError(f"--proposal {path}: a proposal is written as .json")
    out = atomic_write_text(path, to_json(doc))
    template = template_path(path)
    atomic_write_text(template, "item_id,gold\n" + "".join(f"{_csv_cell(i)},\n" for i in doc["proposed"]))
    return out, template


def template_path(proposal: Path) -> Path:
    """Where :func:`write_proposal` writes a proposal's labels template: ``<name>.labels.csv`` beside it."""
    return proposal.with_name(proposal.stem + ".labels.csv")


def _csv_cell(s: str) -> str:
    return '"' + s.replace('"', '""') + '"' if any(c in s for c in ',"\n') else s


@dataclass
class Proposal:
    """A proposal read back against its pool: each item's probability and status (:data:`STATUS` index)."""

    source: str
    pi: np.ndarray
    status: np.ndarray

    @property
    def drawn(self) -> np.ndarray:
        return self.status > 0


def read_proposal(path: str | Path, pool: Pool) -> Proposal:
    """A proposal written by :func:`propose` for this very pool (same item ids), else one line saying why."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RateError(f"{path}: proposal file not found") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise RateError(f"{path}: not a proposal (unreadable JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("kind") != PROPOSAL_KIND:
        raise RateError(
            f"{path}: not a proposal of src.rate (kind {doc.get('kind') if isinstance(doc, dict) else None!r})"
        )
    if doc.get("version") != PROPOSAL_VERSION:
        raise RateError(f"{path}: proposal version {doc.get('version')!r}; this RAIM reads version {PROPOSAL_VERSION}")
    meta = doc.get("pool") or {}
    if meta.get("fingerprint") != pool.fingerprint():
        raise RateError(
            f"{path}: a proposal drawn from another pool ({meta.get('source')!r}, {meta.get('n')} items); "
            f"{pool.source} holds {len(pool)} items with other ids: propose again on this pool"
        )
    items = doc.get("items") or {}
    try:
        order = np.array([pool.index[str(i)] for i in items["item_id"]])
        pi_in, st_in = np.asarray(items["pi"], float), [STATUS.index(s) for s in items["status"]]
    except (KeyError, TypeError, ValueError) as e:
        raise RateError(f"{path}: field 'items': malformed ({type(e).__name__}: {e})") from None
    if len(order) != len(pool) or len(pi_in) != len(order) or len(st_in) != len(order):
        raise RateError(
            f"{path}: field 'items': {len(order)} ids, {len(pi_in)} probabilities, {len(st_in)} statuses "
            f"for a pool of {len(pool)}"
        )
    pi, status = np.empty(len(pool)), np.empty(len(pool), int)
    pi[order], status[order] = pi_in, st_in
    bad = ~((pi > 0) & (pi <= 1))
    if bad.any():
        raise RateError(
            f"{path}: item {pool.item_ids[np.argmax(bad)]!r}: field 'pi': {pi[np.argmax(bad)]!r} is "
            "not a probability in (0, 1]"
        )
    return Proposal(str(path), pi, status)


def check_against(proposal: Proposal, labelled: np.ndarray, pool: Pool, labels_source: str) -> None:
    """Labels read against a proposal: every drawn (or already labelled) item has one, no other item has."""
    extra = labelled & ~proposal.drawn
    if extra.any():
        raise RateError(
            f"{labels_source}: item {pool.item_ids[np.argmax(extra)]!r} has a label but "
            f"{proposal.source} did not draw it ({int(extra.sum())} such item(s)): the active estimate "
            "weights drawn items only; drop them, or estimate without --proposal"
        )
    missing = proposal.drawn & ~labelled
    if missing.any():
        raise RateError(
            f"{labels_source}: {int(missing.sum())} item(s) drawn by {proposal.source} have no label "
            f"(first: {pool.item_ids[np.argmax(missing)]!r}): the active estimate needs every drawn "
            "item's label (a label left out is not missing at random)"
        )


# ---------------------------------------------------------------------------------------------- estimates


def em_rates(f: np.ndarray, train_prevalence, level: float, tol: float = 1e-6, max_iter: int = 1000) -> rates.Rates:
    """The label-free EM prevalence (:func:`src.core.priorshift.estimate_rows`) per row, with the interval of the
    mixture likelihood's observed information (:func:`src.studies.monitor.prevalence_se`); ``valid=False``: it holds only
    under a pure prior shift with a calibrated stacker."""
    f = np.atleast_2d(f)
    t = np.broadcast_to(np.asarray(train_prevalence, dtype=float), f.shape)
    est = priorshift.estimate_rows(f, t, tol, max_iter)
    edge = np.clip(est, 1e-6, 1 - 1e-6)
    se = np.array([drift.prevalence_se(f[r], t[r], edge[r]) for r in range(len(f))])
    z = rates.z_value(level)
    return rates.Rates(
        "em",
        est,
        se,
        np.clip(est - z * se, 0, 1),
        np.clip(est + z * se, 0, 1),
        np.zeros(len(f), int),
        np.full(len(f), np.nan),
        None,
        False,
        level,
        ["label-free EM prevalence: valid only under a pure prior shift with a calibrated stacker"],
    )


def segment_rates(
    pool: Pool,
    idx: np.ndarray,
    labelled: np.ndarray,
    y: np.ndarray,
    proposal: Proposal | None,
    level: float,
    threshold: float,
) -> dict[str, rates.Rates]:
    """Every method on the items ``idx`` of the pool (labels: a uniform random sample, or the proposal's draw)."""
    f, lab, g = pool.p[idx], labelled[idx], y[idx]
    codes = rates.cluster_codes(None if pool.clusters is None else pool.clusters[idx])
    out = {"naive": rates.naive(f, threshold, codes, level)}
    if pool.train_prevalence is not None:
        out["em"] = em_rates(f, pool.train_prevalence, level)
    if proposal is None:
        out["classical"] = rates.classical(g, lab, codes, level)
        out["ppi"] = rates.ppi(g, f, lab, codes, level)
    else:
        cl = rates.active(g, f, lab, proposal.pi[idx], codes, level, lam=0.0)
        cl.method, cl.lam = "classical", None
        cl.notes = ["labels only, inverse-probability weighted (the proposal's π)"]
        out["classical"] = cl
        out["active"] = rates.active(g, f, lab, proposal.pi[idx], codes, level)
    return out


def estimate(
    pool: Pool,
    labelled: np.ndarray,
    y: np.ndarray,
    proposal: Proposal | None = None,
    level: float = 0.95,
    threshold: float = 0.5,
    min_labels: int = 10,
    labeller: str | None = None,
    labels_source: str = "labels",
) -> dict:
    """The rate of the pool and of each segment by every method (:func:`segment_rates`), as a document."""
    if proposal is not None:
        check_against(proposal, labelled, pool, labels_source)
    segs = [("all", np.arange(len(pool)))]
    if pool.segments is not None:
        segs += [(str(s), np.flatnonzero(pool.segments == s)) for s in sorted(set(pool.segments))]
    out = {}
    for name, idx in segs:
        n = int(labelled[idx].sum())
        if n < min_labels:
            where = "the pool" if name == "all" else f"segment {pool.segment_by}={name!r}"
            raise RateError(
                f"{where}: {n} labelled item(s), fewer than --min-labels {min_labels} for an interval: "
                "label more (python -m src.rate propose / plan), or merge segments"
            )
        methods = segment_rates(pool, idx, labelled, y, proposal, level, threshold)
        pos = int(np.nansum(y[idx][labelled[idx]]))
        notes = []
        if min(pos, n - pos) < FEW_POSITIVES:
            notes.append(
                f"only {min(pos, n - pos)} labelled item(s) of one class: the normal intervals may "
                "undercover (docs/rates.md)"
            )
        out[name] = {
            "items": int(len(idx)),
            "labels": n,
            "labelled_hallucinated": pos,
            "methods": {m: r.row() for m, r in methods.items()},
            "notes": notes,
        }
    who = labeller or "gold labels"
    return {
        "pool": {
            "source": pool.source,
            "items": len(pool),
            "fingerprint": pool.fingerprint(),
            "imputed_p": pool.imputed,
            "clusters": None if pool.clusters is None else int(len(set(pool.clusters))),
            "train_prevalence": pool.train_prevalence,
            "warnings": [] if pool.clusters is not None else [NO_CLUSTERS],
        },
        "estimand": ESTIMAND
        if labeller is None
        else ESTIMAND.replace("hallucinated items", f"items {labeller} calls hallucinated"),
        "labeller": who,
        "design": "active (proposal)" if proposal is not None else "uniform random sample (assumed)",
        "level": level,
        "threshold": threshold,
        "segments": out,
    }


def labeller_statement(doc: dict) -> str | None:
    """When the labels are a judge's verdicts: what the rate then means."""
    who = doc.get("labeller")
    if not who or who == "gold labels":
        return None
    return f"the labels are {who}'s verdicts: every rate here estimates what {who} would say on this traffic, not gold"


def text_table(doc: dict) -> str:
    """The estimate document as a plain table (one row per segment × method)."""
    rows = [("segment", "method", "rate", f"{round(100 * doc['level'])}% interval", "labels", "eff. labels", "")]
    for seg, d in doc["segments"].items():
        for m, r in d["methods"].items():
            note = "" if r["valid_interval"] else "no valid interval"
            lo, hi = (_num(v) for v in r["ci"])
            eff = "—" if r["effective_labels"] is None else f"{r['effective_labels']:.0f}"
            rows.append((seg, m, _num(r["estimate"]), f"[{lo}, {hi}]", str(r["labels"]), eff, note))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    extra = [f"note ({seg}): {n}" for seg, d in doc["segments"].items() for n in d["notes"]]
    if doc["pool"]["imputed_p"]:
        extra.append(
            f"note: {doc['pool']['imputed_p']} item(s) without a p (every member abstained) take p = "
            f"{IMPUTED_P} (a fixed predictor value: the estimates stay valid)"
        )
    extra += [f"warning: {w}" for w in doc["pool"].get("warnings", [])]
    st = labeller_statement(doc)
    return "\n".join(lines + extra + ([f"note: {st}"] if st else []) + [f"estimand: {doc['estimand']}"])


def _num(v) -> str:
    return "—" if v is None else f"{v:.4f}"


def plan_labels(
    pool: Pool,
    labelled: np.ndarray,
    y: np.ndarray,
    halfwidth: float,
    level: float = 0.95,
    tau: float = 0.5,
    proposal: Proposal | None = None,
    prevalence_guess: float | None = None,
    min_labels: int = 10,
) -> dict:
    """How many labels ``halfwidth`` needs on this pool per method (:func:`src.core.rates.plan`): from the labels
    in hand when there are at least ``min_labels`` (weighted by 1/π under a proposal); else from the stacker's
    posteriors under a prior shift to ``prevalence_guess`` (default: the EM estimate), which assumes the stacker
    is calibrated on this traffic — a plan, not a guarantee; the interval itself does not rest on it."""
    n = int(labelled.sum())
    if n >= min_labels:
        rows = np.flatnonzero(labelled)
        w = 1.0 / proposal.pi[rows] if proposal is not None else np.ones(len(rows))
        m, basis = y[rows], f"the {n} labels in hand"
    else:
        if pool.train_prevalence is None:
            raise RateError(
                f"plan: {n} labels in hand (fewer than --min-labels {min_labels}) and no training "
                "prevalence to read the posteriors with: pass --train-prevalence (0.5 for a stacker "
                "fitted on a balanced set) or label a first uniform sample"
            )
        guess = (
            priorshift.estimate(pool.p, pool.train_prevalence)
            if prevalence_guess is None
            else priorshift.check_prevalence(prevalence_guess, "--prevalence")
        )
        guess = min(max(guess, 1e-3), 1 - 1e-3)
        rows, w = np.arange(len(pool)), np.ones(len(pool))
        m = priorshift.adjust(pool.p, pool.train_prevalence, guess)
        basis = (
            f"the stacker's posteriors shifted to prevalence {guess:.3f} "
            f"({'given' if prevalence_guess is not None else 'EM estimate'}; assumes a calibrated stacker)"
        )
    p = rates.plan(pool.p, rows, m, halfwidth, level, w, tau)
    return {
        "halfwidth": p.halfwidth,
        "level": p.level,
        "labels": p.labels,
        "expected_halfwidth": p.expected_halfwidth,
        "narrowest_halfwidth": p.narrowest,
        "pool_needed": p.pool_needed,
        "prevalence": p.prevalence,
        "basis": basis,
        "pool": len(pool),
        "note": "for unclustered items; clustered traffic needs more (its design effect)",
    }


# ---------------------------------------------------------------------------------------------- the study


STUDY_KEYS = (
    "level",
    "pool",
    "replicates",
    "prevalences",
    "labels",
    "seed",
    "tau",
    "threshold",
    "simulations",
    "real",
    "labeller",
    "crosscheck",
    "em",
)
STUDY_METHODS = ("classical", "naive", "em", "ppi", "active")
WALD = ("ppi_wald", "active_wald")  # the papers' normal intervals from the same estimates (RAIM's default: Wilson)
BAND = (0.93, 0.97)  # the coverage band a valid 95 % interval should land in at R = 500 (± 2 Monte Carlo s.e.)


@dataclass
class Source:
    """A regime's traffic: ``draw(R, N, π, rng)`` → (p, gold, training prevalence per item, cluster codes)."""

    name: str
    kind: str
    description: str
    draw: Callable
    info: dict


def check_study(s: Mapping) -> None:
    """Refuse settings the study cannot run with, in one line naming the ``rate.*`` key."""
    missing = [k for k in STUDY_KEYS if k not in s]
    if missing:
        raise RateError(
            f"rate: missing setting(s) {missing} (conf/rate/default.yaml has them; a params.yaml older "
            "than it: regenerate it with `python -m src.track params`)"
        )
    for k in ("pool", "replicates"):
        v = s[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 10:
            raise RateError(f"rate.{k}={v!r}: must be an integer ≥ 10")
    for q in s["prevalences"]:
        priorshift.check_prevalence(q, "rate.prevalences")
    for n in s["labels"]:
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n < s["pool"]:
            raise RateError(f"rate.labels: {n!r} must be an integer in [2, rate.pool)")
    rates.z_value(s["level"])
    if not 0.0 <= float(s["tau"]) <= 1.0:
        raise RateError(f"rate.tau={s['tau']!r}: must be a share in [0, 1]")


def _class_draw(p: np.ndarray, t: np.ndarray, y: np.ndarray) -> Callable:
    """i.i.d. traffic from a set's class-conditional posteriors: class ~ Bernoulli(π), then an item of that class
    with replacement (module docstring)."""
    pos, neg = np.flatnonzero(y == 1), np.flatnonzero(y == 0)

    def draw(R: int, N: int, q: float, rng: np.random.Generator):
        gold = rng.random((R, N)) < q
        pick = np.where(gold, pos[rng.integers(0, len(pos), (R, N))], neg[rng.integers(0, len(neg), (R, N))])
        return p[pick], gold.astype(float), t[pick], None

    return draw


def real_sources(table, stacker, settings, labeller: tuple[str, str] | None) -> list[Source]:
    """Each dataset of ``table`` (its cross-fitted posteriors, :func:`src.studies.prevalence.posteriors`) and, with a
    ``labeller`` (name, how chosen), the same with that judge's verdicts as the labels and the other members as
    the panel (items where it abstained left out)."""
    out = []
    for name, t in table.by_dataset().items():
        folds = dataset_folds(t, settings)[name]
        p, tp = prevalence.posteriors(t, stacker, settings, folds)
        y = t.gold
        out.append(
            Source(
                name,
                "real",
                f"{name}: the committed verdicts' cross-fitted stacked p, gold labels",
                _class_draw(p, tp, y),
                {"n": int(len(y)), "members": list(t.members), "hallucinated_share": float(y.mean())},
            )
        )
        if labeller is None:
            continue
        judge, how = labeller
        if judge == t.frontier_name and t.has_frontier:
            verdict, cheap = t.frontier, list(t.members)
        elif judge in t.members:
            verdict, cheap = t.votes[:, t.members.index(judge)], [m for m in t.members if m != judge]
        else:
            continue
        keep = verdict != ABSTAIN
        sub = t.subset(keep, cheap)
        sub_folds = dataset_folds(sub, settings)[name]
        pc, tpc = prevalence.posteriors(sub, stacker, settings, sub_folds)
        yl = verdict[keep].astype(int)
        if yl.min() == yl.max():
            continue
        out.append(
            Source(
                f"{name}-{judge}",
                "labeller",
                f"{name}: {judge} ({how}) as the labeller, the other members' stacked p: estimates what "
                f"{judge} would say",
                _class_draw(pc, tpc, yl),
                {
                    "n": int(keep.sum()),
                    "labeller": judge,
                    "chosen_as": how,
                    "members": cheap,
                    "labeller_share": float(yl.mean()),
                },
            )
        )
    return out


def simulated_source(spec: Mapping, stacker) -> Source:
    """A simulated regime: a stacker fitted on a balanced calibration panel (:func:`src.studies.simulate.table`), traffic
    from the same Gaussian-copula panel (:func:`src.studies.simulate.copula_errors`) with its own accuracies when the
    spec has ``traffic_accuracies``, items in clusters of ``cluster_size`` sharing a latent hallucination
    (``icc_gold``) and difficulty (``icc_difficulty``) when given."""
    name = str(spec["name"])
    acc = list(spec["accuracies"])
    rho, ab = float(spec["rho"]), float(spec.get("abstain_rate", 0.0))
    calib = simulate.table(
        f"rate regime {name}",
        n_clusters=int(spec.get("n_clusters", 500)),
        per_cluster=2,
        accuracies=acc,
        rho=rho,
        abstain_rate=ab,
        dataset=name,
        seed=int(spec.get("seed", 0)),
    )
    fitted = clone(stacker).set_params(n_votes=len(acc)).fit(calib.votes, calib.gold)
    traffic = np.asarray(spec.get("traffic_accuracies") or acc, dtype=float)
    m = int(spec.get("cluster_size") or 1)
    icc_y, icc_z = float(spec.get("icc_gold", 0.0)), float(spec.get("icc_difficulty", 0.0))
    t0 = float(fitted.train_prevalence_)

    def shared(rng, R, N, icc):
        g = -(-N // m)
        return np.sqrt(icc) * np.repeat(rng.standard_normal((R, g)), m, axis=1)[:, :N] + np.sqrt(
            1 - icc
        ) * rng.standard_normal((R, N))

    def draw(R: int, N: int, q: float, rng: np.random.Generator):
        gold = (shared(rng, R, N, icc_y) > norm.ppf(1 - q)) if m > 1 else (rng.random((R, N)) < q)
        z = shared(rng, R, N, icc_z) if m > 1 else rng.standard_normal((R, N))
        eps = rng.standard_normal((R, N, len(traffic)))
        err = simulate.copula_errors(z[..., None], eps, traffic, rho)
        g = gold[..., None].astype(float)
        votes = np.where(err, 1 - g, g)
        votes[rng.random(votes.shape) < ab] = ABSTAIN
        p = fitted.predict_proba(votes.reshape(-1, len(traffic)))[:, 1].reshape(R, N)
        codes = np.arange(N) // m if m > 1 else None
        return p, gold.astype(float), np.full((R, N), t0), codes

    what = spec.get("description") or name
    return Source(
        name,
        "simulated",
        str(what),
        draw,
        {
            "accuracies": acc,
            "traffic_accuracies": list(traffic),
            "rho": rho,
            "abstain_rate": ab,
            "cluster_size": m,
            "icc_gold": icc_y,
            "icc_difficulty": icc_z,
            "calibration_kappa": float(kappa(calib.gold, fitted.predict(calib.votes).astype(float))),
        },
    )


def uniform_labels(R: int, N: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Exactly ``n`` items of each row labelled, a uniform draw without replacement (a mask)."""
    keys = rng.random((R, N))
    idx = np.argpartition(keys, n - 1, axis=1)[:, :n]
    mask = np.zeros((R, N), bool)
    np.put_along_axis(mask, idx, True, axis=1)
    return mask


def method_summary(r: rates.Rates, truth: float, share: np.ndarray, n: int, classical_width: float | None) -> dict:
    """A method's replicates in one cell: coverage of θ (and its Monte Carlo s.e.) and of the pool's own share,
    median width and its ratio to the classical median width, median effective labels and their multiplier over
    n, bias and RMSE of the point estimate, mean labels used."""
    cov = (r.lo <= truth) & (truth <= r.hi)
    c = float(cov.mean())
    width = float(np.median(r.width))
    eff = r.effective_labels
    n_eff = float(np.nanmedian(eff)) if np.isfinite(eff).any() else None
    return {
        "coverage": c,
        "coverage_se": float(np.sqrt(c * (1 - c) / len(cov))),
        "coverage_pool": float(((r.lo <= share) & (share <= r.hi)).mean()),
        "width": width,
        "width_rel": width / classical_width if classical_width else None,
        "effective_labels": n_eff,
        "multiplier": n_eff / n if n_eff is not None and n else None,
        "bias": float(np.mean(r.estimate - truth)),
        "rmse": float(np.sqrt(np.mean((r.estimate - truth) ** 2))),
        "labels_mean": float(np.mean(r.labels)),
        "valid_interval": r.valid,
    }


def _ppi_py_check(f, gold, lab, mine: rates.Rates, level: float, k: int, truth: float) -> dict | None:
    """``ppi_py.ppi_mean_ci`` on the first ``k`` replicates: the largest difference from
    RAIM's PPI++ (estimate, unclipped bounds) and its coverage there."""
    try:
        with warnings.catch_warnings():  # ppi_py switches every warning off when imported
            import ppi_py  # optional reference (the dev extra): imported only when the study cross-checks
    except ImportError:
        return None
    z = rates.z_value(level)
    diffs, cover = [], []
    for r in range(min(k, len(f))):
        L = lab[r]
        lo, hi = (float(v[0]) for v in ppi_py.ppi_mean_ci(gold[r, L], f[r, L], f[r, ~L], alpha=1 - level))
        est = float(mine.estimate[r])
        diffs.append(max(abs((lo + hi) / 2 - est), abs(lo - (est - z * mine.se[r])), abs(hi - (est + z * mine.se[r]))))
        cover.append(lo <= truth <= hi)
    return {"replicates": len(diffs), "max_abs_diff": float(max(diffs)), "coverage": float(np.mean(cover))}


def _cje_check(f, gold, lab, codes, level: float, k: int, truth: float, classical_width: float) -> dict | None:
    """``cje.calibrated_mean_ci`` (cluster-robust) on the first ``k`` replicates: coverage, median width."""
    try:
        from cje import calibrated_mean_ci  # optional reference (the dev extra): only when the study compares
    except ImportError:
        return None
    cover, width, est = [], [], []
    quiet = logging.getLogger("cje")
    level_before = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        for r in range(min(k, len(f))):
            labels = np.where(lab[r], gold[r], np.nan)
            with (
                warnings.catch_warnings(),
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                warnings.simplefilter("ignore")
                res = calibrated_mean_ci(
                    f[r], labels, cluster_ids=None if codes is None else codes, alpha=1 - level, seed=r
                )
            lo, hi = float(res.ci[0]), float(res.ci[1])
            cover.append(lo <= truth <= hi)
            width.append(hi - lo)
            est.append(float(res.estimate))
    finally:
        quiet.setLevel(level_before)
    w = float(np.median(width))
    return {
        "replicates": len(cover),
        "coverage": float(np.mean(cover)),
        "width": w,
        "width_rel": w / classical_width if classical_width else None,
        "bias": float(np.mean(np.asarray(est) - truth)),
    }


def study_cell(src: Source, q: float, s: Mapping, rng: np.random.Generator) -> dict:
    """One regime at one prevalence: ``replicates`` pools, their label-free estimates, then per label count the
    uniform and the active draws and every method's summary (:func:`method_summary`), with the references."""
    R, N, level = int(s["replicates"]), int(s["pool"]), float(s["level"])
    f, gold, T, codes = src.draw(R, N, q, rng)
    share = gold.mean(axis=1)
    free = {
        "naive": rates.naive(f, float(s["threshold"]), codes, level),
        "em": em_rates(f, T, level, float(s["em"]["tol"]), int(s["em"]["max_iter"])),
    }
    cc = s["crosscheck"]
    out = {}
    for n in s["labels"]:
        lab = uniform_labels(R, N, int(n), rng)
        res = {
            "classical": rates.classical(gold, lab, codes, level),
            **free,
            "ppi": rates.ppi(gold, f, lab, codes, level),
        }
        pi = rates.sampling_probabilities(f, int(n), float(s["tau"]))
        act = rates.draw(pi, rng)
        short = act.sum(axis=1) < 2  # a draw of fewer than two labels has no interval: draw that row again
        while short.any():
            act[short] = rates.draw(pi[short], rng)
            short = act.sum(axis=1) < 2
        res["active"] = rates.active(gold, f, act, pi, codes, level)
        res["ppi_wald"] = rates.ppi(gold, f, lab, codes, level, interval="wald")
        res["active_wald"] = rates.active(gold, f, act, pi, codes, level, interval="wald")
        cw = float(np.median(res["classical"].width))
        cell = {"methods": {m: method_summary(res[m], q, share, int(n), cw) for m in STUDY_METHODS + WALD}}
        if codes is not None:  # the same PPI++ with the item-level variance: what ignoring the clusters gives
            cell["ppi_ignoring_clusters"] = method_summary(rates.ppi(gold, f, lab, None, level), q, share, int(n), cw)
        check = _ppi_py_check(
            f,
            gold,
            lab,
            res["ppi"] if codes is None else rates.ppi(gold, f, lab, None, level),
            level,
            int(cc["ppi_py"]),
            q,
        )
        if check is not None:
            check["same_estimator"] = codes is None  # with clusters ppi_py's variance is the item-level one
            cell["ppi_py"] = check
        cj = cc.get("cje") or {}
        if (
            int(cj.get("replicates", 0))
            and int(n) in list(cj.get("labels") or [])
            and any(abs(q - float(x)) < 1e-12 for x in cj.get("prevalences") or [])
        ):
            k = int(cj["replicates"])
            got = _cje_check(f, gold, lab, codes, level, k, q, cw)
            if got is not None:
                sub = rates.Rates(
                    "ppi",
                    *(getattr(res["ppi"], a)[:k] for a in ("estimate", "se", "lo", "hi", "labels", "effective_labels")),
                )
                got["raim_ppi_same_replicates"] = method_summary(sub, q, share[:k], int(n), cw)
                cell["cje"] = got
        out[str(n)] = cell
    return {"prevalence": q, "share_mean": float(share.mean()), "labels": out}


def study(table, stacker, settings, s: Mapping, labeller: tuple[str, str] | None = None) -> dict:
    """The rate study (module docstring) on the simulated regimes of ``s['simulations']`` and, when ``s['real']``
    and a ``table`` is given, its datasets (and their labeller variants)."""
    check_study(s)
    sources = [simulated_source(spec, stacker) for spec in s["simulations"] or []]
    if s["real"] and table is not None:
        sources += real_sources(table, stacker, settings, labeller)
    rng = np.random.default_rng(int(s["seed"]))
    doc: dict[str, Any] = {}
    bar = tqdm(total=len(sources) * len(s["prevalences"]), desc="rate", unit="cell", mininterval=2.0)
    for src in sources:
        cells = {}
        for q in s["prevalences"]:
            cells[f"{float(q):g}"] = study_cell(src, float(q), s, np.random.default_rng(rng.integers(2**63)))
            bar.update()
        doc[src.name] = {"kind": src.kind, "description": src.description, "info": src.info, "cells": cells}
    bar.close()
    return {
        "settings": {k: v for k, v in s.items() if k not in ("output", "figure")},
        "estimand": ESTIMAND,
        "band": list(BAND),
        "regimes": doc,
        "summary": summary(doc),
        "crosscheck": crosscheck(doc),
    }


def _cells(reg: dict):
    for q, c in reg["cells"].items():
        for n, cell in c["labels"].items():
            yield q, n, cell


def summary(regimes: dict) -> dict:
    """Per regime and method over its (prevalence × labels) cells: mean, min and max coverage, the cells inside
    the band, median width, median width relative to classical, median effective labels and multiplier."""
    out = {}
    for name, reg in regimes.items():
        per = {}
        for m in STUDY_METHODS + WALD:
            got = [cell["methods"][m] for _, _, cell in _cells(reg)]
            cov = [g["coverage"] for g in got]
            rel = [g["width_rel"] for g in got if g["width_rel"] is not None]
            eff = [g["effective_labels"] for g in got if g["effective_labels"] is not None]
            mul = [g["multiplier"] for g in got if g["multiplier"] is not None]
            per[m] = {
                "coverage": float(np.mean(cov)),
                "coverage_min": float(min(cov)),
                "coverage_max": float(max(cov)),
                "cells": len(cov),
                "cells_in_band": int(sum(BAND[0] <= c <= BAND[1] for c in cov)),
                "cells_below": int(sum(c < BAND[0] for c in cov)),
                "width": float(np.median([g["width"] for g in got])),
                "width_rel": float(np.median(rel)) if rel else None,
                "effective_labels": float(np.median(eff)) if eff else None,
                "multiplier": float(np.median(mul)) if mul else None,
            }
        out[name] = per
    return out


def crosscheck(regimes: dict) -> dict:
    """The references over every cell: the largest |RAIM − ppi_py| where they are the same estimator, ppi_py's
    coverage where the items are clustered, and cje's coverage and width beside RAIM's PPI++ on the same
    replicates."""
    same = [
        cell["ppi_py"]["max_abs_diff"]
        for reg in regimes.values()
        for _, _, cell in _cells(reg)
        if cell.get("ppi_py", {}).get("same_estimator")
    ]
    clustered = {
        name: [cell["ppi_py"]["coverage"] for _, _, cell in _cells(reg) if "ppi_py" in cell]
        for name, reg in regimes.items()
        if any(not cell.get("ppi_py", {}).get("same_estimator", True) for _, _, cell in _cells(reg))
    }
    cje = {}
    for name, reg in regimes.items():
        for q, n, cell in _cells(reg):
            if "cje" in cell:
                c = cell["cje"]
                cje[f"{name}/p{q}/n{n}"] = {
                    "cje_coverage": c["coverage"],
                    "cje_width_rel": c["width_rel"],
                    "raim_ppi_coverage": c["raim_ppi_same_replicates"]["coverage"],
                    "raim_ppi_width_rel": c["raim_ppi_same_replicates"]["width_rel"],
                    "replicates": c["replicates"],
                }
    return {
        "ppi_py": {
            "cells": len(same),
            "max_abs_diff": max(same) if same else None,
            "clustered_coverage": {k: {"min": min(v), "mean": float(np.mean(v))} for k, v in clustered.items() if v},
        },
        "cje": cje,
    }


def statements(doc: dict) -> list[str]:
    """The study's plain conclusions, from its numbers (the log, the report, docs/rates.md)."""
    lines = []
    for name, per in doc["summary"].items():
        parts = []
        for m in STUDY_METHODS:
            d = per[m]
            w = "" if d["width_rel"] is None or m == "classical" else f", width {d['width_rel']:.2f}× classical"
            e = "" if d["multiplier"] is None or m == "classical" else f", {d['multiplier']:.2f}× the labels"
            parts.append(
                f"{m} coverage {d['coverage_min']:.3f}–{d['coverage_max']:.3f} ({d['cells_in_band']} of "
                f"{d['cells']} cells in {BAND[0]:.2f}–{BAND[1]:.2f}){w}{e}"
            )
        lines.append(f"{name}: " + "; ".join(parts))
    pp = doc["crosscheck"]["ppi_py"]
    if pp["max_abs_diff"] is not None:
        lines.append(
            f"ppi_py.ppi_mean_ci: largest difference from RAIM's PPI++ {pp['max_abs_diff']:.1e} over "
            f"{pp['cells']} cells"
        )
    for name, c in pp["clustered_coverage"].items():
        lines.append(f"{name}: ppi_py (item-level variance) covers {c['mean']:.3f} on average (min {c['min']:.3f})")
    return lines
