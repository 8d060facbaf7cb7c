"""What to deploy on one dataset, read off its ladder summary (§2 calls, §3.3 admissibility).

One of three decisions, in this order:

1. ``panel`` — *deploy the panel*: the panel is admissible at (κ₀, c, φ₀) (§3.3), its paired Δκ against the
   CV-best single judge as deployed is a ``win`` (§2: the 95% paired cluster-bootstrap interval lies above 0),
   and the stacked κ reaches the floor κ_min;
2. ``single`` — *deploy the single judge X*: otherwise, when the CV-best single judge as deployed reaches κ_min.
   X is the member the CV-best rule picks on all labelled items (argmax κ among the eligible members,
   ``selected.oracle`` in the summary), and its κ and interval are those of the CV-best comparator as deployed
   (out of fold, so not inflated by picking the maximum on the very items it is scored on);
3. ``none`` — *nothing here is good enough*: neither the panel where it pays nor the CV-best single reaches
   κ_min; the reason names the best κ any member or aggregate reached.

Every κ is compared with κ_min within :data:`src.core.admissibility.TOL` (a κ of exactly κ_min reaches it), by the
floor rule (``analysis.floor_rule``): ``estimate`` — the point estimate reaches κ_min; ``lower_bound`` — the 95%
interval's lower bound does. Either way the reason says when the interval spans κ_min (the floor is then reached,
or missed, on the estimate only).

The rule is the paper's: an inadmissible panel is never deployed, even where the ladder measures a win against
the CV-best single (a strong member among weak ones: §3.3 counts the members at κ₀, not the win). The decision
then says so — ``vetoed_win`` and a reason that names the win and the rule's grounds, with how often the panel
is admissible over the bootstrap draws (``admissibility.admitted_share``: near ½ when a member's κ sits at κ₀).

Like with like. A deployed judge must answer every item, as the panel does; §2's κ of the CV-best single leaves out
the items it abstains on, which the panel must answer. The decision therefore reads the comparison against the
CV-best single *as deployed* (``best_cv_deployed`` in the summary: its abstentions answered "hallucinated",
:data:`src.core.evaluate.FALLBACK`), both arms scored on every item; §2's comparison stays in ``deltas.best_cv``
and its call beside the decision (``call_paper``). Each decision carries the evidence its comparison rests on:
the items where the two arms differ (``discordant``) and each arm's abstentions.

The decision only reads the JSON summary (:func:`src.core.ladder.analyze_dataset`), so an older results.json can be
decided again (one without ``best_cv_deployed`` on §2's comparison).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from src.core.admissibility import TOL
from src.core.errors import RaimError
from src.core.evidence import DEPLOYED, comparison, evidence, evidence_text

FLOOR_RULES = ("estimate", "lower_bound")  # what must reach κ_min: the κ estimate, or its interval's lower bound
WINS = ("win", "clean win")  # the ladder's calls against the CV-best single that mean the panel pays (§2)
ACTIONS = {"panel": "deploy the panel", "single": "deploy the single judge", "none": "nothing here is good enough"}
AGGREGATES = ("stacked", "majority", "dawid_skene", "acc_weighted", "logodds_weighted")


@dataclass
class Decision:
    """One dataset's decision, with the numbers its reason quotes."""

    action: str  # panel | single | none
    member: str | None  # the single judge to deploy (action ``single``), else None
    kappa: float | None  # κ of what is deployed (stacked or CV-best single); for ``none``, the better of the two
    kappa_ci: list[float]
    kappa_floor: float
    delta_kappa: float  # stacked − CV-best single, paired
    delta_ci: list[float]
    call: str  # the ladder's call against the CV-best single (§2)
    admissible: bool
    share_competent: float  # members at κ ≥ κ₀ / members (§3.3)
    members_at_kappa0: int
    n_members: int
    phi_bar: float | None
    reason: str
    vetoed_win: bool = False  # the ladder shows a win vs the CV-best single that admissibility vetoes
    admitted_share: float | None = None  # share of the bootstrap draws in which the panel is admissible
    floor_rule: str = "estimate"
    floor_clear: bool | None = None  # the deployed κ's interval lies wholly on one side of the floor
    comparison: str = "best_cv"  # the comparator the call is read against: best_cv_deployed, or best_cv (older)
    discordant: int | None = None  # items where the panel and the single judge differ (abstentions included)
    abstentions: dict[str, int] | None = None  # each arm's own abstentions (panel, single judge)
    call_paper: str | None = None  # §2's call: the CV-best single's κ on the items it answers

    @property
    def label(self) -> str:
        """``deploy the panel`` / ``deploy the single judge X`` / ``nothing here is good enough``."""
        return ACTIONS[self.action] + (f" {self.member}" if self.member else "")

    def as_dict(self) -> dict:
        return {**asdict(self), "label": self.label}


