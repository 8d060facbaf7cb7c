"""The README and the documentation site: the README stays a front door, every relative link resolves, the API
reference is generated from the package (not hand-written), and docstrings and pages cite the paper, never an
issue number."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_MAX_LINES = 200

FENCE = re.compile(r"^ {0,8}(```|~~~)")
CODE_SPAN = re.compile(r"(`+).+?\1")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
ISSUE_CITATION = re.compile(r"\bissues?\s*#?\s*\d+", re.IGNORECASE)


def relative_links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every relative Markdown link or image outside code: inline links, reference
    definitions; targets with a scheme (``https:``, ``mailto:``) and same-page anchors are left out, and an
    anchor or query is cut off the target."""
    found, in_fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        line = CODE_SPAN.sub("", line)
        targets = INLINE_LINK.findall(line)
        ref = REFERENCE_DEF.match(line)
        if ref:
            targets.append(ref.group(1))
        for target in targets:
            if SCHEME.match(target) or target.startswith("#"):
                continue
            target = re.split(r"[#?]", target, maxsplit=1)[0]
            if target:
                found.append((number, target))
    return found


def broken_links(page: Path, inside: Path | None = None) -> list[str]:
    """The page's relative links that point at no existing file (or, with ``inside``, outside that folder)."""
    bad = []
    for number, target in relative_links(page.read_text(encoding="utf-8")):
        path = (page.parent / target).resolve()
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not path.exists():
            bad.append(f"{where} (no such file)")
        elif inside is not None and inside.resolve() not in path.parents:
            bad.append(f"{where} (outside {inside.relative_to(ROOT)}/: the site does not publish it)")
    return bad


def doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def issue_citations(paths) -> list[str]:
    hits = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if ISSUE_CITATION.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    return hits


def test_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the manual into docs/"
    )


