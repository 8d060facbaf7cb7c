"""The stacking stage's DVC files: compact metrics (``dvc metrics show/diff``) and the β table (``dvc plots``)."""

from __future__ import annotations

from pathlib import Path

from src.io.files import atomic_write_text, to_json


def compact_metrics(doc: dict) -> dict:
    """Per dataset, the headline numbers of results.json (what `dvc metrics show/diff` should compare)."""
    out = {}
    for name, s in doc["datasets"].items():
        comp, delta, adm = s["comparators"], s["deltas"], s["admissibility"]
        row = {
            "n": s["n"],
            "stacked": {m: comp["stacked"][m]["estimate"] for m in ("kappa", "bacc", "f1")},
            "best_cv_kappa": comp["best_cv"]["kappa"]["estimate"],
            "delta_best_cv_kappa": delta["best_cv"]["kappa"]["estimate"],
            "delta_best_cv_kappa_lo": delta["best_cv"]["kappa"]["ci"][0],
            "call_best_cv": delta["best_cv"]["kappa"]["call"],
            "admissible": bool(adm["admissible"]),
            "decision": (s.get("decision") or {}).get("action"),
            "decision_member": (s.get("decision") or {}).get("member"),
            "phi_bar": adm["phi_bar"],
            "members_at_kappa0": adm["members_at_kappa0"],
        }
        if "frontier" in delta:
            row["delta_frontier_kappa"] = delta["frontier"]["kappa"]["estimate"]
        out[name] = row
    return out


NOISE = 1e-9  # a coefficient this close to 0 is rounding noise (a member that never changes its vote): written as 0


def _meaningful(beta: float) -> float:
    """β as written to the tracked β table: below :data:`NOISE` in size it is 0.0, so that the file does not
    depend on the machine's floating-point path (one BLAS kernel gives 6.6e-16, another 1.7e-16)."""
    return 0.0 if abs(beta) < NOISE else beta


def beta_rows(doc: dict):
    """β per dataset and stacker feature (fold mean and full refit), long format, as a DataFrame."""
    import pandas as pd  # imported here, not at start-up: pandas ~0.5 s

    rows = [
        {
            "dataset": name,
            "feature": f,
            "label": f"{name}: {f}",
            "beta": _meaningful(b),
            "beta_full": _meaningful(s["stacker"]["beta_full"][f]),
        }
        for name, s in doc["datasets"].items()
        for f, b in s["stacker"]["beta_mean"].items()
    ]
    return pd.DataFrame(rows, columns=["dataset", "feature", "label", "beta", "beta_full"])


def write_stage_files(doc: dict, metrics: str | Path | None = None, betas: str | Path | None = None) -> None:
    """The DVC `metrics` (compact JSON) and `plots` (β CSV) files of the stacking stage, each written atomically
    (a failure leaves the previous file whole)."""
    for path, text in (
        (metrics, lambda: to_json(compact_metrics(doc), default=str)),
        (betas, lambda: beta_rows(doc).to_csv(index=False, float_format="%.6g")),
    ):
        if path:
            atomic_write_text(path, text())
