"""RAIM's configuration (``conf/``, composed by Hydra): one option of a group read by name, the option a set of
values matches, and ``params.yaml`` — the composition DVC's stages read — regenerated from ``conf/``."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from src.core.errors import ArgumentParser, one_line
from src.io.paths import CONF_DIR, ROOT


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """Dotted keys → string values (lists as JSON), as MLflow params."""
    out: dict[str, str] = {}
    if isinstance(data, Mapping):
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
        if not data and prefix:
            out[prefix[:-1]] = "{}"
        return out
    value = json.dumps(data, default=str) if isinstance(data, (list, tuple)) else str(data)
    out[prefix[:-1]] = value[:6000]
    return out


def group_option(group: str, name: str) -> DictConfig:
    """Load one option of a config group by name (e.g. a dataset's frame when ``frame=auto``)."""
    path = CONF_DIR / group / f"{name}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no config {group}/{name}.yaml under {CONF_DIR}")
    return OmegaConf.load(path)


def composed_option(group: str, name: str) -> DictConfig:
    """conf/<group>/<name>.yaml with its defaults list (other options of the group) merged first, as Hydra does."""
    node = group_option(group, name)
    defaults = list(node.pop("defaults", None) or []) or ["_self_"]
    if "_self_" not in defaults:
        defaults.append("_self_")
    merged = OmegaConf.create()
    for d in defaults:
        merged = OmegaConf.merge(merged, node if d == "_self_" else composed_option(group, d))
    return merged


@functools.cache
def _option(group: str, name: str) -> tuple[tuple[str, str], ...]:
    """:func:`composed_option`, flattened."""
    return tuple(sorted(flatten(OmegaConf.to_container(composed_option(group, name), resolve=False)).items()))


def option_name(group: str, values: Mapping) -> str | None:
    """The conf/<group> option whose composed values ``values`` hold (``logreg``), else the nearest one with the
    values that differ (``logreg (C=0.1)``); None when the group has no options. Read off the values, so the
    same under ``python -m src.run`` and the DVC stage (params.yaml has no Hydra group choices)."""
    flat = flatten(values)
    diffs = {}
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        opt = dict(_option(group, path.stem))
        diffs[path.stem] = [k for k in sorted(set(flat) | set(opt)) if flat.get(k) != opt.get(k)]
    if not diffs:
        return None
    best = min(diffs, key=lambda n: len(diffs[n]))
    changed = ", ".join(f"{k}={flat.get(k, 'unset')}" for k in diffs[best])
    return f"{best} ({changed})" if changed else best


ENV_DEPENDENT = ("MLFLOW_TRACKING_URI", "RAIM_RAW_DIR")  # conf/ interpolations whose env values must not be baked


def write_params(path: str | Path = ROOT / "params.yaml", overrides: Iterable[str] = ()) -> Path:
    """Regenerate params.yaml from conf/ exactly as `dvc exp run` does (DVC's Hydra composition), with the
    environment variables of :data:`ENV_DEPENDENT` unset so that no machine-specific value is committed."""
    from dvc.utils.hydra import compose_and_dump  # imported here, not at start-up: dvc ~0.14 s

    saved = {k: os.environ.pop(k) for k in ENV_DEPENDENT if k in os.environ}
    try:
        compose_and_dump(path, str(CONF_DIR), None, "config", "", list(overrides))
    finally:
        os.environ.update(saved)
    return Path(path)


@one_line
def params_main(argv: list[str] | None = None) -> int:
    """``python -m src.track params [override …]``: regenerate params.yaml from conf/."""
    ap = ArgumentParser(prog="python -m src.track")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("params", help="regenerate params.yaml from conf/ (as `dvc exp run` does)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. stacker.C=0.5")
    p.add_argument("--out", default=str(ROOT / "params.yaml"))
    a = ap.parse_args(argv)
    print(f"wrote {write_params(a.out, a.overrides)}")
    return 0
