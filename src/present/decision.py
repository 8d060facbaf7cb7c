"""The report's opening section: the deployment decision per dataset (:mod:`src.core.decide`: the panel, the
CV-best single judge, or nothing, from the §3.3 admissibility test and the §2 call against the CV-best single),
read off results.json.
"""

from __future__ import annotations

from src.core.decide import decide
from src.core.evidence import evidence_text
from src.present.markdown import f3, table


def kappa_of(d: dict, s: dict) -> str:
    """Whose κ a decision quotes (:class:`src.core.decide.Decision`): the stacked panel or the single judge it
    deploys; where nothing is deployed, whichever of the two it quotes as the better."""
    if d["action"] == "panel":
        return "stacked panel"
    if d["action"] == "single":
        return f"single judge {d['member']}"
    stacked = (s["comparators"].get("stacked") or {}).get("kappa", {}).get("estimate")
    better = "stacked panel" if d["kappa"] == stacked else f"CV-best single {s['selected']['oracle']}"
    return f"{better} (the better)"


def decision_section(results: dict) -> str:
    """The opening table: one deployment decision per dataset (:mod:`src.core.decide`), then the rule in words."""
    st = results.get("settings", {})
    floor = st.get("kappa_floor", 0.40)
    rows = []
    for n, s in results["datasets"].items():
        d = s.get("decision") or decide(s, floor, st.get("floor_rule", "estimate")).as_dict()  # older results.json
        cell = f"**{d['label']}**" if d["action"] != "none" else d["label"]
        kappa = f"{f3(d['kappa'])} [{f3(d['kappa_ci'][0])}, {f3(d['kappa_ci'][1])}]"
        call = f"{d['call']} ({evidence_text(s)})" if evidence_text(s) else d["call"]
        rows.append([n, cell, kappa_of(d, s), kappa, call, d["reason"]])
    for n, v in (results.get("skipped") or {}).items():
        why = f"{v.get('reason', 'left out')}; compute with `{v.get('command', '')}`"
        rows.append([n, "not analysed", "—", "—", "—", why])
    head = ["Dataset", "Decision", "κ of", "κ [95% CI]", "Call vs the CV-best single (evidence)", "Reason"]
    return table(head, rows) + (
        f"\n\nRule ({', '.join(f'{k}={st.get(k)}' for k in ('kappa0', 'c', 'phi0'))}, "
        f"kappa_floor={floor}): **deploy the panel** where it is admissible (at least a share c of the members "
        f"at κ ≥ κ₀ and mean error correlation φ̄ ≤ φ₀, §3.3, and at least two of them), its paired Δκ against "
        f"the CV-best single judge as deployed (its abstentions answered 'hallucinated', both arms scored on every "
        f"item) is a win (95% paired cluster-bootstrap interval above 0, §2, with the stacker and the CV-best choice "
        f"fitted again in every draw and never narrower than its discordant items allow: docs/intervals.md) and its "
        f"κ reaches the floor {floor:g}"
        f"{' with its interval' + chr(39) + 's lower bound' if st.get('floor_rule') == 'lower_bound' else ''}; "
        f"otherwise **deploy the single judge** the CV-best rule picks on all labelled items, if its out-of-fold "
        f"κ as deployed reaches the floor; otherwise **nothing here is good enough**. κ [95% CI]: of what is "
        f"deployed (the κ of column: the stacked panel or the single judge; for nothing, the better of the two). "
        f"The call's evidence: the items on which the panel and the single judge differ (discordant) and each one's "
        f"own abstentions. The floor (analysis.kappa_floor) is what a deployed judge must reach, not κ₀, which "
        f"counts the competent members."
    )
