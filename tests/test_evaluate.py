"""Metrics, bootstrap and calls against reference implementations (scikit-learn, statsmodels)."""

import weakref

import numpy as np
import pytest
from scipy import sparse
from sklearn.metrics import balanced_accuracy_score, cohen_kappa_score, f1_score
from statsmodels.stats.multitest import multipletests

from src.core import evaluate
from src.core.evaluate import ClusterBootstrap, best_single_call, from_counts, holm, indicators, paired_delta, scores
from src.core.verdicts import ABSTAIN


def random_pred(rng, gold, acc=0.7, abstain=0.1):
    pred = np.where(rng.random(len(gold)) < acc, gold, 1 - gold).astype(float)
    pred[rng.random(len(gold)) < abstain] = ABSTAIN
    return pred


@pytest.mark.parametrize("seed", range(8))
def test_metrics_match_sklearn_with_abstentions(seed):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, 300)
    pred = random_pred(rng, gold, acc=rng.uniform(0.3, 0.95), abstain=rng.uniform(0, 0.3))
    s = scores(gold, pred)
    voted = pred != ABSTAIN
    # κ excludes abstentions
    assert s["kappa"] == pytest.approx(cohen_kappa_score(gold[voted], pred[voted].astype(int)))
    # bacc: an abstention is an error of its own class
    as_error = np.where(voted, pred, 1 - gold).astype(int)
    assert s["bacc"] == pytest.approx(balanced_accuracy_score(gold, as_error))
    # F1 of the hallucinated class: an abstention is a missed detection
    assert s["f1"] == pytest.approx(f1_score(gold, (pred == 1).astype(int)))


def test_undefined_kappa_is_zero_not_nan():
    gold = np.array([1, 1, 1])
    assert scores(gold, np.array([1.0, 1.0, 1.0]))["kappa"] == 0.0
    assert scores(gold, np.full(3, ABSTAIN))["kappa"] == 0.0
    assert scores(gold, np.full(3, ABSTAIN))["bacc"] == 0.0


def test_bootstrap_keeps_clusters_whole_and_resamples_all_clusters():
    rng = np.random.default_rng(0)
    clusters = np.repeat(np.arange(50), rng.integers(1, 5, 50))
    boot = ClusterBootstrap(clusters, n_boot=300, seed=1)
    w = boot.item_weights()
    for c in np.unique(clusters):
        cols = w[:, clusters == c]
        assert (cols == cols[:, :1]).all(), "items of one cluster must share their multiplicity"
    assert (boot.weights.sum(axis=1) == 50).all()
    assert (boot.weights.mean(axis=0) > 0.8).all() and (boot.weights.mean(axis=0) < 1.2).all()


def test_bootstrap_metrics_equal_weighted_sklearn_per_draw():
    rng = np.random.default_rng(3)
    clusters = np.repeat(np.arange(80), 2)
    gold = np.tile([0, 1], 80)
    preds = np.column_stack([random_pred(rng, gold, 0.8, 0.05), random_pred(rng, gold, 0.6, 0.0)])
    boot = ClusterBootstrap(clusters, n_boot=20, seed=0)
    got = boot.metrics(gold, preds)
    for b in range(5):
        w = boot.item_weights()[b]
        for p in range(2):
            m = (preds[:, p] != ABSTAIN) & (w > 0)
            ref = cohen_kappa_score(gold[m], preds[m, p].astype(int), sample_weight=w[m])
            assert got["kappa"][b, p] == pytest.approx(ref)
            as_err = np.where(preds[:, p] != ABSTAIN, preds[:, p], 1 - gold).astype(int)
            assert got["bacc"][b, p] == pytest.approx(balanced_accuracy_score(gold, as_err, sample_weight=w))


