"""The evidence a ladder summary's call against the CV-best single rests on (§2; docs/intervals.md): which
comparison decides deployment, the items where its two arms differ and each arm's abstentions, in words. Read
from the JSON summary only (no numerical imports: the main job's summary lines use it at start-up's cost)."""

from __future__ import annotations

DEPLOYED = "best_cv_deployed"  # the CV-best single as deployed: the comparison that decides (else §2's best_cv)


def comparison(s: dict) -> str:
    """The comparator a dataset's decision reads (:data:`DEPLOYED`, or §2's ``best_cv`` in an older summary)."""
    return DEPLOYED if DEPLOYED in s["deltas"] else "best_cv"


def evidence(s: dict) -> dict:
    """What the decision's comparison rests on: the discordant items and each arm's own abstentions (the single
    judge's before they are answered), from a ladder summary; empty for an older one."""
    d = s["deltas"][comparison(s)]["kappa"]
    if d.get("discordant") is None:
        return {}
    own = (s["deltas"]["best_cv"]["kappa"].get("abstentions") or {}).get("best_cv")
    return {
        "discordant": d["discordant"],
        "abstentions": {"panel": (d.get("abstentions") or {}).get("stacked"), "single": own},
    }


def evidence_text(s: dict) -> str:
    """The evidence in words, for the call's brackets: ``2 discordant items; abstentions: panel 0, single 2``
    (the single judge's answered "hallucinated" when deployed); "" for an older summary."""
    ev = evidence(s)
    if not ev:
        return ""
    k, ab = ev["discordant"], ev["abstentions"]
    answered = " answered 'hallucinated'" if comparison(s) == DEPLOYED and ab["single"] else ""
    text = f"{k} discordant item{'' if k == 1 else 's'}; abstentions: panel {ab['panel']}, single {ab['single']}"
    return text + answered