class FloorError(RaimError, ValueError):
    """A κ floor outside [-1, 1] (``analysis.kappa_floor``)."""


def check_floor(kappa_floor: float, floor_rule: str = "estimate") -> None:
    if isinstance(kappa_floor, bool) or not isinstance(kappa_floor, (int, float)) or not -1 <= kappa_floor <= 1:
        raise FloorError(f"analysis.kappa_floor={kappa_floor!r}: must be in [-1, 1]")
    if floor_rule not in FLOOR_RULES:
        raise FloorError(f"analysis.floor_rule={floor_rule!r}: must be one of {', '.join(FLOOR_RULES)}")


def reaches(kappa: float | None, floor: float) -> bool:
    """κ at or above the floor (within :data:`TOL`); an undefined κ never is."""
    return kappa is not None and math.isfinite(kappa) and kappa >= floor - TOL


def _kappa(s: dict, comp: str) -> tuple[float | None, list[float]]:
    c = s["comparators"].get(comp)
    return (None, [math.nan, math.nan]) if c is None else (c["kappa"]["estimate"], list(c["kappa"]["ci"]))


def _num(x: float | None, signed: bool = False) -> str:
    return "n/a" if x is None or not math.isfinite(x) else (f"{x:+.3f}" if signed else f"{x:.3f}")


def _ci(ci: list[float], signed: bool = False) -> str:
    return f"[{_num(ci[0], signed)}, {_num(ci[1], signed)}]"


def _adm_text(a: dict) -> str:
    """Admissibility in its two coordinates: the competent share and φ̄ (§3.3)."""
    phi = "undefined" if a["phi_bar"] is None else f"{a['phi_bar']:.3f}"
    verdict = "admissible" if a["admissible"] else "not admissible"
    return (
        f"{verdict}: {a['members_at_kappa0']}/{a['n_members']} members at κ≥{a['kappa0']:g} (share needed "
        f"{a['c']:g}), φ̄ {phi} (≤ {a['phi0']:g} needed)"
    )


def _best_reached(s: dict) -> str:
    """The highest κ of any member (on all items) and of any aggregate (out of fold)."""
    members = {m: v["kappa"] for m, v in s["members"].items()}
    aggs = {c: k for c in AGGREGATES if (k := _kappa(s, c)[0]) is not None}
    best = [(f"member {m}", members[m]) for m in [max(members, key=lambda m: members[m])] if members]
    best += [(f"aggregate {c}", aggs[c]) for c in [max(aggs, key=lambda c: aggs[c])] if aggs]
    return ", ".join(f"best {what} κ {_num(k)}" for what, k in best)


def spans(ci: list[float], floor: float) -> bool:
    """The interval holds values on both sides of the floor (within :data:`TOL`)."""
    return reaches(ci[1], floor) and not reaches(ci[0], floor)


def reaches_floor(kappa: float | None, ci: list[float], floor: float, rule: str = "estimate") -> bool:
    """The floor rule (:data:`FLOOR_RULES`): the estimate, or the interval's lower bound, at or above the floor."""
    return reaches(kappa, floor) if rule == "estimate" else reaches(kappa, floor) and reaches(ci[0], floor)


def _cmp(kappa: float | None, ci: list[float], floor: float, rule: str = "estimate") -> str:
    text = f"{'≥' if reaches_floor(kappa, ci, floor, rule) else '<'} floor {floor:g}"
    if kappa is not None and math.isfinite(kappa) and spans(ci, floor):
        text += " (its interval spans the floor: " + (
            "reached on the estimate only)" if reaches(kappa, floor) else "missed on the estimate only)"
        )
    return text


def _no_pay(admissible: bool, call: str) -> str:
    why = ([] if admissible else ["not admissible"]) + ([] if call in WINS else [f"a {call} vs the CV-best single"])
    return f"the panel does not pay here ({' and '.join(why)})"


def _veto(a: dict, d: dict) -> str:
    """The reason's statement of a win the admissibility rule vetoes."""
    share = a.get("admitted_share")
    shown = "" if share is None else f"; admissible in {100 * share:.0f}% of the bootstrap draws"
    uncertain = a.get("members_uncertain") or []
    near = f"; {len(uncertain)} member(s) with κ intervals across κ₀ {a['kappa0']:g}" if uncertain else ""
    return (
        f"the ladder shows a {d['call']} against the CV-best single (Δκ lower bound {_num(d['ci'][0], True)}) "
        f"that the admissibility rule vetoes ({a.get('reason') or 'not admissible'}{shown}{near})"
    )


