"""Cost model (Table 2 cost columns, Appendix H; §4).

* a panel member costs ``price_per_gpu_hour / (items per second · 3600) · 1000`` USD per 1k items, its
  throughput measured (mean ``seconds`` per verdict in the verdict cache) or configured;
* the frontier judge costs ``(input tokens · input price + output tokens · output price) / 10⁶ · 1000`` per
  1k items, token counts measured (``n_prompt_tokens`` in its cache records) or configured;
* calibration costs ``records · labels per record · price per label`` once (the paper: $1 a label, two labels
  per record on the paired sets, 50–100 records → $100–$200);
* the cheaper inference pays the calibration back after ``one-time cost / (frontier − panel per item)``
  evaluated items (the paper: ~40k–81k).

``conf/suite/default.yaml`` (``cost``) carries the paper's inputs; :func:`paper` reproduces its $0.039 per 1k
for the ten members against $2.52 for Sonnet (1.55%, a sixty-fourth).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from src.io.suite_settings import CostSettings, settings_of
from src.judges.cache import iter_records


def member_per_1k(price_per_hour: float, items_per_second: float) -> float:
    """USD per 1,000 items for one member on hardware billed at ``price_per_hour``."""
    return float(price_per_hour) / (float(items_per_second) * 3600.0) * 1000.0


def frontier_per_1k(tokens_in: float, tokens_out: float, price_in_per_mtok: float, price_out_per_mtok: float) -> float:
    """USD per 1,000 items for an API judge priced per million input/output tokens."""
    return 1000.0 * (tokens_in * price_in_per_mtok + tokens_out * price_out_per_mtok) / 1e6


def labelling_cost(records: float, labels_per_record: float, price_per_label: float) -> float:
    return float(records) * float(labels_per_record) * float(price_per_label)


def break_even(one_time: float, panel_1k: float, frontier_1k: float) -> float | None:
    """Evaluated items after which the panel's cheaper inference has paid for its calibration."""
    saving = (frontier_1k - panel_1k) / 1000.0
    return float(one_time / saving) if saving > 0 else None


def settings(cfg: CostSettings | Mapping) -> CostSettings:
    """The cost model's settings (``suite.cost``), checked (:mod:`src.io.suite_settings`)."""
    return settings_of(CostSettings, cfg, "suite.cost")


def _frontier(cfg: CostSettings, measured_tokens: float | None = None) -> dict:
    f = cfg.frontier
    tin = measured_tokens if measured_tokens is not None else float(f.tokens_per_item.input)
    tout = float(f.tokens_per_item.output)
    pin, pout = float(f.price_per_mtok.input), float(f.price_per_mtok.output)
    return {
        "tokens_in": tin,
        "tokens_out": tout,
        "tokens_source": "measured" if measured_tokens else "config",
        "price_per_mtok": {"input": pin, "output": pout},
        "per_1k": frontier_per_1k(tin, tout, pin, pout),
    }


def _calibration(cfg: CostSettings, panel_1k: float, front_1k: float, labels_per_record: float) -> dict:
    price = float(cfg.labelling.price_per_label)
    out = {}
    for r in cfg.labelling.records:
        one = labelling_cost(r, labels_per_record, price)
        out[str(r)] = {"cost": one, "break_even_items": break_even(one, panel_1k, front_1k)}
    return {"price_per_label": price, "labels_per_record": float(labels_per_record), "records": out}


def compute(
    cfg: CostSettings | Mapping,
    members: list[str],
    labels_per_record: Mapping[str, float] | None = None,
    measured: Mapping[str, Mapping] | None = None,
    frontier_name: str | None = None,
) -> dict:
    """The cost block of suite.json for a panel of ``members``.

    ``measured``: per judge name, ``seconds_per_item`` and/or ``prompt_tokens_per_item`` (e.g. from
    :func:`measured_from_cache`); used when ``cfg.use_measured``. ``labels_per_record``: per dataset (its mean
    cluster size), used when ``cfg.labelling.labels_per_record`` is null.
    """
    cfg = settings(cfg)
    price = float(cfg.price_per_gpu_hour)
    thr = dict(cfg.throughput)
    use = cfg.use_measured and measured
    per_member = {}
    for m in members:
        sec = (measured or {}).get(m, {}).get("seconds_per_item") if use else None
        if sec:
            ips, src = 1.0 / float(sec), "measured"
        else:
            ips, src = float(thr.get(m, thr["default"])), "config"
        per_member[m] = {"items_per_second": ips, "source": src, "per_1k": member_per_1k(price, ips)}
    panel = float(sum(v["per_1k"] for v in per_member.values()))
    tok = (measured or {}).get(frontier_name or "", {}).get("prompt_tokens_per_item") if use else None
    front = _frontier(cfg, tok)
    lpr_cfg = cfg.labelling.labels_per_record
    if lpr_cfg is not None:  # one labelling rate for every dataset
        calib = {"all": _calibration(cfg, panel, front["per_1k"], float(lpr_cfg))}
    else:  # each dataset's own records: its mean items per cluster
        calib = {
            ds: _calibration(cfg, panel, front["per_1k"], float(lpr)) for ds, lpr in (labels_per_record or {}).items()
        }
    return {
        "price_per_gpu_hour": price,
        "members": per_member,
        "panel_per_1k": panel,
        "frontier": front,
        "ratio": front["per_1k"] / panel if panel > 0 else None,
        "panel_share_of_frontier": panel / front["per_1k"] if front["per_1k"] > 0 else None,
        "calibration": calib,
    }


def paper(cfg: CostSettings | Mapping) -> dict:
    """The paper's own inputs: ``paper_panel_size`` members at the default throughput (Table 2, App. H)."""
    cfg = settings(cfg)
    k = cfg.paper_panel_size
    members = [f"member{i}" for i in range(k)]
    out = compute(dataclasses.replace(cfg, use_measured=False), members)
    out["members"] = {"each": next(iter(out["members"].values())), "count": k}
    return out


def measured_from_cache(cache_dir: str | Path, names: list[str]) -> dict[str, dict]:
    """Mean seconds per verdict and prompt tokens per item of each judge, read off its verdict-cache records
    (``<cache_dir>/<dataset>/<name>/*.jsonl``, every dataset's); judges without records are absent."""

    out = {}
    for name in names:
        files = sorted(Path(cache_dir).glob(f"*/{name}/*.jsonl"))
        secs, toks = [], []
        for rec in iter_records(files):
            if rec.get("seconds") is not None:
                secs.append(float(rec["seconds"]))
            if rec.get("n_prompt_tokens") is not None:
                toks.append(float(rec["n_prompt_tokens"]))
        if secs or toks:
            out[name] = {
                "seconds_per_item": float(np.mean(secs)) if secs else None,
                "prompt_tokens_per_item": float(np.mean(toks)) if toks else None,
                "records": max(len(secs), len(toks)),
            }
    return out
