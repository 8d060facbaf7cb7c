"""The main job's summary lines (§2, §3.3): per dataset, the stacker against the CV-best single judge, the
paired call with the evidence it rests on, the admissibility verdict and the deployment decision
(:mod:`src.core.decide`)."""

from __future__ import annotations

from src.core.evidence import comparison, evidence_text


def summary_lines(doc: dict) -> list[str]:
    """One line per dataset: the stacker against the CV-best single judge as deployed (the comparison the decision
    reads, :func:`src.core.decide.comparison`), the call with its evidence (discordant items, each arm's
    abstentions), §2's call where it differs, the admissibility verdict (§3.3), and what to deploy there."""
    out = []
    for name, s in doc["datasets"].items():
        key = comparison(s)
        st, cv = (s["comparators"][c]["kappa"]["estimate"] for c in ("stacked", key))
        d = s["deltas"][key]["kappa"]
        ev = evidence_text(s)
        paper = s["deltas"]["best_cv"]["kappa"]["call"]
        also = f"; §2 on its answered items: {paper}" if paper != d["call"] else ""
        call = f"{d['call']} ({ev}{also})" if ev else d["call"]
        adm = s["admissibility"]
        verdict = "admissible" if adm["admissible"] else f"not admissible ({adm['reason']})"
        out.append(
            f"{name}: stacked κ {st:.3f} vs CV-best single {cv:.3f}, Δκ {d['estimate']:+.3f} "
            f"[{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]: {call}; {verdict} → {s['decision']['label']}"
        )
    return out


def skipped_lines(doc: dict) -> list[str]:
    return [f"{d}: left out, {v['reason']}; compute with `{v['command']}`" for d, v in doc.get("skipped", {}).items()]
