"""llama.cpp (``llama-cpp-python``, GGUF): the default CPU backend.

Constrained scoring reads the next-token logits of the last prompt position in one forward pass
(``llama_get_logits_ith(ctx, -1)``: with ``logits_all=False`` ``Llama.scores`` stays zero) and compares the
probabilities of every casing / leading-space variant of the verdict words.

Prefix reuse: the prompt is tokenised piecewise, ``head | document | context || candidate+instruction | tail``,
and the tokens are compared with those still in the KV cache; only the part after the longest common prefix is
evaluated (``kv_cache_seq_rm`` drops the rest), so items that share a document pay for it once.

Context cap: when the prompt would exceed ``n_ctx`` (minus the tokens to generate), the document tokens are
cut from the end and the record is flagged ``truncated`` with the original length; a prompt that cannot fit
even without its document is an abstention (``too_long``), never silently cut.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from src.core.threads import allowed_cpus
from src.judges.backends import llama_build
from src.judges.backends.base import Backend, abstention, split_template, verdict_token_ids
from src.judges.frames import Frame, Rendered
from src.judges.scoring import ABSTAIN_LOW_MASS, parse_free_text, verdict_from_probs
from src.judges.weights import WEIGHTS, resolve, verify_path

ABSTAIN_TOO_LONG = "too_long"
THREADS_ENV = "RAIM_THREADS"  # llama.cpp's threads for every member of a run (not part of a judge's identity)


SYSFS_CPU = Path("/sys/devices/system/cpu")


def default_threads(sysfs: Path | None = None) -> int:
    """llama.cpp's threads when neither the backend node (``n_threads``) nor ``RAIM_THREADS`` sets them: the physical
    cores among the CPUs this process may run on (its affinity: a container's or ``taskset``'s share, not the
    machine's), as llama.cpp itself counts them. A core's second hardware thread shares its arithmetic units, so
    a thread on it adds contention, not speed; where the topology cannot be read, every allowed CPU."""
    sysfs = SYSFS_CPU if sysfs is None else sysfs
    cores = set()
    for cpu in allowed_cpus():
        try:
            siblings = (sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text()
        except OSError:  # no sysfs topology (not Linux, or hidden): count the CPU itself
            siblings = str(cpu)
        cores.add(siblings.strip())
    return max(1, len(cores))


def threads(n_threads: int | None = None) -> int:
    """The threads a llama.cpp judge runs on: ``n_threads``, else ``RAIM_THREADS``, else :func:`default_threads`."""
    return int(n_threads or os.environ.get(THREADS_ENV, 0) or default_threads())


class LlamaCppBackend(Backend):
    kind = "llama_cpp"

    def __init__(
        self,
        model: str | None = None,
        model_path: str | None = None,
        sha256: str | None = None,
        template: str = "chatml",
        n_ctx: int = 8192,
        n_threads: int | None = None,
        n_batch: int = 512,
        mass_floor: float = 0.1,
        mode: str = "constrained",
        max_new_tokens: int = 8,
        prefix_reuse: bool = True,
        verbose: bool = False,
    ):
        super().__init__(mass_floor=mass_floor, mode=mode)
        if not model and not model_path:
            raise ValueError("llama_cpp backend needs `model` (a key of src.judges.weights.WEIGHTS) or `model_path`")
        if model and not sha256:
            sha256 = WEIGHTS[model].sha256
        self.model = model
        self.model_path = model_path
        self.sha256 = sha256 or ""
        self.template = template
        self.n_ctx = int(n_ctx)
        self.n_threads = threads(n_threads)
        self.n_batch = int(n_batch)
        self.max_new_tokens = int(max_new_tokens)
        self.prefix_reuse = bool(prefix_reuse)
        self.verbose = verbose
        self.llm = None
        self._vocab_ids: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.n_evaluated = 0  # tokens actually evaluated (after prefix reuse)
        self.n_prompt = 0  # prompt tokens requested

    def _identity_extra(self) -> dict:
        d = {
            "model": self.model or Path(self.model_path).name,
            "sha256": self.sha256,
            "template": self.template,
            "n_ctx": self.n_ctx,
        }
        if self.mode == "generate":
            d["max_new_tokens"] = self.max_new_tokens
            d["decoding"] = "greedy"
        return d

    # loading -----------------------------------------------------------------------------------
    def load(self):
        if self.llm is not None:
            return self.llm
        from llama_cpp import Llama  # imported here, not at start-up: llama.cpp (an optional extra)

        if self.model:
            path = resolve(self.model)
        else:
            path = Path(self.model_path)
            verify_path(path, self.sha256)
        llama_build.check(path)  # a build that dies on this CPU: one line naming the rebuild, not a crash in decode
        self.llm = Llama(
            model_path=str(path),
            n_ctx=self.n_ctx,
            n_threads=self.n_threads,
            n_threads_batch=self.n_threads,
            n_batch=self.n_batch,
            logits_all=False,
            verbose=self.verbose,
        )
        return self.llm

    def close(self) -> None:
        if self.llm is not None:
            try:
                self.llm.close()
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass
            self.llm = None

    # tokens ------------------------------------------------------------------------------------
    def _tok(self, text: str, bos: bool = False, special: bool = False) -> list[int]:
        if not text:
            return []
        return self.llm.tokenize(text.encode("utf-8"), add_bos=bos, special=special)

    def verdict_ids(self, frame: Frame) -> tuple[np.ndarray, np.ndarray]:
        if frame.hash not in self._vocab_ids:
            llm = self.load()
            s, h = verdict_token_ids(frame, self._tok, lambda t: llm.detokenize([t]).decode("utf-8", "ignore"))
            self._vocab_ids[frame.hash] = (np.array(s, dtype=np.int64), np.array(h, dtype=np.int64))
        return self._vocab_ids[frame.hash]

    def prompt_tokens(self, r: Rendered) -> tuple[list[int], list[int], bool, int]:
        """(prefix tokens, suffix tokens, truncated, original length)."""
        self.load()
        head, tail = split_template(self.template, r.system)
        t_head = self._tok(head, bos=True, special=True)
        t_doc = self._tok(r.document)
        t_ctx = self._tok(r.context)
        t_suf = self._tok(r.suffix) + self._tok(tail, special=True)
        total = len(t_head) + len(t_doc) + len(t_ctx) + len(t_suf)
        reserve = self.max_new_tokens if self.mode == "generate" else 0
        budget = self.n_ctx - reserve - 1
        truncated = False
        if total > budget:
            cut = total - budget
            if cut > len(t_doc):
                return [], [], True, total
            t_doc = t_doc[: len(t_doc) - cut]
            truncated = True
        return t_head + t_doc + t_ctx, t_suf, truncated, total

    def eval_last_logits(self, tokens: list[int]) -> np.ndarray:
        """Evaluate ``tokens`` (reusing the KV cache of the longest common prefix) and return the logits of
        the last position (float64 copy)."""
        import llama_cpp  # imported here, not at start-up: llama.cpp (an optional extra)

        llm = self.load()
        n = 0
        if self.prefix_reuse and llm.n_tokens:
            cached = np.asarray(llm.input_ids[: llm.n_tokens])
            m = min(len(cached), len(tokens))
            if m:
                neq = np.nonzero(cached[:m] != np.asarray(tokens[:m]))[0]
                n = int(neq[0]) if len(neq) else m
        n = min(n, len(tokens) - 1)  # always evaluate at least the last token to get its logits
        llm.n_tokens = n  # Llama.eval() removes KV cells from n on (kv_cache_seq_rm)
        llm.eval(tokens[n:])
        self.n_evaluated += len(tokens) - n
        self.n_prompt += len(tokens)
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float64)

    # scoring -----------------------------------------------------------------------------------
    def score_one(self, frame: Frame, item: Mapping[str, Any]) -> dict:
        t0 = time.perf_counter()
        r = frame.render(item)
        prefix, suffix, truncated, n_orig = self.prompt_tokens(r)
        if not prefix:
            return abstention(ABSTAIN_TOO_LONG, t0, truncated=True, n_prompt_tokens=n_orig)
        logits = self.eval_last_logits(prefix + suffix)
        if self.mode == "generate":
            rec = self._generate(frame, logits)
        else:
            sup, hal = self.verdict_ids(frame)
            z = np.exp(logits - logits.max())
            probs = z / z.sum()
            rec = verdict_from_probs(float(probs[sup].sum()), float(probs[hal].sum()), self.mass_floor)
        rec.update(truncated=truncated, n_prompt_tokens=n_orig)
        rec["seconds"] = time.perf_counter() - t0
        return rec

    def _is_eog(self, tok: int) -> bool:
        import llama_cpp  # imported here, not at start-up: llama.cpp (an optional extra)

        vocab = llama_cpp.llama_model_get_vocab(self.llm._model.model)
        return bool(llama_cpp.llama_vocab_is_eog(vocab, tok))

    def _generate(self, frame: Frame, logits: np.ndarray) -> dict:
        llm = self.llm
        out: list[int] = []
        for _ in range(self.max_new_tokens):
            tok = int(np.argmax(logits))
            if self._is_eog(tok):
                break
            out.append(tok)
            text = llm.detokenize(out).decode("utf-8", "ignore")
            if "\n" in text.strip("\n") or len(out) >= self.max_new_tokens:
                break
            llm.eval([tok])
            import llama_cpp  # imported here, not at start-up: llama.cpp (an optional extra)

            ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
            logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float64)
        answer = llm.detokenize(out).decode("utf-8", "ignore")
        rec = parse_free_text(answer, frame.supported_words, frame.hallucinated_words)
        rec["answer"] = answer
        return rec


__all__ = ["LlamaCppBackend", "ABSTAIN_TOO_LONG", "ABSTAIN_LOW_MASS"]
