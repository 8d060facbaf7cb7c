"""The ``src/`` files each DVC stage depends on, derived from the import graph of its command's module.

A stage runs ``python -m src.<module>``; it depends on every ``src/`` file that module imports, directly or
through others (:func:`src.io.modules.closure`, the packages above it included: ``-m`` imports them), plus the
modules the composed config names as ``_target_`` (the roster's backends, the stacker, the analysis settings,
Hydra callbacks) — Hydra imports those at run time. ``python scripts/dvc_deps.py``
prints, per stage, what dvc.yaml should list; ``--write`` rewrites dvc.yaml's ``src/`` entries in place;
``tests/test_pipeline.py`` fails when dvc.yaml differs.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from the checkout: the package beside it

from src.io.modules import closure, module_file  # noqa: E402


def targets(node) -> set[str]:
    """Modules named by ``_target_`` values anywhere in a config node."""
    out: set[str] = set()
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "_target_" and isinstance(v, str) and v.startswith("src."):
                out.add(v.rsplit(".", 1)[0])
            else:
                out |= targets(v)
    elif isinstance(node, list):
        for v in node:
            out |= targets(v)
    return out


def stage_modules(cmd: str) -> set[str]:
    return set(re.findall(r"python -m (src(?:\.\w+)*)", cmd))


def derived(spec: dict, params: dict) -> dict[str, list[str]]:
    """Per stage, the sorted ``src/`` files it depends on."""
    roster_targets = targets(params.get("roster", {}))
    every_target = targets(params) | {"src.run", "src.mlops.redact"}  # conf/config.yaml's hydra callbacks
    out = {}
    for name, st in spec["stages"].items():
        body = st.get("do", st)
        mods = stage_modules(body["cmd"])
        entry = {m + ".__main__" if module_file(m + ".__main__") else m for m in mods}
        hydra_app = "--config-name" in body["cmd"]
        extra = (every_target if hydra_app else set()) | (roster_targets if "--roster" in body["cmd"] else set())
        files = closure(entry | extra)
        out[name] = sorted(str(p.relative_to(ROOT)) for p in files)
    return out


def declared(body: dict) -> list[str]:
    return [d for d in body.get("deps", []) if isinstance(d, str) and d.startswith("src/")]


def rewrite(text: str, stage: str, files: list[str]) -> str:
    """dvc.yaml with ``stage``'s ``src/`` deps replaced by ``files`` (kept before the other deps)."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if re.match(rf"^  {re.escape(stage)}:\s*$", line))
    deps = next(i for i in range(start, len(lines)) if re.match(r"^\s+deps:\s*$", lines[i]))
    indent = re.match(r"^(\s*)", lines[deps + 1]).group(1)
    j, kept = deps + 1, []
    while j < len(lines) and lines[j].startswith(indent + "- "):
        if not lines[j][len(indent) + 2 :].startswith("src/"):
            kept.append(lines[j])
        j += 1
    new = [f"{indent}- {f}\n" for f in files] + kept
    return "".join(lines[: deps + 1] + new + lines[j:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/dvc_deps.py", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite dvc.yaml's src/ deps")
    a = ap.parse_args(argv)
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    want = derived(spec, params)
    text = (ROOT / "dvc.yaml").read_text()
    for stage, files in want.items():
        if a.write:
            text = rewrite(text, stage, files)
        else:
            print(stage, *files, sep="\n  ")
    if a.write:
        (ROOT / "dvc.yaml").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
