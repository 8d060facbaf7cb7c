"""The report's cost section (paper Table 2, Appendix H): the suite's cost model, per 1k items and the labelled
records' calibration cost with its break-even.
"""

from __future__ import annotations

from src.present.markdown import dash_note, table


def cost_section(suite: dict) -> str:
    c = suite.get("cost") or {}
    if not c:
        return ""
    rows = []
    for key, label in (("paper", "paper inputs"), ("panel", "this panel")):
        b = c[key]
        rows.append(
            [
                label,
                f"${b['price_per_gpu_hour']:.2f}",
                f"${b['panel_per_1k']:.4f}",
                f"${b['frontier']['per_1k']:.3f}",
                f"{b['panel_share_of_frontier'] * 100:.2f}%",
                "—" if b["ratio"] is None else f"{b['ratio']:.1f}×",
            ]
        )
    out = [
        table(["", "GPU-hour", "panel $/1k items", "frontier $/1k items", "panel / frontier", "frontier ÷ panel"], rows)
        + dash_note(rows, "the panel's measured cost is zero (no ratio)."),
        "",
        "Per member (this panel):",
        "",
        table(
            ["member", "items/s", "source", "$/1k items"],
            [
                [m, f"{v['items_per_second']:.2f}", v["source"], f"${v['per_1k']:.5f}"]
                for m, v in c["panel"]["members"].items()
            ],
        ),
    ]
    for key, label in (("paper", "paper inputs"), ("panel", "this panel")):
        cal = c[key]["calibration"].get("all")
        if not cal or (key == "panel" and cal == c["paper"]["calibration"].get("all")):
            continue
        out += [
            "",
            f"Calibration ({label}: "
            f"${cal['price_per_label']:.2f} a label, {cal['labels_per_record']:g} labels per record):",
            "",
            _break_even(
                c[key],
                ["records", "one-time cost", "break-even items"],
                [[r, f"${v['cost']:.0f}", _items(v["break_even_items"])] for r, v in cal["records"].items()],
            ),
        ]
    per = {k: v for k, v in c["panel"]["calibration"].items() if k != "all"}
    if per:
        recs = list(next(iter(per.values()))["records"])
        out += [
            "",
            "Calibration per dataset (this panel):",
            "",
            _break_even(
                c["panel"],
                ["Dataset", "labels/record"] + [f"{r} records: cost / break-even" for r in recs],
                [
                    [n, f"{v['labels_per_record']:.2f}"]
                    + [f"${v['records'][r]['cost']:.0f} / {_items(v['records'][r]['break_even_items'])}" for r in recs]
                    for n, v in per.items()
                ],
            ),
        ]
    return "\n".join(out)


def _items(x) -> str:
    return "—" if x is None else f"{x:,.0f}"


def _break_even(b: dict, head: list[str], rows: list[list]) -> str:
    """A calibration table; its "—" break-even cells explained: the panel is not cheaper than the frontier."""
    return table(head, rows) + dash_note(
        rows,
        f"never: the panel costs ${b['panel_per_1k']:.2f} per 1k items, the frontier judge "
        f"${b['frontier']['per_1k']:.2f}, so the panel's inference saves nothing to pay its calibration back.",
    )
