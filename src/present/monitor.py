"""The report's live-monitoring section (beyond the paper; :mod:`src.studies.monitor`)."""

from __future__ import annotations

from src.present.markdown import f3, table


def monitor_section(doc: dict) -> list[str]:
    """Live monitoring (beyond the paper): the monitored stream's alarms and, for a replay, the
    detection delay and false alarms over seeds (monitor.json of :mod:`src.studies.monitor`)."""
    s, cal = doc["settings"], doc["calibration"]
    out = [
        "## Live monitoring of the served panel (beyond the paper)",
        "",
        f"Windows of {s['window']} items every {s['step']}; drift test against the calibration set's class-"
        f"conditional votes (n = {cal['n']}, agreement proxy {f3(cal['agreement_proxy'])}, "
        f"{'admissible' if cal['admissibility']['admissible'] else 'not admissible'}: "
        f"{cal['admissibility']['reason']}) at α = {s['alpha']:g} (Holm within a window"
        + (
            f"; set for at most {1e5 * s['false_alarm_target']:g} false alarms per 100,000 stable items, α = target "
            f"· step / 2"
            if s.get("alpha_setting") == "auto"
            else ""
        )
        + "); prevalence flagged "
        f"when it moves beyond ±{s['tolerance']:g} of {f3(s['reference_prevalence'])}, significantly at α; an "
        f"alarm is {s['consecutive']} successive flagged windows.",
        "",
    ]
    st, alarms = doc["stream"], doc["alarms"]
    head = (
        f"Replayed stream '{st['scenario']}' (seed {st['seed']}), {st['n']} items, change at item {st['change']}"
        if doc["source"] == "replay"
        else f"Store {st['store']}, {st['n']} recorded items"
    )
    out += [
        f"{head}: panel alarms at items {alarms['panel'] or 'none'}, prevalence alarms at "
        f"{alarms['prevalence'] or 'none'}."
    ]
    rep = doc.get("replay")
    if rep:
        fa = [a for v in rep["false_alarms"].values() for a in v]
        out[-1] += (
            f" Expected ({rep['expected'] or 'no'}) alarm "
            + (f"after {rep['delay']} items" if rep["delay"] is not None else "not raised")
            + f"; false alarms before the change: {fa or 'none'}."
        )
    ev = doc.get("evaluation")
    if ev:
        es = doc["evaluation_settings"]
        rows = [
            [
                name,
                v["expected"] or "—",
                f"{v['detected']}/{v['seeds']}",
                f"{v['within_max_delay']}/{v['seeds']}" if v["expected"] else "—",
                "—" if v["delay_median"] is None else f"{v['delay_median']:g}",
                "—" if v["delay_max"] is None else str(v["delay_max"]),
                f"{v['false_alarm_seeds_panel']} / {v['false_alarm_seeds_prevalence']}",
                str(v["other_alarm_seeds"]),
            ]
            for name, v in ev.items()
        ]
        seeds = es["seeds"]
        span = (
            f"seeds {seeds[0]}–{seeds[1]}"
            if isinstance(seeds, list)
            else f"{len(seeds)} blocks of seeds, one per scenario ({', '.join(f'{k} {v[0]}–{v[1]}' for k, v in seeds.items())})"
        )
        out += [
            "",
            f"Over {span}, each seed its own calibration set and stream:",
            "",
            table(
                [
                    "scenario",
                    "expected alarm",
                    "detected",
                    f"within {es['stated_max_delay']} items",
                    "median delay",
                    "max delay",
                    "seeds with a false alarm (panel / prevalence)",
                    "seeds with another alarm after the change",
                ],
                rows,
            ),
        ]
    fa = doc.get("false_alarms")
    if fa:
        lo, hi = fa["rate_ci"]
        s_lo, s_hi = fa["streams_with_alarm_ci"]
        out += [
            "",
            f"False alarms on {fa['streams']} fresh stable streams (seeds {fa['seeds'][0]}–{fa['seeds'][1]}, "
            f"{fa['items_per_stream']} stable items each, {fa['items']} in all): {fa['alarms_total']} "
            f"(panel {fa['alarms']['panel']}, prevalence {fa['alarms']['prevalence']}), "
            f"{fa['rate']:.2f} per {fa['per']:,} items [{lo:.2f}, {hi:.2f}] (exact Poisson 95%); "
            f"{fa['streams_with_alarm']}/{fa['streams']} streams with any false alarm "
            f"[{100 * s_lo:.1f}%, {100 * s_hi:.1f}%] (Clopper–Pearson). Design bound at α = {s['alpha']:g}: "
            f"{fa['bound']:.2f} per {fa['per']:,}" + (f" (target {fa['target']:g})." if fa["target"] else "."),
        ]
    return out + [""]
