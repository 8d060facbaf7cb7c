"""The report's escalation-cascade section (beyond the paper; :mod:`src.studies.suite.cascade`)."""

from __future__ import annotations

from src.present.markdown import dash_note, delta_cell, f3, pct, table


def cascade_section(suite: dict, fig) -> list[str]:
    """The escalation cascade (beyond the paper; :mod:`src.studies.suite.cascade`): the headline per dataset, then κ,
    Δκ against the expensive judge and cost at each operating point, and the figure ([] when not run)."""
    c = suite.get("cascade") or {}
    if not c.get("datasets"):
        return []
    ds = {n: d for n, d in c["datasets"].items() if "skipped" not in d}
    budgets = [f"{b:g}" for b in c["budgets"]]
    head = (
        ["Dataset", "cheap panel alone κ", "expensive alone κ"]
        + [f"κ at {pct(float(b), 0)}%" for b in budgets]
        + ["fewest escalations non-inferior", "κ there", "Δκ vs expensive [95% CI]", "calls saved", "$/1k items"]
    )
    rows = []
    for n, d in ds.items():
        ni = d["noninferior"] or {}
        rows.append(
            [n, f3(d["alone"]["panel"]["kappa"]["estimate"]), f3(d["alone"]["expensive"]["kappa"]["estimate"])]
            + [f3(d["budgets"][b]["kappa"]["estimate"]) for b in budgets]
            + (
                [
                    f"{pct(ni['share'])}%",
                    f3(ni["kappa"]["estimate"]),
                    delta_cell(ni["delta_expensive"], ci=True),
                    f"{pct(ni['calls_saved'])}%",
                    f"${ni['cost_per_1k']:.3f}",
                ]
                if ni
                else ["—"] * 5
            )
        )
    ops = {round(v, 6) for v in c["operating_points"]}
    detail = [
        [
            n,
            f"{pct(p['target'], 0)}%",
            f"{pct(p['share'])}%",
            f"{f3(p['kappa']['estimate'])} [{f3(p['kappa']['ci'][0])}, {f3(p['kappa']['ci'][1])}]",
            delta_cell(p["delta_expensive"], ci=True),
            delta_cell(p["delta_panel"], ci=True),
            f3(p["random_kappa"]),
            f"${p['cost_per_1k']:.3f}",
        ]
        for n, d in ds.items()
        for p in d["points"]
        if round(p["target"], 6) in ops
    ]
    cost = c["cost_per_1k"]
    skipped = [f"{n}: {d['skipped']}" for n, d in c["datasets"].items() if "skipped" in d]
    return [
        "## Escalation cascade (beyond the paper)",
        "",
        f"The cheap panel ({', '.join(c['cheap'])}; ${cost['cheap_panel']:.3f} per 1k items) decides; the items "
        f"whose stacked p(hallucinated) lies in the uncertainty band around the threshold go to {c['expensive']} "
        f"({c['chosen_as']}; ${cost['expensive']:.3f} per 1k items). Band widths are fitted on the training "
        f"folds and applied to the held-out ones; intervals are paired cluster-bootstrap 95% intervals with the "
        "stacker, the band and its tie rule refitted in every draw (docs/intervals.md; the fixed-prediction ones are "
        "in suite.json as `*_fixed`). "
        f"Non-inferior: the lower bound of Δκ (cascade − {c['expensive']}) above −{c['margin']:g} at that share "
        "and every larger one.",
        "",
        table(head, rows)
        + dash_note(
            rows,
            "the cascade is not non-inferior even at 100% escalated (the expensive "
            "judge's abstentions keep the panel's verdict).",
        ),
        "",
        table(
            [
                "Dataset",
                "target",
                "escalated",
                "κ [95% CI]",
                "Δκ vs expensive",
                "Δκ vs panel",
                "random escalation κ",
                "$/1k items",
            ],
            detail,
        ),
        "",
        *([f"Not run: {'; '.join(skipped)}.", ""] if skipped else []),
        fig("cascade", "Escalation cascade: κ against the share escalated"),
        "",
    ]
