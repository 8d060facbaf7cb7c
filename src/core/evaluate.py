"""Metrics, paired cluster bootstrap and the calls of §2 (Table 1, Tables 15–17, Appendix K).

Predictions are float vectors in {0, 1, 0.5}; 0.5 is an abstention. Following §2:

* Cohen's κ excludes abstentions;
* balanced accuracy counts an abstention as an error of its item's own class;
* hallucinated-class F1 counts an abstention as a missed detection.

Every metric is computed from six confusion counts per item (gold × {1, 0, abstain}), so a bootstrap is one
matrix product: cluster resampling weights (B × clusters) times per-cluster counts (clusters × (2 + 4·P): each
gold class's items, then four of the six cells per prediction, the other two following by subtraction), taken in
chunks of draws when B × clusters weights would not fit in :data:`MAX_WEIGHT_BYTES`. Every term is a whole number,
so the product is exact in any summation order (in float32 while the largest count stays under 2²⁴). Where the
items take few distinct rows of values (a panel's verdicts: a few thousand among 250,000 items), the product is
taken through the rows instead (:class:`RowTable`): each draw's count of items per row, times the rows' values —
the same whole numbers, for a fraction of the work and without the clusters × q table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from src.core import compiled
from src.core.verdicts import ABSTAIN

METRICS = ("kappa", "bacc", "f1")
# count columns: gold=1 & pred=1, gold=1 & pred=0, gold=1 & abstain, gold=0 & pred=1, gold=0 & pred=0, gold=0 & abstain
_N_COUNTS = 6
# B × clusters bootstrap weights up to this size are drawn once and kept; larger ones are drawn again, chunk by
# chunk of draws, on every pass (same numbers: one generator, consumed in draw order). A chunk is drawn while the
# analysis's threads refit the one before (src.core.threads): two are alive at once, hence half of 64 MiB.
MAX_WEIGHT_BYTES = 32 * 2**20
# such a chunk holds a whole number of blocks of this many draws where it holds one at all: the refit bootstrap's
# parts of a chunk (src.core.refit.MIN_CHUNK) then all hold this many, none a short remainder that costs a part's
# fixed work for a few draws (2,000 draws of 125,000 clusters: 16 chunks of 128, not 15 of 134 split 64 + 64 + 6)
CHUNK_BLOCK = 64
# from this many picks per call multiplicities() counts them in a compiled loop (numba's import: ~0.4 s, once)
COMPILE_PICKS = 2**22
# A deployed judge must answer every item: a single judge's abstention is its score ½ (§2's encoding of an
# abstention), cut at 0.5 like every probability here (p ≥ 0.5 → hallucinated), so it is answered "hallucinated".
FALLBACK = 1.0
_KEPT = [0, 2, 3, 5]  # the cells a bootstrap sums per prediction; (1, 0) and (0, 0) follow from the class totals


def indicators(gold: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """Per-item one-hot of the six confusion cells: n × 6 for one prediction vector, n × P × 6 for P (n × P)."""
    gold = np.asarray(gold)
    pred = np.asarray(pred, dtype=float)
    if pred.ndim == 2:
        gold = gold[:, None]
    ab = pred == ABSTAIN
    g1, g0 = gold == 1, gold == 0
    p1, p0 = (pred == 1) & ~ab, (pred == 0) & ~ab
    return np.stack([g1 & p1, g1 & p0, g1 & ab, g0 & p1, g0 & p0, g0 & ab], axis=-1).astype(float)


def from_counts(c: np.ndarray) -> dict[str, np.ndarray]:
    """κ, bacc and F1 from confusion counts (last axis = the six cells); vectorised over leading axes.

    An undefined κ (no voted item, or chance agreement of 1) is reported as 0, never NaN.
    """
    a11, a10, a1a, a01, a00, a0a = np.moveaxis(c, -1, 0)
    n = a11 + a10 + a01 + a00
    with np.errstate(divide="ignore", invalid="ignore"):
        po = (a11 + a00) / n
        pe = ((a11 + a01) * (a11 + a10) + (a10 + a00) * (a01 + a00)) / n**2
        kap = np.where((n > 0) & (pe < 1), (po - pe) / (1 - pe), 0.0)
        r1 = np.where(a11 + a10 + a1a > 0, a11 / (a11 + a10 + a1a), 0.0)
        r0 = np.where(a00 + a01 + a0a > 0, a00 / (a00 + a01 + a0a), 0.0)
        den = 2 * a11 + a01 + a10 + a1a
        f1 = np.where(den > 0, 2 * a11 / den, 0.0)
    return {"kappa": np.nan_to_num(kap), "bacc": 0.5 * (r1 + r0), "f1": f1}


def scores(gold: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """κ, bacc, F1 of one prediction vector on the full sample."""
    return {k: float(v) for k, v in from_counts(indicators(gold, pred).sum(axis=0)).items()}


def kappa(gold: np.ndarray, pred: np.ndarray) -> float:
    return scores(gold, pred)["kappa"]


def coverage(votes: np.ndarray) -> np.ndarray:
    """Share of items with a parseable verdict, per column (Table 22)."""
    return (np.asarray(votes) != ABSTAIN).mean(axis=0)


# ------------------------------------------------------------------------------------------------ bootstrap


def classes(codes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The items' classes under the joint value of per-item integer ``codes`` (each ≥ 0), numbered in the
    lexicographic order of the codes: (each item's class, one item of each class). One integer key per item, its
    range compressed whenever the next code would overflow it."""
    n = len(codes[0]) if codes else 0
    key, size = np.zeros(n, np.int64), 1
    for c in codes:
        width = int(c.max()) + 1 if n else 1
        if size * width >= 2**62:
            key, _ = _compress(key, size)
            size = int(key.max()) + 1
        key, size = key * width + c, size * width
    return _compress(key, size)


