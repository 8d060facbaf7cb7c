"""The figures of the paper, drawn from results.json (the ladder, :mod:`src.core.ladder`) and suite.json (the analysis
suite, :mod:`src.studies.suite`); :func:`draw` writes every one the two documents allow.

* Fig. 2 (§3.1) — per-member κ violins per dataset, with the stacked panel (●), the oracle best single (■) and
  the frontier judge (★) overlaid, datasets by descending mean member κ;
* Fig. 3a (§3.3) — φ̄ against the members at κ ≥ κ₀, the thresholds φ₀ and c·K bounding the admissible (shaded)
  quadrant, the invariance region hatched; Fig. 3b — paired Δκ of the panel against the CV-best single, the
  average member and the frontier with 95% paired cluster-bootstrap intervals;
* Fig. 4 (§3.3) — pairwise error-correlation φ heatmaps, datasets by ascending φ̄, one colour scale, diagonal
  masked;
* Fig. 5 (§3.3) — leave-one-member-out Δκ heatmap (red: load-bearing), clipped at ±0.07, column extremes in bold;
* Fig. 6a — stacked κ against panel size K (greedy decorrelating order); Fig. 6b — stacked κ against the
  labelled records, interquartile range shaded, the label-free majority dotted (Appendix C);
* Fig. 8 (Appendix E) — leave-one-dataset-out transfer against in-domain stacking, the CV-best single and the
  average member.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from src.io.files import atomic_path
from src.studies.noise import parts as studied


def _plt():
    import matplotlib  # imported here, not at start-up: matplotlib ~0.6 s

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # imported here, not at start-up: matplotlib ~0.6 s

    return plt


def estimate(s: dict, comp: str, metric: str = "kappa") -> float | None:
    """A comparator's point estimate in a dataset summary (None when the ladder has no such rung)."""
    c = s["comparators"].get(comp)
    return None if c is None else c[metric]["estimate"]


def _grid(n: int, ncols: int = 4) -> tuple[int, int]:
    ncols = min(ncols, n)
    return int(np.ceil(n / ncols)), ncols


def _small_multiples(n: int):
    """One κ panel per dataset on a grid of up to four columns: (figure, the n panels); the grid's spare cells
    are blanked. Title and legend follow with :func:`_figure_legend`."""
    nr, nc = _grid(n)
    fig, axes = _plt().subplots(nr, nc, figsize=(3.3 * nc, 2.6 * nr + 0.9), squeeze=False)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    return fig, list(axes.flat)[:n]


def _label_panel(ax, title: str, xlabel: str) -> None:
    """A small multiple's title, axis labels (κ up) and tick size."""
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel("κ", fontsize=8)
    ax.tick_params(labelsize=7)


def fig2_member_kappa(results: dict, path: Path) -> Path:
    """Fig. 2: single-member competence per dataset."""
    plt = _plt()
    ds = results["datasets"]
    names = sorted(ds, key=lambda n: -np.mean([m["kappa"] for m in ds[n]["members"].values()]))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(names) + 1.5), 4.2))
    data = [[m["kappa"] for m in ds[n]["members"].values()] for n in names]
    pos = np.arange(len(names))
    parts = ax.violinplot(data, positions=pos, showextrema=False, widths=0.8)
    for b in parts["bodies"]:
        b.set_facecolor("#9ecae1")
        b.set_alpha(0.6)
    rng = np.random.default_rng(0)
    for i, vals in enumerate(data):
        ax.scatter(i + rng.uniform(-0.12, 0.12, len(vals)), vals, s=10, color="#3182bd", alpha=0.8, zorder=2)
    for marker, comp, label, color in (
        ("o", "stacked", "stacked panel", "black"),
        ("s", "oracle", "oracle best single", "#e6550d"),
        ("*", "frontier", "frontier", "#756bb1"),
    ):
        ys = [estimate(ds[n], comp) for n in names]
        if any(v is not None for v in ys):
            ax.scatter(
                [p for p, v in zip(pos, ys) if v is not None],
                [v for v in ys if v is not None],
                marker=marker,
                s=90 if marker == "*" else 45,
                color=color,
                label=label,
                zorder=3,
                edgecolor="white",
                linewidth=0.6,
            )
    ax.set_xticks(pos, names, rotation=30 if len(names) > 5 else 0, ha="right" if len(names) > 5 else "center")
    ax.set_ylabel("Cohen's κ vs gold")
    ax.axhline(0, color="grey", lw=0.6, ls=":")
    ax.set_title("Fig. 2 — single-member competence per dataset")
    ax.legend(loc="best", fontsize=8, frameon=False)
    return _save(fig, path)


