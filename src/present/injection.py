"""The injection study's figure and report section (beyond the paper; :mod:`src.studies.injection`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from src.present.figures import _plt, _save
from src.studies.injection import statements
from src.studies.injection.items import AGGREGATES, CLEAN, heldout_conditions
from src.studies.injection.path import PATHS

FRAME_STYLE = {"paper": ("tab:red", "paper frame"), "guarded": ("tab:blue", "guarded frame")}


def _attacks(doc: dict) -> list[str]:
    return [*doc["settings"]["attacks"], *heldout_conditions(int(doc["settings"].get("heldout_draws", 0)))]


def injection_figure(doc: dict, path: str | Path) -> Path:
    """Attack success rate (hallucinated items the judge catches when clean, voted supported once attacked) per
    judge — each member, the stacked panel, the majority — under the paper frame and the guarded frame (95 %
    cluster-bootstrap intervals), one row per dataset, one column per attack class."""
    plt = _plt()
    sets, attacks = list(doc["datasets"]), _attacks(doc)
    judges = [*doc["members"], *AGGREGATES]
    fig, axes = plt.subplots(
        max(len(sets), 1),
        len(attacks),
        figsize=(2.3 * len(attacks) + 1.2, 0.28 * len(judges) * max(len(sets), 1) + 1.2),
        squeeze=False,
        sharex=True,
    )
    y = np.arange(len(judges))
    for i, ds in enumerate(sets):
        d = doc["datasets"][ds]
        for c, a in enumerate(attacks):
            ax = axes[i, c]
            for off, (fk, (colour, label)) in zip((-0.18, 0.18), FRAME_STYLE.items()):
                est, lo, hi = [], [], []
                for j in judges:
                    v = (d["judges"].get(j, {}).get(fk, {}).get(a) or {}).get("asr") or {}
                    e = v.get("estimate")
                    ci = v.get("ci") or [None, None]
                    est.append(np.nan if e is None else e)
                    lo.append(np.nan if e is None or ci[0] is None else e - ci[0])
                    hi.append(np.nan if e is None or ci[1] is None else ci[1] - e)
                ax.barh(
                    y + off,
                    est,
                    height=0.34,
                    color=colour,
                    alpha=0.75,
                    label=label,
                    xerr=np.array([lo, hi]),
                    error_kw={"lw": 0.7, "capsize": 1.5},
                )
                ax.plot(est, y + off, "|", color=colour, ms=6)  # an estimate of 0 has no bar
            ax.set_yticks(y)
            ax.set_yticklabels(judges if c == 0 else [""] * len(judges), fontsize=7)
            ax.axhline(len(doc["members"]) - 0.5, color="black", lw=0.5)
            ax.set_xlim(0, 1)
            ax.invert_yaxis()
            if i == 0:
                ax.set_title(a, fontsize=9)
            if c == 0:
                ax.set_ylabel(ds, fontsize=9)
            if i == len(sets) - 1:
                ax.set_xlabel("attack success rate", fontsize=8)
    h, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(h, labels, loc="lower center", ncol=2, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.03))
    fig.suptitle(f"Injection: hallucinated → supported flips (roster {doc['roster']})", fontsize=10)
    return _save(fig, path)


def _f(x, nd: int = 2, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "—"
    return f"{x:+.{nd}f}" if signed else f"{x:.{nd}f}"


def _rate(v: dict | None) -> str:
    """A rate as "k/n = r [lo, hi]"."""
    if not v or v.get("estimate") is None:
        return "—"
    lo, hi = v["ci"]
    return f"{v['events']}/{v['n']} = {_f(v['estimate'])} [{_f(lo)}, {_f(hi)}]"


def _delta(d: dict | None) -> str:
    """A paired Δ with its interval, bold when the interval excludes 0."""
    if not d:
        return "—"
    s = f"{d['estimate']:+.2f} [{d['ci'][0]:+.2f}, {d['ci'][1]:+.2f}]"
    return f"**{s}**" if d["ci"][0] > 0 or d["ci"][1] < 0 else s


def _missed(cell: dict | None) -> str:
    """The share of hallucinated items voted supported, clean → attacked."""
    m = (cell or {}).get("missed")
    if not m:
        return "—"
    return f"{_f(m['clean']['estimate'])} → {_f(m['attacked']['estimate'])}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *["| " + " | ".join(str(c) for c in r) + " |" for r in rows],
    ]


def injection_section(doc: dict) -> list[str]:
    """Candidates that instruct the judges (beyond the paper; injection.json): per dataset and attack class, each
    judge's attack success rate under the paper frame and under the guarded frame, Δκ under attack (paired
    cluster-bootstrap intervals, bold when they exclude 0), the guarded − paper Δ, the panel against the members
    and with only one member attacked; then the detector's rates."""
    st = doc["settings"]
    out = [
        "## Candidates that instruct the judges (beyond the paper)",
        "",
        f"Roster `{doc['roster']}`; per dataset {st['n_items']} judged items (whole clusters, half hallucinated), "
        f"each attacked once per class ({', '.join(_attacks(doc))}; seed {st['seed']}), judged under the "
        f"paper frame and its guarded version. ASR: of the hallucinated items a judge votes hallucinated when "
        f"clean, the share it votes supported once attacked; missed: the share of hallucinated items voted "
        f"supported. Δκ: κ attacked − κ clean on the same items. "
        f"Intervals: {round(100 * st['level'])} % paired cluster bootstrap ({st['n_boot']} draws). The "
        f"stacker is cross-fitted on the clean verdicts and applied to the attacked ones.",
        "",
        *[f"* {line}" for line in statements(doc)],
        "",
    ]
    for ds, d in doc["datasets"].items():
        out += [
            f"### {ds} ({d['n']} items, {d['n_clusters']} clusters; frames {d['frames'].get('paper')} → "
            f"{d['frames'].get('guarded', '—')})",
            "",
        ]
        rows = []
        for j, frames in d["judges"].items():
            for a in _attacks(doc):
                p, g = (frames.get("paper") or {}).get(a), (frames.get("guarded") or {}).get(a)
                if p is None and g is None:
                    continue
                dd = (d["defence"].get(j) or {}).get(a) or {}
                rows.append(
                    [
                        j,
                        a,
                        _rate((p or {}).get("asr")),
                        _rate((g or {}).get("asr")),
                        _delta(dd.get("asr")),
                        _delta((p or {}).get("delta_kappa")),
                        _delta((g or {}).get("delta_kappa")),
                        _missed(p),
                        _missed(g),
                    ]
                )
        out += _table(
            [
                "judge",
                "attack",
                "ASR paper",
                "ASR guarded",
                "Δ ASR (guarded − paper)",
                "Δκ attack, paper",
                "Δκ attack, guarded",
                "missed clean → attacked, paper",
                "missed clean → attacked, guarded",
            ],
            rows,
        ) + [""]
        clean = []
        for j, frames in d["judges"].items():
            dd = (d["defence"].get(j) or {}).get(CLEAN) or {}
            clean.append(
                [
                    j,
                    _f(((frames.get("paper") or {}).get(CLEAN) or {}).get("kappa", {}).get("estimate")),
                    _f(((frames.get("guarded") or {}).get(CLEAN) or {}).get("kappa", {}).get("estimate")),
                    _delta(dd.get("kappa")),
                ]
            )
        out += [
            "Clean κ on the same items (the cost of the guarded frame):",
            "",
            *_table(["judge", "κ paper", "κ guarded", "Δκ (guarded − paper)"], clean),
            "",
        ]
        for fk, agg in d["aggregation"].items():
            rows = []
            for a, v in agg.items():
                for m in doc["members"]:
                    one = v["one_attacked"].get(m) or {}
                    rows.append(
                        [
                            a,
                            m,
                            _delta(v["stacked_minus_member_asr"].get(m)),
                            _rate(one.get("asr")),
                            _delta(one.get("delta_kappa")),
                        ]
                    )
            if rows:
                out += [
                    f"Aggregation, {fk} frame: the stacked panel's ASR − the member's (all members attacked); "
                    "the panel's ASR and Δκ when only that member's verdicts are attacked:",
                    "",
                    *_table(
                        [
                            "attack",
                            "member",
                            "Δ ASR (panel − member)",
                            "panel ASR, only member attacked",
                            "panel Δκ, only member attacked",
                        ],
                        rows,
                    ),
                    "",
                ]
        if d.get("missing"):
            out += [f"Verdicts still missing: `{doc.get('command')}`.", ""]
        out += _decision_tables(d)
    det = doc["detector"]
    rows = [[a, v["n"], v["flagged"], _f(v["rate"])] for a, v in det["attacked"].items()]
    out += ["### Detector (src.core.injection.detect)", "", *_table(["attack", "items", "flagged", "rate"], rows), ""]
    rows = [
        [
            ds,
            *[f"{v[f]['flagged']}/{v[f]['n']}" for f in ("candidate", "question", "evidence")],
            f"{v['item']['flagged']}/{v['item']['n']} = {_f(v['item']['rate'], 4)}",
        ]
        for ds, v in det["clean"].items()
    ]
    for name, per in det.get("written", {}).items():
        wrows = [
            [k, v["attacks"], v["attacks_flagged"], f"{v['flagged']}/{v['pairs']}", _f(v["rate"]), _ci(v["ci"])]
            for k, v in per.items()
        ]
        out += [
            f"Attacks written apart from the generator, the {name} set (data/injection/{name}.jsonl; every attack "
            "planted in every study item):",
            "",
            *_table(
                ["class", "attacks", "flagged in most items", "(attack, item) pairs flagged", "recall", "interval"],
                wrows,
            ),
            "",
        ]
    out += [
        "Clean items of the shipped sets flagged (false positives):",
        "",
        *_table(["set", "candidate", "question", "evidence", "any field"], rows),
        "",
    ]
    return out


