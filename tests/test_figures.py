"""The measured figures the pages quote agree with their one place, ``docs/figures.yaml``.

Each figure there has its values, the command that measured them and the quotes the pages use (``{name}`` for a
value). A quote's words are searched for in every page (README, docs, their line breaks ignored) with anything
in place of the values: a page whose quote carries other values (a stale figure), or a page named under
``pages`` that does not quote it, fails. ``python tests/test_figures.py --write`` rewrites the pages' quotes
from the file after a figure was measured again.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures.yaml"
FIELD = re.compile(r"\{(\w+)\}")


def figures() -> dict:
    return yaml.safe_load(FIGURES.read_text(encoding="utf-8"))


def pages() -> list[Path]:
    """The pages figures may be quoted in: the README and the documentation (not the changelog: history)."""
    docs = (ROOT / "docs").rglob("*.md")
    return [ROOT / "README.md", *sorted(p for p in docs if p.name != "changelog.md")]


def shape(text: str) -> re.Pattern:
    """A quote's words with any value in each ``{name}`` (words split across lines match too)."""
    parts = FIELD.split(text)  # words, name, words, name, …
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(rf"(?P<{part}>[^\s;|()\[\]](?:[^;|()\[\]\n]|\n(?!\n))*?)")
        else:
            out.append(r"\s+".join(re.escape(w) for w in part.split(" ")))
    return re.compile("".join(out))


def quotes_in(text: str, quote: str) -> list[re.Match]:
    return list(shape(quote).finditer(text))


def disagreements() -> list[str]:
    """Every page quote of a figure with other values than the file's, and every missing quote."""
    bad = []
    texts = {p: p.read_text(encoding="utf-8") for p in pages()}
    for name, fig in figures().items():
        values = {k: str(v) for k, v in fig["values"].items()}
        for q in fig["quotes"]:
            for page, text in texts.items():
                found = quotes_in(text, q["text"])
                where = page.relative_to(ROOT).as_posix()
                for m in found:
                    got = {k: " ".join(v.split()) for k, v in m.groupdict().items()}
                    if got != {k: values[k] for k in got}:
                        bad.append(f"{where}: {name} quoted as {got}, docs/figures.yaml has {values}")
                if where in q["pages"] and not found:
                    bad.append(f"{where}: does not quote {name} as {q['text']!r}")
    return bad


def write() -> list[Path]:
    """Rewrite every page's quotes from docs/figures.yaml; the pages it changed."""
    changed = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = text
        for fig in figures().values():
            values = {k: str(v) for k, v in fig["values"].items()}
            for q in fig["quotes"]:
                new = shape(q["text"]).sub(lambda m, v=values: _filled(m, v), new)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def _filled(m: re.Match, values: dict) -> str:
    """The match with each value group replaced (the quote's own words and line breaks kept)."""
    out, at = [], m.start()
    for name in m.re.groupindex:
        out += [m.string[at : m.start(name)], values[name]]
        at = m.end(name)
    return "".join([*out, m.string[at : m.end()]])


def test_the_pages_quote_each_measured_figure_as_its_one_place_has_it():
    assert disagreements() == []


def test_every_figure_says_how_it_was_measured():
    for name, fig in figures().items():
        assert {"what", "command", "measured", "values", "quotes"} <= set(fig), name
        for q in fig["quotes"]:
            assert set(FIELD.findall(q["text"])) <= set(fig["values"]) and q["pages"], (name, q)
            assert not q["text"].endswith("}"), f"{name}: a quote ends with words, so that its last value ends"


def test_a_stale_quote_is_found_and_rewritten(tmp_path, monkeypatch):
    """A page quoting an older count (split across lines, as a paragraph wraps) fails, and --write mends it."""
    readme = tmp_path / "README.md"
    readme.write_text("loop (the edit-test loop: 953 tests,\n2 m 53 s here; no weights)\n", encoding="utf-8")
    fig = tmp_path / "figures.yaml"
    fig.write_text(
        "fast_tests: {what: w, command: c, measured: m, values: {count: '1,063', time: 3 m 50 s}, quotes: "
        "[{text: 'the edit-test loop: {count} tests, {time} here', pages: [README.md]}]}\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "FIGURES", fig)
    monkeypatch.setattr(sys.modules[__name__], "pages", lambda: [readme])
    assert disagreements() == [
        "README.md: fast_tests quoted as {'count': '953', 'time': '2 m 53 s'}, docs/figures.yaml has "
        "{'count': '1,063', 'time': '3 m 50 s'}"
    ]
    assert write() == [readme] and disagreements() == []
    assert readme.read_text(encoding="utf-8") == "loop (the edit-test loop: 1,063 tests,\n3 m 50 s here; no weights)\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_figures.py --write   (rewrites the pages' quotes from docs/figures.yaml)")
    for path in write():
        print(f"rewrote {path.relative_to(ROOT)}")
    for line in disagreements():
        print(f"still: {line}")
