"""One interface for every judge backend.

A backend is built from its config node through the allow-list ``src.judges.config.BACKENDS`` and must NOT load
its model in ``__init__``: ``identity()`` is computed from the config alone (model sha256 or hub revision, scoring
mode, decoding settings), so reading the verdict cache never touches weights.  ``score(frame, items)``
loads lazily and returns one verdict record per item, in order.

A verdict record holds: ``vote`` (1 hallucinated, 0 supported, None abstained), ``p_hal``, ``logodds``,
``mass``, ``abstain`` (None or a reason), ``truncated`` (bool), ``n_prompt_tokens``, ``seconds`` and, for
free generation, ``answer`` (the generated text).
"""

from __future__ import annotations

import time
import time as _t
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from src.judges.frames import Frame
from src.judges.scoring import word_variants

TEMPLATES = {
    # The chat templates the cheap panel needs; `{user}` splits the template into head and tail.
    "chatml": "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n",
    # Base models (no chat template): end the prompt with a cue so the next token is the verdict.
    "plain": "{system}\n\n{user}\nAnswer:",
    "llama3": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n{user}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ),
    "gemma": "<start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n<start_of_turn>model\n",
}


def split_template(template: str, system: str) -> tuple[str, str]:
    name = template if template in TEMPLATES else None
    t = TEMPLATES[name] if name else template
    if "{user}" not in t:
        raise ValueError("a prompt template must contain {user}")
    head, tail = t.split("{user}", 1)
    return head.replace("{system}", system), tail.replace("{system}", system)


class Backend:
    """Base class: subclasses implement ``_identity_extra`` and ``_score``."""

    kind = "base"
    mode = "constrained"  # or "generate"
    reads_instructions = True  # a language model: text in the item can address it (src.core.injection)

    def __init__(self, mass_floor: float = 0.1, mode: str = "constrained"):
        self.mass_floor = float(mass_floor)
        self.mode = mode
        self.timings: list[float] = []

    # identity ----------------------------------------------------------------------------------
    def identity(self) -> dict:
        d = {"backend": self.kind, "mode": self.mode, "mass_floor": self.mass_floor}
        d.update(self._identity_extra())
        return d

    def _identity_extra(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    # scoring -----------------------------------------------------------------------------------
    def score(self, frame: Frame, items: Sequence[Mapping[str, Any]]) -> list[dict]:
        t0 = time.perf_counter()
        out = self._score(frame, items)
        if len(out) != len(items):
            raise RuntimeError(f"{self.kind}: {len(out)} records for {len(items)} items")
        dt = time.perf_counter() - t0
        self.timings.append(dt)
        return out

    def score_iter(self, frame: Frame, items: Sequence[Mapping[str, Any]]) -> Iterable[dict]:
        """Yield records one by one, so the runner caches each as soon as it exists (batching backends
        override this)."""
        for it in items:
            yield self.score_one(frame, it)

    def _score(self, frame: Frame, items: Sequence[Mapping[str, Any]]) -> list[dict]:
        return list(self.score_iter(frame, items))

    def score_one(self, frame: Frame, item: Mapping[str, Any]) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        pass


def verdict_token_ids(frame: Frame, encode, decode) -> tuple[list[int], list[int]]:
    """First-token ids of every casing / leading-space variant of the frame's verdict words.

    A first token counts only when its text is a prefix of its own word and of no word of the other class;
    an id claimed by both classes is dropped.  ``encode(text) -> ids`` adds no special tokens.
    """

    def ids(words: list[str], other: list[str]) -> set[int]:
        others = [o.strip().lower() for o in word_variants(other)]
        out = set()
        for v in word_variants(words):
            toks = encode(v)
            if not toks:
                continue
            piece = decode(toks[0]).strip().lower()
            if piece and v.strip().lower().startswith(piece) and not any(o.startswith(piece) for o in others):
                out.add(int(toks[0]))
        return out

    sup = ids(frame.supported_words, frame.hallucinated_words)
    hal = ids(frame.hallucinated_words, frame.supported_words)
    both = sup & hal
    s, h = sorted(sup - both), sorted(hal - both)
    if not s or not h:
        raise RuntimeError(f"no verdict tokens for frame {frame.name}: supported {s}, hallucinated {h}")
    return s, h


def abstention(reason: str, t0: float, **extra: Any) -> dict:
    """A verdict record for an item the judge could not score (counted, never NaN or random)."""

    rec = {
        "vote": None,
        "p_hal": None,
        "logodds": None,
        "mass": None,
        "abstain": reason,
        "truncated": False,
        "n_prompt_tokens": None,
    }
    rec.update(extra)
    rec["seconds"] = _t.perf_counter() - t0
    return rec
