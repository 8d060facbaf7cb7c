"""Turning a judge's next-token distribution (or its free text) into a verdict record.

Constrained scoring (the default): in one forward pass, sum the next-token probabilities of every casing and
leading-space variant of the verdict words.  The record holds the vote (1 hallucinated / 0 supported),
p(hallucinated) renormalised over the verdict words, the log-odds log p(hal)/p(sup), and the mass (the
probability the model put on any verdict word).  Mass below the configured floor is an abstention.

Free generation: the verdict is parsed from the model's *answer* only (the generated continuation, never the
prompt); unparseable answers are abstentions with a reason.  Abstentions are counted, never NaN, never random.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

ABSTAIN_LOW_MASS = "low_mass"
ABSTAIN_UNPARSEABLE = "unparseable"
ABSTAIN_NO_INPUT = "no_input"
ABSTAIN_ERROR = "error"


def word_variants(words: Iterable[str]) -> list[str]:
    """Every casing and leading-space variant of the verdict words (order-preserving, deduplicated)."""
    out: list[str] = []
    for w in words:
        w = w.strip()
        for c in (w, w.lower(), w.upper(), w.capitalize()):
            for v in (c, " " + c):
                if v not in out:
                    out.append(v)
    return out


def verdict_from_probs(p_sup: float, p_hal: float, mass_floor: float) -> dict:
    """A verdict record from the total probability on supported / hallucinated verdict words."""
    mass = p_sup + p_hal
    rec: dict = {"mass": float(mass)}
    tiny = 1e-30
    if mass <= 0.0:
        rec.update(vote=None, p_hal=None, logodds=None, abstain=ABSTAIN_LOW_MASS)
        return rec
    rec["p_hal"] = float(p_hal / mass)
    rec["logodds"] = float(math.log(max(p_hal, tiny)) - math.log(max(p_sup, tiny)))
    if mass < mass_floor:
        rec.update(vote=None, abstain=ABSTAIN_LOW_MASS)
    else:
        rec.update(vote=int(p_hal > p_sup), abstain=None)
    return rec


def verdict_from_token_logprobs(
    logprobs: Mapping[str, float], sup_words: Iterable[str], hal_words: Iterable[str], mass_floor: float
) -> dict:
    """Score from a {token_text: logprob} map (top-k from an API, or the full vocabulary).

    A token counts for a class when its text is one of the class's variants; tokens absent from the map
    (outside an API's top-k) contribute 0, which is conservative for the mass.
    """
    sup = set(word_variants(sup_words))
    hal = set(word_variants(hal_words))
    p_sup = sum(math.exp(lp) for t, lp in logprobs.items() if t in sup)
    p_hal = sum(math.exp(lp) for t, lp in logprobs.items() if t in hal)
    return verdict_from_probs(p_sup, p_hal, mass_floor)


def parse_free_text(text: str, sup_words: Iterable[str], hal_words: Iterable[str]) -> dict:
    """Parse a generated answer.  The first verdict word (whole word, case-insensitive) decides;
    an answer naming neither class is an abstention."""
    sup = [w.strip().lower() for w in sup_words]
    hal = [w.strip().lower() for w in hal_words]
    words = sorted(set(sup + hal), key=len, reverse=True)
    if not text or not words:
        return {"vote": None, "p_hal": None, "logodds": None, "mass": None, "abstain": ABSTAIN_UNPARSEABLE}
    pat = re.compile(r"\b(" + "|".join(re.escape(w) for w in words) + r")\b", re.IGNORECASE)
    m = pat.search(text)
    if m is None:
        return {"vote": None, "p_hal": None, "logodds": None, "mass": None, "abstain": ABSTAIN_UNPARSEABLE}
    w = m.group(1).lower()
    vote = 1 if w in hal else 0
    return {"vote": vote, "p_hal": float(vote), "logodds": None, "mass": None, "abstain": None}
