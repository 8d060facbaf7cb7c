"""The refit cluster bootstrap (src/core/refit.py): the batched fit against scikit-learn, every per-draw refit
against the straightforward loop (the draw's training clusters repeated by their multiplicity, one fit each)."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from src.core import logitfit, refit
from src.core.aggregate import BestSingle, StackedLogit, WeightedVote, cluster_folds
from src.core.evaluate import ClusterBootstrap, distinct_rows, from_counts, indicators
from src.core.intervals import corrected_interval
from src.core.logitfit import SINGLE_CLASS_LOGIT, fit_logit
from src.core.refit import RefitBootstrap, RefitDraws, gradients
from src.studies import simulate


def panel(seed=3, n_clusters=60, abstain_rate=0.05):
    rng = np.random.default_rng(seed)
    gold, votes = simulate.draw(rng, n_clusters, 2, [0.8, 0.72, 0.66, 0.62, 0.6, 0.55], 0.3, abstain_rate)
    return gold, votes, np.repeat(np.arange(n_clusters), 2)


def weighted_problems(m: int, seed: int):
    """(rows, Z with the intercept's column, W1, W0): m problems' random whole weights on a panel's distinct rows."""
    _, votes, _ = panel()
    rows = np.unique(votes, axis=0)
    rng = np.random.default_rng(seed)
    W1, W0 = (rng.integers(0, 4, (m, len(rows))).astype(float) for _ in range(2))
    return rows, np.column_stack([np.ones(len(rows)), rows]), W1, W0


@pytest.mark.parametrize("C", [0.1, 1.0, 10.0])
def test_batched_fit_is_sklearns_logistic_regression(C):
    """Each problem is LogisticRegression(C) with sample weights: same penalty, intercept unpenalised."""
    rows, Z, W1, W0 = weighted_problems(12, seed=0)
    B = fit_logit(Z, W1, W0, C)
    X2, y2 = np.vstack([rows, rows]), np.r_[np.ones(len(rows)), np.zeros(len(rows))]
    for m in range(len(W1)):
        ref = LogisticRegression(C=C, solver="newton-cholesky", tol=1e-12, max_iter=1000)
        ref.fit(X2, y2, sample_weight=np.r_[W1[m], W0[m]])
        assert np.abs(B[m] - np.r_[ref.intercept_, ref.coef_.ravel()]).max() < 1e-6
    started = fit_logit(Z, W1, W0, C, start=B[0])  # convex: the start moves the steps, not the answer
    assert np.abs(started - B).max() < 1e-6


def test_the_fits_elementwise_terms_are_the_textbook_formulas_bit_for_bit():
    """log(1 + eᶯ) and σ(η), computed in place, are the same doubles as the formulas written out, from −800 to 800;
    and a rung's design matrix gets its rows' zᵢzⱼ (i ≤ j: zᵀz's upper triangle) computed once, not once a fit."""
    rng = np.random.default_rng(0)
    eta = np.concatenate([rng.normal(0, 8, 3500), [-800.0, -40, -1e-300, 0.0, 1e-300, 40, 800]]).reshape(-1, 7)
    e = np.exp(-np.abs(eta))
    log1pexp, sigmoid = logitfit.softplus_sigmoid(eta)
    assert np.array_equal(log1pexp, np.maximum(eta, 0.0) + np.log1p(e))
    assert np.array_equal(sigmoid, np.where(eta >= 0, 1.0, e) / (1.0 + e))
    Z = np.column_stack([np.ones(5), rng.choice([0.0, 0.5, 1.0], (5, 3))])
    pairs = logitfit._row_pairs(Z)
    iu, ju = np.triu_indices(4)
    assert np.array_equal(pairs, (Z[:, iu] * Z[:, ju]).astype(np.float32))  # halves and quarters: exact
    assert logitfit._row_pairs(Z) is pairs and logitfit._row_pairs(Z.copy()) is not pairs


def sklearn_fit(rows, w1, w0, C):
    """β (intercept first) of scikit-learn's LogisticRegression(C) on the rows with gold 1 / 0 weighted w1 / w0."""
    ref = LogisticRegression(C=C, solver="newton-cholesky", tol=1e-14, max_iter=1000)
    ref.fit(np.vstack([rows, rows]), np.r_[np.ones(len(rows)), np.zeros(len(rows))], sample_weight=np.r_[w1, w0])
    return np.r_[ref.intercept_, ref.coef_.ravel()]


@pytest.mark.parametrize("start", ["zero", "answer", "near", "far"])
def test_the_fit_stops_at_the_answer_from_any_start(start):
    """The convergence test reads how fast the steps shrink: a start at the answer, 10⁻⁷ from it or far from it
    all end within 10⁻⁹ of scikit-learn's answer (one fold's bootstrap draws of a panel with rows no draw trains
    on: those are dropped, not fitted)."""
    _, votes, _ = panel(5)
    rows = np.unique(votes, axis=0)
    rng = np.random.default_rng(1)
    W1, W0 = (rng.poisson(1.5, (6, len(rows))).astype(float) for _ in range(2))
    W1[:, :3] = W0[:, :3] = 0.0
    Z = np.column_stack([np.ones(len(rows)), rows])
    ref = np.array([sklearn_fit(rows, W1[m], W0[m], 1.0) for m in range(len(W1))])
    starts = {"zero": None, "answer": ref, "near": ref + 1e-7, "far": ref + rng.normal(0, 2, ref.shape)}
    assert np.abs(fit_logit(Z, W1, W0, 1.0, starts[start]) - ref).max() < 1e-9


def test_a_common_first_hessian_moves_the_steps_not_the_answer():
    """The fold's start and its Hessian (the fit to the draws' mean weights) for every draw's first step: a chord step,
    one Hessian product fewer per fit, the same answer within 10⁻⁹ of scikit-learn's."""
    _, votes, _ = panel(5)
    rows = np.unique(votes, axis=0)
    rng = np.random.default_rng(2)
    W1, W0 = (rng.poisson(1.5, (8, len(rows))).astype(float) for _ in range(2))
    Z = np.column_stack([np.ones(len(rows)), rows])
    ref = np.array([sklearn_fit(rows, W1[m], W0[m], 1.0) for m in range(len(W1))])
    start = logitfit.mean_fit(Z, W1, W0, 1.0)
    H = logitfit.start_hessian(Z, W1.mean(axis=0), W0.mean(axis=0), 1.0, start)
    products = []
    real = logitfit._hessians
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(logitfit, "_hessians", lambda a, *r: products.append(len(a)) or real(a, *r))
        plain = fit_logit(Z, W1, W0, 1.0, start)
        n_plain, products[:] = sum(products), []
        common = fit_logit(Z, W1, W0, 1.0, start, hessian=H)
    assert sum(products) < n_plain
    assert np.abs(common - ref).max() < 1e-9 and np.abs(plain - ref).max() < 1e-9
    assert start_hessian_is_fits(Z, W1[0], W0[0], ref[0])


def start_hessian_is_fits(Z, w1, w0, beta):
    """start_hessian is Σ w σ(1 − σ) z zᵀ + I/C (intercept unpenalised), written out."""
    s = 1 / (1 + np.exp(-(Z @ beta)))
    want = (Z * ((w1 + w0) * s * (1 - s))[:, None]).T @ Z + np.diag(np.r_[0.0, np.ones(Z.shape[1] - 1)])
    return np.allclose(logitfit.start_hessian(Z, w1, w0, 1.0, beta), want, rtol=1e-6)


def test_a_float32_step_stops_no_fit():
    """σ and the gradients are float32 while the steps are large; such a step, however small it comes out (here at
    the answer, after a large step), never ends a fit: only steps in doubles do."""
    _, votes, _ = panel(5)
    rows = np.unique(votes, axis=0)
    w1, w0 = np.ones((1, len(rows))), np.ones((1, len(rows))) * 2
    Z = np.column_stack([np.ones(len(rows)), rows])
    answer = fit_logit(Z, w1, w0, 1.0)
    state = logitfit._Newton(Z, np.r_[0.0, np.ones(Z.shape[1] - 1)], w1, w1 + w0, answer.copy())
    state.last[:] = 0.5  # the step before was large: still float32
    assert state.low and (state.step(logitfit._row_pairs(Z), 1e-10) >= 1e-10).all()
    state.last[:] = 1e-6  # a small step: from now on in doubles, which may stop it
    state.step(logitfit._row_pairs(Z), 1e-10)
    assert not state.low


@pytest.mark.filterwarnings("error")
def test_a_fit_started_at_its_answer_stops_there_quietly():
    """Balanced weights (each row's gold-1 weight its gold-0 weight) from β = 0: the answer itself, a float32 step of
    size 0, then steps in doubles of size 0 — no rate of 0 / 0 is taken (no warning), β stays 0 (p = ½: a tie)."""
    _, votes, _ = panel(5)
    rows = np.unique(votes, axis=0)
    w = np.random.default_rng(3).integers(1, 4, (3, len(rows))).astype(float)
    Z = np.column_stack([np.ones(len(rows)), rows])
    assert np.array_equal(fit_logit(Z, w, w, 1.0), np.zeros((3, Z.shape[1])))


@pytest.mark.parametrize("p", [1, 4, 11, 21])
def test_the_compiled_newton_solve_is_lapacks(p):
    """The Cholesky factors and two triangular solves of each Newton step give numpy's (LAPACK's) solve."""
    rng = np.random.default_rng(p)
    A = rng.normal(size=(30, p, p))
    H = A @ A.transpose(0, 2, 1) + 0.1 * np.eye(p)
    g = rng.normal(size=(30, p))
    L = logitfit._factors(H)
    assert L is not None  # numba is a dependency
    np.testing.assert_allclose(L @ L.transpose(0, 2, 1), H, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(logitfit._newton_steps(H, L, g), np.linalg.solve(H, g[..., None])[..., 0], rtol=1e-9)


def test_a_hessian_that_is_not_positive_definite_is_solved_by_lu():
    """Rounding can leave a Hessian (summed in float32) without a Cholesky factor: that problem's step is LU's."""
    H = np.array([[[2.0, 0.0], [0.0, 1.0]], [[1.0, 2.0], [2.0, 1.0]]])  # the second is indefinite
    g = np.array([[2.0, 1.0], [3.0, 3.0]])
    L = logitfit._factors(H)
    assert L[0, 0, 0] > 0 and L[1, 0, 0] == 0
    np.testing.assert_allclose(logitfit._newton_steps(H, L, g), np.linalg.solve(H, g[..., None])[..., 0])


def test_the_fits_are_the_same_without_numba(monkeypatch):
    _, Z, W1, W0 = weighted_problems(20, seed=1)
    compiled = fit_logit(Z, W1, W0, 1.0)
    monkeypatch.setattr(logitfit.compiled, "njit", lambda fn: None)
    np.testing.assert_allclose(fit_logit(Z, W1, W0, 1.0), compiled, atol=1e-9)


def test_batched_fit_gives_a_one_class_problem_its_class():
    Z = np.column_stack([np.ones(3), [0.0, 0.5, 1.0]])
    B = fit_logit(Z, np.array([[1.0, 2, 0], [0, 0, 0]]), np.array([[0.0, 0, 0], [1, 1, 1]]))
    assert B.tolist() == [[SINGLE_CLASS_LOGIT, 0.0], [-SINGLE_CLASS_LOGIT, 0.0]]


def loop_counts(gold, votes, clusters, folds, boot, make, n_draws):
    """Per draw and fold: the training clusters repeated by their multiplicity, a fresh fit, its predictions on
    the held-out clusters weighted by theirs."""
    w = boot.weights
    out = np.zeros((n_draws, 6))
    for b in range(n_draws):
        iw = w[b][boot.item_cluster]
        for tr, te in folds:
            rep = np.repeat(tr, iw[tr].astype(int))
            pred = make().fit(votes[rep], gold[rep]).predict(votes[te])
            out[b] += iw[te] @ indicators(gold[te], pred)
    return out


@pytest.mark.parametrize("seed", [3, 8])
def test_every_refit_equals_the_loop_of_fits(seed):
    gold, votes, clusters = panel(seed)
    folds = cluster_folds(gold, clusters, 5, 0)
    boot = ClusterBootstrap(clusters, 40, seed)
    rb = RefitBootstrap(gold, folds, boot)
    n = 6
    assert np.array_equal(
        rb.counts(rb.stacked(votes, 1.0, 0.5))[:n], loop_counts(gold, votes, clusters, folds, boot, StackedLogit, n)
    )
    assert np.array_equal(
        rb.counts(rb.best_cv(votes, 0.5))[:n], loop_counts(gold, votes, clusters, folds, boot, BestSingle, n)
    )
    for weighting in ("accuracy", "logodds"):
        assert np.array_equal(
            rb.counts(rb.weighted(votes, weighting))[:n],
            loop_counts(gold, votes, clusters, folds, boot, lambda w=weighting: WeightedVote(w), n),
        )
    categorical = StackedLogit(abstention="category", n_votes=votes.shape[1])
    assert np.array_equal(
        rb.counts(rb.stacked(categorical.features(votes), 1.0, 0.5))[:n],
        loop_counts(gold, votes, clusters, folds, boot, lambda: StackedLogit(abstention="category"), n),
    )


def test_any_other_stacker_is_refitted_by_its_own_fit():
    gold, votes, clusters = panel(5, n_clusters=30)
    folds = cluster_folds(gold, clusters, 5, 0)
    rb = RefitBootstrap(gold, folds, ClusterBootstrap(clusters, 8, 1))
    assert np.array_equal(rb.counts(rb.stacked_loop(StackedLogit(), votes)), rb.counts(rb.stacked(votes, 1.0, 0.5)))


def test_best_cv_draws_choose_on_the_training_part_only():
    """A member perfect on one fold's held-out clusters and useless elsewhere is never that fold's choice."""
    gold, votes, clusters = panel(2)
    folds = cluster_folds(gold, clusters, 5, 0)
    _, te = folds[0]
    cheat = np.where(np.isin(np.arange(len(gold)), te), gold, 1 - gold).astype(float)
    rb = RefitBootstrap(gold, folds, ClusterBootstrap(clusters, 30, 0))
    rung = rb.best_cv(np.column_stack([votes, cheat]), 0.5)
    rb.counts(rung)
    chosen = rb.choices(rung)
    assert chosen.shape == (30, 5) and not (chosen[:, 0] == votes.shape[1]).any()


def test_the_cv_best_pair_and_the_weighted_pair_share_what_they_fit():
    """The CV-best single and its deployed twin choose once per fold and chunk (the same κ), the two weighted votes
    take the members' accuracies once; side by side they count as each alone."""
    gold, votes, clusters = panel(4)
    folds = cluster_folds(gold, clusters, 5, 0)
    rb = RefitBootstrap(gold, folds, ClusterBootstrap(clusters, 30, 1))
    alone = {
        "cv": rb.counts(rb.best_cv(votes, 0.5)),
        "dep": rb.counts(rb.best_cv(votes, 0.5, as_deployed=True)),
        "acc": rb.counts(rb.weighted(votes, "accuracy")),
        "lo": rb.counts(rb.weighted(votes, "logodds")),
    }
    rb = RefitBootstrap(gold, folds, ClusterBootstrap(clusters, 30, 1))
    calls = {"from_counts": 0, "member_accuracy": 0}
    with pytest.MonkeyPatch.context() as mp:
        for name, module in (("from_counts", refit), ("member_accuracy", refit)):
            real = getattr(module, name)
            mp.setattr(module, name, lambda *a, _r=real, _n=name: calls.__setitem__(_n, calls[_n] + 1) or _r(*a))
        rungs = {
            "cv": rb.best_cv(votes, 0.5),
            "dep": rb.best_cv(votes, 0.5, as_deployed=True),
            "acc": rb.weighted(votes, "accuracy"),
            "lo": rb.weighted(votes, "logodds"),
        }
        together = list(rb.draws(rungs))
    assert calls == {"from_counts": 5 * len(together), "member_accuracy": 5 * len(together)}  # once per fold
    for r in rungs:
        assert np.array_equal(np.vstack([c[r][0] for c in together]), alone[r])
    assert np.array_equal(rb.choices(rungs["cv"]), rb.choices(rungs["dep"]))


def test_gradients_linearise_every_metric():
    c = np.array([40.0, 12, 3, 9, 50, 2])
    g = gradients(c)
    step = np.array([0.3, -0.2, 0.1, 0.25, -0.1, 0.05])
    moved, base = from_counts(c + step), from_counts(c)
    for m in ("kappa", "bacc", "f1"):
        assert moved[m] - base[m] == pytest.approx(g[m] @ step, abs=1e-4)


def own_by_cluster(rb, rungs, full):
    """The correction's term as first written: each cluster's own linearised contribution (the gradients at the
    full-sample counts times its counts in the draw), its variance across draws per cluster, summed."""
    names = list(rungs)
    grads = {r: refit.gradients(full[r]) for r in names}
    u = []
    for chunk in rb.draws(rungs):
        per = [rb.cluster_counts(rungs[r], chunk[r][1]) for r in names]  # draws × clusters × 6 each
        u.append(np.concatenate([c @ np.column_stack(list(grads[r].values())) for r, c in zip(names, per)], axis=-1))
    u = np.concatenate(u)  # draws × clusters × units
    mean = u.mean(axis=0)
    return np.einsum("bcu,bcv->uv", u, u) / len(u) - mean.T @ mean


@pytest.mark.parametrize("seed, n_clusters, n_boot", [(6, 40, 50), (7, 120, 300), (9, 25, 1000)])
def test_the_own_term_is_each_clusters_variance_summed(seed, n_clusters, n_boot):
    """Clusters of one to four items, every kind of rung (the CV-best single abstains): the exact counts' quadratic
    form equals the per-cluster variances summed in floating point."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 5, n_clusters)
    clusters = np.repeat(np.arange(n_clusters), sizes)
    gold, votes = simulate.draw(rng, len(clusters), 1, [0.8, 0.7, 0.65, 0.6, 0.55], 0.3, 0.08)
    folds = cluster_folds(gold, clusters, 5, 0)
    rb = RefitBootstrap(gold, folds, ClusterBootstrap(clusters, n_boot, seed))
    cat = StackedLogit(abstention="category", n_votes=votes.shape[1]).features(votes)
    rungs = {
        "stacked": rb.stacked(votes, 1.0, 0.5),
        "best_cv": rb.best_cv(votes, 0.5),
        "acc_weighted": rb.weighted(votes, "accuracy"),
        "other_encoding": rb.stacked(cat, 1.0, 0.5),
    }
    full = {r: indicators(gold, votes[:, j]).sum(0) for j, r in enumerate(rungs)}
    rd = RefitDraws.collect(rb, rungs, full)
    ref = own_by_cluster(rb, rungs, full)
    assert np.abs(rd.own - ref).max() <= 1e-10 * np.abs(ref).max()
    for r in rungs:
        assert np.array_equal(rd.counts[r], rb.counts(rungs[r]))
    # a fractional rung among them (each row's probability of 1): its own term in doubles, the same sum
    rungs["smoothed"] = smoothed_rung(votes)
    full["smoothed"] = indicators(gold, votes[:, 1]).sum(0)
    rd = RefitDraws.collect(rb, rungs, full)
    ref = own_by_cluster(rb, rungs, full)
    assert np.abs(rd.own - ref).max() <= 1e-9 * np.abs(ref).max()


def smoothed_rung(votes):
    """A fractional rung: each vote pattern predicts 1 with its training share of gold 1, smoothed (varies by draw)."""
    rows, inv = distinct_rows(votes)
    return refit.Rung(inv, len(rows), lambda t1, t0, k: (t1 + 1) / (t1 + t0 + 2), fractional=True)


def test_a_fractional_rung_counts_its_items_by_their_probability():
    """Its draws' counts are the items' expected cells under the refitted probabilities, summed with multiplicity."""
    gold, votes, clusters = panel(4, n_clusters=30)
    folds = cluster_folds(gold, clusters, 5, 0)
    boot = ClusterBootstrap(clusters, 20, 3)
    rb = RefitBootstrap(gold, folds, boot)
    rung = smoothed_rung(votes)
    counts = rb.counts(rung)
    rows, inv = distinct_rows(votes)
    for b, w in enumerate(boot.weights[:5]):
        iw = w[boot.item_cluster]
        want = np.zeros(6)
        for tr, te in folds:
            t1 = np.bincount(inv[tr], iw[tr] * (gold[tr] == 1), len(rows))
            t0 = np.bincount(inv[tr], iw[tr] * (gold[tr] == 0), len(rows))
            p = ((t1 + 1) / (t1 + t0 + 2))[inv[te]]
            g = gold[te] == 1
            want += iw[te] @ np.column_stack([g * p, g * (1 - p), 0 * p, ~g * p, ~g * (1 - p), 0 * p])
        np.testing.assert_allclose(counts[b], want, rtol=1e-12)
    with pytest.raises(ValueError, match="never abstains"):
        refit.Rung(inv, len(rows), None, abstains=True, fractional=True)


def test_the_own_term_is_exact_whatever_the_chunks(monkeypatch):
    """Whole-number moments: reading the draws one at a time or all at once gives the same bits."""
    gold, votes, clusters = panel(6, n_clusters=40)
    folds = cluster_folds(gold, clusters, 5, 0)
    full = {"stacked": indicators(gold, votes[:, 0]).sum(0), "best_cv": indicators(gold, votes[:, 1]).sum(0)}

    def own():
        rb = RefitBootstrap(gold, folds, ClusterBootstrap(clusters, 200, 2))
        return RefitDraws.collect(rb, {"stacked": rb.stacked(votes, 1.0, 0.5), "best_cv": rb.best_cv(votes, 0.5)}, full)

    whole = own()
    monkeypatch.setattr(refit, "PART_BYTES", 1)  # chunks of one draw
    one = own()
    assert np.array_equal(one.own, whole.own) and np.array_equal(one.counts["best_cv"], whole.counts["best_cv"])


def test_refit_draws_read_side_by_side_and_the_own_term_by_hand():
    gold, votes, clusters = panel(6, n_clusters=40)
    folds = cluster_folds(gold, clusters, 5, 0)
    rb = RefitBootstrap(gold, folds, ClusterBootstrap(clusters, 50, 2))
    full = {"stacked": indicators(gold, votes[:, 0]).sum(0), "best_cv": indicators(gold, votes[:, 1]).sum(0)}
    rungs = {"stacked": rb.stacked(votes, 1.0, 0.5), "best_cv": rb.best_cv(votes, 0.5)}
    rd = RefitDraws.collect(rb, rungs, full)
    assert np.array_equal(rd.counts["stacked"], rb.counts(rb.stacked(votes, 1.0, 0.5)))
    assert np.array_equal(rd.counts["best_cv"], rb.counts(rb.best_cv(votes, 0.5)))
    gs, gc = gradients(full["stacked"])["kappa"], gradients(full["best_cv"])["kappa"]
    chunks = list(rb.draws(rungs))
    st = np.vstack([rb.cluster_counts(rungs["stacked"], c["stacked"][1]) for c in chunks])
    cv = np.vstack([rb.cluster_counts(rungs["best_cv"], c["best_cv"][1]) for c in chunks])
    own = (st @ gs - cv @ gc).var(axis=0).sum()  # each cluster's own contribution, across the draws
    assert rd.correction({("stacked", "kappa"): 1.0, ("best_cv", "kappa"): -1.0}) == pytest.approx(own, rel=1e-9)
    assert rd.correction({("stacked", "kappa"): 1.0}) == pytest.approx((st @ gs).var(axis=0).sum(), rel=1e-9)


def test_corrected_interval_never_falls_under_the_fixed_predictions():
    rng = np.random.default_rng(0)
    draws, fixed = rng.normal(0.1, 0.05, 2000), rng.normal(0.1, 0.03, 2000)
    ci, se, p = corrected_interval(0.1, draws, fixed, correction=0.0)
    assert se == pytest.approx(np.std(draws)) and ci[0] == pytest.approx(0.1 - 1.959964 * se, rel=1e-6)
    _, se_floor, _ = corrected_interval(0.1, draws, fixed, correction=1.0)  # a correction larger than the variance
    assert se_floor == pytest.approx(np.std(fixed))
    assert corrected_interval(0.0, np.zeros(5), np.zeros(5), 0.0)[2] == 1.0