def fig3a_regime(results: dict, suite: dict | None, path: Path) -> Path:
    """Fig. 3a: φ̄ against members at κ ≥ κ₀, admissible quadrant shaded, invariance region hatched."""
    plt = _plt()
    from matplotlib.patches import Rectangle  # imported here, not at start-up: matplotlib ~0.6 s

    ds = results["datasets"]
    first = next(iter(ds.values()))["admissibility"]
    K, k0, c, p0 = first["n_members"], first["kappa0"], first["c"], first["phi0"]
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    ax.add_patch(Rectangle((-1, c * K), p0 + 1, K + 1 - c * K, color="#fdd49e", alpha=0.5, lw=0, label="admissible"))
    inv = (suite or {}).get("appendix_c", {}).get("invariance")
    if inv:
        phis, cs, same = np.array(inv["phi0"]), np.array(inv["c"]), np.array(inv["same"], bool)
        xe = np.r_[phis[0], (phis[1:] + phis[:-1]) / 2, phis[-1]]  # cell edges around the grid points
        for i, cc in enumerate(cs):  # one hatched rectangle per run of positions where nobody changes side
            run = np.flatnonzero(np.diff(np.r_[0, same[i].astype(int), 0]))
            for a, b in zip(run[::2], run[1::2]):
                ax.add_patch(
                    Rectangle(
                        (xe[a], cc * K - 0.5), xe[b] - xe[a], 1.0, fill=False, hatch="///", edgecolor="#9e9e9e", lw=0
                    )
                )
        ax.add_patch(
            Rectangle((0, 0), 0, 0, fill=False, hatch="///", edgecolor="#9e9e9e", lw=0, label="invariance region")
        )
    ax.axvline(p0, color="#d4a017", lw=2)
    ax.axhline(c * K, color="#d4a017", lw=2)
    xs, placed, undefined = [], [], []
    for n, s in sorted(ds.items(), key=lambda kv: kv[1]["admissibility"]["phi_bar"] or 0.0):
        a = s["admissibility"]
        if a["phi_bar"] is None:
            undefined.append(n)
            continue
        x, y = a["phi_bar"], a["members_at_kappa0"]
        xs.append(x)
        ax.scatter(
            x,
            y,
            s=50,
            zorder=3,
            marker="o" if a["admissible"] else "X",
            color="#2b8cbe" if a["admissible"] else "#de2d26",
        )
        near = sum(1 for px, py in placed if py == y and abs(px - x) < 0.06)  # stagger labels that would collide
        placed.append((x, y))
        ax.annotate(n, (x, y), xytext=(5, 4 + 11 * near), textcoords="offset points", fontsize=8)
    if undefined:
        ax.text(
            0.99,
            0.02,
            f"φ̄ undefined, not shown: {', '.join(undefined)}",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=7,
            color="grey",
        )
    lo = min([0.0] + xs)
    ax.set_xlim(lo - 0.02, max([p0 + 0.2] + [x + 0.1 for x in xs]))
    ax.set_ylim(-0.5, K + 0.5)
    ax.set_xlabel("mean pairwise error correlation φ̄")
    ax.set_ylabel(f"members at κ ≥ {k0:g}")
    ax.set_title(f"Fig. 3a — regime ordering (φ₀={p0:g}, c={c:g}: {c * K:g} of {K} members)")
    ax.legend(loc="upper right", fontsize=8, frameon=True)
    return _save(fig, path)


