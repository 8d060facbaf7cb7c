"""MkDocs hook: the API reference's navigation file is not a page of the site.

``docs/gen_ref_pages.py`` writes ``reference/SUMMARY.md`` for literate-nav, which reads it in its own ``on_files``
and marks it "not in nav"; MkDocs would still publish it as an orphan ``reference/SUMMARY/`` page. Once
literate-nav has read it, it is excluded from the build.
"""

from mkdocs.plugins import event_priority
from mkdocs.structure.files import Files, InclusionLevel

NAV_FILE = "reference/SUMMARY.md"


@event_priority(-200)  # after literate-nav's on_files (-100), which reads the file
def on_files(files: Files, config) -> Files:
    """Exclude :data:`NAV_FILE` from the pages MkDocs builds."""
    nav = files.get_file_from_path(NAV_FILE)
    if nav is not None:
        nav.inclusion = InclusionLevel.EXCLUDED
    return files
