"""The candidate side's signs of an injection that no rule of :mod:`src.core.detector` reads (beyond the paper): a
switch of language within the text (:func:`language_switch`) and odd tokens (:func:`odd_tokens`: repeated words,
punctuation runs, glued symbols, runs of praise — the marks of optimised adversarial suffixes). Pure functions.
"""

from __future__ import annotations

import re
import unicodedata

# words that mark a sentence as written in a language (frequent, and not English words), and the scripts beside Latin
_STOPWORDS = {
    "fr": "les des est une pour que qui dans cette sont avec pas sur aux mais ces ses leur été être très",
    "de": "der das und ist nicht ein eine mit dem von für auf sich auch wird sind nur bitte oder wie",
    "es": "los las que es una por para del como su está son pero muy esta este sí también",
    "it": "il che di è una non sono del della gli nel alla questa questo anche come più",
    "pt": "os que é um uma para não em está são mas seu sua pelo pela este esta também",
    "nl": "het een en van dat niet met op voor zijn dit ook wordt aan bij deze naar",
    "pl": "na nie się jest że jak ta ten oraz są przez dla tak",
    "tr": "ve bir bu için ile çok daha olarak değil gibi sadece ama",
    "id": "yang dan di ini itu dengan untuk tidak dari dalam akan adalah juga",
    "sv": "och att det som är på för med inte av till den har",
}


_STOP_SETS = {k: frozenset(v.split()) for k, v in _STOPWORDS.items()}


_EN_STOP = frozenset(
    "the and of to is in that it for was on are with as this be by at from or an not have has but which their they".split()
)


_SCRIPTS = {
    "cjk": ("\u3040", "\u30ff"),
    "han": ("\u4e00", "\u9fff"),
    "hangul": ("\uac00", "\ud7af"),
    "cyrillic": ("\u0400", "\u04ff"),
    "arabic": ("\u0600", "\u06ff"),
    "hebrew": ("\u0590", "\u05ff"),
    "devanagari": ("\u0900", "\u097f"),
    "bengali": ("\u0980", "\u09ff"),
    "thai": ("\u0e00", "\u0e7f"),
}


_SENTENCE = re.compile(r"[^.!?。！？\n]+")


def _language(sentence: str) -> str | None:
    """The language (or script) a sentence is written in: ``en``, another language of :data:`_STOPWORDS`, a script
    of :data:`_SCRIPTS`; None when too short to tell."""
    letters = [c for c in sentence if c.isalpha()]
    for name, (lo, hi) in _SCRIPTS.items():
        n = sum(lo <= c <= hi for c in letters)
        if n >= 4 and n >= 0.5 * len(letters):
            return name
    words = re.findall(r"[^\W\d_]+", sentence.lower())
    if len(words) < 3:
        return None
    en = sum(w in _EN_STOP for w in words)
    best, hits = max(((k, sum(w in v for w in words)) for k, v in _STOP_SETS.items()), key=lambda kv: kv[1])
    if hits >= 2 and hits > en:
        return best
    return "en" if en >= 2 else None


def language_switch(text: str) -> bool:
    """English text with a sentence in another language or script (an instruction in a language the rules do not
    read, appended to an English candidate or passage)."""
    langs = {_language(s) for s in _SENTENCE.findall(text)} - {None}
    return "en" in langs and len(langs) > 1


_REPEATED = re.compile(r"\b([^\W\d_]{2,})(?:\W{1,3}\1\b){3,}", re.I)


_PUNCT_RUN = re.compile(r"([!?✓✔✅☑★~^])\1{3,}")


_GLUED = re.compile(r"[^\W\d_](?:([\]}~$=!])\1)|([\[{~$=])\2[^\W\d_]")


_MARKUP = re.compile(r"\\[A-Za-z]+|\$[^$\n]+\$|<[a-z][^>]*>")  # LaTeX, inline maths, HTML: braces and $ honestly


_PRAISE = (
    r"(?:accurate|reliable|grounded|verified|validated|truthful|factual|faithful|correct|perfect|excellent|exceptional|"
    r"outstanding|exemplary|impeccable|flawless|superb|spotless|supported|entailed|consistent|trustworthy|precise|"
    r"immaculate|brilliant|stellar|superlative|valid|credible|authentic|approved|[a-z]+-(?:aligned|perfect|verified|"
    r"validated|checked|grounded|backed|supported|approved|consistent|accurate))(?:ly)?"
)


_PRAISE_RUN = re.compile(r"\b" + _PRAISE + r"(?:[\s,;]+" + _PRAISE + r"){2,}\b", re.I)


def odd_tokens(text: str) -> bool:
    """Tokens no writer of an answer leaves in it (the shape of optimised adversarial suffixes): styled
    (mathematical) letters, a word repeated four times over, a run of the same mark, words glued to doubled
    brackets or symbols (outside LaTeX, maths and HTML), a string of praise words with nothing between."""
    if sum("\U0001d400" <= c <= "\U0001d7ff" for c in text) >= 3:
        return True
    plain = unicodedata.normalize("NFKC", text)
    return bool(
        _REPEATED.search(plain)
        or _PUNCT_RUN.search(plain)
        or (len(_GLUED.findall(plain)) >= 2 and not _MARKUP.search(plain))
        or _PRAISE_RUN.search(plain)
    )