def test_from_counts_vectorises_over_leading_axes():
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 100)
    c = np.stack([indicators(gold, random_pred(rng, gold)).sum(0) for _ in range(6)]).reshape(2, 3, 6)
    out = from_counts(c)
    assert out["kappa"].shape == (2, 3)
    assert out["kappa"][1, 2] == pytest.approx(from_counts(c[1, 2])["kappa"])


HOLM_CASES = {
    "uniform": list(np.random.default_rng(0).uniform(0, 0.2, 5)),
    "wide": list(np.random.default_rng(1).uniform(0, 1, 9)),
    "ties": [0.01, 0.04, 0.04, 0.2, 0.01, 0.04],
    "all equal": [0.03] * 4,
    "caps at 1": [0.4, 0.6, 0.9, 1.0, 0.35],
    "p = 1": [1.0, 1.0, 0.001],
    "one": [0.3],
    "tiny": [1e-300, 5e-4, 2.5e-4],
}


@pytest.mark.parametrize("p", HOLM_CASES.values(), ids=HOLM_CASES.keys())
def test_holm_equals_statsmodels(p):
    got = holm(p)
    assert got == list(multipletests(p, method="holm")[1])  # the same floats, not just close
    assert all(a >= b for a, b in zip(got, p)) and max(got) <= 1.0
    assert holm([]) == []


def test_bootstrap_draws_in_chunks_and_heads_are_the_same_draws():
    rng = np.random.default_rng(4)
    clusters = np.repeat(np.arange(37), rng.integers(1, 4, 37))
    gold = rng.integers(0, 2, len(clusters))
    preds = np.column_stack([random_pred(rng, gold), random_pred(rng, gold, 0.6, 0.2)])
    kept = ClusterBootstrap(clusters, n_boot=250, seed=7)
    chunked = ClusterBootstrap(clusters, n_boot=250, seed=7, chunk=16)
    assert kept._weights is not None and chunked._weights is None
    assert np.array_equal(kept.weights, chunked.weights)
    assert np.array_equal(kept.counts(gold, preds), chunked.counts(gold, preds))
    brute = np.einsum("bn,npc->bpc", kept.item_weights().astype(float), indicators(gold, preds))
    assert kept.dtype == np.float32 and np.array_equal(kept.counts(gold, preds), brute)  # whole numbers: exact
    for b in (1, 100, 250):
        fresh = ClusterBootstrap(clusters, n_boot=b, seed=7)
        assert np.array_equal(kept.head(b).weights, fresh.weights)
        assert np.array_equal(chunked.head(b).counts(gold, preds), fresh.counts(gold, preds))
    with pytest.raises(ValueError):
        kept.head(251)


def test_multiplicities_are_multinomial_draws():
    """Each draw counts n_clusters uniform picks: Multinomial(n_clusters, 1/n_clusters) (per cluster
    Binomial(n, 1/n), covariance −1/n between clusters), whatever the block of rows it was built in."""
    from scipy import stats

    n, B = 6, 60_000
    W = evaluate.multiplicities(np.random.default_rng(11), B, n, np.float64)
    assert W.shape == (B, n) and (W.sum(axis=1) == n).all()
    observed = np.stack([np.bincount(W[:, j].astype(int), minlength=n + 1) for j in range(n)])
    expected = B * stats.binom.pmf(np.arange(n + 1), n, 1 / n)
    keep = expected > 5
    for row in observed:
        assert stats.chisquare(row[keep], expected[keep] * row[keep].sum() / expected[keep].sum()).pvalue > 1e-3
    cov = np.cov(W, rowvar=False)
    assert np.allclose(np.diag(cov), 1 - 1 / n, atol=0.03)
    assert np.allclose(cov[~np.eye(n, dtype=bool)], -1 / n, atol=0.03)


