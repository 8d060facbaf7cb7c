"""The refit paired cluster bootstrap (§2's paired cluster bootstrap, with every label-fitted step redone per draw).

§2 reads each comparison off a paired cluster bootstrap of the out-of-fold predictions: clusters are resampled
and the predictions scored again, the predictions themselves kept. That leaves out the variance of what was
fitted to the labels — the stacker's β, the CV-best single judge's selection, the weighted votes' weights — and
its intervals cover less than they claim at a few hundred items (docs/intervals.md). Here, within every draw,
what was fitted is fitted again on the draw's clusters:

* each cluster keeps the fold it has in the data (§2's 5-fold cluster folds), and a draw's copies of a cluster
  count with their multiplicity: a fold's training part is the draw's clusters outside the fold, weighted by
  how often the draw took them (as duplicated rows would be), its held-out part the draw's clusters inside it;
* the stacker — scikit-learn's ``LogisticRegression(C)`` objective, C·Σ wᵢ·logloss + ½‖β‖² with a free
  intercept — is refitted per draw and fold by :func:`src.core.logitfit.fit_logit` (batched Newton, all draws at
  once) and predicts the held-out clusters;
* the CV-best single judge is chosen again per draw and fold (κ on the training part, among the members that
  answer ``min_coverage`` of it) and scored on the held-out part;
* the accuracy- and log-odds-weighted votes take their weights from the training part's accuracies.

Everything is a sum of per-cluster counts weighted by the draw's multiplicities, so each step is a matrix
product over (draws × clusters); the draws are those of :class:`src.core.evaluate.ClusterBootstrap` (same seed, same
B), so the refit and the fixed-prediction intervals come from the same resampled clusters.

The refit draws' variance overstates the estimate's: a cluster's outcomes enter a draw through its multiplicity and
again through the refitted predictions that score it. :class:`RefitDraws` reads the comparators' per-cluster counts
side by side and takes the second term out; :func:`src.core.intervals.corrected_interval` turns the corrected variance
into the interval the ladder's calls read (docs/intervals.md has the derivation and the measured coverage).
"""

from __future__ import annotations

import threading

import numpy as np
from scipy import sparse

from src.core import threads
from src.core.aggregate import WeightedVote, member_accuracy
from src.core.evaluate import (
    CHUNK_BLOCK,
    ClusterBootstrap,
    class_counts,
    classes,
    deployed,
    distinct_rows,
    from_counts,
    indicators,
)
from src.core.logitfit import FoldFits, loop_proba
from src.core.memory import LastCall, PerArray
from src.core.threads import InOrder
from src.core.verdicts import ABSTAIN, at_or_over

# the fewest and the most draws refitted at once (RefitBootstrap._split), memory permitting; the bootstrap's
# chunks of draws hold whole numbers of the fewest
MIN_CHUNK, MAX_CHUNK = CHUNK_BLOCK, 400
# what a chunk of draws refitted at once may hold in its (draws × width) arrays of doubles (RefitBootstrap._split)
PART_BYTES = 64 * 2**20


class Rung:
    """A label-fitted rung as the refit reads it: its out-of-fold prediction depends on an item only through the
    item's row (``inv``: each item's row among ``n_rows``) and fold. ``predict(t1, t0, k)`` gives fold k's
    predictions on every row (draws × rows, in {0, 1, ½}) fitted with t1 / t0 (draws × rows) as each row's weight of
    training items of gold 1 / gold 0 in each draw; ``abstains`` says whether a prediction can be ½. A
    ``fractional`` rung predicts instead each row's probability of the verdict 1 (in [0, 1], never an abstention):
    a randomised rule's expected verdict, its items counted in the cells (g, 1) and (g, 0) by that probability.
    ``at_rows(t1, t0, k, rows)``, where given, gives fold k's predictions on some rows only (:meth:`predict_at`)."""

    def __init__(
        self, inv: np.ndarray, n_rows: int, predict, abstains: bool = False, fractional: bool = False, at_rows=None
    ):
        if abstains and fractional:
            raise ValueError("a fractional rung never abstains")
        self.inv, self.n_rows, self.predict, self.abstains = inv, n_rows, predict, abstains
        self.fractional = fractional
        self._at_rows = at_rows
        self.chosen: list[np.ndarray] = []  # the CV-best single's choices, one array per call of predict

    def predict_at(self, t1: np.ndarray, t0: np.ndarray, k: int, rows: np.ndarray) -> np.ndarray:
        """Fold k's predictions on ``rows`` only (draws × rows): ``at_rows(t1, t0, k, rows)`` where the rung has it
        (it may answer None: not those rows), else :attr:`predict`'s read there."""
        got = None if self._at_rows is None else self._at_rows(t1, t0, k, rows)
        return self.predict(t1, t0, k)[:, rows] if got is None else got


