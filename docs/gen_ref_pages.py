"""Generate the API reference pages at build time (mkdocs-gen-files + literate-nav).

Walks the ``src`` package, writes one virtual page ``reference/<module path>.md`` per module holding a
mkdocstrings ``::: module`` directive, and a ``reference/SUMMARY.md`` navigation for literate-nav. Entry
points' ``__main__`` modules are skipped. Nothing is written into ``docs/``: the pages exist only inside the
build, so the reference follows the code wherever modules move.
"""

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src"

nav = mkdocs_gen_files.Nav()

for path in sorted(PACKAGE.rglob("*.py")):
    module_path = path.relative_to(ROOT).with_suffix("")
    doc_path = path.relative_to(ROOT).with_suffix(".md")
    parts = tuple(module_path.parts)
    if "__pycache__" in parts or parts[-1] == "__main__":
        continue
    if parts[-1] == "__init__":
        parts = parts[:-1]
        doc_path = doc_path.with_name("index.md")
    full_doc_path = Path("reference", doc_path)
    nav[parts] = doc_path.as_posix()
    with mkdocs_gen_files.open(full_doc_path, "w") as fd:
        fd.write(f"::: {'.'.join(parts)}\n")
    mkdocs_gen_files.set_edit_path(full_doc_path, path.relative_to(ROOT))

with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as nav_file:
    nav_file.writelines(nav.build_literate_nav())