def test_multiplicities_do_not_depend_on_their_row_blocks(monkeypatch):
    whole = evaluate.multiplicities(np.random.default_rng(5), 40, 1000)
    monkeypatch.setattr(evaluate, "MAX_WEIGHT_BYTES", 48 * 1000 * 3)  # blocks of 3 rows
    assert np.array_equal(evaluate.multiplicities(np.random.default_rng(5), 40, 1000), whole)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_picks_are_the_same_draws(monkeypatch, dtype):
    """The compiled loop (large draws) consumes the generator as numpy does: the same multiplicities, and the
    generator left in the same state."""
    pytest.importorskip("numba")
    rngs = [np.random.default_rng(9) for _ in range(2)]
    plain = [evaluate.multiplicities(rngs[0], 30, 777, dtype) for _ in range(2)]
    monkeypatch.setattr(evaluate, "COMPILE_PICKS", 0)
    fast = [evaluate.multiplicities(rngs[1], 30, 777, dtype) for _ in range(2)]
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(plain, fast))
    assert rngs[0].random() == rngs[1].random()


def test_distinct_rows_are_numpys():
    """The rows a rung is fitted on, by one sort per column: np.unique(axis=0)'s rows, order and inverse."""
    rng = np.random.default_rng(0)
    for trial in range(12):
        n, d = int(rng.integers(1, 400)), int(rng.integers(1, 12))
        X = [rng.choice([0.0, 0.5, 1.0], size=(n, d)), np.round(rng.normal(size=(n, d)), 1)][trial % 2]
        rows, inv = np.unique(X, axis=0, return_inverse=True)
        got, got_inv = evaluate.distinct_rows(X)
        assert np.array_equal(got, rows) and np.array_equal(got_inv, inv.ravel())


def test_one_sweep_gives_every_reader_the_same_draws():
    """Sums of several per-cluster matrices and any number of readers in one pass: the draws each would have
    drawn alone (chunked: drawn once, not once per reader)."""
    rng = np.random.default_rng(3)
    clusters = np.repeat(np.arange(29), rng.integers(1, 4, 29))
    gold = rng.integers(0, 2, len(clusters))
    preds = np.column_stack([random_pred(rng, gold), random_pred(rng, gold, 0.6, 0.2)])
    values = rng.normal(size=(len(clusters), 3))
    boot = ClusterBootstrap(clusters, n_boot=100, seed=2, chunk=7)
    seen = []
    raw, sums = boot.sweep([boot.per_cluster(gold, preds), boot.cluster_sums(values)], (seen.append,))
    assert np.array_equal(np.vstack(seen), boot.weights) and len(seen) == 15
    assert np.array_equal(ClusterBootstrap.unpack(raw), boot.counts(gold, preds))
    assert np.allclose(sums, boot.weights.astype(float) @ boot._agg @ values)


def test_a_sweep_through_rows_gives_the_per_cluster_sums():
    """A table of few distinct rows is summed per draw through the draws' counts of items on each row (a
    RowTable): the same numbers, bit for bit, as the per-cluster table's product, on kept and on chunked draws
    (every chunk's blocks of 32 draws); values that are not whole numbers keep the per-cluster table."""
    rng = np.random.default_rng(8)
    clusters = np.repeat(np.arange(300), rng.integers(1, 4, 300))
    gold = rng.integers(0, 2, len(clusters))
    preds = np.column_stack([random_pred(rng, gold), random_pred(rng, gold, 0.6, 0.2), random_pred(rng, gold)])
    for chunk in (None, 45):
        boot = ClusterBootstrap(clusters, n_boot=200, seed=1, chunk=chunk)
        table = boot.per_row(gold, preds)
        assert isinstance(table, evaluate.RowTable) and table.values.dtype == np.float32
        raw, direct = boot.sweep([table, boot.per_cluster(gold, preds)])
        assert np.array_equal(raw, direct) and np.array_equal(ClusterBootstrap.unpack(raw), boot.counts(gold, preds))
    rows, inv = evaluate.distinct_rows(preds)
    assert isinstance(boot.row_table(rows + 0.25, inv), np.ndarray)  # not whole: each cluster's sums in doubles
    many = np.arange(len(clusters))  # as many rows as items: the per-cluster table is cheaper
    assert isinstance(boot.row_table(np.ones((len(clusters), 2)), many), np.ndarray)


