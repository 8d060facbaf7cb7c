"""An installed RAIM has a ``raim-<x>`` console script for every ``python -m src.<x>`` command, calling the same
``main`` (``pyproject.toml``'s ``[project.scripts]``); the commands are found from the source, so a new one is
held to it too. The wheel's own entry points are checked in ``tests/test_install.py``."""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALIASES = {"raim-suite": "raim-analyses", "raim-params": "raim-track"}  # older names, kept for installed users


def _runs_main(path: Path) -> bool:
    """Whether the file's ``if __name__ == "__main__":`` block calls ``main``."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return any(
                isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "main"
                for stmt in node.body
                for c in ast.walk(stmt)
            )
    return False


def entry_modules() -> dict[str, str]:
    """``x`` → the module ``python -m src.<x>`` runs, for every command of the package."""
    out = {p.stem: f"src.{p.stem}" for p in (ROOT / "src").glob("*.py") if "__main__" in p.read_text(encoding="utf-8")}
    out |= {p.parent.name: f"src.{p.parent.name}.__main__" for p in (ROOT / "src").glob("*/__main__.py")}
    return out


def scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]


def test_every_command_has_its_console_script_calling_the_same_main():
    entries = entry_modules()
    assert {"run", "rate", "injection", "judges", "analyses", "predict", "serve"} <= set(entries)
    for x, module in entries.items():
        assert _runs_main(ROOT / (module.replace(".", "/") + ".py")), f"python -m src.{x} does not call main()"
        assert scripts().get(f"raim-{x}") == f"{module}:main", f"python -m src.{x} has no raim-{x} = {module}:main"


def test_every_console_script_is_a_command_and_its_main_imports():
    entries = entry_modules()
    for script, target in scripts().items():
        name = ALIASES.get(script, script).removeprefix("raim-")
        assert name in entries and target == f"{entries[name]}:main", f"{script} = {target} is no python -m src.<x>"
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func))


def test_the_readme_promises_the_scripts_it_has():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`raim-<x>` for every `python -m src.<x>`" in readme