def decide(s: dict, kappa_floor: float = 0.40, floor_rule: str = "estimate") -> Decision:
    """The decision for one dataset's ladder summary (the rule of the module docstring)."""
    check_floor(kappa_floor, floor_rule)
    key = comparison(s)
    a, d = s["admissibility"], s["deltas"][key]["kappa"]
    stk, stk_ci = _kappa(s, "stacked")
    single, single_ci = _kappa(s, key)
    member = s["selected"]["oracle"]
    pays = bool(a["admissible"]) and d["call"] in WINS
    vetoed = not a["admissible"] and d["call"] in WINS
    ev, paper = evidence(s), s["deltas"]["best_cv"]["kappa"]["call"]
    said = "; ".join(x for x in (d["call"], evidence_text(s)) if x)
    also = f"; §2's call on the items it answers: {paper}" if key == DEPLOYED and paper != d["call"] else ""
    answered = key == DEPLOYED and bool((ev.get("abstentions") or {}).get("single"))
    vs = "the CV-best single as deployed" if answered else "the CV-best single"
    numbers = f"Δκ vs {vs} {_num(d['estimate'], True)} {_ci(d['ci'], True)} ({said}){also}; {_adm_text(a)}"
    panel = f"stacked κ {_num(stk)} {_ci(stk_ci)} {_cmp(stk, stk_ci, kappa_floor, floor_rule)}"
    own = f" as deployed ({_num(_kappa(s, 'best_cv')[0])} on the items it answers)" if answered else ""
    cv = (
        f"CV-best single {member} κ{own} {_num(single)} {_ci(single_ci)} "
        f"{_cmp(single, single_ci, kappa_floor, floor_rule)}"
    )
    common = dict(
        kappa_floor=kappa_floor,
        delta_kappa=d["estimate"],
        delta_ci=list(d["ci"]),
        call=d["call"],
        admissible=bool(a["admissible"]),
        share_competent=a["members_at_kappa0"] / max(a["n_members"], 1),
        members_at_kappa0=a["members_at_kappa0"],
        n_members=a["n_members"],
        phi_bar=a["phi_bar"],
        vetoed_win=vetoed,
        admitted_share=a.get("admitted_share"),
        floor_rule=floor_rule,
        comparison=key,
        discordant=ev.get("discordant"),
        abstentions=ev.get("abstentions"),
        call_paper=paper,
    )

    def clear(k, ci):
        return dict(floor_clear=None if k is None or not math.isfinite(k) else not spans(ci, kappa_floor))

    if pays and reaches_floor(stk, stk_ci, kappa_floor, floor_rule):
        return Decision(
            "panel", None, stk, stk_ci, reason=f"the panel pays: {panel}; {numbers}", **common, **clear(stk, stk_ci)
        )
    why_not = (
        "the panel pays but is under the floor"
        if pays
        else f"{_no_pay(False, d['call'])}: {_veto(a, d)}"
        if vetoed
        else _no_pay(bool(a["admissible"]), d["call"])
    )
    if reaches_floor(single, single_ci, kappa_floor, floor_rule):
        return Decision(
            "single",
            member,
            single,
            single_ci,
            reason=f"{why_not}; {cv}; {panel}; {numbers}",
            **common,
            **clear(single, single_ci),
        )
    better = stk is not None and (single is None or stk > single)
    kappa, ci = (stk, stk_ci) if better else (single, single_ci)
    return Decision(
        "none",
        None,
        kappa,
        ci,
        reason=f"{why_not}; {cv}; {panel}; {_best_reached(s)}; {numbers}",
        **common,
        **clear(kappa, ci),
    )


def decide_all(doc: dict, kappa_floor: float | None = None) -> dict[str, Decision]:
    """A results.json document's decisions, per dataset (the floor and its rule: ``settings.kappa_floor`` and
    ``settings.floor_rule`` unless given)."""
    settings = doc.get("settings", {})
    floor = kappa_floor if kappa_floor is not None else settings.get("kappa_floor", 0.40)
    return {name: decide(s, floor, settings.get("floor_rule", "estimate")) for name, s in doc["datasets"].items()}


__all__ = [
    "Decision",
    "decide",
    "decide_all",
    "reaches",
    "reaches_floor",
    "WINS",
    "ACTIONS",
    "FLOOR_RULES",
    "comparison",
    "evidence_text",
]
