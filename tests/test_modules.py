"""RAIM's import graph (src.io.modules): the one reading that DVC's stage dependencies and a logged model's code
both come from."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from src.io import modules
from src.io.paths import PACKAGE_DIR


def _tree_imports(path: Path) -> set[str]:
    """What a syntax tree says a file imports (absolute names, relative ones resolved), RAIM's modules only."""
    package = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    prefixes = {".".join(n.split(".")[:i]) for n in out for i in range(1, n.count(".") + 2)}
    return {n for n in prefixes if modules.module_file(n) is not None}


@pytest.mark.parametrize("path", sorted(PACKAGE_DIR.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_reading_import_lines_finds_every_import_a_syntax_tree_finds(path):
    """Imports are read as text (a syntax tree of every file cost ~0.4 s a logged model): that reading must miss
    nothing the tree holds, in every file of the package."""
    assert _tree_imports(path) <= modules.imports_of(path)


def test_the_closure_follows_relative_imports_imports_in_functions_and_the_packages_above(tmp_path, monkeypatch):
    pkg = tmp_path / "src"
    files = {
        "__init__.py": "",
        "app/__init__.py": "",
        "app/__main__.py": "import json\n\n\ndef main():\n    from .parts import thing  # only when called\n",
        "app/parts.py": "from src.lib import (\n    deep,  # a module\n    helper,\n)\n",
        "lib/__init__.py": "def helper():\n    pass\n",
        "lib/deep.py": "from .. import app\n",
        "unused.py": "",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    monkeypatch.setattr(modules, "PACKAGE_DIR", pkg)
    modules._closure.cache_clear()
    try:
        got = [str(p.relative_to(pkg)) for p in modules.closure(["src.app.__main__"])]
    finally:
        modules._closure.cache_clear()
    assert got == sorted(set(files) - {"unused.py"})


def test_a_stage_run_with_dash_m_depends_on_its_packages_init():
    """``python -m src.analyses`` imports src/analyses/__init__.py before __main__: an edit to it must rerun the
    stage."""
    assert PACKAGE_DIR / "analyses" / "__init__.py" in modules.closure(["src.analyses.__main__"])
