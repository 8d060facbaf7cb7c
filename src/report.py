"""Figures and the generated Markdown report (issue 5): ``python -m src.report``.

:func:`figures` draws, from results.json (the ladder, :mod:`src.ladder`) and suite.json (:mod:`src.analyses`):

* Fig. 2 — per-member κ violins per dataset, with the stacked panel (●), the oracle best single (■) and the
  frontier judge (★) overlaid, datasets by descending mean member κ;
* Fig. 3a — φ̄ against the members at κ ≥ κ₀, the thresholds φ₀ and c·K bounding the admissible (shaded)
  quadrant, the invariance region hatched; Fig. 3b — paired Δκ of the panel against the CV-best single, the
  average member and the frontier with 95% paired cluster-bootstrap intervals;
* Fig. 4 — pairwise error-correlation φ heatmaps, datasets by ascending φ̄, one colour scale, diagonal masked;
* Fig. 5 — leave-one-member-out Δκ heatmap (red: load-bearing), clipped at ±0.07, column extremes in bold;
* Fig. 6a — stacked κ against panel size K (greedy decorrelating order); Fig. 6b — stacked κ against the
  labelled records, interquartile range shaded, the label-free majority dotted;
* Fig. 8 — leave-one-dataset-out transfer against in-domain stacking, the CV-best single and the average member.

:func:`markdown` writes the report mirroring Tables 1, 4, 5, 6, 7, 15, 16, 17, 22 and 23, the Appendix C
check, the transfer and the cost model (Table 2, Appendix H), with the figures embedded.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from .errors import RaimError, one_line

log = logging.getLogger("raim.report")

METHODS = [  # Tables 15 / 16 row order: label-free, label-selected, stacked, frontier
    ("majority", "unweighted panel"), ("dawid_skene", "Dawid–Skene"), ("acc_weighted", "accuracy-weighted"),
    ("logodds_weighted", "log-odds-weighted"), ("avg_member", "average member"),
    ("best_avg", "best-on-average single"), ("best_cv", "best single (CV)"), ("oracle", "oracle best single"),
    ("stacked", "stacked panel"), ("frontier", "frontier"),
]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _est(s: dict, comp: str, metric: str = "kappa") -> float | None:
    c = s["comparators"].get(comp)
    return None if c is None else c[metric]["estimate"]


def _grid(n: int, ncols: int = 4) -> tuple[int, int]:
    ncols = min(ncols, n)
    return int(np.ceil(n / ncols)), ncols


# ---------------------------------------------------------------------------------------------- figures


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
    for marker, comp, label, color in (("o", "stacked", "stacked panel", "black"),
                                       ("s", "oracle", "oracle best single", "#e6550d"),
                                       ("*", "frontier", "frontier", "#756bb1")):
        ys = [_est(ds[n], comp) for n in names]
        if any(v is not None for v in ys):
            ax.scatter([p for p, v in zip(pos, ys) if v is not None], [v for v in ys if v is not None],
                       marker=marker, s=90 if marker == "*" else 45, color=color, label=label, zorder=3,
                       edgecolor="white", linewidth=0.6)
    ax.set_xticks(pos, names, rotation=30 if len(names) > 5 else 0, ha="right" if len(names) > 5 else "center")
    ax.set_ylabel("Cohen's κ vs gold")
    ax.axhline(0, color="grey", lw=0.6, ls=":")
    ax.set_title("Fig. 2 — single-member competence per dataset")
    ax.legend(loc="best", fontsize=8, frameon=False)
    return _save(fig, path)


def fig3a_regime(results: dict, suite: dict | None, path: Path) -> Path:
    """Fig. 3a: φ̄ against members at κ ≥ κ₀, admissible quadrant shaded, invariance region hatched."""
    plt = _plt()
    from matplotlib.patches import Rectangle

    ds = results["datasets"]
    first = next(iter(ds.values()))["admissibility"]
    K, k0, c, p0 = first["n_members"], first["kappa0"], first["c"], first["phi0"]
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    ax.add_patch(Rectangle((-1, c * K), p0 + 1, K + 1 - c * K, color="#fdd49e", alpha=0.5, lw=0,
                           label="admissible"))
    inv = (suite or {}).get("appendix_c", {}).get("invariance")
    if inv:
        phis, cs, same = np.array(inv["phi0"]), np.array(inv["c"]), np.array(inv["same"], bool)
        xe = np.r_[phis[0], (phis[1:] + phis[:-1]) / 2, phis[-1]]  # cell edges around the grid points
        for i, cc in enumerate(cs):  # one hatched rectangle per run of positions where nobody changes side
            run = np.flatnonzero(np.diff(np.r_[0, same[i].astype(int), 0]))
            for a, b in zip(run[::2], run[1::2]):
                ax.add_patch(Rectangle((xe[a], cc * K - 0.5), xe[b] - xe[a], 1.0, fill=False, hatch="///",
                                       edgecolor="#9e9e9e", lw=0))
        ax.add_patch(Rectangle((0, 0), 0, 0, fill=False, hatch="///", edgecolor="#9e9e9e", lw=0,
                               label="invariance region"))
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
        ax.scatter(x, y, s=50, zorder=3,
                   marker="o" if a["admissible"] else "X", color="#2b8cbe" if a["admissible"] else "#de2d26")
        near = sum(1 for px, py in placed if py == y and abs(px - x) < 0.06)  # stagger labels that would collide
        placed.append((x, y))
        ax.annotate(n, (x, y), xytext=(5, 4 + 11 * near), textcoords="offset points", fontsize=8)
    if undefined:
        ax.text(0.99, 0.02, f"φ̄ undefined, not shown: {', '.join(undefined)}", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=7, color="grey")
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
    ax.set_xticks(range(len(names)), names, rotation=30 if len(names) > 5 else 0,
                  ha="right" if len(names) > 5 else "center")
    ax.set_ylabel("paired Δκ (panel − comparator)")
    ax.set_title("Fig. 3b — paired deltas, 95% cluster-bootstrap intervals")
    ax.legend(fontsize=8, frameon=False)
    return _save(fig, path)


def fig4_phi(suite: dict, path: Path) -> Path:
    """Fig. 4: pairwise error correlation φ per dataset, ascending φ̄, shared colour scale, diagonal masked."""
    plt = _plt()
    ds = suite["datasets"]
    names = sorted(ds, key=lambda n: np.inf if ds[n]["admissibility"]["phi_bar"] is None
                   else ds[n]["admissibility"]["phi_bar"])
    members = suite["members"]
    nr, nc = _grid(len(names))
    fig, axes = plt.subplots(nr, nc, figsize=(3.1 * nc + 1.2, 3.1 * nr + 0.4), squeeze=False,
                             layout="constrained")
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
    for ax in list(axes.flat)[len(names):]:
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
            ax.text(j, i, f"{col[i]:+.3f}", ha="center", va="center", fontsize=7,
                    fontweight="bold" if i in extremes else "normal",
                    color="white" if abs(col[i]) > 0.6 * clip else "black")
    ax.set_xticks(range(len(names)), names, rotation=30 if len(names) > 5 else 0,
                  ha="right" if len(names) > 5 else "center")
    ax.set_yticks(range(len(members)), members)
    ax.set_title("Fig. 5 — leave-one-member-out Δκ (red: load-bearing)")
    fig.colorbar(im, ax=ax, label=f"Δκ (clipped at ±{clip:g})")
    return _save(fig, path)


def fig6_curves(suite: dict, path_a: Path, path_b: Path) -> list[Path]:
    """Fig. 6a (size) and Fig. 6b (labelling budget), one panel per dataset."""
    plt = _plt()
    ds = suite["datasets"]
    names = list(ds)
    nr, nc = _grid(len(names))
    fig, axes = plt.subplots(nr, nc, figsize=(3.3 * nc, 2.6 * nr + 0.9), squeeze=False, sharey=False)
    for ax, n in zip(axes.flat, names):
        sz = ds[n]["size"]
        ax.plot(sz["k"], sz["stacked"], "o-", ms=4, label="stacked")
        ax.plot(sz["k"], sz["majority"], ":", color="grey", label="majority")
        ax.axhline(sz["best_single"], color="#e6550d", lw=0.8, ls="--", label="best single (full sample)")
        ax.set_title(n, fontsize=9)
        ax.set_xlabel("panel size K", fontsize=8)
        ax.set_ylabel("κ", fontsize=8)
        ax.set_xticks(sz["k"])
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    _figure_legend(fig, axes.flat[0], 3, "Fig. 6a — stacked κ against panel size (greedy decorrelating order)")
    out = [_save(fig, path_a, tight=False)]
    fig, axes = plt.subplots(nr, nc, figsize=(3.3 * nc, 2.6 * nr + 0.9), squeeze=False)
    for ax, n in zip(axes.flat, names):
        cv = ds[n]["curve"]
        pts = [(int(b), v) for b, v in cv["budgets"].items() if v]
        if pts:
            x = np.array([p[0] for p in pts])
            ax.plot(x, [p[1]["mean"] for p in pts], "-", color="#3182bd", label="stacked (mean)")
            ax.fill_between(x, [p[1]["iqr"][0] for p in pts], [p[1]["iqr"][1] for p in pts], color="#9ecae1",
                            alpha=0.5, lw=0, label="IQR")
            for b, v in pts:
                mk = "o" if v["beats_best_cv"] else ("^" if v["beats_majority"] else "x")
                ax.plot(b, v["mean"], mk, color="#08519c", ms=5)
            ax.set_xscale("log")
            ax.set_xticks(x, [str(b) for b in x])
            ax.xaxis.set_minor_formatter(_null_formatter())
        ax.axhline(cv["majority"], color="grey", ls=":", label="majority (label-free)")
        ax.axhline(cv["best_cv"], color="#e6550d", lw=0.8, ls="--", label="CV-best single")
        ax.axhline(cv["full"], color="black", lw=0.6, ls="-.", label="full stacker")
        ax.set_title(f"{n} (train {cv['train_records']} records)", fontsize=9)
        ax.set_xlabel("labelled records", fontsize=8)
        ax.set_ylabel("κ", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    _figure_legend(fig, axes.flat[0], 5,
                   "Fig. 6b — stacked κ against labelled records (● beats CV-best, ▲ beats majority, × neither)")
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
    from matplotlib.ticker import NullFormatter

    return NullFormatter()


def fig8_transfer(suite: dict, path: Path) -> Path | None:
    """Fig. 8: leave-one-dataset-out transfer."""
    tr = suite.get("transfer") or {}
    if not tr:
        return None
    plt = _plt()
    names = list(tr)
    keys = [("in_domain", "in-domain stacked"), ("lodo", "transferred (lodo)"), ("best_cv", "CV-best single"),
            ("avg_member", "average member")]
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
    path.parent.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


FIGURES = {
    "fig2": "fig2_member_kappa.png", "fig3a": "fig3a_regime.png", "fig3b": "fig3b_deltas.png",
    "fig4": "fig4_phi.png", "fig5": "fig5_leave_one_out.png", "fig6a": "fig6a_size.png",
    "fig6b": "fig6b_budget.png", "fig8": "fig8_transfer.png",
}


def figures(results: dict | None, suite: dict | None, outdir: str | Path) -> list[Path]:
    """Every figure the two documents allow; returns the written paths."""
    out = Path(outdir)
    paths: list[Path | None] = []
    if results:
        paths += [fig2_member_kappa(results, out / FIGURES["fig2"]), fig3a_regime(results, suite, out / FIGURES["fig3a"]),
                  fig3b_deltas(results, out / FIGURES["fig3b"])]
    if suite:
        paths += [fig4_phi(suite, out / FIGURES["fig4"]), fig5_leave_one_out(suite, out / FIGURES["fig5"])]
        paths += fig6_curves(suite, out / FIGURES["fig6a"], out / FIGURES["fig6b"])
        paths.append(fig8_transfer(suite, out / FIGURES["fig8"]))
    return [p for p in paths if p is not None]


# ---------------------------------------------------------------------------------------------- Markdown


def f3(x, nd: int = 3, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "—"
    return f"{x:+.{nd}f}" if signed else f"{x:.{nd}f}"


def pct(x, nd: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{nd}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def delta_cell(d: dict | None, nd: int = 3, scale: float = 1.0, ci: bool = False) -> str:
    """A paired Δ, bold when its interval excludes 0 (the paper's convention)."""
    if d is None:
        return "—"
    s = f"{scale * d['estimate']:+.{nd}f}"
    if ci:
        s += f" [{scale * d['ci'][0]:+.{nd}f}, {scale * d['ci'][1]:+.{nd}f}]"
    clear = d["ci"][0] > 0 or d["ci"][1] < 0
    return f"**{s}**" if clear else s


def _delta(s: dict, comp: str, metric: str = "kappa") -> dict | None:
    return s["deltas"].get(comp, {}).get(metric)


def table1(results: dict) -> str:
    ds = results["datasets"]
    fr = (results.get("meta") or {}).get("frontier") or "frontier"
    rows = []
    for n, s in ds.items():
        call = s["deltas"]["best_cv"]["kappa"]["call"]
        mark = {"clean win": " ‡", "win": " †"}.get(call, "")
        rows.append([n, s["n"], f3(_est(s, "avg_member")), f3(_est(s, "majority")), f3(_est(s, "dawid_skene")),
                     f3(_est(s, "best_avg")), f3(_est(s, "best_cv")), f3(_est(s, "oracle")),
                     f3(_est(s, "stacked")), pct(_est(s, "stacked", "bacc")),
                     f3(_est(s, "frontier")), pct(_est(s, "frontier", "bacc")),
                     delta_cell(_delta(s, "avg_member")), delta_cell(_delta(s, "best_cv")) + mark,
                     delta_cell(_delta(s, "frontier")), delta_cell(_delta(s, "frontier", "bacc"), 2, 100)])
    head = ["Dataset", "n", "avg. mem.", "unw.", "D–S", "best (avg)", "best (CV)", "oracle", "stacked κ",
            "stacked bacc", f"{fr} κ", f"{fr} bacc", "Δ avg (κ)", "Δ best (κ)", f"Δ {fr} (κ)", f"Δ {fr} (bacc)"]
    if not any("frontier" in s["comparators"] for s in ds.values()):  # no frontier judge: drop its columns
        keep = [i for i, h in enumerate(head) if fr not in h]
        head, rows = [head[i] for i in keep], [[r[i] for i in keep] for r in rows]
    return table(head, rows) + ("\n\nκ as a decimal, bacc as a percentage; Δ = panel − comparator, bold where the "
                                "95% paired cluster-bootstrap interval excludes 0; † win, ‡ clean win against the "
                                "CV-best single (§2).")


def method_ladder(results: dict, metric: str) -> str:
    ds = results["datasets"]
    names = list(ds)
    rows = []
    for key, label in METHODS:
        vals = [_est(ds[n], key, metric) for n in names]
        if all(v is None for v in vals):
            continue
        rows.append([label] + [f3(v) if metric == "kappa" else pct(v) for v in vals])
    return table(["method"] + names, rows)


def table17(results: dict, suite: dict | None) -> str:
    rows = []
    for n, s in results["datasets"].items():
        lf = ((suite or {}).get("datasets", {}).get(n) or {}).get("label_free") or {}
        rows.append([n, f3(_est(s, "majority")), f3(_est(s, "dawid_skene")), f3(_est(s, "stacked")),
                     delta_cell(_delta(s, "majority"), ci=True),
                     delta_cell(lf.get("majority_minus_best_cv"), ci=True),
                     delta_cell(_delta(s, "dawid_skene"), ci=True),
                     delta_cell(lf.get("dawid_skene_minus_best_cv"), ci=True)])
    return table(["Dataset", "unw.", "D–S", "stk.", "Δ stk−unw", "Δ unw−best", "Δ stk−DS", "Δ DS−best"], rows) + (
        "\n\nPaired Δκ with 95% cluster-bootstrap intervals on the ladder's draws; bold where the interval "
        "excludes 0; best = the CV-best single.")


def table22(results: dict) -> str:
    ds = results["datasets"]
    names = list(ds)
    members = results.get("meta", {}).get("members") or list(dict.fromkeys(m for d in ds.values() for m in d["members"]))
    # a member set aside on a dataset (`excluded_members`) returned no verdict there: coverage 0
    rows = [[m] + [f3(ds[n]["members"][m]["coverage"] if m in ds[n]["members"] else 0.0) for n in names]
            for m in members]
    return table(["member"] + names, rows)


def table23(results: dict) -> str:
    rows = []
    for n, s in results["datasets"].items():
        ac = s.get("abstention_contrast")
        if not ac:
            continue
        rows.append([n, s["n"], s["abstentions"]["count"], f"{100 * s['abstentions']['rate']:.1f}%",
                     f3(ac["kappa_scalar"]), f3(ac["kappa_category"]),
                     delta_cell(ac["delta_category_minus_scalar"], ci=True), ac["moved"]])
    return table(["Dataset", "n", "abstentions", "rate", "κ (0.5)", "κ (categ.)", "Δκ (categ. − 0.5)", "moved"],
                 rows)


def table4(suite: dict) -> str:
    rec = suite.get("recovery") or {}
    if not rec:
        return "_no item where the CV-best single is wrong_"
    rows = [[r["members_correct"], f3(r["p_recovers"]), r["n"]] for r in rec["by_members_correct"] if r["n"]]
    out = [f"Items where the CV-best single judge returns a wrong verdict: **{rec['n_items']}** "
           f"(pooled over {len(rec['per_dataset'])} datasets).", "",
           "(a) pooled", "", table(["members correct", "P(recovers)", "n"], rows), ""]
    fe, pb = rec.get("logit_fe"), rec.get("pointbiserial")
    if fe and "coef" in fe:
        out.append(f"Logistic regression of recovery on the share of the other members correct, dataset fixed "
                   f"effects: coefficient **{fe['coef']:+.2f}** (SE {fe['se']:.2f}, 95% CI [{fe['ci'][0]:+.2f}, "
                   f"{fe['ci'][1]:+.2f}], p = {fe['p']:.2g}, n = {fe['n']}"
                   + (f"; datasets without variation left out: {', '.join(fe['dropped'])}" if fe["dropped"] else "")
                   + "). Paper: +4.67.")
    elif fe:
        out.append(f"Fixed-effects logit not estimable: {fe.get('error')}.")
    if pb:
        out.append(f"Point-biserial r = **{pb['r']:+.2f}** (p = {pb['p']:.2g}). Paper: +0.41. Positive within "
                   f"{len(rec['positive_within'])} of {len(rec['per_dataset'])} datasets.")
    K = max(r["members_correct"] for r in rec["by_members_correct"])
    rows_b = []
    for n, v in rec["per_dataset"].items():
        cells = [f"{f3(r['p_recovers'], 2)} ({r['n']})" if r["n"] else "—" for r in v["by_members_correct"]]
        r_ = v["pointbiserial"]["r"] if v["pointbiserial"] else None
        rows_b.append([n, v["n"]] + cells + [f3(r_, 2, signed=True)])
    out += ["", "(b) per dataset: P(recovers) (n) by members correct", "",
            table(["Dataset", "n"] + [str(k) for k in range(K + 1)] + ["r"], rows_b)]
    return "\n".join(out)


def table5(suite: dict) -> str:
    cd = suite.get("cross_dataset") or {}

    def cell(v):
        return "—" if not v else f"{v['rho']:+.2f} ({v['p']:.2f})"

    rows = [[r["subset"], r["n"], cell(r["phi_bar"]), cell(r["members_at_kappa0"]), cell(r["composite"])]
            for r in cd.get("rows", [])]
    k0 = suite["settings"]["analysis"]["kappa0"]
    return table(["subset", "n", "φ̄", f"members κ≥{k0:g}", "(1−φ̄)×members"], rows)


def table6(suite: dict) -> str:
    budgets = [str(b) for b in suite["settings"]["suite"]["budget"]["budgets"]]
    rows = []
    for n, d in suite["datasets"].items():
        r = d["regime"]
        rows.append([n, r["n"], f3(r["phi_bar"]), f"{r['spread']}/{r['n_members']}",
                     "admissible" if r["admissible"] else "not admissible"]
                    + [f3(r["budgets"][b]["p_match"], 2) if r["budgets"].get(b) else "—" for b in budgets])
    summ = suite.get("regime_summary") or {}
    rows.append(["**mean**", "", "", "", ""] + [f3(summ[b]["p_match"], 3) if summ.get(b) else "—" for b in budgets])
    rows.append(["best member named", "", "", "", ""]
                + [f3(summ[b]["p_best_member"], 2) if summ.get(b) else "—" for b in budgets])
    draws = suite["settings"]["suite"]["budget"]["draws"]
    return table(["Dataset", "n", "φ̄", "spread", "regime"] + budgets, rows) + (
        f"\n\nPr(call matches) over R = {draws} draws of whole clusters per budget (paper: 85.5% at 50 records, "
        "91.9% at 100; naming the best member from 100 records: 69%).")


def table7(suite: dict) -> str:
    budgets = [str(b) for b in suite["settings"]["suite"]["budget"]["curve_budgets"]]
    rows = []
    for n, d in suite["datasets"].items():
        c = d["curve"]
        cells = []
        for b in budgets:
            v = c["budgets"].get(b)
            cells.append("—" if not v else (f"**{v['mean']:.3f}**" if v["beats_best_cv"] else f"{v['mean']:.3f}"))
        rows.append([n, c["train_records"], f3(c["majority"])] + cells + [f3(c["full"])])
    draws = suite["settings"]["suite"]["budget"]["curve_draws"]
    return table(["Dataset", "train", "unw."] + budgets + ["full"], rows) + (
        f"\n\nMean κ over R = {draws} draws per budget (labelled records = clusters), budgets drawn within each "
        "fold's training clusters, out-of-fold predictions pooled; bold: beats the CV-best single.")


def loo_table(suite: dict) -> str:
    rows = []
    for n, d in suite["datasets"].items():
        lo = d["leave_one_out"]
        lb = [m for m, v in lo["members"].items() if v["load_bearing"]]
        sp = [m for m, v in lo["members"].items() if v["spare"]]
        most = lo["most_load_bearing"]
        rows.append([n, f3(lo["full_stacked"]), f"{most} ({lo['members'][most]['estimate']:+.3f})",
                     ", ".join(lb) or "—", ", ".join(sp) or "—"])
    return table(["Dataset", "full stacked κ", "most load-bearing (Δκ)", "clearly load-bearing",
                  "clearly spare"], rows)


def transfer_table(suite: dict) -> str:
    tr = suite.get("transfer") or {}
    if not tr:
        return "_needs at least two datasets_"
    rows = [[n, f3(v["in_domain"]), f3(v["lodo"]), delta_cell(v["delta_lodo_minus_in"], ci=True), f3(v["best_cv"]),
             f3(v["avg_member"])] for n, v in tr.items()]
    return table(["Dataset", "in-domain", "lodo", "Δ lodo − in", "best (CV)", "avg. member"], rows)


def appendix_c(suite: dict) -> str:
    ac = suite.get("appendix_c") or {}
    if not ac:
        return ""
    op = ac["operating"]

    def side(s):
        return [s["n"], f3(s["share_above_best"], 2), s["clear_gains"], f3(s["share_near_frontier"], 2),
                f3(s["mean_delta_best"], 3, True), f3(s["mean_delta_frontier"], 3, True)]

    near = suite["settings"]["suite"]["mechanism"]["near_frontier"]
    out = [f"{ac['n_panels']} (sub-)panels × datasets checked at the operating point (κ₀={op['kappa0']:g}, "
           f"c={op['c']:g}, φ₀={op['phi0']:g}); full panels admitted: {', '.join(op['admitted_full']) or 'none'}.",
           "", table(["", "panels", "share above own CV-best", "clear gains", f"share within {near:g} of frontier",
                      "mean Δ best", "mean Δ frontier"],
                     [["admitted"] + side(op["admitted"]), ["rejected"] + side(op["rejected"])]), "",
           f"Rejected panels with a clear gain over their CV-best single: **{op['rejected_with_clear_gain']}**. "
           f"Over the threshold grid, the direction (admitted panels beat their best member and reach the "
           f"frontier at least as often as rejected ones) holds at "
           f"{pct(ac['share_points_direction_holds'], 0)}% of the {_populated(ac)} grid points (of "
           f"{len(ac['points'])}) where both sides are populated."]
    k0 = op["kappa0"]
    pts = [p for p in ac["points"] if abs(p["kappa0"] - k0) < 1e-9]
    cs = sorted({p["c"] for p in pts})
    phis = sorted({p["phi0"] for p in pts})
    cell = {(p["c"], p["phi0"]): p for p in pts}
    rows = []
    for p0 in phis:
        row = [f"φ₀={p0:g}"]
        for c in cs:
            p = cell[(c, p0)]
            sp = p["subpanels"]
            ok = "✓" if sp["direction_holds"] else ("✗" if sp["admitted"]["n"] and sp["rejected"]["n"] else "·")
            row.append(f"{len(p['admitted_full'])} {ok}")
        rows.append(row)
    out += ["", f"Full panels admitted (and direction check on the sub-panels) over the grid at κ₀={k0:g}:", "",
            table([""] + [f"c={c:g}" for c in cs], rows)]
    return "\n".join(out)


def _populated(ac: dict) -> int:
    return sum(1 for p in ac["points"] if p["subpanels"]["admitted"]["n"] and p["subpanels"]["rejected"]["n"])


def cost_section(suite: dict) -> str:
    c = suite.get("cost") or {}
    if not c:
        return ""
    rows = []
    for key, label in (("paper", "paper inputs"), ("panel", "this panel")):
        b = c[key]
        rows.append([label, f"${b['price_per_gpu_hour']:.2f}", f"${b['panel_per_1k']:.4f}",
                     f"${b['frontier']['per_1k']:.3f}", f"{b['panel_share_of_frontier'] * 100:.2f}%",
                     "—" if b["ratio"] is None else f"{b['ratio']:.1f}×"])
    out = [table(["", "GPU-hour", "panel $/1k items", "frontier $/1k items", "panel / frontier",
                  "frontier ÷ panel"], rows),
           "", "Per member (this panel):", "",
           table(["member", "items/s", "source", "$/1k items"],
                 [[m, f"{v['items_per_second']:.2f}", v["source"], f"${v['per_1k']:.5f}"]
                  for m, v in c["panel"]["members"].items()])]
    for key, label in (("paper", "paper inputs"), ("panel", "this panel")):
        cal = c[key]["calibration"].get("all")
        if not cal or (key == "panel" and cal == c["paper"]["calibration"].get("all")):
            continue
        out += ["", f"Calibration ({label}: "
                f"${cal['price_per_label']:.2f} a label, {cal['labels_per_record']:g} labels per record):", "",
                table(["records", "one-time cost", "break-even items"],
                      [[r, f"${v['cost']:.0f}", _items(v["break_even_items"])] for r, v in cal["records"].items()])]
    per = {k: v for k, v in c["panel"]["calibration"].items() if k != "all"}
    if per:
        recs = list(next(iter(per.values()))["records"])
        out += ["", "Calibration per dataset (this panel):", "",
                table(["Dataset", "labels/record"] + [f"{r} records: cost / break-even" for r in recs],
                      [[n, f"{v['labels_per_record']:.2f}"]
                       + [f"${v['records'][r]['cost']:.0f} / {_items(v['records'][r]['break_even_items'])}" for r in recs]
                       for n, v in per.items()])]
    return "\n".join(out)


def _items(x) -> str:
    return "—" if x is None else f"{x:,.0f}"


def markdown(results: dict | None, suite: dict | None, fig_dir: str | Path, report_path: str | Path) -> str:
    """The report text; figure links are relative to the report's folder."""
    import os

    rel = os.path.relpath(Path(fig_dir), Path(report_path).parent)

    def fig(key, caption):
        p = Path(fig_dir) / FIGURES[key]
        return f"![{caption}]({rel}/{FIGURES[key]})\n\n*{caption}*" if p.exists() else f"_{caption}: not drawn_"

    meta = (results or {}).get("meta") or (suite or {}).get("meta") or {}
    parts = ["# RAIM report", "",
             f"Verdicts: `{meta.get('verdicts', '?')}`; members: {', '.join(meta.get('members') or [])}; "
             f"frontier: {meta.get('frontier') or 'none'}. Generated by `python -m src.report` from "
             "results.json (the ladder) and suite.json (the analysis suite).", ""]
    if results:
        st = results.get("settings", {})
        parts += [f"Settings: {st.get('n_splits')}-fold cluster cross-fitting, B = {st.get('n_boot')} paired "
                  f"cluster-bootstrap draws, operating point (κ₀, c, φ₀) = ({st.get('kappa0')}, {st.get('c')}, "
                  f"{st.get('phi0')}).", "",
                  "## Table 1 — comparator ladder", "", table1(results), "",
                  fig("fig2", "Fig. 2 — single-member competence per dataset"), "",
                  "## Fig. 3 — the regime ordering", "", fig("fig3a", "Fig. 3a — φ̄ against members at κ ≥ κ₀"), "",
                  fig("fig3b", "Fig. 3b — paired deltas"), "",
                  "## Table 15 — full method ladder, Cohen's κ", "", method_ladder(results, "kappa"), "",
                  "## Table 16 — full method ladder, balanced accuracy (%)", "", method_ladder(results, "bacc"), "",
                  "## Table 17 — the stacked panel against the label-free aggregators (κ)", "",
                  table17(results, suite), "",
                  "## Table 22 — per-member coverage", "", table22(results), "",
                  "## Table 23 — abstention as a category", "", table23(results), ""]
    if suite:
        parts += ["## Fig. 4 — pairwise error correlation", "", fig("fig4", "Fig. 4 — pairwise φ per dataset"), "",
                  "## Table 4 — item-level mechanism", "", table4(suite), "",
                  "## Table 5 — cross-dataset predictor (Spearman ρ, two-sided p)", "", table5(suite), "",
                  "## Table 6 — regime call from a labelling budget", "", table6(suite), "",
                  "## Table 7 — the stacker's learning curve", "", table7(suite), "",
                  fig("fig6a", "Fig. 6a — stacked κ against panel size"), "",
                  fig("fig6b", "Fig. 6b — stacked κ against labelled records"), "",
                  "## Fig. 5 — leave-one-member-out", "", loo_table(suite), "",
                  fig("fig5", "Fig. 5 — leave-one-member-out Δκ"), "",
                  "## Fig. 8 — leave-one-dataset-out transfer", "", transfer_table(suite), "",
                  fig("fig8", "Fig. 8 — transfer"), "",
                  "## Appendix C — threshold family and sub-panels", "", appendix_c(suite), "",
                  "## Cost — Table 2 / Appendix H", "", cost_section(suite), ""]
    return "\n".join(parts)


def write_docs(results: dict | None, suite: dict | None, fig_dir: str | Path, report_path: str | Path,
               redraw: bool = True) -> Path:
    """Draw the figures (only the missing ones unless ``redraw``) and write the report; returns its path."""
    if results is None and suite is None:
        raise ValueError("nothing to report: neither results.json nor suite.json")
    if redraw or any(not (Path(fig_dir) / f).exists() for f in FIGURES.values()):
        figures(results, suite, fig_dir)
    report_path = Path(report_path)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(markdown(results, suite, fig_dir, report_path))
    return report_path


def write(results_path: str | Path, suite_path: str | Path, fig_dir: str | Path, report_path: str | Path,
          redraw: bool = False) -> Path:
    """Read results.json and suite.json (either may be absent, not both) and write the report."""
    results, suite = _read(results_path), _read(suite_path)
    if results is None and suite is None:
        raise FileNotFoundError(f"neither {results_path} nor {suite_path} exists: run src.run / src.analyses first")
    return write_docs(results, suite, fig_dir, report_path, redraw)


def _read(path) -> dict | None:
    p = Path(path)
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise RaimError(f"{p}: not a readable JSON document ({e}); rerun the stage that writes it") from None


def _main() -> None:
    import hydra
    from omegaconf import DictConfig

    @hydra.main(version_base=None, config_path="../conf", config_name="config")
    @one_line
    def main(cfg: DictConfig) -> None:
        out = write(cfg.output, cfg.suite.output, cfg.suite.figures_dir, cfg.suite.report,
                    redraw=bool(cfg.get("redraw", False)))
        log.info("report written to %s", out)

    main()


if __name__ == "__main__":
    _main()