def _compress(key: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Integer keys in [0, size) renumbered 0, 1, … in their order (each key's number, one index of each number):
    by a table over the range when it is small, else by a sort."""
    if size > 4 * len(key) + 1024:
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        return inv.ravel(), first
    present = np.zeros(size, bool)
    present[key] = True
    number = np.cumsum(present) - 1
    some = np.empty(int(present.sum()), np.int64)
    some[number[key]] = np.arange(len(key))
    return number[key], some


def distinct_rows(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of X in lexicographic order and each item's row index (``np.unique(X, axis=0,
    return_inverse=True)``, by one sort per column of its distinct values instead of a sort of whole rows)."""
    X = np.asarray(X, float)
    cols = [X[:, j] for j in range(X.shape[1])]
    inv, some = classes([np.searchsorted(np.unique(c), c) for c in cols])
    return X[some], inv


def multiplicities(rng: np.random.Generator, n_draws: int, n_clusters: int, dtype=np.float32) -> np.ndarray:
    """``n_draws`` × ``n_clusters`` cluster multiplicities: per draw, ``n_clusters`` clusters picked uniformly
    with replacement and counted — a Multinomial(n_clusters, 1/n_clusters) vector.

    Each pick is ⌊u·n_clusters⌋ of one uniform double u (uniform to within 2⁻⁵³), so the generator is consumed one
    64-bit word per pick, in draw order: any split into chunks gives the same draws. From :data:`COMPILE_PICKS`
    picks on, a compiled loop counts them as they come (:func:`_count_picks`); otherwise numpy builds a block of
    rows at a time, its temporaries under half of :data:`MAX_WEIGHT_BYTES`. The same numbers either way.
    """
    out = np.zeros((n_draws, n_clusters), dtype=dtype)
    kernel = compiled.njit(_count_picks) if n_draws * n_clusters >= COMPILE_PICKS else None
    if kernel is not None:
        kernel(rng, out)
        return out
    rows = max(1, MAX_WEIGHT_BYTES // (48 * max(n_clusters, 1)))
    for a in range(0, n_draws, rows):
        m = min(rows, n_draws - a)
        u = rng.random((m, n_clusters))
        u *= n_clusters
        picks = u.astype(np.intp)
        picks += np.arange(0, m * n_clusters, n_clusters)[:, None]
        out[a : a + m] = np.bincount(picks.ravel(), minlength=m * n_clusters).reshape(m, n_clusters)
    return out


def transposed(w: np.ndarray, block: int = 32):
    """The draws' weights (draws × clusters) as C-contiguous clusters × draws blocks of ``block`` draws, in draw
    order: what a sparse (classes × clusters) product reads (a block's copy, not the whole chunk's)."""
    for a in range(0, len(w), block):
        yield np.ascontiguousarray(w[a : a + block].T)


def class_counts(by_class: sparse.spmatrix, w: np.ndarray, block: int = 32) -> np.ndarray:
    """Each draw's count of items in each class (draws × classes) from ``by_class`` (classes × clusters: each
    cluster's items in each class) and the draws' multiplicities ``w`` (draws × clusters), ``block`` draws at a time
    (:func:`transposed`), in the weights' dtype: whole numbers, exact (:class:`ClusterBootstrap` keeps float32 only
    while every count stays under 2²⁴)."""
    A = by_class.astype(w.dtype, copy=False)
    return np.vstack([(A @ wt).T for wt in transposed(w, block)])


@dataclass(frozen=True)
class RowTable:
    """Per-item values given by rows, for :meth:`ClusterBootstrap.sweep`: ``by_row`` (rows × clusters, sparse CSC:
    each cluster's items on each row) and ``values`` (rows × q). A draw's sums are its count of items on each row
    (:func:`class_counts`) times the values: items + rows × q products per draw, where a per-cluster table
    (:meth:`ClusterBootstrap.cluster_sums`) costs clusters × q, and no clusters × q table is held. Built by
    :meth:`ClusterBootstrap.row_table` only for whole-number values whose every sum is exact in the weights' dtype,
    so both give the same numbers."""

    by_row: sparse.csc_matrix
    values: np.ndarray

    def sums(self, wt: np.ndarray) -> np.ndarray:
        """Each draw's sums (draws × q) from a block of the draws' weights, transposed (:func:`transposed`)."""
        return (self.by_row @ wt).T @ self.values


def _count_picks(rng: np.random.Generator, out: np.ndarray) -> None:
    """:func:`multiplicities`' picks, one uniform double each, counted into ``out`` (draws × clusters, zeros) in
    draw order (written to compile: :func:`src.core.compiled.njit`)."""
    n_draws, n_clusters = out.shape
    for b in range(n_draws):
        row = out[b]
        for _ in range(n_clusters):
            row[int(rng.random() * n_clusters)] += 1


def _chunk_draws(room: int) -> int:
    """Draws per chunk when ``room`` draws' weights fit in :data:`MAX_WEIGHT_BYTES`: a whole number of
    :data:`CHUNK_BLOCK` draws where that many fit, else ``room``."""
    return room - room % CHUNK_BLOCK if room >= CHUNK_BLOCK else room


def _row_sums(w: np.ndarray, rows: list[tuple[list, RowTable]]) -> None:
    """Each :class:`RowTable`'s sums of the draws w appended to its list, block by block of transposed draws."""
    for wt in transposed(w) if rows else ():
        for o, m in rows:
            o.append(m.sums(wt))


class ClusterBootstrap:
    """Paired cluster bootstrap (§2): B draws of whole clusters with replacement, shared by every comparator.

    Draw b is a multinomial vector of cluster multiplicities (:func:`multiplicities`); an item's
    weight in a draw is its cluster's. Percentile intervals. The draws come from one generator in draw order, so
    the first B' draws of a B-draw bootstrap are the B'-draw bootstrap of the same seed (:meth:`head`), and draws
    made chunk by chunk equal draws made at once: the weights are kept when they fit in
    :data:`MAX_WEIGHT_BYTES`, otherwise drawn again in chunks of ``chunk`` draws on each pass (bounded memory).
    """

    def __init__(self, clusters: np.ndarray, n_boot: int = 2000, seed: int = 0, chunk: int | None = None):
        self.cluster_ids, inv = np.unique(np.asarray(clusters), return_inverse=True)
        self.item_cluster = inv.ravel()
        self.n_boot, self.seed = int(n_boot), seed
        nc, n = len(self.cluster_ids), len(self.item_cluster)
        # a count is at most n_clusters draws × the largest cluster: whole numbers up to 2²⁴ are exact in float32
        self.largest = int(np.bincount(self.item_cluster).max()) if n else 0
        self.dtype = np.float32 if nc * self.largest < 2**24 else np.float64
        room = int(chunk or max(1, MAX_WEIGHT_BYTES // (np.dtype(self.dtype).itemsize * max(nc, 1))))
        self.chunk = room if chunk else _chunk_draws(room)
        self._agg = sparse.csr_matrix((np.ones(n), (self.item_cluster, np.arange(n))), shape=(nc, n))
        self._weights = next(self._draws(self.n_boot)) if self.n_boot <= room else None

    def _draws(self, chunk: int):
        """Weight chunks (≤ ``chunk`` draws × n_clusters), in draw order, from a fresh generator."""
        rng = np.random.default_rng(self.seed)
        for start in range(0, self.n_boot, chunk):
            yield multiplicities(rng, min(chunk, self.n_boot - start), len(self.cluster_ids), self.dtype)

    def chunks(self):
        """The B × n_clusters weights, as one kept matrix or chunk by chunk of draws."""
        if self._weights is not None:
            yield self._weights
        else:
            yield from self._draws(self.chunk)

    @property
    def weights(self) -> np.ndarray:
        """All B × n_clusters weights (built here when they are not kept)."""
        return self._weights if self._weights is not None else np.vstack(list(self.chunks()))

    def head(self, n_boot: int) -> ClusterBootstrap:
        """The first ``n_boot`` draws, without drawing again: the ``n_boot``-draw bootstrap of this seed."""
        if n_boot > self.n_boot:
            raise ValueError(f"head({n_boot}) of a {self.n_boot}-draw bootstrap")
        out = object.__new__(ClusterBootstrap)
        out.__dict__.update(self.__dict__, n_boot=int(n_boot))
        if self._weights is not None:
            out._weights = self._weights[:n_boot]
        return out

    def sums(self, per_item: np.ndarray) -> np.ndarray:
        """Each draw's weighted sums of per-item values (n × …) → B × … (a custom statistic's bootstrap: each
        cluster's sum, times its multiplicity in the draw)."""
        per_item = np.asarray(per_item, dtype=float)
        out = self.sweep([self.cluster_sums(per_item.reshape(len(self.item_cluster), -1))])[0]
        return out.reshape((len(out),) + per_item.shape[1:])

    def cluster_sums(self, values: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Each cluster's sums → n_clusters × q: of per-item ``values`` (n × q), or, with ``rows`` (each item's row),
        of the rows' values ``values[rows]`` (values: rows × q; the n × q array is never built). Summed in the
        weights' dtype where the values are whole numbers that no draw can sum past 2²⁴ (n_clusters × the largest
        cluster × the largest value: then every draw's sums are exact, as the counts are), else in float64."""
        values = np.asarray(values, dtype=float)
        top = np.abs(values).max(initial=0)
        whole = np.array_equal(values, np.round(values)) and len(self.cluster_ids) * self.largest * top < 2**24
        dtype = self.dtype if whole else np.float64
        if rows is None:
            agg = self._agg
        else:
            shape = (len(self.cluster_ids), len(values))
            agg = sparse.csr_matrix((np.ones(len(rows)), (self.item_cluster, rows)), shape=shape)
        return agg.astype(dtype) @ values.astype(dtype)

    def row_table(self, values: np.ndarray, rows: np.ndarray) -> RowTable | np.ndarray:
        """What :meth:`sweep` sums for per-item values given by rows (each item's row ``rows``, the rows' ``values``:
        rows × q): a :class:`RowTable` where that is exact and cheaper — whole-number values that no draw can sum
        past 2²⁴, and fewer products per draw (items + rows × q against clusters × q) — else the per-cluster table
        of :meth:`cluster_sums`. The same sums either way."""
        values = np.asarray(values, dtype=float)
        nc, q = len(self.cluster_ids), values.shape[1]
        top = np.abs(values).max(initial=0)
        whole = np.array_equal(values, np.round(values)) and nc * self.largest * top < 2**24
        if not whole or len(rows) + len(values) * q >= nc * q:
            return self.cluster_sums(values, rows)
        by_row = sparse.csc_matrix(
            (np.ones(len(rows), self.dtype), (rows, self.item_cluster)), shape=(len(values), nc)
        )  # duplicates summed: each cluster's items on each row
        return RowTable(by_row, values.astype(self.dtype))

    def sweep(self, tables: list[np.ndarray | RowTable], readers: tuple = ()) -> list[np.ndarray]:
        """One pass over the draws: each draw's sums (B × q, float64) of each table — a per-cluster matrix
        (n_clusters × q) weighted by its multiplicities, or a :class:`RowTable` — ; every chunk of weights is also
        handed to each of ``readers`` (e.g. :class:`src.core.refit.DrawReader`'s ``add``), so they read the same draws
        without drawing them again."""
        out: list[list[np.ndarray]] = [[] for _ in tables]
        rows = [(o, m) for o, m in zip(out, tables) if isinstance(m, RowTable)]
        for w in self.chunks():
            for o, m in zip(out, tables):
                if not isinstance(m, RowTable):
                    o.append(w @ m)
            _row_sums(w, rows)  # one block's transposed copy at a time, none held while the readers read
            for read in readers:
                read(w)
            del w  # before the next chunk is drawn: one chunk of weights in memory, not two
        return [np.vstack(o).astype(float) for o in out]

    def item_weights(self) -> np.ndarray:
        """B × n item multiplicities (for tests and for custom statistics)."""
        return self.weights[:, self.item_cluster]

    def per_cluster(self, gold: np.ndarray, preds: np.ndarray) -> np.ndarray:
        """Counts of each cluster for P prediction vectors (preds: n × P) → n_clusters × (2 + 4P): its items of
        gold 1 and of gold 0, then per prediction the cells (1, 1), (1, abstain), (0, 1), (0, abstain) of
        :func:`indicators`; from the distinct (gold, predictions) rows (:meth:`cluster_sums`), so no per-item
        indicators are built."""
        return self.cluster_sums(*_count_rows(gold, preds)).astype(self.dtype)

    def per_row(self, gold: np.ndarray, preds: np.ndarray) -> RowTable | np.ndarray:
        """:meth:`per_cluster`'s counts as :meth:`sweep` reads them, through the distinct (gold, predictions) rows
        where that is cheaper (:meth:`row_table`): the same sums."""
        return self.row_table(*_count_rows(gold, preds))

    def counts(self, gold: np.ndarray, preds: np.ndarray) -> np.ndarray:
        """Bootstrap confusion counts for P prediction vectors (preds: n × P) → B × P × 6."""
        return self.unpack(self.sweep([self.per_cluster(gold, preds)])[0])

    @staticmethod
    def unpack(raw: np.ndarray) -> np.ndarray:
        """The draws' sums of :meth:`per_cluster` (B × (2 + 4P)) as confusion counts, B × P × 6."""
        n1, n0 = raw[:, :1], raw[:, 1:2]
        a11, a1a, a01, a0a = np.moveaxis(raw[:, 2:].reshape(len(raw), -1, 4), -1, 0)
        return np.stack([a11, n1 - a11 - a1a, a1a, a01, n0 - a01 - a0a, a0a], axis=-1)

    def metrics(self, gold: np.ndarray, preds: np.ndarray) -> dict[str, np.ndarray]:
        """B × P arrays of κ, bacc, F1."""
        return from_counts(self.counts(gold, preds))


def _count_rows(gold: np.ndarray, preds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (gold, predictions) rows' counts (rows × (2 + 4P), :meth:`ClusterBootstrap.per_cluster`'s
    columns) and each item's row."""
    preds = np.atleast_2d(np.asarray(preds, dtype=float).T).T
    rows, inv = distinct_rows(np.column_stack([gold, preds]))
    g, p = rows[:, 0], rows[:, 1:]
    cells = indicators(g, p)[..., _KEPT].reshape(len(rows), -1)
    return np.column_stack([g == 1, g == 0, cells]), inv


def interval(draws: np.ndarray, level: float = 0.95) -> list[float]:
    a = (1 - level) / 2
    lo, hi = np.percentile(draws, [100 * a, 100 * (1 - a)])
    return [float(lo), float(hi)]


@dataclass
class Delta:
    """A paired difference (stacked − comparator) with its interval, one-sided p and call."""

    estimate: float
    ci: list[float]
    p_one_sided: float
    call: str
    p_holm: float | None = None
    se: float | None = None  # the standard error behind a normal interval (the ladder's corrected refit one)
    # the evidence (docs/intervals.md): the items where the two arms' verdicts differ (an abstention against a
    # verdict counts), each arm's abstentions, and whether the interval's variance is the discordance floor
    discordant: int | None = None
    abstentions: dict[str, int] | None = None
    floored: bool | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def paired_delta(full: float, draws: np.ndarray, level: float = 0.95) -> Delta:
    """Δ on the full sample, percentile CI of the paired draws, p = P*(Δ ≤ 0) (H1: the panel is better)."""
    ci = interval(draws, level)
    p = float((1 + np.sum(draws <= 0)) / (len(draws) + 1))
    return Delta(float(full), ci, p, call_for(ci))


def deployed(pred: np.ndarray) -> np.ndarray:
    """A judge's verdicts as deployed: its abstentions answered by :data:`FALLBACK`."""
    pred = np.asarray(pred, float)
    return np.where(pred == ABSTAIN, FALLBACK, pred)


def evidence(a: np.ndarray, b: np.ndarray, names: tuple[str, str]) -> dict:
    """What a paired comparison of two arms' verdicts (n-vectors in {0, 1, ½}) rests on: the items where they
    differ — an abstention against a verdict counts, two abstentions agree — and each arm's abstentions, by the
    arms' ``names``. The fields of :class:`Delta` (``discordant``, ``abstentions``)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    return {
        "discordant": int(np.sum(a != b)),
        "abstentions": {names[0]: int(np.sum(a == ABSTAIN)), names[1]: int(np.sum(b == ABSTAIN))},
    }


def call_for(ci: list[float]) -> str:
    """§2: a difference is clear when its 95% paired interval excludes 0, unresolved otherwise."""
    if ci[0] > 0:
        return "clear improvement"
    if ci[1] < 0:
        return "clear worsening"
    return "unresolved"


def best_single_call(vs_cv: Delta, vs_oracle: Delta | None) -> str:
    """§2 against the CV-best single: win when the lower bound exceeds 0; clean win when the panel's
    interval against the oracle best also lies above 0; tie when the interval spans 0."""
    if vs_cv.ci[0] > 0:
        return "clean win" if vs_oracle is not None and vs_oracle.ci[0] > 0 else "win"
    if vs_cv.ci[1] < 0:
        return "clear worsening"
    return "tie"


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values over one family (§2: Holm over the core datasets): with the m p-values
    sorted ascending, p₍ᵢ₎ × (m − i + 1), made non-decreasing by a running maximum and capped at 1; returned in
    the input order. The same numbers as statsmodels' ``multipletests(method="holm")``."""
    p = np.asarray(pvalues, dtype=float)
    order = np.argsort(p)
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1)), 1.0)
    return [float(v) for v in adjusted]