def _share(pred: np.ndarray, v: float, fractional: bool) -> np.ndarray:
    """Each row's share of items predicted ``v`` (1 or ½): the indicator pred == v, or for a fractional rung's
    probabilities of 1 the probability itself (v = 1; it never abstains)."""
    if not fractional:
        return pred == v
    if v != 1.0:
        raise ValueError("a fractional rung predicts 1 with a probability and never abstains")
    return pred


class Cells:
    """The items' joint classes by fold, gold and each rung's row: a draw reaches the rungs' refits only through
    its count of items in each cell (Σ over clusters of multiplicity × the cluster's items in the cell).

    ``by_cluster`` (cells × clusters) holds each cluster's items per cell, ``fold`` / ``g`` each cell's fold and
    gold (g = 0 for gold 1, 1 for gold 0: the order of :func:`src.core.evaluate.indicators`' cells), ``rows`` each
    rung's row of each cell, ``layouts`` each rung's map from cells to its (g, fold, row) counts and ``pairs`` each
    rung's (fold, row) pairs that hold items (fold × n_rows + row, sorted): a row scores only its own fold's items, so
    the counts of a draw and the moves of its predictions are read on those pairs only."""

    def __init__(self, gold: np.ndarray, fold_of: np.ndarray, item_cluster: np.ndarray, n_clusters: int, rungs):
        g_item = (np.asarray(gold) != 1).astype(np.int64)
        cell, first = classes([fold_of, g_item] + [r.inv for r in rungs])  # first: one item of each cell
        self.n_folds = int(fold_of.max()) + 1
        self.fold, self.g = fold_of[first], g_item[first]
        self.rows = [r.inv[first] for r in rungs]
        m = len(first)
        self.by_cluster = sparse.csr_matrix((np.ones(len(cell)), (cell, item_cluster)), shape=(m, n_clusters))
        self.by_cluster_csc = self.by_cluster.tocsc()
        self.layouts = [
            sparse.csr_matrix(
                (np.ones(m), (((self.g * self.n_folds + self.fold) * r.n_rows + rows), np.arange(m))),
                shape=(self.n_folds * 2 * r.n_rows, m),
            )
            for r, rows in zip(rungs, self.rows)
        ]
        self.pairs = [np.unique(self.fold * r.n_rows + rows) for r, rows in zip(rungs, self.rows)]

    def __len__(self) -> int:
        return len(self.fold)

    def counts(self, w: np.ndarray, block: int = 32) -> np.ndarray:
        """Each draw's count of items in each cell (draws × cells), ``block`` draws at a time, summed cluster by
        cluster in the weights' dtype: whole numbers, exact (:class:`ClusterBootstrap` keeps float32 only while
        every count stays under 2²⁴)."""
        return class_counts(self.by_cluster_csc, w, block)

    def layout(self, N: np.ndarray, r: int, n_rows: int) -> np.ndarray:
        """Rung r's counts of a chunk's draws by gold, fold and row (draws × 2 × folds × rows)."""
        return np.asarray((self.layouts[r].astype(N.dtype) @ N.T).T).reshape(len(N), 2, self.n_folds, n_rows)

    def lift(self, pred: np.ndarray, r: int) -> np.ndarray:
        """Rung r's predictions (draws × folds × rows) read at each cell (draws × cells)."""
        return pred[:, self.fold, self.rows[r]]


def confusion(R: np.ndarray, pred: np.ndarray, fractional: bool = False) -> np.ndarray:
    """draws × 6 counts (the cells of :func:`src.core.evaluate.indicators`, doubles) of out-of-fold predictions
    ``pred`` (draws × pairs) on a draw's items counted by gold and (fold, row) pair (R: draws × 2 × pairs, whole
    numbers exact in its dtype; or draws × folds × rows and draws × 2 × folds × rows);
    ``fractional``: pred holds probabilities of 1 (:class:`Rung`), summed in doubles."""
    dtype = np.float64 if fractional else R.dtype
    flat = R.reshape(len(R), 2, -1).astype(dtype, copy=False)
    if fractional:
        on = [(flat @ pred.reshape(len(R), -1, 1))[..., 0], np.zeros(flat.shape[:2])]
    else:
        on = [(flat @ (pred == v).reshape(len(R), -1, 1).astype(dtype))[..., 0] for v in (1.0, ABSTAIN)]  # draws × 2
    total = flat.sum(axis=2)
    cells = [[on[0][:, g], total[:, g] - on[0][:, g] - on[1][:, g], on[1][:, g]] for g in (0, 1)]
    return np.stack(cells[0] + cells[1], axis=-1).astype(float)


