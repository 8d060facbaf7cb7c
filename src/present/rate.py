"""The rate study's figure and report section (beyond the paper; :mod:`src.studies.rate`, maths :mod:`src.core.rates`).

* :func:`rate_figure` — per regime, the median interval width against the labels for every method at the
  headline prevalence, each point filled where the method's coverage reached the band's floor and hollow where
  it fell short (coverage marked);
* :func:`rate_section` — the Markdown section: the conclusions, one row per regime × method (coverage range and
  cells in the band, median width relative to classical, effective-label multiplier), the headline cell, and the
  cross-checks against ``ppi_py`` and ``cje-eval``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from src.present import figures, markdown
from src.studies.rate import BAND, STUDY_METHODS, statements

STYLE = {
    "classical": ("black", "o", "classical (labels only)"),
    "ppi": ("tab:blue", "s", "PPI++"),
    "active": ("tab:green", "D", "active"),
    "naive": ("tab:red", "v", "naive flag share (no valid interval)"),
    "em": ("tab:orange", "^", "EM prevalence (label-free)"),
}
NAMES = {"classical": "classical", "ppi": "PPI++", "active": "active", "naive": "naive share", "em": "EM"}


def headline(doc: dict) -> str:
    """The prevalence the figure and the headline table show: 0.1 when studied, else the middle one."""
    qs = [f"{float(q):g}" for q in doc["settings"]["prevalences"]]
    return "0.1" if "0.1" in qs else qs[len(qs) // 2]


def rate_figure(doc: dict, path: str | Path) -> Path:
    """Width against labels per method and regime at the headline prevalence, coverage marked (module docstring)."""
    q = headline(doc)
    names = list(doc["regimes"])
    fig, axes = figures._small_multiples(len(names))
    for ax, name in zip(axes, names):
        cell = doc["regimes"][name]["cells"][q]["labels"]
        ns = [int(n) for n in cell]
        for m in STUDY_METHODS:
            colour, marker, label = STYLE[m]
            w = [cell[str(n)]["methods"][m]["width"] for n in ns]
            cov = np.array([cell[str(n)]["methods"][m]["coverage"] for n in ns])
            ax.plot(ns, w, "-", color=colour, lw=1, alpha=0.7, marker=marker, ms=0, label=label)
            ok = cov >= BAND[0]
            ax.scatter(np.array(ns)[ok], np.array(w)[ok], color=colour, marker=marker, s=18, zorder=3)
            ax.scatter(
                np.array(ns)[~ok],
                np.array(w)[~ok],
                facecolors="white",
                edgecolors=colour,
                marker=marker,
                s=18,
                zorder=3,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.xaxis.set_minor_formatter(figures._null_formatter())
        ax.set_title(f"{name} ({doc['regimes'][name]['kind']})", fontsize=9)
        ax.set_xlabel("labels", fontsize=8)
        ax.set_ylabel("median width", fontsize=8)
        ax.tick_params(labelsize=7)
    figures._figure_legend(
        fig,
        axes[0],
        3,
        f"Rate intervals at prevalence {q}: median width against labels (hollow: coverage below {BAND[0]:.2f})",
    )
    return figures._save(fig, Path(path), tight=False)


def _cov(d: dict) -> str:
    lo, hi = d["coverage_min"], d["coverage_max"]
    return f"{lo:.3f}–{hi:.3f} ({d['cells_in_band']}/{d['cells']})"


def rate_section(doc: dict) -> list[str]:
    """The Markdown section of the rate study (module docstring)."""
    st = doc["settings"]
    q = headline(doc)
    out = [
        "## How much of the traffic hallucinates? Rates with valid intervals (beyond the paper)",
        "",
        f"Pools of {st['pool']} items of traffic at prevalences {', '.join(f'{float(x):g}' for x in st['prevalences'])} "
        f"with {', '.join(str(n) for n in st['labels'])} labels, {st['replicates']} replicates per cell; "
        f"{round(100 * st['level'])} % intervals. Estimand: {doc['estimand']}. Coverage is read against the band "
        f"{BAND[0]:.2f}–{BAND[1]:.2f} (± 2 Monte Carlo s.e. at {st['replicates']} replicates); widths are medians, "
        "relative to the classical (labels-only, Wilson) interval of the same labels; the multiplier is the "
        "median effective labels over the labels used.",
        "",
        *[f"* {line}" for line in statements(doc)],
        "",
    ]
    rows = []
    for name, per in doc["summary"].items():
        for m in STUDY_METHODS:
            d = per[m]
            rows.append(
                [
                    name,
                    NAMES[m],
                    _cov(d),
                    markdown.f3(d["width"]),
                    "—" if d["width_rel"] is None else f"{d['width_rel']:.2f}",
                    "—" if d["multiplier"] is None else f"{d['multiplier']:.2f}",
                ]
            )
    out += [
        markdown.table(
            [
                "regime",
                "method",
                "coverage min–max (cells in band)",
                "median width",
                "width / classical",
                "effective labels / labels",
            ],
            rows,
        ),
        markdown.dash_note(rows, "no valid interval, so no effective labels (naive share, EM)"),
        "",
    ]
    ns = [str(n) for n in st["labels"]]
    n_head = "100" if "100" in ns else ns[len(ns) // 2]
    head = ["regime", *[f"{NAMES[m]} cov. / width" for m in STUDY_METHODS]]
    rows = []
    for name, reg in doc["regimes"].items():
        cell = reg["cells"][q]["labels"][n_head]["methods"]
        rows.append([name, *[f"{cell[m]['coverage']:.3f} / {cell[m]['width']:.3f}" for m in STUDY_METHODS]])
    out += [f"### At prevalence {q} with {n_head} labels", "", markdown.table(head, rows), ""]
    cj = doc["crosscheck"]["cje"]
    if cj:
        rows = [
            [
                k,
                f"{v['cje_coverage']:.3f}",
                "—" if v["cje_width_rel"] is None else f"{v['cje_width_rel']:.2f}",
                f"{v['raim_ppi_coverage']:.3f}",
                "—" if v["raim_ppi_width_rel"] is None else f"{v['raim_ppi_width_rel']:.2f}",
                str(v["replicates"]),
            ]
            for k, v in cj.items()
        ]
        out += [
            "### Side by side: cje-eval's calibrated mean and RAIM's PPI++ on the same replicates",
            "",
            markdown.table(
                [
                    "cell",
                    "cje coverage",
                    "cje width / classical",
                    "PPI++ coverage",
                    "PPI++ width / classical",
                    "replicates",
                ],
                rows,
            ),
            "",
        ]
    return out
