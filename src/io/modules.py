"""RAIM's own modules as files, and the import graph between them: the source files a module needs, directly or
through one another.

Two readers share it: each DVC stage depends on the files its command's module needs (``scripts/dvc_deps.py``
writes them into dvc.yaml), and a logged stacker model ships the files its pickled objects need
(:func:`src.mlops.packaging.code_tree`). Imports are read from each file's ``import`` lines as text, at any depth
(imports inside functions too, so a code path taken only at serving time is there): parsing every file into a
syntax tree cost ~0.4 s a model, and the text reading finds every import a syntax tree does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path

from src.io.paths import PACKAGE_DIR

_IMPORT = re.compile(r"^[ \t]*(?:import[ \t]+([\w.]+)|from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*))", re.M)


def module_file(name: str) -> Path | None:
    """The source file of one of RAIM's modules (``src.core.ladder``; a package: its ``__init__.py``), None for
    any other name."""
    top, *rest = name.split(".")
    if top != PACKAGE_DIR.name:
        return None
    base = PACKAGE_DIR.joinpath(*rest)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _package_of(path: Path) -> list[str]:
    """The package a relative import in ``path`` starts from: ``src/core/x.py`` → ``src.core``."""
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    return parts[:-1]


def _absolute(source: str, path: Path) -> str:
    """``from .x import`` / ``from .. import`` in ``path`` → the absolute module name."""
    level = len(source) - len(source.lstrip("."))
    if not level:
        return source
    package = _package_of(path)
    package = package[: len(package) - level + 1]
    return ".".join(package + ([source[level:]] if source[level:] else []))


def _with_packages(names: Iterable[str]) -> set[str]:
    """Each dotted name with the packages above it: ``src.core.ladder`` → src, src.core, src.core.ladder."""
    return {".".join(parts[:i]) for parts in (n.split(".") for n in names) for i in range(1, len(parts) + 1)}


def imports_of(path: Path) -> set[str]:
    """RAIM's modules that a source file imports anywhere in it, each with the packages above it."""
    found = set()
    for module, source, names in _IMPORT.findall(path.read_text(encoding="utf-8")):
        base = module or _absolute(source, path)
        found.add(base)
        for name in re.findall(r"\w+", names.split("#")[0] if "(" not in names else names):
            found.add(f"{base}.{name}")  # a name may be a module
    return {m for m in _with_packages(found) if module_file(m) is not None}


@functools.cache
def _closure(modules: tuple[str, ...]) -> tuple[Path, ...]:
    files: dict[str, Path] = {}
    todo = list(_with_packages(modules))
    while todo:
        name = todo.pop()
        if name in files or (path := module_file(name)) is None:
            continue
        files[name] = path
        todo.extend(imports_of(path))
    return tuple(sorted(files.values()))


def closure(modules: Iterable[str]) -> list[Path]:
    """The source files ``modules`` need to load and run: their own, those of every module of RAIM they import
    directly or through one another, and the ``__init__`` files of the packages above each (sorted; read once a
    process)."""
    return list(_closure(tuple(sorted(set(modules)))))
