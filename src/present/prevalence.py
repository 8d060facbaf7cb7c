"""The report's prevalence-shift section (beyond the paper; :mod:`src.studies.prevalence`)."""

from __future__ import annotations

from src.present.markdown import delta_cell, f3, table
from src.studies.prevalence import CONDITIONS, statements


def prevalence_section(doc: dict) -> list[str]:
    """Prevalence shift (beyond the paper; :mod:`src.studies.prevalence`): per calibration set and deployment
    prevalence π, the stacker's Brier, ECE, F1 and balanced accuracy at the served decision — uncorrected, and the
    paired Δ of the correction with the true π and with the EM-estimated π (Saerens et al. 2002), bold when its
    cluster-bootstrap interval excludes 0 — and the EM estimate of π (prevalence.json)."""

    st = doc["settings"]
    out = [
        "## Prevalence shift (beyond the paper)",
        "",
        f"Each calibration set's cross-fitted stacker posteriors, resampled within class to windows of "
        f"{st['window']} items at each deployment prevalence π ({st['n_boot']} cluster-bootstrap replicates × "
        f"{st['n_draws']} windows; {round(100 * st['level'])} % intervals over replicates). Cells: the uncorrected "
        "value, then Δ (corrected − uncorrected) with the true π / with the EM estimate π̂; the decision is "
        "corrected p ≥ the stacker's threshold, as served.",
        "",
        *[f"* {line}" for line in statements(doc)],
        "",
    ]
    metrics = [("brier", "Brier"), ("ece", "ECE"), ("f1", "F1"), ("bacc", "bacc")]
    for name, d in doc["datasets"].items():
        b = d["balanced"]
        out += [
            f"### {name} ({d['kind']}; balanced set: κ {f3(b['kappa'])}, Brier {f3(b['brier'])}, ECE {f3(b['ece'])})",
            "",
        ]
        rows = []
        for q, cell in d["prevalences"].items():
            pe = cell["prevalence_estimate"]
            rows.append(
                [
                    q,
                    *[
                        f"{f3(cell['metrics'][m][CONDITIONS[0]]['estimate'])}; "
                        + " / ".join(delta_cell(cell["deltas"][m][c]) for c in CONDITIONS[1:])
                        for m, _ in metrics
                    ],
                    f"{f3(pe['estimate'])} [{f3(pe['window_ci'][0])}, {f3(pe['window_ci'][1])}]",
                    f3(pe["mae"]),
                ]
            )
        out += [
            table(
                ["π", *[f"{label}; Δ true / Δ π̂" for _, label in metrics], "π̂ [one window]", "mean abs. error of π̂"],
                rows,
            ),
            "",
        ]
    return out
