"""The report's sections read off suite.json (the analysis suite, :mod:`src.studies.suite`): the paper's Tables 4,
5, 6 and 7, leave one member out (Fig. 5), the transfer (Appendix E, Fig. 8) and the Appendix C check, followed by
the cost model (:mod:`src.present.cost`) and the escalation cascade (:mod:`src.present.cascade`).
"""

from __future__ import annotations

from src.present.cascade import cascade_section
from src.present.cost import cost_section
from src.present.markdown import dash_note, delta_cell, f3, pct, table


def table4(suite: dict) -> str:
    rec = suite.get("recovery") or {}
    if not rec:
        return "_no item where the CV-best single is wrong_"
    rows = [[r["members_correct"], f3(r["p_recovers"]), r["n"]] for r in rec["by_members_correct"] if r["n"]]
    out = [
        f"Items where the CV-best single judge returns a wrong verdict: **{rec['n_items']}** "
        f"(pooled over {len(rec['per_dataset'])} datasets).",
        "",
        "(a) pooled",
        "",
        table(["members correct", "P(recovers)", "n"], rows),
        "",
    ]
    fe, pb = rec.get("logit_fe"), rec.get("pointbiserial")
    if fe and "coef" in fe:
        out.append(
            f"Logistic regression of recovery on the share of the other members correct, dataset fixed "
            f"effects: coefficient **{fe['coef']:+.2f}** (SE {fe['se']:.2f}, 95% CI [{fe['ci'][0]:+.2f}, "
            f"{fe['ci'][1]:+.2f}], p = {fe['p']:.2g}, n = {fe['n']}"
            + (f"; datasets without variation left out: {', '.join(fe['dropped'])}" if fe["dropped"] else "")
            + "). Paper: +4.67."
        )
    elif fe:
        out.append(f"Fixed-effects logit not estimable: {fe.get('error')}.")
    if pb:
        out.append(
            f"Point-biserial r = **{pb['r']:+.2f}** (p = {pb['p']:.2g}). Paper: +0.41. Positive within "
            f"{len(rec['positive_within'])} of {len(rec['per_dataset'])} datasets."
        )
    K = max(r["members_correct"] for r in rec["by_members_correct"])
    rows_b = []
    for n, v in rec["per_dataset"].items():
        cells = [f"{f3(r['p_recovers'], 2)} ({r['n']})" if r["n"] else "—" for r in v["by_members_correct"]]
        r_ = v["pointbiserial"]["r"] if v["pointbiserial"] else None
        rows_b.append([n, v["n"]] + cells + [f3(r_, 2, signed=True)])
    out += [
        "",
        "(b) per dataset: P(recovers) (n) by members correct",
        "",
        table(["Dataset", "n"] + [str(k) for k in range(K + 1)] + ["r"], rows_b)
        + dash_note(
            rows_b,
            "no such item on this dataset (no item where the CV-best single is wrong with that "
            "many other members correct), or r undefined (recovery does not vary).",
        ),
    ]
    return "\n".join(out)


def table5(suite: dict) -> str:
    cd = suite.get("cross_dataset") or {}

    def cell(v):
        return "—" if not v else f"{v['rho']:+.2f} ({v['p']:.2f})"

    rows = [
        [r["subset"], r["n"], cell(r["phi_bar"]), cell(r["members_at_kappa0"]), cell(r["composite"])]
        for r in cd.get("rows", [])
    ]
    k0 = suite["settings"]["analysis"]["kappa0"]
    return table(["subset", "n", "φ̄", f"members κ≥{k0:g}", "(1−φ̄)×members"], rows) + dash_note(
        rows,
        "ρ not estimable: fewer than three datasets with the coordinate defined, or the coordinate or the "
        "panel's gain over its CV-best single does not vary across them.",
    )


def table6(suite: dict) -> str:
    budgets = [str(b) for b in suite["settings"]["suite"]["budget"]["budgets"]]
    rows = []
    for n, d in suite["datasets"].items():
        r = d["regime"]
        rows.append(
            [
                n,
                r["n"],
                f3(r["phi_bar"]),
                f"{r['spread']}/{r['n_members']}",
                "admissible" if r["admissible"] else "not admissible",
            ]
            + [f3(r["budgets"][b]["p_match"], 2) if r["budgets"].get(b) else "—" for b in budgets]
        )
    summ = suite.get("regime_summary") or {}
    rows.append(["**mean**", "", "", "", ""] + [f3(summ[b]["p_match"], 3) if summ.get(b) else "—" for b in budgets])
    rows.append(
        ["best member named", "", "", "", ""]
        + [f3(summ[b]["p_best_member"], 2) if summ.get(b) else "—" for b in budgets]
    )
    draws = suite["settings"]["suite"]["budget"]["draws"]
    return (
        table(["Dataset", "n", "φ̄", "spread", "regime"] + budgets, rows)
        + (
            f"\n\nPr(call matches) over R = {draws} draws of whole clusters per budget (paper: 85.5% at 50 records, "
            "91.9% at 100; naming the best member from 100 records: 69%)."
        )
        + dash_note(
            rows,
            "the budget is not below the dataset's number of clusters, so every draw would be the whole sample "
            "(mean rows: no dataset where it is).",
        )
    )


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
    return (
        table(["Dataset", "train", "unw."] + budgets + ["full"], rows)
        + (
            f"\n\nMean κ over R = {draws} draws per budget (labelled records = clusters), budgets drawn within each "
            "fold's training clusters, out-of-fold predictions pooled; bold: beats the CV-best single."
        )
        + dash_note(rows, "the budget exceeds the smallest fold's training clusters (column train).")
    )


