"""The traces study's figure and report section (beyond the paper; :mod:`src.studies.ensembles`): the stacked panel
against MLflow's ``make_scorer_ensemble`` aggregations of the same members.

* :func:`traces_figure` — per dataset, κ of each aggregation with its 95 % interval (coverage beside it: the
  share of items the aggregation answered);
* :func:`traces_section` — the Markdown section: one row per dataset × aggregation (κ, balanced accuracy,
  coverage and the items MLflow refused, Δκ stacked − it with its paired interval and call).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from src.present import figures, markdown
from src.studies.ensembles import MLFLOW_PREFIX, REFERENCE, statements

STYLE = {
    "stacked": ("tab:green", "RAIM stacked panel (cross-fitted)"),
    f"{MLFLOW_PREFIX}majority_vote": ("tab:red", "MLflow make_scorer_ensemble: majority_vote"),
    f"{MLFLOW_PREFIX}mean": ("tab:orange", "MLflow make_scorer_ensemble: mean ≥ threshold"),
    REFERENCE: ("tab:gray", "RAIM majority (abstention = 0.5)"),
}


def label(method: str) -> str:
    return STYLE.get(method, ("black", method))[1]


def traces_figure(doc: dict, path: str | Path) -> Path:
    """κ per aggregation and dataset with its interval, coverage written beside each bar (module docstring)."""
    names = list(doc["datasets"])
    fig, axes = figures._small_multiples(len(names))
    for ax, name in zip(axes, names):
        d = doc["datasets"][name]
        methods = list(d["methods"])
        y = np.arange(len(methods))[::-1]
        for yi, m in zip(y, methods):
            k = d["methods"][m]["kappa"]
            colour = STYLE.get(m, ("black", m))[0]
            lo, hi = k["estimate"] - k["ci"][0], k["ci"][1] - k["estimate"]
            ax.barh(yi, k["estimate"], color=colour, alpha=0.8, xerr=[[max(lo, 0)], [max(hi, 0)]], capsize=2)
            ax.text(
                1.02,
                yi,
                f"{100 * d['methods'][m]['coverage']:.0f}%",
                va="center",
                fontsize=6,
                transform=ax.get_yaxis_transform(),
            )
        ax.set_yticks(y)
        ax.set_yticklabels([m.replace(MLFLOW_PREFIX, "mlflow ") for m in methods], fontsize=7)
        ax.axvline(0, color="black", lw=0.5)
        ax.set_title(f"{name} (n={d['n']})", fontsize=9)
        ax.set_xlabel("κ (95 % interval); coverage at right", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle("Stacked panel vs MLflow's scorer ensembles over the same members", fontsize=10)
    return figures._save(fig, Path(path))


def traces_section(doc: dict) -> list[str]:
    """The Markdown section of the traces study (module docstring)."""
    st = doc["settings"]
    out = [
        "## The panel against MLflow's own judge ensembles (beyond the paper)",
        "",
        f"RAIM's members as MLflow scorers, aggregated by `make_scorer_ensemble` ({', '.join(st['ensembles'])}; "
        f"`mean` flags an item at a share ≥ {st['mean_threshold']:g} of members voting hallucinated), against the "
        "cross-fitted stacker on the same members and items (MLflow "
        f"{doc['meta'].get('mlflow', '?')}). MLflow's built-in aggregations refuse an item on which a member "
        "abstained: such an item is an abstention of the aggregation (κ leaves it out, balanced accuracy counts it "
        "wrong). Δκ = stacked − aggregation, 95 % paired cluster-bootstrap interval with the stacker refitted in "
        "every draw.",
        "",
        *[f"* {line}" for line in statements(doc)],
        "",
    ]
    rows = []
    for name, d in doc["datasets"].items():
        for m, per in d["methods"].items():
            delta = d["deltas"].get(m, {}).get("kappa")
            rows.append(
                [
                    name,
                    label(m),
                    f"{markdown.f3(per['kappa']['estimate'])} [{markdown.f3(per['kappa']['ci'][0])}, "
                    f"{markdown.f3(per['kappa']['ci'][1])}]",
                    markdown.f3(per["bacc"]["estimate"]),
                    f"{100 * per['coverage']:.0f}%",
                    str(per.get("refused", "—")),
                    "—"
                    if delta is None
                    else f"{markdown.f3(delta['estimate'], signed=True)} [{markdown.f3(delta['ci'][0], signed=True)}, "
                    f"{markdown.f3(delta['ci'][1], signed=True)}] {delta['call']}",
                ]
            )
    out += [
        markdown.table(
            ["dataset", "aggregation", "κ [95 %]", "bacc", "coverage", "refused by MLflow", "Δκ stacked − it"], rows
        ),
        "",
    ]
    return out
