"""The ladder's intervals: refit draws for what was fitted (calls, decisions), the paper's fixed-prediction
intervals kept beside them, and Holm's families as a setting."""

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from src.core import ladder, ladderbase, verdicts
from src.core.aggregate import StackedLogit
from src.core.evaluate import ClusterBootstrap, from_counts, indicators, interval, paired_delta
from src.core.intervals import fisher_interval
from src.core.refit import RefitBootstrap, gradients
from src.studies import simulate

Z = norm.ppf(0.975)


def _table(seed=3, n_clusters=80, datasets=("sim",)):
    parts = [
        simulate.panel(
            n_clusters, 2, [0.8, 0.72, 0.68, 0.64, 0.6, 0.56], 0.3, abstain_rate=0.05, dataset=d, seed=seed + i
        )
        for i, d in enumerate(datasets)
    ]
    return verdicts.validate(pd.concat(parts, ignore_index=True))


@pytest.fixture(scope="module")
def result():
    t = _table()
    return t, ladder.analyze(t, StackedLogit(), ladderbase.LadderSettings(n_boot=300))["sim"]


def test_calls_read_the_corrected_refit_interval_and_the_fixed_ones_are_kept(result):
    t, r = result
    s = r.summary
    y, clusters = t.gold, t.clusters
    boot = ClusterBootstrap(clusters, 300, 0)
    folds = ladderbase.checked_folds(y, clusters, ladderbase.LadderSettings())
    rb = RefitBootstrap(y, folds, boot)
    rungs = {"stacked": rb.stacked(t.votes, 1.0, 0.5), "best_cv": rb.best_cv(t.votes, 0.5)}
    chunks = list(rb.draws(rungs))
    fixed = boot.metrics(y, np.column_stack([r.predictions["stacked"], r.predictions["best_cv"]]))["kappa"]
    # the correction by hand: each cluster's own linearised contribution (gradient at the full-sample counts)
    full = {k: indicators(y, r.predictions[k]).sum(0) for k in ("stacked", "best_cv")}
    g = {k: gradients(full[k])["kappa"] for k in full}
    own = np.vstack(
        [
            rb.cluster_counts(rungs["stacked"], c["stacked"][1]) @ g["stacked"]
            - rb.cluster_counts(rungs["best_cv"], c["best_cv"][1]) @ g["best_cv"]
            for c in chunks
        ]
    )  # draws × clusters
    k_st = from_counts(np.vstack([c["stacked"][0] for c in chunks]))["kappa"]
    k_cv = from_counts(np.vstack([c["best_cv"][0] for c in chunks]))["kappa"]
    d = s["deltas"]["best_cv"]["kappa"]
    se = np.sqrt(max(np.var(k_st - k_cv) - own.var(axis=0).sum(), np.var(fixed[:, 0] - fixed[:, 1])))
    assert d["se"] == pytest.approx(se, rel=1e-6)
    assert d["ci"] == pytest.approx([d["estimate"] - 1.959964 * se, d["estimate"] + 1.959964 * se], rel=1e-5)
    assert d["p_one_sided"] == pytest.approx(norm.sf(d["estimate"] / se), rel=1e-6)
    # the paper's intervals: the out-of-fold predictions held fixed, clusters resampled (§2 as published)
    f = s["deltas_fixed"]["best_cv"]["kappa"]
    assert f["ci"] == paired_delta(f["estimate"], fixed[:, 0] - fixed[:, 1]).ci and f["se"] is None
    assert s["comparators"]["stacked"]["kappa"]["ci_fixed"] == interval(fixed[:, 0])
    assert s["bootstrap"]["interval"] == "refit_corrected" and "stacked" in s["bootstrap"]["refitted"]
    # a rung nothing was fitted for keeps its percentile interval
    assert s["comparators"]["majority"]["kappa"]["ci"] == s["comparators"]["majority"]["kappa"]["ci_fixed"]
    # the decision reads the corrected call against the CV-best single as deployed (its abstentions answered)
    doc = ladder.to_json({"sim": r}, ladderbase.LadderSettings(n_boot=300))
    assert doc["datasets"]["sim"]["decision"]["delta_ci"] == s["deltas"]["best_cv_deployed"]["kappa"]["ci"]


def test_the_correction_lies_between_the_fixed_and_the_refit_variance(result):
    """The fit's variation adds to the fixed-prediction variance; the refit bootstrap overstates it (each
    cluster's outcome counted twice); the corrected variance sits in between on this panel."""
    t, r = result
    s = r.summary
    y, clusters = t.gold, t.clusters
    boot = ClusterBootstrap(clusters, 300, 0)
    rb = RefitBootstrap(y, ladderbase.checked_folds(y, clusters, ladderbase.LadderSettings()), boot)
    k_st = from_counts(rb.counts(rb.stacked(t.votes, 1.0, 0.5)))["kappa"]
    k_st -= from_counts(rb.counts(rb.best_cv(t.votes, 0.5)))["kappa"]
    fixed = boot.metrics(y, np.column_stack([r.predictions["stacked"], r.predictions["best_cv"]]))["kappa"]
    se = s["deltas"]["best_cv"]["kappa"]["se"]
    assert np.std(fixed[:, 0] - fixed[:, 1]) < se < np.std(k_st)