def loo_table(suite: dict) -> str:
    rows = []
    for n, d in suite["datasets"].items():
        lo = d["leave_one_out"]
        lb = [m for m, v in lo["members"].items() if v["load_bearing"]]
        sp = [m for m, v in lo["members"].items() if v["spare"]]
        most = lo["most_load_bearing"]
        rows.append(
            [
                n,
                f3(lo["full_stacked"]),
                f"{most} ({lo['members'][most]['estimate']:+.3f})",
                ", ".join(lb) or "none",
                ", ".join(sp) or "none",
            ]
        )
    return table(["Dataset", "full stacked κ", "most load-bearing (Δκ)", "clearly load-bearing", "clearly spare"], rows)


def transfer_table(suite: dict) -> str:
    tr = suite.get("transfer") or {}
    if not tr:
        return "_needs at least two datasets_"
    rows = [
        [
            n,
            f3(v["in_domain"]),
            f3(v["lodo"]),
            delta_cell(v["delta_lodo_minus_in"], ci=True),
            f3(v["best_cv"]),
            f3(v["avg_member"]),
        ]
        for n, v in tr.items()
    ]
    return table(["Dataset", "in-domain", "lodo", "Δ lodo − in", "best (CV)", "avg. member"], rows)


def appendix_c(suite: dict) -> str:
    ac = suite.get("appendix_c") or {}
    if not ac:
        return ""
    op = ac["operating"]

    def side(s):
        return [
            s["n"],
            f3(s["share_above_best"], 2),
            s["clear_gains"],
            f3(s["share_near_frontier"], 2),
            f3(s["mean_delta_best"], 3, True),
            f3(s["mean_delta_frontier"], 3, True),
        ]

    near = suite["settings"]["suite"]["mechanism"]["near_frontier"]
    sides = [["admitted"] + side(op["admitted"]), ["rejected"] + side(op["rejected"])]
    out = [
        f"{ac['n_panels']} (sub-)panels × datasets checked at the operating point (κ₀={op['kappa0']:g}, "
        f"c={op['c']:g}, φ₀={op['phi0']:g}); full panels admitted: {', '.join(op['admitted_full']) or 'none'}.",
        "",
        table(
            [
                "",
                "panels",
                "share above own CV-best",
                "clear gains",
                f"share within {near:g} of frontier",
                "mean Δ best",
                "mean Δ frontier",
            ],
            sides,
        )
        + dash_note(sides, "no panel on that side, or (frontier columns) no frontier judge in the table."),
        "",
        f"Rejected panels with a clear gain over their CV-best single: **{op['rejected_with_clear_gain']}**. "
        f"Over the threshold grid, the direction (admitted panels beat their best member and reach the "
        f"frontier at least as often as rejected ones) holds at "
        f"{pct(ac['share_points_direction_holds'], 0)}% of the {_populated(ac)} grid points (of "
        f"{len(ac['points'])}) where both sides are populated.",
    ]
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
    out += [
        "",
        f"Full panels admitted (and direction check on the sub-panels) over the grid at κ₀={k0:g}:",
        "",
        table([""] + [f"c={c:g}" for c in cs], rows),
        "",
        "✓ the direction holds on the sub-panels, ✗ it does not, · one side has no sub-panel (not checked).",
    ]
    return "\n".join(out)


def _populated(ac: dict) -> int:
    return sum(1 for p in ac["points"] if p["subpanels"]["admitted"]["n"] and p["subpanels"]["rejected"]["n"])


def suite_sections(suite: dict, fig) -> list[str]:
    """The sections read off suite.json (the analysis suite)."""
    return [
        "## Pairwise error correlation (paper Fig. 4)",
        "",
        fig("fig4", "Pairwise φ per dataset (paper Fig. 4)"),
        "",
        "## The item-level mechanism (paper Table 4)",
        "",
        table4(suite),
        "",
        "## Cross-dataset predictor, Spearman ρ and two-sided p (paper Table 5)",
        "",
        table5(suite),
        "",
        "## The regime call from a labelling budget (paper Table 6)",
        "",
        table6(suite),
        "",
        "## The stacker's learning curve (paper Table 7, Fig. 6)",
        "",
        table7(suite),
        "",
        fig("fig6a", "Stacked κ against panel size (paper Fig. 6a)"),
        "",
        fig("fig6b", "Stacked κ against labelled records (paper Fig. 6b)"),
        "",
        "## Leave one member out (paper Fig. 5)",
        "",
        loo_table(suite),
        "",
        fig("fig5", "Leave-one-member-out Δκ (paper Fig. 5)"),
        "",
        "## Leave one dataset out: transfer (paper Fig. 8)",
        "",
        transfer_table(suite),
        "",
        fig("fig8", "Transfer (paper Fig. 8)"),
        "",
        "## Threshold family and sub-panels (paper Appendix C)",
        "",
        appendix_c(suite),
        "",
        "## Cost (paper Table 2, Appendix H)",
        "",
        cost_section(suite),
        "",
    ] + cascade_section(suite, fig)
