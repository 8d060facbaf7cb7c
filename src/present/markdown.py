"""Markdown cells and tables of the report: numbers to fixed decimals with "—" for what is undefined, paired Δ
cells bold when the interval excludes 0 (the paper's convention), GitHub tables."""

from __future__ import annotations

import numpy as np


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


def dash_note(rows: list[list], why: str) -> str:
    """A footnote saying why the table's "—" cells are empty, when it has any."""
    return f"\n\n—: {why}" if any("—" in str(c) for r in rows for c in r) else ""


def delta_cell(d: dict | None, nd: int = 3, scale: float = 1.0, ci: bool = False) -> str:
    """A paired Δ, bold when its interval excludes 0 (the paper's convention)."""
    if d is None:
        return "—"
    s = f"{scale * d['estimate']:+.{nd}f}"
    if ci:
        s += f" [{scale * d['ci'][0]:+.{nd}f}, {scale * d['ci'][1]:+.{nd}f}]"
    clear = d["ci"][0] > 0 or d["ci"][1] < 0
    return f"**{s}**" if clear else s