@pytest.mark.parametrize(
    "mode, families",
    [
        ("core", [["a"], None, None]),
        ("separate", [["a"], ["b", "c"], ["b", "c"]]),
        ("all", [["a", "b", "c"]] * 3),
    ],
)
def test_holm_families_are_a_setting(mode, families):
    t = _table(n_clusters=40, datasets=("a", "b", "c"))
    res = ladder.analyze(
        t, StackedLogit(), ladderbase.LadderSettings(n_boot=60, core=["a"], holm=mode, abstention_contrast=False)
    )
    for name, fam in zip("abc", families):
        s = res[name].summary
        assert s["holm_family"] == fam
        p = s["deltas"]["best_cv"]["kappa"]
        if fam is None:
            assert p["p_holm"] is None  # not adjusted, and said so
        else:
            assert p["p_holm"] >= p["p_one_sided"]


def test_holm_setting_is_checked():
    with pytest.raises(ladderbase.AnalysisError, match=r"^analysis.holm='some': must be one of core, separate, all$"):
        ladderbase.check_settings(ladderbase.LadderSettings(holm="some"), StackedLogit())


def test_admissibility_is_read_with_its_uncertainty():
    """admitted_share: the rule on each bootstrap draw's members' κ and φ̄ (the loop: the draw's items repeated by
    their cluster's multiplicity, admissibility.test on them); members_uncertain: κ intervals across κ₀."""
    from src.core import admissibility

    t = _table(seed=5, n_clusters=60)
    y, votes = t.gold, t.votes
    boot = ClusterBootstrap(t.clusters, 40, 0)
    kd = boot.metrics(y, votes)["kappa"]
    share = admissibility.admitted_share(boot, y, votes, kd, 0.30, 0.5, 0.40)
    w = boot.item_weights().astype(int)
    loop = [
        admissibility.test(
            y[np.repeat(np.arange(len(y)), w[b])], votes[np.repeat(np.arange(len(y)), w[b])], 0.30, 0.5, 0.40
        ).admissible
        for b in range(len(w))
    ]
    assert share == pytest.approx(np.mean(loop))
    s = ladder.analyze(t, StackedLogit(), ladderbase.LadderSettings(n_boot=200))["sim"].summary
    a = s["admissibility"]
    assert 0 <= a["admitted_share"] <= 1
    assert a["members_uncertain"] == [m for m, v in s["members"].items() if v["kappa_ci"][0] < 0.30 <= v["kappa_ci"][1]]


def test_a_kappas_interval_is_normal_on_fishers_scale(result):
    """κ near ±1 is skewed toward 0 (κ of two binary ratings with equal margins is their correlation): a refitted
    rung's κ interval is normal on the atanh scale, symmetric there around the estimate, reaching further toward 0
    than away from it; a rung nothing was fitted for keeps its percentile interval."""
    s = result[1].summary
    for c in set(s["bootstrap"]["refitted"]) & set(s["comparators"]):  # Table 23's other arm is not a rung
        k = s["comparators"][c]["kappa"]
        lo, hi = np.arctanh(k["ci"])
        assert (lo + hi) / 2 == pytest.approx(np.arctanh(k["estimate"]), abs=1e-9), c
        if k["estimate"] > 0:  # it reaches further toward 0 than away from it
            assert k["ci"][1] - k["estimate"] < k["estimate"] - k["ci"][0], c
    assert fisher_interval(0.9, 0.03) == pytest.approx([np.tanh(np.arctanh(0.9) + d * 0.03 / 0.19) for d in (-Z, Z)])
    assert fisher_interval(0.0, 0.05) == pytest.approx([-np.tanh(Z * 0.05), np.tanh(Z * 0.05)])
    # at the bound the normal interval, cut to [−1, 1] (atanh's slope would make any se > 0 read [−1, 1])
    assert fisher_interval(1.0, 0.0) == [1.0, 1.0] and fisher_interval(1.0, 0.01) == pytest.approx([1 - Z * 0.01, 1])
    assert fisher_interval(-0.99, 0.01) == pytest.approx([-1.0, -0.99 + Z * 0.01])


def test_cluster_numbers_are_the_sorted_ids_inverse():
    """The folds and the bootstrap take each item's cluster as a number: the same numbers as np.unique of the id
    strings (code point order: accents, case, digits and characters beyond the BMP included)."""
    ids = ["b", "a", "B", "é", "e\u0301x", "10", "9", "𝔸", "a", "ß", "Z", "é"]
    df = pd.DataFrame({"item_id": [f"i{i}" for i in range(len(ids))], "cluster_id": ids, "gold": [0, 1] * 6, "m": 1})
    table = verdicts.validate(df)
    _, inv = np.unique(table.clusters, return_inverse=True)
    assert np.array_equal(ladderbase.cluster_numbers(table), inv.ravel())