def test_a_sweep_holds_no_transposed_block_while_its_readers_read(monkeypatch):
    """A reader (the refit bootstrap, on the analysis's threads) runs while the next weights are drawn: the row
    sums' transposed copy of the last block is gone by then, not kept alive by the loop that made it."""
    rng = np.random.default_rng(3)
    clusters = np.repeat(np.arange(200), 2)
    gold = rng.integers(0, 2, len(clusters))
    boot = ClusterBootstrap(clusters, n_boot=100, seed=2, chunk=40)
    blocks: list = []
    real = evaluate.transposed

    def recorded(w, block=32):
        for wt in real(w, block):
            blocks.append(weakref.ref(wt))
            yield wt

    monkeypatch.setattr(evaluate, "transposed", recorded)
    alive = []
    boot.sweep(
        [boot.per_row(gold, random_pred(rng, gold)[:, None])],
        (lambda w: alive.append(any(b() is not None for b in blocks)),),
    )
    assert blocks and alive == [False, False, False]


def test_class_counts_of_blocks_are_each_draws_counts():
    rng = np.random.default_rng(2)
    w = rng.integers(0, 4, (70, 50)).astype(np.float32)
    A = sparse.random(9, 50, density=0.3, random_state=1, format="csc")
    A.data = np.ceil(A.data * 3)
    assert np.array_equal(evaluate.class_counts(A, w, block=32), w @ A.T.toarray())


def test_paired_delta_calls():
    d = paired_delta(0.05, np.random.default_rng(0).normal(0.05, 0.01, 2000))
    assert d.call == "clear improvement" and d.ci[0] > 0 and d.p_one_sided < 0.01
    d = paired_delta(-0.05, np.random.default_rng(0).normal(-0.05, 0.01, 2000))
    assert d.call == "clear worsening" and d.p_one_sided > 0.99
    d = paired_delta(0.0, np.random.default_rng(0).normal(0, 0.05, 2000))
    assert d.call == "unresolved"


def test_best_single_calls():
    win = paired_delta(0.05, np.full(100, 0.05))
    tie = paired_delta(0.0, np.linspace(-0.1, 0.1, 100))
    assert best_single_call(win, win) == "clean win"
    assert best_single_call(win, tie) == "win"
    assert best_single_call(tie, tie) == "tie"
    assert best_single_call(paired_delta(-0.05, np.full(100, -0.05)), tie) == "clear worsening"


def test_coverage_counts_abstentions():
    v = np.array([[1, ABSTAIN], [0, ABSTAIN], [ABSTAIN, 1], [1, 0]])
    assert evaluate.coverage(v) == pytest.approx([0.75, 0.5])


def test_chunks_of_draws_hold_whole_blocks(monkeypatch):
    """Weights drawn again chunk by chunk come in whole blocks of CHUNK_BLOCK draws (the refit's parts: none left a
    few draws short), the same draws; weights that fit whole are kept whole, as before."""
    clusters = np.arange(1000)
    monkeypatch.setattr(evaluate, "MAX_WEIGHT_BYTES", 4 * 1000 * 150)  # room for 150 draws
    boot = ClusterBootstrap(clusters, n_boot=400, seed=3)
    assert boot.chunk == 128 and [len(w) for w in boot.chunks()] == [128, 128, 128, 16]
    assert np.array_equal(boot.weights, ClusterBootstrap(clusters, n_boot=400, seed=3, chunk=400).weights)
    assert ClusterBootstrap(clusters, n_boot=150, seed=3)._weights is not None  # 150 fit: kept whole
    monkeypatch.setattr(evaluate, "MAX_WEIGHT_BYTES", 4 * 1000 * 40)  # room for fewer than a block
    assert ClusterBootstrap(clusters, n_boot=400, seed=3).chunk == 40