class RefitBootstrap:
    """Per-draw refits of the ladder's label-fitted rungs on the draws of a :class:`ClusterBootstrap`.

    Built once per dataset from its gold, its cluster folds and the bootstrap. Each rung is a :class:`Rung`
    (:meth:`stacked`, :meth:`stacked_loop`, :meth:`weighted`, :meth:`best_cv`); :meth:`draws` refits several side
    by side, chunk by chunk of draws, from the draws' counts of items per cell (:class:`Cells`), and :meth:`counts`
    gives one rung's B × 6 counts, ready for :func:`src.core.evaluate.from_counts`.
    """

    def __init__(self, gold: np.ndarray, folds: list[tuple], boot: ClusterBootstrap):
        self.y = np.asarray(gold)
        self.boot = boot
        self.item_cluster = boot.item_cluster
        self.n_clusters = len(boot.cluster_ids)
        n = len(self.y)
        self.fold_of = np.full(n, -1)
        for k, (_, te) in enumerate(folds):
            self.fold_of[te] = k
        if (self.fold_of < 0).any():
            raise ValueError("the folds do not hold every item out once")
        self.n_folds = len(folds)
        # :func:`src.core.evaluate.distinct_rows` of an array, once while it lives (the ladder's rungs read the same votes)
        self._rows = PerArray(distinct_rows)
        # what two rungs on the same rows both compute from a fold's training weights, by rows and kind
        self._shared: dict[tuple, tuple[np.ndarray, LastCall]] = {}
        self._picks = threading.local()  # the CV-best choices of the chunk this thread refits (:meth:`part`)

    # ------------------------------------------------------------------------------------------- the draws

    def cells(self, rungs: list[Rung]) -> Cells:
        """The joint cells of ``rungs`` (:class:`Cells`)."""
        return Cells(self.y, self.fold_of, self.item_cluster, self.n_clusters, rungs)

    def _split(self, w: np.ndarray, cells: Cells, rungs: list[Rung]):
        """A chunk of the bootstrap's weights (:meth:`ClusterBootstrap.chunks`) in chunks of draws refitted as one
        batch: as many as fill :data:`PART_BYTES` with (items + 6 × clusters) doubles, within
        [:data:`MIN_CHUNK`, :data:`MAX_CHUNK`], fewer where a chunk × (cells + 8 × the largest rung's rows) array of
        doubles would exceed it. Larger batches spread each Newton step's fixed costs over more fits (fewer than
        ~250 draws cost up to 1.5× the time); past a few hundred they only hold more memory. A fractional rung's
        predictions are doubles: its (fold, row) pairs add to the width. The results do not depend on the chunks."""
        fill = PART_BYTES // (8 * (len(self.y) + 6 * self.n_clusters))
        width = len(cells) + 8 * max(r.n_rows for r in rungs)
        width += sum(len(pairs) for r, pairs in zip(rungs, cells.pairs) if r.fractional)
        rows = max(1, min(max(MIN_CHUNK, min(fill, MAX_CHUNK)), PART_BYTES // (8 * width)))
        for a in range(0, len(w), rows):
            yield w[a : a + rows]

    def draws(self, rungs: dict[str, Rung], cells: Cells | None = None):
        """Chunk by chunk of draws, each rung's (counts: chunk × 6, out-of-fold predictions: chunk × pairs, each
        (fold, row) pair that holds items, :class:`Cells`' ``pairs``): :meth:`refit` on every chunk of the bootstrap's
        weights."""
        cells = self.cells(list(rungs.values())) if cells is None else cells
        for w in self.boot.chunks():
            yield from self.refit(w, rungs, cells)

    def refit(self, w: np.ndarray, rungs: dict[str, Rung], cells: Cells):
        """For draws of weights w, chunk by chunk, each rung's (counts, predictions), every rung refitted on each
        fold's training part: the draw's clusters outside the fold, weighted by their multiplicity (as duplicated
        rows would be) (:meth:`parts`, :meth:`part`, :meth:`keep`, on this thread)."""
        for part in self.parts(w, rungs, cells):
            yield self.keep(self.part(part))

    def parts(self, w: np.ndarray, rungs: dict[str, Rung], cells: Cells):
        """The chunks of draws of weights w that :meth:`part` refits, each as its draws' counts of items per cell
        (:meth:`Cells.counts`, computed here: a chunk in flight holds those, not the draws × clusters weights) with
        what it needs: independent of each other (:class:`src.core.threads.InOrder` may refit several at once)."""
        for part in self._split(w, cells, list(rungs.values())):
            yield cells.counts(part), rungs, cells

    def part(self, job: tuple[np.ndarray, dict[str, Rung], Cells]) -> tuple[dict, list]:
        """One chunk of draws (:meth:`parts`: its counts per cell) refitted: (each rung's (counts, predictions), the
        CV-best choices its :meth:`best_cv` rungs made, for :meth:`keep`). Rungs on the same rows (one ``inv``
        array) share their counts by fold, gold and row, and each fold's training weights: the same arrays reach
        their ``predict``, fold by fold."""
        N, rungs, cells = job
        groups: dict[tuple[int, int], list[tuple[int, str]]] = {}
        for r, (name, rung) in enumerate(rungs.items()):
            groups.setdefault((id(rung.inv), rung.n_rows), []).append((r, name))
        picks: list[tuple[Rung, np.ndarray]] = []
        self._picks.now = picks
        try:
            out = {}
            for members in groups.values():
                r0, name0 = members[0]
                R = cells.layout(N, r0, rungs[name0].n_rows)
                out.update(self._refit({name: rungs[name] for _, name in members}, R, cells.pairs[r0]))
        finally:
            self._picks.now = None
        return {name: out[name] for name in rungs}, picks

    @staticmethod
    def keep(done: tuple[dict, list]) -> dict:
        """A refitted chunk (:meth:`part`) taken in draw order: its CV-best choices join their rungs' ``chosen``;
        returns each rung's (counts, predictions)."""
        out, picks = done
        for rung, sel in picks:
            rung.chosen.append(sel)
        return out

    def _refit(self, group: dict[str, Rung], R: np.ndarray, pairs: np.ndarray) -> dict:
        """A chunk's (counts, predictions) of rungs on the same rows from their counts by fold, gold and row (R), read
        on the (fold, row) pairs that hold items (``pairs``): each fold's predictions on its own rows."""
        total = R.sum(axis=2)
        fold, row = np.divmod(pairs, R.shape[3])
        pred = {
            name: np.empty((len(R), len(pairs)), np.float64 if rung.fractional else np.float32)
            for name, rung in group.items()
        }  # 0, 1 or ½: exact in float32
        for k in range(self.n_folds):
            train = (total - R[:, :, k]).astype(float)
            t1, t0 = train[:, 0], train[:, 1]  # the same arrays for every rung: the rungs that share a step share it
            at = np.flatnonzero(fold == k)
            for name, rung in group.items():
                pred[name][:, at] = rung.predict_at(t1, t0, k, row[at])
        dtype = np.float64 if any(rung.fractional for rung in group.values()) else R.dtype
        on = R.reshape(len(R), 2, -1)[:, :, pairs].astype(dtype)
        return {name: (confusion(on, pred[name], rung.fractional), pred[name]) for name, rung in group.items()}

    def counts(self, rung: Rung) -> np.ndarray:
        """B × 6: each draw's confusion counts of one rung."""
        return np.vstack([d["rung"][0] for d in self.draws({"rung": rung})])

    def cluster_counts(self, rung: Rung, pred: np.ndarray) -> np.ndarray:
        """Each cluster's own confusion counts (draws × clusters × 6, unweighted) under a chunk's out-of-fold
        predictions of ``rung`` (draws × pairs, as :meth:`draws` gives them): a draw's counts are Σ_c w_c · these, and
        :class:`RefitDraws` linearises them."""
        agg = sparse.csr_matrix((np.ones(len(self.y)), (self.item_cluster, np.arange(len(self.y)))))
        _, at = np.unique(self.fold_of * rung.n_rows + rung.inv, return_inverse=True)  # each item's pair (Cells')
        return np.stack([agg @ _cells(self.y, p, rung.fractional) for p in pred[:, at.ravel()]])

    # ------------------------------------------------------------------------------------------- the rungs

    def stacked(self, F: np.ndarray, C: float, threshold: float) -> Rung:
        """The stacker on its design matrix ``F`` (n × d, :meth:`src.core.aggregate.StackedLogit.features`), refitted
        per draw and fold (:class:`src.core.logitfit.FoldFits`): hallucinated iff P ≥ ``threshold``
        (:func:`src.core.verdicts.at_or_over`: ties by rule)."""
        rows, inv = self._rows(F)
        fits = FoldFits(np.column_stack([np.ones(len(rows)), rows]), C)

        def predict(t1, t0, k):
            return at_or_over(fits.proba(t1, t0, k), threshold).astype(float)

        return Rung(inv, len(rows), predict)

    def stacked_loop(self, stacker, X: np.ndarray) -> Rung:
        """Any other stacker (e.g. :class:`src.core.aggregate.NoiseRobustStackedLogit`), refitted per draw and fold by
        its own ``fit`` on the training part's items repeated by their multiplicity (:func:`loop_proba`): the same
        refit as :meth:`stacked`, one fit at a time (B × folds fits), each item its own row; its ``threshold`` decides.
        A training part of one gold class predicts it."""
        X = np.asarray(X, float)
        n = len(self.y)

        def predict(t1, t0, k):
            return at_or_over(loop_proba(stacker, X, t1, t0), stacker.threshold).astype(float)

        return Rung(np.arange(n), n, predict)

    def weighted(self, votes: np.ndarray, weighting: str, threshold: float = 0.5) -> Rung:
        """The accuracy- or log-odds-weighted vote (:class:`src.core.aggregate.WeightedVote`), its member accuracies
        taken per draw and fold on the training part."""
        rows, inv = self._rows(votes)
        accuracies = self._accuracies(rows)

        def predict(t1, t0, k):
            acc = accuracies(t1, t0)
            p1 = WeightedVote.p1_of(rows, WeightedVote.weights_of(acc, weighting), weighting)
            return at_or_over(p1, threshold).astype(float)

        return Rung(inv, len(rows), predict)

    def best_cv(self, votes: np.ndarray, min_coverage: float, as_deployed: bool = False) -> Rung:
        """The CV-best single judge (:class:`src.core.aggregate.BestSingle`), chosen per draw and fold: the member
        with the highest κ on the training part among those answering at least ``min_coverage`` of it (all
        members when none does); its votes, abstentions included, are the predictions — or, ``as_deployed``, its
        abstentions answered by :data:`src.core.evaluate.FALLBACK` (:func:`src.core.evaluate.deployed`). Each
        call's choices are kept in the rung's ``chosen`` (:meth:`choices`)."""
        rows, inv = self._rows(votes)
        choose = self._choosers(rows, min_coverage)

        def predict(t1, t0, k):
            sel = choose(t1, t0)
            now = getattr(self._picks, "now", None)  # inside :meth:`part`: kept in draw order by :meth:`keep`
            if now is None:
                rung.chosen.append(sel)
            else:
                now.append((rung, sel))
            pred = rows[:, sel].T
            return deployed(pred) if as_deployed else pred

        rung = Rung(inv, len(rows), predict, abstains=not as_deployed)
        return rung

    def _shared_step(self, rows: np.ndarray, kind: tuple, make) -> LastCall:
        """The step ``make()`` (a function of a fold's training weights t1, t0) of the rungs on ``rows``, one
        :class:`LastCall` per rows and kind (the entry keeps the rows, so no other array takes their id)."""
        key = (id(rows), *kind)
        held = self._shared.get(key)
        if held is None or held[0] is not rows:
            held = self._shared[key] = (rows, LastCall(make()))
        return held[1]

    def _accuracies(self, rows: np.ndarray) -> LastCall:
        """The members' accuracies on a fold's training part (t1, t0: draws × rows) for the weighted votes on
        ``rows``: computed once for the accuracy- and the log-odds-weighted rung (the same arrays come to both)."""

        def make():
            both = np.vstack([rows, rows])
            gold = np.r_[np.ones(len(rows)), np.zeros(len(rows))]
            return lambda t1, t0: member_accuracy(both, gold, np.hstack([t1, t0]))

        return self._shared_step(rows, ("accuracy",), make)

    def _choosers(self, rows: np.ndarray, min_coverage: float) -> LastCall:
        """The CV-best member of a fold's training part (t1, t0: draws × rows) on ``rows``: the highest κ among the
        members that answer ``min_coverage`` of it (all when none does), computed once for the rung and its
        deployed twin (the same arrays come to both)."""

        def make():
            K = rows.shape[1]
            ind = [indicators(np.full(len(rows), g), rows).reshape(len(rows), K * 6) for g in (1, 0)]

            def choose(t1, t0):
                fit = (t1 @ ind[0] + t0 @ ind[1]).reshape(len(t1), K, 6)
                kap = from_counts(fit)["kappa"]
                total = fit.sum(axis=2)
                cov = np.where(total > 0, (total - fit[..., 2] - fit[..., 5]) / np.where(total > 0, total, 1), 0.0)
                ok = cov >= min_coverage - 1e-12
                ok[~ok.any(axis=1)] = True
                return np.argmax(np.where(ok, kap, -np.inf), axis=1)

            return choose

        return self._shared_step(rows, ("best", min_coverage), make)

    def choices(self, rung: Rung) -> np.ndarray:
        """B × folds: the members a :meth:`best_cv` rung chose, once its draws were read."""
        F = self.n_folds
        return np.vstack([np.column_stack(rung.chosen[a : a + F]) for a in range(0, len(rung.chosen), F)])


# ------------------------------------------------------------------------------------------- the variance


def gradients(counts: np.ndarray, h: float = 1e-4) -> dict[str, np.ndarray]:
    """Each metric's gradient in the six confusion cells at ``counts`` (:func:`src.core.evaluate.from_counts`, central
    differences of step ``h``): the linearisation that gives a cluster's contribution to a metric."""
    c = np.asarray(counts, dtype=float)
    steps = np.eye(6) * h
    up, down = from_counts(c + steps), from_counts(c - steps)
    return {m: (up[m] - down[m]) / (2 * h) for m in up}


_CELL_OF = {1.0: 0, 0.0: 1, ABSTAIN: 2}  # a prediction's cell within its gold's three (indicators' order)


def _cells(gold: np.ndarray, pred: np.ndarray, fractional: bool) -> np.ndarray:
    """n × 6: :func:`src.core.evaluate.indicators`, or for probabilities of 1 (a fractional :class:`Rung`) each
    item's expected cells."""
    if not fractional:
        return indicators(gold, pred)
    g1, g0 = (np.asarray(gold) == 1).astype(float), (np.asarray(gold) == 0).astype(float)
    p, none = np.asarray(pred, float), np.zeros(len(gold))
    return np.stack([g1 * p, g1 * (1 - p), none, g0 * p, g0 * (1 - p), none], axis=-1)


class OwnCounts:
    """Σ over clusters of the covariance across draws of each cluster's own counts, exactly, read draw by draw.

    A cluster c of fold k holds n_{c,g,v} items of gold g on row v of a rung; under the rung's fold-k predictions
    p(b) of draw b its own count of gold-g items predicted ``v`` is y_c(b) = Σ_row n_{c,g,row}·[p_row(b) = v]: a
    *channel* (rung, v, g) with v = 1 (and v = ½ for a rung that abstains; the third cell is what remains). The
    covariance is the same for y_c(b) − y_c(b₀) (b₀ the first draw), which is zero wherever the refits predict as
    in b₀, so each chunk costs the items on the rows whose prediction moved. Every term is a whole number:
    ``num`` = B·Σ_b Σ_c ẏ_c ẏ_cᵀ − Σ_c (Σ_b ẏ_c)(Σ_b ẏ_c)ᵀ (channels × channels, int64) is B² times the sum, exact in
    any order and chunking. A fractional rung's channel (:class:`Rung`) counts its items by their probability of 1,
    Σ_row n_{c,g,row}·p_row(b): then the terms are doubles, summed in floating point."""

    def __init__(self, cells: Cells, rungs: list[Rung]):
        self.channels = [
            (r, v, g)
            for r, rung in enumerate(rungs)
            for v in ((1.0, ABSTAIN) if rung.abstains else (1.0,))
            for g in (0, 1)
        ]
        self.fractional = [rung.fractional for rung in rungs]
        self.dtype = np.float64 if any(self.fractional) else np.int64
        self.n_rows = [rung.n_rows for rung in rungs]
        self.pairs = cells.pairs
        self.n_folds = cells.n_folds
        by_cluster = cells.by_cluster.astype(np.int64)
        self.maps = [
            (layout.astype(np.int64) @ by_cluster).tocsr() for layout in cells.layouts
        ]  # (g, fold, row) × clusters
        self.n_clusters = by_cluster.shape[1]
        self.ref: list[np.ndarray] | None = None
        J = len(self.channels)
        self.gram = np.zeros((J, J), self.dtype)
        self.sums = np.zeros(J * self.n_clusters)  # whole numbers, far under 2⁵³
        self.n_draws = 0

    def _moved(self, preds: list[np.ndarray]) -> sparse.coo_matrix:
        """(channel, draw) × clusters: each cluster's own count in each channel minus its count in the first draw."""
        on = preds  # draws × pairs: each fold's predictions on its own rows
        ref = self.ref = [p[0] for p in on] if self.ref is None else self.ref
        b = len(preds[0])
        parts = []
        for j0 in range(0, len(self.channels), 2):  # a (rung, v) pair's two channels, gold 1 then gold 0
            r, v, _ = self.channels[j0]
            share = np.float64 if self.fractional[r] else np.int8
            d = _share(on[r], v, self.fractional[r]).astype(share) - _share(ref[r], v, self.fractional[r]).astype(
                share
            )  # draws × pairs: −1, 0, 1 (a fractional rung: any difference of probabilities)
            moved = np.flatnonzero(d != 0)  # a flat index of a mask: 4× a 2-d np.nonzero of the values
            bb, pp = np.divmod(moved, d.shape[1])
            kk, vv = np.divmod(self.pairs[r][pp], self.n_rows[r])
            rows = np.concatenate([(j0 + g) * b + bb for g in (0, 1)])
            cols = np.concatenate([(g * self.n_folds + kk) * self.n_rows[r] + vv for g in (0, 1)])
            shape = (len(self.channels) * b, self.maps[r].shape[0])
            data = np.tile(d.ravel()[moved], 2)
            parts.append((sparse.csr_matrix((data, (rows, cols)), shape=shape) @ self.maps[r]).tocoo())
        joined = [np.concatenate([getattr(p, a) for p in parts]) for a in ("data", "row", "col")]
        return sparse.coo_matrix((joined[0], (joined[1], joined[2])), shape=(len(self.channels) * b, self.n_clusters))

    def add(self, preds: list[np.ndarray]) -> None:
        """A chunk's out-of-fold predictions of each rung (draws × pairs, :meth:`RefitBootstrap.draws`)."""
        b = len(preds[0])
        Y = self._moved(preds)
        j, draw = np.divmod(Y.row, b)
        _, at = np.unique(draw * self.n_clusters + Y.col, return_inverse=True)  # the (draw, cluster) pairs moved
        flat = sparse.csr_matrix((Y.data, (j, at.ravel())), shape=(len(self.channels), int(at.max(initial=-1)) + 1))
        self.gram += (flat @ flat.T).toarray()
        self.sums += np.bincount(j * self.n_clusters + Y.col, Y.data.astype(float), len(self.sums))
        self.n_draws += b

    def num(self) -> np.ndarray:
        """B² × Σ_c Cov*(ẏ_c) over the channels (int64; doubles where a rung is fractional)."""
        S = self.sums.reshape(len(self.channels), self.n_clusters)
        S = S[:, S.any(axis=0)].astype(self.dtype)
        return self.n_draws * self.gram - S @ S.T


def _unit_coefficients(channels: list[tuple[int, float, int]], grads: list[dict[str, np.ndarray]]) -> np.ndarray:
    """channels × units: how one more item in a channel (:class:`OwnCounts`) moves each unit (rung, metric), the
    gradient of its cell less that of the cell it leaves (the gold's items predicted 0)."""
    metrics = list(grads[0])
    alpha = np.zeros((len(channels), len(grads) * len(metrics)))
    for j, (rung, v, g) in enumerate(channels):
        for i, m in enumerate(metrics):
            G = grads[rung][m]
            alpha[j, rung * len(metrics) + i] = G[3 * g + _CELL_OF[v]] - G[3 * g + _CELL_OF[0.0]]
    return alpha


class RefitDraws:
    """The draws of the refitted rungs, read side by side (:meth:`collect`): each rung's B × 6 counts, and Σ over
    clusters of the covariance across draws of each cluster's own linearised contribution (``own``, units × units;
    a unit is a (rung, metric) pair, its value for cluster c in draw b the gradient of the metric at the rung's
    full-sample counts times the cluster's counts in that draw).

    Why the second part. In a refit draw a cluster's outcomes count twice: through its multiplicity (the
    sampling variance the bootstrap is for) and through the predictions that score it, which change as the
    rungs are refitted on the draw's other clusters. The variance of that second contribution, taken with
    the cluster's *observed* outcomes, is noise the estimate does not have — where a refit flips a decision on an
    item whose class is a coin flip given its votes, the flip moves the expected κ by nothing and the observed
    one by a whole item — so the refit bootstrap's variance overstates the estimate's. :meth:`correction` takes it
    out: Var*(S) − Σ_c Var*(s_c), with s_c the cluster's own linearised contribution to S (its multiplicity
    aside: w_c is independent of the predictions scoring c, so this keeps the cluster's sampling variance at the
    draws' predictions and every covariance between clusters — how the fit's variation moves many clusters at
    once, and how a cluster's weight moves the fits that score the others). A cluster's contribution is linear in
    its counts, so ``own`` is the gradients' quadratic form of the counts' exact covariance (:class:`OwnCounts`)."""

    def __init__(self, counts: dict[str, np.ndarray], units: list[tuple[str, str]], own: np.ndarray):
        self.counts, self.units, self.own = counts, units, own

    @classmethod
    def collect(cls, refit: RefitBootstrap, rungs: dict[str, Rung], full: dict[str, np.ndarray]) -> RefitDraws:
        """Refit ``rungs`` (:class:`RefitBootstrap`) on every draw, side by side; ``full`` holds each rung's
        full-sample counts (the linearisation point)."""
        reader = DrawReader(refit, rungs, full)
        for w in refit.boot.chunks():
            reader.add(w)
        return reader.result()

    def correction(self, coef: dict[tuple[str, str], float]) -> float:
        """Σ_c Var*(s_c) of the statistic Σ coef[unit]·unit (units not refitted count as constants)."""
        a = np.array([coef.get(u, 0.0) for u in self.units])
        return float(a @ self.own @ a)


class DrawReader:
    """:meth:`RefitDraws.collect` as a reader of weights (:meth:`add`, chunk by chunk of draws, e.g. beside the fixed
    predictions' sums in one :meth:`ClusterBootstrap.sweep`); :meth:`result` gives the :class:`RefitDraws`. The
    chunks are refitted on ``workers`` threads (:class:`src.core.threads.InOrder`) and summed in draw order."""

    def __init__(
        self, refit: RefitBootstrap, rungs: dict[str, Rung], full: dict[str, np.ndarray], workers: int | None = None
    ):
        self.refit, self.rungs, self.full = refit, rungs, full
        self.cells = refit.cells(list(rungs.values()))
        self.own = OwnCounts(self.cells, list(rungs.values()))
        self.totals: dict[str, list[np.ndarray]] = {r: [] for r in rungs}
        # the chunks on ``workers`` threads (default: :func:`src.core.threads.count`); the first sets the fits' starts
        self.threads = InOrder(refit.part, threads.count() if workers is None else workers, first_alone=True)

    def add(self, w: np.ndarray) -> None:
        """The next draws' cluster multiplicities (draws × clusters): their chunks refitted on the analysis's threads
        (:class:`src.core.threads.InOrder`), each taken in draw order as it is done."""
        for job in self.refit.parts(w, self.rungs, self.cells):
            for done in self.threads.put(job):
                self._take(done)

    def _take(self, done: tuple[dict, list]) -> None:
        chunk = self.refit.keep(done)
        for r in self.rungs:
            self.totals[r].append(chunk[r][0])
        self.own.add([chunk[r][1] for r in self.rungs])

    def result(self) -> RefitDraws:
        """Each rung's B × 6 counts and the own term (:class:`RefitDraws`)."""
        for done in self.threads.drain():
            self._take(done)
        if not self.own.n_draws:
            raise ValueError("no bootstrap draws")
        names = list(self.rungs)
        grads = [gradients(self.full[r]) for r in names]
        units = [(r, m) for r in names for m in grads[0]]
        alpha = _unit_coefficients(self.own.channels, grads)
        own = alpha.T @ (self.own.num() / self.own.n_draws**2) @ alpha
        return RefitDraws({r: np.vstack(v) for r, v in self.totals.items()}, units, own)