def fig3b_deltas(results: dict, path: Path) -> Path:
    """Fig. 3b: the panel's paired Δκ against the CV-best single, the average member and the frontier."""
    plt = _plt()
    ds = results["datasets"]
    names = list(ds)
    fig, ax = plt.subplots(figsize=(max(5.5, 1.2 * len(names) + 1.5), 4.2))
    comps = [("best_cv", "CV-best single", "o"), ("avg_member", "average member", "s"), ("frontier", "frontier", "D")]
    for i, (comp, label, marker) in enumerate(comps):
        xs, ys, lo, hi = [], [], [], []
        for j, n in enumerate(names):
            d = ds[n]["deltas"].get(comp)
            if d is None:
                continue
            xs.append(j + (i - 1) * 0.22)
            ys.append(d["kappa"]["estimate"])
            lo.append(d["kappa"]["estimate"] - d["kappa"]["ci"][0])
            hi.append(d["kappa"]["ci"][1] - d["kappa"]["estimate"])
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt=marker, capsize=3, label=f"vs {label}", ms=6)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(
        range(len(names)), names, rotation=30 if len(names) > 5 else 0, ha="right" if len(names) > 5 else "center"
    )
    ax.set_ylabel("paired Δκ (panel − comparator)")
    ax.set_title("Fig. 3b — paired deltas, 95% cluster-bootstrap intervals")
    ax.legend(fontsize=8, frameon=False)
    return _save(fig, path)


