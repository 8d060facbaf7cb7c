"""The main job's summary lines (§2, §3.3): per dataset, the stacker against the CV-best single judge, the
paired call, the admissibility verdict and the deployment decision (:mod:`src.core.decide`)."""

from __future__ import annotations


def summary_lines(doc: dict) -> list[str]:
    """One line per dataset: the stacker against the CV-best single judge, the call, the admissibility verdict
    (§2, §3.3), and what to deploy there (:mod:`src.core.decide`)."""
    out = []
    for name, s in doc["datasets"].items():
        st, cv = (s["comparators"][c]["kappa"]["estimate"] for c in ("stacked", "best_cv"))
        d = s["deltas"]["best_cv"]["kappa"]
        adm = s["admissibility"]
        verdict = "admissible" if adm["admissible"] else f"not admissible ({adm['reason']})"
        out.append(
            f"{name}: stacked κ {st:.3f} vs CV-best single {cv:.3f}, Δκ {d['estimate']:+.3f} "
            f"[{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]: {d['call']}; {verdict} → {s['decision']['label']}"
        )
    return out


def skipped_lines(doc: dict) -> list[str]:
    return [f"{d}: left out, {v['reason']}; compute with `{v['command']}`" for d, v in doc.get("skipped", {}).items()]
