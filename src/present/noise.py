"""The report's noisy-calibration-labels section (beyond the paper; :mod:`src.studies.noise`)."""

from __future__ import annotations

from src.present.markdown import delta_cell, f3, pct, table
from src.studies.noise import parts as studied


def noise_section(doc: dict, brief: bool = False) -> list[str]:
    """Noisy calibration labels (beyond the paper; :mod:`src.studies.noise`): per dataset and the simulated
    admissible panel, each TRIVIA+ noise type at each rate — stacked κ on clean gold of each stacker trained on
    noisy labels with its paired Δκ against the clean-label fit, how often the ladder's call and the CV-best
    selection survive, and how far noisy *test* labels move the measured κ and the admissibility call.
    ``brief``: the headline lines only (the command's summary)."""

    parts = studied(doc)
    rate = doc["settings"]["default_rate"]
    head = []
    for name, ds in parts.items():
        sts = list(ds["clean"]["stacked"])
        row = ", ".join(
            f"{t.upper()} " + " / ".join(f"{v[f'delta_{k}']:+.3f}" for k in sts)
            for t, v in doc["headline"][name].items()
        )
        head.append(
            f"{name}: clean κ {' / '.join(f3(ds['clean']['stacked'][k]) for k in sts)} "
            f"({' / '.join(sts)}; call {' / '.join(ds['clean']['calls'].values())}); Δκ at {rate:g} noise: {row}"
        )
    if brief:
        return ["Noisy calibration labels (Δκ vs the clean-label fit, " + " / ".join(sts) + ")", *head]
    out = [
        "## Noisy calibration labels (beyond the paper)",
        "",
        "TRIVIA+'s four label-noise types (seed 002) injected into the calibration labels (or its own noisy "
        "columns when present; `src/studies/noise.py` defines each). *Train*: every stacker and the CV-best single are "
        "cross-fitted on noisy labels and scored on clean gold; Δκ is paired against the clean-label fit "
        "(cluster bootstrap, noise draws averaged). *Measure*: the clean-trained panel scored against noisy "
        "labels (TRIVIA+ Table 5's question), and the admissibility test estimated from them.",
        "",
        *[f"* {h}" for h in head],
        "",
    ]
    for name, ds in parts.items():
        sts = list(ds["clean"]["stacked"])
        judge = ds["ws_judge"]
        out += [
            f"### {name}",
            "",
            f"WS labels from `{judge['name']}` (error rate {judge['error_rate']:.3f}"
            + ("; **a panel member, so its label errors are its own vote errors**" if judge["member"] else "")
            + f"). Clean labels: admissible {ds['clean']['admissible']}, CV-best `{ds['clean']['selected']}`.",
            "",
        ]
        rows = []
        for p in ds["points"]:
            tr, me = p["train"], p["measure"]
            rows.append(
                [
                    p["type"].upper(),
                    p["rate"] if p["rate"] == "native" else f"{p['rate']:g}",
                    f3(p["realised_rate"]),
                    *[f"{f3(tr[k]['kappa'])} ({delta_cell(tr[k]['delta_vs_clean'], ci=True)})" for k in sts],
                    f3(tr["best_cv"]["kappa"]),
                    " / ".join(pct(tr["call_same"][k], 0) for k in sts),
                    pct(tr["selected_same"], 0),
                    f3(me["bias"][sts[0]], signed=True),
                    pct(me["call_same"], 0),
                    pct(me["admissible_same"], 0),
                ]
            )
        out += [
            table(
                [
                    "type",
                    "rate",
                    "realised",
                    *[f"κ {k} (Δκ vs clean)" for k in sts],
                    "κ CV-best",
                    f"call kept % ({' / '.join(sts)})",
                    "selection kept %",
                    "measured κ bias",
                    "measured call kept %",
                    "admissibility kept %",
                ],
                rows,
            ),
            "",
        ]
    return out