def fig4_phi(suite: dict, path: Path) -> Path:
    """Fig. 4: pairwise error correlation φ per dataset, ascending φ̄, shared colour scale, diagonal masked."""
    plt = _plt()
    ds = suite["datasets"]
    names = sorted(
        ds, key=lambda n: np.inf if ds[n]["admissibility"]["phi_bar"] is None else ds[n]["admissibility"]["phi_bar"]
    )
    members = suite["members"]
    nr, nc = _grid(len(names))
    fig, axes = plt.subplots(nr, nc, figsize=(3.1 * nc + 1.2, 3.1 * nr + 0.4), squeeze=False, layout="constrained")
    mats = [np.array([[np.nan if v is None else v for v in row] for row in ds[n]["phi"]], float) for n in names]
    for m in mats:
        np.fill_diagonal(m, np.nan)
    vmax = max([np.nanmax(np.abs(m)) for m in mats if np.isfinite(m).any()] + [0.1])
    im = None
    for ax, n, m in zip(axes.flat, names, mats):
        im = ax.imshow(np.ma.masked_invalid(m), cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        pb = ds[n]["admissibility"]["phi_bar"]
        ax.set_title(f"{n} (φ̄={pb:.2f})" if pb is not None else n, fontsize=9)
        ax.set_xticks(range(len(members)), members, rotation=90, fontsize=6)
        ax.set_yticks(range(len(members)), members if ax in axes[:, 0] else [], fontsize=6)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.suptitle("Fig. 4 — pairwise error correlation φ (datasets by ascending φ̄)")
    fig.colorbar(im, ax=axes, shrink=0.8, label="φ (error correlation)")
    return _save(fig, path, tight=False)


def fig5_leave_one_out(suite: dict, path: Path, clip: float = 0.07) -> Path:
    """Fig. 5: Δκ (stacked without the member − full stacked), members × datasets."""
    plt = _plt()
    ds = suite["datasets"]
    names, members = list(ds), suite["members"]
    M = np.array([[ds[n]["leave_one_out"]["members"][m]["estimate"] for n in names] for m in members])
    fig, ax = plt.subplots(figsize=(1.1 * len(names) + 2.5, 0.42 * len(members) + 1.6))
    im = ax.imshow(np.clip(M, -clip, clip), cmap="RdBu", vmin=-clip, vmax=clip, aspect="auto")
    for j in range(len(names)):
        col = M[:, j]
        extremes = {i for i in (int(np.argmin(col)), int(np.argmax(col))) if abs(col[i]) > 5e-4}
        for i in range(len(members)):
            ax.text(
                j,
                i,
                f"{col[i]:+.3f}",
                ha="center",
                va="center",
                fontsize=7,
                fontweight="bold" if i in extremes else "normal",
                color="white" if abs(col[i]) > 0.6 * clip else "black",
            )
    ax.set_xticks(
        range(len(names)), names, rotation=30 if len(names) > 5 else 0, ha="right" if len(names) > 5 else "center"
    )
    ax.set_yticks(range(len(members)), members)
    ax.set_title("Fig. 5 — leave-one-member-out Δκ (red: load-bearing)")
    fig.colorbar(im, ax=ax, label=f"Δκ (clipped at ±{clip:g})")
    return _save(fig, path)


def fig6_curves(suite: dict, path_a: Path, path_b: Path) -> list[Path]:
    """Fig. 6a (size) and Fig. 6b (labelling budget), one panel per dataset."""
    ds = suite["datasets"]
    names = list(ds)
    fig, axes = _small_multiples(len(names))
    for ax, n in zip(axes, names):
        sz = ds[n]["size"]
        ax.plot(sz["k"], sz["stacked"], "o-", ms=4, label="stacked")
        ax.plot(sz["k"], sz["majority"], ":", color="grey", label="majority")
        ax.axhline(sz["best_single"], color="#e6550d", lw=0.8, ls="--", label="best single (full sample)")
        _label_panel(ax, n, "panel size K")
        ax.set_xticks(sz["k"])
    _figure_legend(fig, axes[0], 3, "Fig. 6a — stacked κ against panel size (greedy decorrelating order)")
    out = [_save(fig, path_a, tight=False)]
    fig, axes = _small_multiples(len(names))
    for ax, n in zip(axes, names):
        cv = ds[n]["curve"]
        pts = [(int(b), v) for b, v in cv["budgets"].items() if v]
        if pts:
            x = np.array([p[0] for p in pts])
            ax.plot(x, [p[1]["mean"] for p in pts], "-", color="#3182bd", label="stacked (mean)")
            ax.fill_between(
                x,
                [p[1]["iqr"][0] for p in pts],
                [p[1]["iqr"][1] for p in pts],
                color="#9ecae1",
                alpha=0.5,
                lw=0,
                label="IQR",
            )
            for b, v in pts:
                mk = "o" if v["beats_best_cv"] else ("^" if v["beats_majority"] else "x")
                ax.plot(b, v["mean"], mk, color="#08519c", ms=5)
            ax.set_xscale("log")
            ax.set_xticks(x, [str(b) for b in x])
            ax.xaxis.set_minor_formatter(_null_formatter())
        ax.axhline(cv["majority"], color="grey", ls=":", label="majority (label-free)")
        ax.axhline(cv["best_cv"], color="#e6550d", lw=0.8, ls="--", label="CV-best single")
        ax.axhline(cv["full"], color="black", lw=0.6, ls="-.", label="full stacker")
        _label_panel(ax, f"{n} (train {cv['train_records']} records)", "labelled records")
    _figure_legend(
        fig, axes[0], 5, "Fig. 6b — stacked κ against labelled records (● beats CV-best, ▲ beats majority, × neither)"
    )
    out.append(_save(fig, path_b, tight=False))
    return out


def _figure_legend(fig, ax, ncol: int, title: str) -> None:
    """A title over and one legend under the small multiples (keeps the panels free of it)."""
    handles, labels = ax.get_legend_handles_labels()
    fig.suptitle(title)
    h = fig.get_figheight()
    fig.tight_layout(rect=(0, 0.35 / h, 1, 1 - 0.2 / h))  # room for the legend under and the title over
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)


def _null_formatter():
    from matplotlib.ticker import NullFormatter  # imported here, not at start-up: matplotlib ~0.6 s

    return NullFormatter()