def test_ci_runs_the_readmes_whole_suite_command():
    """.ci/run calls the test command the README writes for the whole suite (on both cores, the ten slowest tests
    printed at the end), and the getting-started page writes the same one."""
    pattern = re.compile(r"^(python -m pytest [^#]*?)\s+# the whole suite", re.MULTILINE)
    command = pattern.search((ROOT / "README.md").read_text(encoding="utf-8"))
    assert command, "README: no `python -m pytest …  # the whole suite …` line"
    assert pattern.search((DOCS / "getting-started.md").read_text(encoding="utf-8"))[1] == command[1]
    assert "-n 2" in command[1] and "--durations=10" in command[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert any(ln.endswith(".venv/bin/" + command[1]) for ln in ci), command[1]


def test_readme_links_resolve():
    assert broken_links(ROOT / "README.md") == []


def test_docs_links_resolve_inside_the_site():
    assert doc_pages(), "docs/ has no page"
    bad = [b for page in doc_pages() for b in broken_links(page, inside=DOCS)]
    assert bad == []


def test_every_docs_page_is_in_the_nav():
    """mkdocs.yml's nav lists every hand-written page (the API reference's pages come from its SUMMARY)."""
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    listed = set(re.findall(r"([\w/.-]+\.md)\s*$", nav, re.MULTILINE))
    missing = [p.relative_to(DOCS).as_posix() for p in doc_pages() if p.relative_to(DOCS).as_posix() not in listed]
    assert missing == []


def test_link_checker_catches_what_it_must(tmp_path, monkeypatch):
    """Broken and escaping links are found; links in code, absolute URLs and anchors are not links to check."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# there\n")
    (tmp_path / "outside.md").write_text("# outside\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[ok](there.md#a-heading) [web](https://example.org/x.md) [anchor](#top) [mail](mailto:a@b.c)\n"
        "`[in code](missing-in-span.md)`\n"
        "```\n[in a fence](missing-in-fence.md)\n```\n"
        '[gone](missing.md) ![img](img/none.png "title")\n'
        "[ref]: also-missing.md\n"
        "[up](../outside.md)\n"
    )
    bad = broken_links(page, inside=tmp_path / "docs")
    assert [b.split(": ", 1)[1] for b in bad] == [
        "missing.md (no such file)",
        "img/none.png (no such file)",
        "also-missing.md (no such file)",
        "../outside.md (outside docs/: the site does not publish it)",
    ]


def test_reference_pages_follow_the_package(monkeypatch):
    """docs/gen_ref_pages.py writes one ``::: module`` page per module of src/ (an index page per package), none
    for a ``__main__`` entry point, and the literate-nav SUMMARY that lists them."""
    pages: dict[str, str] = {}

    class Buffer:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            pages[self.name] = ""
            return self

        def __exit__(self, *exc):
            return False

        def write(self, text):
            pages[self.name] += text

        def writelines(self, lines):
            pages[self.name] += "".join(lines)

    class Nav(dict):
        def build_literate_nav(self):
            return [f"* [{'.'.join(k)}]({v})\n" for k, v in self.items()]

    stub = types.SimpleNamespace(
        Nav=Nav, open=lambda name, mode="w": Buffer(Path(name).as_posix()), set_edit_path=lambda *a: None
    )
    monkeypatch.setitem(sys.modules, "mkdocs_gen_files", stub)
    runpy.run_path(str(DOCS / "gen_ref_pages.py"))

    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "src").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    expected = {m.removesuffix(".__init__") for m in modules if not m.endswith("__main__")}
    written = {text.removeprefix("::: ").strip() for name, text in pages.items() if name != "reference/SUMMARY.md"}
    assert written == expected
    assert pages["reference/src/index.md"] == "::: src\n"
    assert not any("__main__" in name for name in pages)
    assert pages["reference/SUMMARY.md"].count("\n") == len(expected)


def test_docs_cite_no_issue_numbers():
    """Pages say which paper section a thing follows, never which tracker issue asked for it."""
    assert issue_citations(p for p in DOCS.rglob("*") if p.suffix in {".md", ".py"}) == []


def test_src_cites_no_issue_numbers():
    """Docstrings and comments cite the paper's sections, never an issue number (conf/ comments too)."""
    assert issue_citations((ROOT / "src").rglob("*.py")) == []
    assert issue_citations((ROOT / "conf").rglob("*.yaml")) == []


def test_tests_benchmarks_and_scripts_cite_no_issue_numbers():
    """A test, benchmark or script says what it checks or does, not which tracker issue asked for it."""
    paths = [p for d in ("tests", "bench", "scripts") for p in (ROOT / d).rglob("*") if p.suffix in {".py", ".sh"}]
    assert issue_citations(paths) == []


@pytest.mark.slow
def test_the_site_builds_strict_with_no_orphan_page(tmp_path):
    """``mkdocs build --strict`` (CI builds it after the tests, with the docs extra): a page outside the nav is a
    warning (mkdocs.yml ``validation``), and the API reference's navigation file is not published as a page."""
    pytest.importorskip("mkdocs_gen_files")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (site / "reference" / "src" / "index.html").is_file()
    assert not (site / "reference" / "SUMMARY").exists()


# what a forge clone cannot follow: a machine's absolute paths, notes and locks outside the repository
OUTSIDE = re.compile("|".join([r"/" + "work/", r"shared/" + "notes", r"\bwork" + r"place\b", r"heavy" + r"\.lock"]))
SPOKEN = ("src", "docs", "tests", "bench", "scripts", "conf", "examples", ".ci")


def test_the_project_speaks_of_itself_only():
    """Docstrings (rendered on the site), pages, tests, benchmarks, scripts and configs point only at what a clone
    has; ``../shared/data/raw``, data.dvc's recorded import source, is named as such where it is explained."""
    files = [ROOT / n for n in ("README.md", "dvc.yaml", "mkdocs.yml", "pyproject.toml", "data.dvc")]
    files += [
        p
        for d in SPOKEN
        for p in (ROOT / d).rglob("*")
        if p.is_file() and p.suffix in {".py", ".md", ".yaml", ".sh", ""}
    ]
    bad = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in files
        if "__pycache__" not in p.parts
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert bad == []