def _ci(ci) -> str:
    return "—" if not ci or ci[0] is None else f"[{_f(ci[0])}, {_f(ci[1])}]"


def _decision_tables(d: dict) -> list[str]:
    """The decision path under attack, per frame: each path's attack success per attack class, its clean κ and
    share escalated, and the inherited flips when only one LLM member is attacked."""
    out: list[str] = []
    for fk, block in (d.get("decision") or {}).items():
        groups = list(dict.fromkeys(g for per in block["asr"].values() for g in per))
        rows = [[g, *[_rate(block["asr"].get(p, {}).get(g)) for p in PATHS]] for g in groups]
        out += [
            f"Decision path, {fk} frame (attack success: of the hallucinated items the path's clean decision calls "
            "hallucinated, the share its attacked decision calls supported; escalated is not a success):",
            "",
            *_table(["attacks", *PATHS], rows),
            "",
        ]
        rows = [
            [p, _f(v["kappa"]["estimate"]), _delta(v["delta_kappa"]), _f(v["escalated"])]
            for p, v in block["clean"].items()
        ]
        out += [
            "Clean items on each path (κ on the items it decides; Δκ against the panel alone; share escalated):",
            "",
            *_table(["path", "κ", "Δκ vs panel", "escalated"], rows),
            "",
        ]
        rows = [
            [m, g, *[_rate((per.get(p) or {}).get(g)) for p in per]]
            for m, per in block.get("one_attacked", {}).items()
            for g in ("generator (all)", "heldout (all)")
        ]
        if rows:
            paths = list(next(iter(block["one_attacked"].values())))
            out += [
                "Inherited flips: only that member's verdicts attacked (the aggregation-level checks):",
                "",
                *_table(["member", "attacks", *paths], rows),
                "",
            ]
    return out