def fig8_transfer(suite: dict, path: Path) -> Path | None:
    """Fig. 8: leave-one-dataset-out transfer."""
    tr = suite.get("transfer") or {}
    if not tr:
        return None
    plt = _plt()
    names = list(tr)
    keys = [
        ("in_domain", "in-domain stacked"),
        ("lodo", "transferred (lodo)"),
        ("best_cv", "CV-best single"),
        ("avg_member", "average member"),
    ]
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 2.5, 4.0))
    w = 0.2
    for i, (k, label) in enumerate(keys):
        ax.bar(np.arange(len(names)) + (i - 1.5) * w, [tr[n][k] for n in names], w, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("Cohen's κ")
    ax.axhline(0, color="grey", lw=0.6)
    ax.set_title("Fig. 8 — leave-one-dataset-out transfer of the stacker")
    ax.legend(fontsize=8, frameon=False)
    return _save(fig, path)


def _save(fig, path: Path, tight: bool = True) -> Path:
    plt = _plt()
    path = Path(path)
    if tight:
        fig.tight_layout()
    with atomic_path(path) as tmp:  # a crash never leaves a truncated PNG
        fig.savefig(tmp, dpi=130, bbox_inches="tight", format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path


def fig_cascade(suite: dict, path: Path) -> Path | None:
    """Escalation cascade (beyond the paper; :mod:`src.studies.suite.cascade`): per dataset, the cascade's κ against
    the share of items escalated (95% paired cluster-bootstrap band), escalating the same share at random, the
    expensive judge alone, its non-inferiority bound (κ − margin) and the cheap panel alone."""
    c = suite.get("cascade") or {}
    ds = {n: d for n, d in (c.get("datasets") or {}).items() if "skipped" not in d}
    if not ds:
        return None
    fig, axes = _small_multiples(len(ds))
    for ax, (n, d) in zip(axes, ds.items()):
        pts = d["points"]
        x = [p["share"] for p in pts]
        ax.fill_between(
            x,
            [p["kappa"]["ci"][0] for p in pts],
            [p["kappa"]["ci"][1] for p in pts],
            color="#9ecae1",
            alpha=0.5,
            lw=0,
            label="cascade 95% CI",
        )
        ax.plot(x, [p["kappa"]["estimate"] for p in pts], "o-", ms=3, color="#08519c", label="cascade")
        ax.plot(x, [p["random_kappa"] for p in pts], ":", color="grey", label="random escalation")
        k_exp = d["alone"]["expensive"]["kappa"]["estimate"]
        ax.axhline(k_exp, color="#e6550d", lw=0.9, ls="--", label=f"{c['expensive']} alone")
        ax.axhline(k_exp - c["margin"], color="#e6550d", lw=0.6, ls=":", label="non-inferiority bound")
        ax.axhline(d["alone"]["panel"]["kappa"]["estimate"], color="black", lw=0.8, ls="-.", label="cheap panel alone")
        if d["noninferior"]:
            ax.axvline(d["noninferior"]["share"], color="#31a354", lw=0.9, label="fewest escalations, non-inferior")
        _label_panel(ax, n, "share escalated")
    _figure_legend(fig, axes[0], 4, "Escalation cascade — κ against the share of items escalated")
    return _save(fig, path, tight=False)


def noise_figure(doc: dict, path: Path) -> Path:
    """Noisy calibration labels (beyond the paper): stacked κ on clean gold against the label-noise
    rate, one colour per TRIVIA+ noise type (WS, DW, DL, RF), the plain stacker solid and the others dashed,
    one panel per dataset and the simulated admissible panel; a native TRIVIA+ column is a marker at its rate."""

    plt = _plt()
    parts = studied(doc)
    nrows, ncols = _grid(len(parts), 3)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    colours = dict(zip(("ws", "dw", "dl", "rf"), plt.get_cmap("tab10").colors))
    for ax, (name, ds) in zip(axes.flat, parts.items()):
        stackers = list(ds["clean"]["stacked"])
        for kind in dict.fromkeys(p["type"] for p in ds["points"]):
            pts = [p for p in ds["points"] if p["type"] == kind]
            for si, st in enumerate(stackers):
                style = dict(
                    color=colours.get(kind),
                    ls="-" if si == 0 else "--",
                    marker="o" if si == 0 else "s",
                    ms=3,
                    lw=1.2,
                    label=f"{kind.upper()} · {st}",
                )
                if pts[0]["rate"] == "native":
                    ax.plot([pts[0]["realised_rate"]], [pts[0]["train"][st]["kappa"]], **{**style, "ms": 7})
                    continue
                xs = [0.0] + [p["rate"] for p in pts]
                ax.plot(xs, [ds["clean"]["stacked"][st]] + [p["train"][st]["kappa"] for p in pts], **style)
        ax.axhline(ds["clean"]["best_cv"], color="grey", ls=":", lw=1, label="CV-best single, clean labels")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("calibration-label noise rate")
        ax.set_ylabel("stacked κ on clean gold")
    for ax in list(axes.flat)[len(parts) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="lower center",
        ncol=min(len(labels), 5),
        fontsize=7,
        frameon=False,
        bbox_to_anchor=(0.5, -0.02 - 0.03 * (len(labels) // 5)),
    )
    fig.suptitle("Stacked κ trained on noisy calibration labels (solid: plain stacker; dashed: noise-robust)")
    return _save(fig, path)


def monitor_figure(doc: dict, path: str | Path) -> Path:
    """Live monitoring (beyond the paper; :mod:`src.studies.monitor`): per window, the label-free agreement
    proxy against the calibration set's, the estimated prevalence against its reference ± tolerance, and the
    drift test's smallest Holm-adjusted p against α; alarms marked, the replay's change point dashed."""
    plt = _plt()
    w = doc["windows"]
    x = np.array([r["end"] for r in w], dtype=float)
    fig, axes = plt.subplots(3, 1, figsize=(7.5, 7.0), sharex=True)
    axes[0].plot(x, [r["agreement_proxy"] for r in w], color="#3182bd", label="window")
    axes[0].axhline(doc["calibration"]["agreement_proxy"], color="grey", ls=":", label="calibration set")
    axes[0].set_ylabel("agreement proxy")
    s = doc["settings"]
    ref, tol = s["reference_prevalence"], s["tolerance"]
    axes[1].plot(x, [r["prevalence"] for r in w], color="#e6550d", label="estimated (EM)")
    axes[1].axhspan(ref - tol, ref + tol, color="#fdd0a2", alpha=0.5, label="reference ± tolerance")
    axes[1].set_ylabel("prevalence")
    p = np.clip(np.array([r["p_holm_min"] for r in w], dtype=float), 1e-300, 1.0)
    axes[2].plot(x, -np.log10(p), color="black", label="drift test")
    axes[2].axhline(-np.log10(s["alpha"]), color="red", ls=":", label=f"α = {s['alpha']:g}")
    axes[2].set_ylabel("−log₁₀ min Holm p")
    axes[2].set_xlabel("items scored (window end)")
    for kind, ax, color in (("panel", axes[2], "red"), ("prevalence", axes[1], "#a63603")):
        for a in doc["alarms"][kind]:
            ax.axvline(a, color=color, lw=1.2, alpha=0.7)
    change = (doc.get("stream") or {}).get("change")
    for ax in axes:
        if change is not None:
            ax.axvline(change, color="grey", ls="--", lw=1)
        ax.legend(fontsize=7, frameon=False, loc="upper left")
    title = "Live monitoring of the panel's votes"
    if change is not None:
        title += f" — replay '{doc['stream']['scenario']}', change at item {change} (dashed), alarms solid"
    fig.suptitle(title, fontsize=9)
    return _save(fig, Path(path))


def prevalence_figure(doc: dict, path: str | Path) -> Path:
    """Prior shift (beyond the paper; :mod:`src.studies.prevalence`): per calibration set (columns), Brier, ECE, F1 and
    balanced accuracy at the served decision against the deployment prevalence — uncorrected, corrected with the
    true prevalence, corrected with the EM estimate (95 % cluster-bootstrap intervals shaded) — and, last row,
    the EM estimate of the prevalence against the truth (the mean uncorrected posterior dotted)."""
    plt = _plt()
    sets = list(doc["datasets"])
    rows = [("brier", "Brier"), ("ece", "ECE"), ("f1", "F1 (hallucinated)"), ("bacc", "balanced accuracy")]
    style = {
        "uncorrected": ("tab:gray", "uncorrected"),
        "true": ("tab:blue", "corrected, true π"),
        "estimated": ("tab:orange", "corrected, EM-estimated π"),
    }
    fig, axes = plt.subplots(
        len(rows) + 1, len(sets), figsize=(2.9 * len(sets), 2.2 * (len(rows) + 1)), squeeze=False, sharex=True
    )
    for j, name in enumerate(sets):
        d = doc["datasets"][name]
        cells = d["prevalences"]
        x = np.array([float(q) for q in cells])
        for i, (m, label) in enumerate(rows):
            ax = axes[i, j]
            for c, (colour, text) in style.items():
                s = [cells[q]["metrics"][m][c] for q in cells]
                ax.plot(x, [v["estimate"] for v in s], "o-", color=colour, ms=3, label=text)
                ax.fill_between(x, [v["ci"][0] for v in s], [v["ci"][1] for v in s], color=colour, alpha=0.2, lw=0)
            if j == 0:
                ax.set_ylabel(label)
            if i == 0:
                ax.set_title(f"{name} ({d['kind']}, κ {d['balanced']['kappa']:.2f})", fontsize=9)
        ax = axes[-1, j]
        pe = [cells[q]["prevalence_estimate"] for q in cells]
        ax.plot(x, x, color="black", lw=0.8, label="truth")
        ax.plot(x, [v["estimate"] for v in pe], "o-", color="tab:orange", ms=3, label="EM estimate")
        ax.fill_between(
            x,
            [v["window_ci"][0] for v in pe],
            [v["window_ci"][1] for v in pe],
            color="tab:orange",
            alpha=0.15,
            lw=0,
            label="one window (95 %)",
        )
        ax.plot(x, [v["mean_posterior"]["estimate"] for v in pe], ":", color="tab:gray", label="mean posterior")
        ax.set_ylim(0, 1)
        ax.set_xlabel("deployment prevalence π")
        if j == 0:
            ax.set_ylabel("estimated π")
    h1, l1 = axes[0, 0].get_legend_handles_labels()
    h2, l2 = axes[-1, 0].get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, loc="lower center", ncol=4, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.04))
    fig.suptitle("Prevalence shift: the stacker's posteriors at the served decision (p ≥ threshold)", fontsize=10)
    return _save(fig, Path(path))


FIGURES = {
    "fig2": "fig2_member_kappa.png",
    "fig3a": "fig3a_regime.png",
    "fig3b": "fig3b_deltas.png",
    "fig4": "fig4_phi.png",
    "fig5": "fig5_leave_one_out.png",
    "fig6a": "fig6a_size.png",
    "fig6b": "fig6b_budget.png",
    "fig8": "fig8_transfer.png",
    "cascade": "cascade.png",
}


def draw(results: dict | None, suite: dict | None, outdir: str | Path) -> list[Path]:
    """Every figure the two documents allow (a document without datasets allows none); returns the written
    paths."""
    out = Path(outdir)
    paths: list[Path | None] = []
    if results and results.get("datasets"):
        paths += [
            fig2_member_kappa(results, out / FIGURES["fig2"]),
            fig3a_regime(results, suite, out / FIGURES["fig3a"]),
            fig3b_deltas(results, out / FIGURES["fig3b"]),
        ]
    if suite and suite.get("datasets"):
        paths += [fig4_phi(suite, out / FIGURES["fig4"]), fig5_leave_one_out(suite, out / FIGURES["fig5"])]
        paths += fig6_curves(suite, out / FIGURES["fig6a"], out / FIGURES["fig6b"])
        paths.append(fig8_transfer(suite, out / FIGURES["fig8"]))
        paths.append(fig_cascade(suite, out / FIGURES["cascade"]))
    return [p for p in paths if p is not None]


# The beyond-the-paper studies draw their own figure into their stage's output (conf/<name>/default.yaml):
# noise_figure, monitor_figure, prevalence_figure.
__all__ = ["FIGURES", "draw", "estimate", "monitor_figure", "noise_figure", "prevalence_figure"]
