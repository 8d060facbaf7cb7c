"""Throughput of the judge runner against naive per-item generation, same model, same run.

    python bench/bench_judges.py --model smollm2-135m --items datasets/medhallu.jsonl --n 40

* runner: ``src.judges.runner.score_judge`` — items grouped by document, the document's KV cache reused,
  constrained scoring in one forward pass, each verdict appended (fsync) to a fresh verdict cache;
* naive: for each item, the KV cache cleared and ``Llama.create_completion`` generating up to
  ``--max-new-tokens`` greedy tokens from the full prompt, the answer parsed.

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
from src.judges.backends.llamacpp import LlamaCppBackend  # noqa: E402
from src.judges.frames import load_frames  # noqa: E402
from src.judges.runner import cluster_subsample, score_judge  # noqa: E402
from src.judges.scoring import parse_free_text  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a key of src.judges.weights.WEIGHTS")
    ap.add_argument("--template", default="chatml")
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
    be = LlamaCppBackend(model=a.model, template=a.template, n_ctx=a.n_ctx, n_threads=a.threads)
    be.load()
    print(f"{len(recs)} items from {a.items.name}, {items['cluster_id'].nunique()} clusters; model {a.model}, "
          f"n_ctx {a.n_ctx}, {a.threads} threads")

    # naive first (so the runner does not profit from a warm cache), on the same Llama object
    llm = be.llm
    t0 = time.perf_counter()
    parsed = 0
    for r in recs:
        f = frames[r["frame"]]
        rr = f.render(r)
        head, tail = split_template(a.template, rr.system)
        llm.reset()
        out = llm.create_completion(head + rr.user + tail, max_tokens=a.max_new_tokens, temperature=0.0)
        parsed += parse_free_text(out["choices"][0]["text"], f.supported_words, f.hallucinated_words)["vote"] is not None
    t_naive = time.perf_counter() - t0
    llm.reset()

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        out, rep = score_judge("bench", None, recs, frames, Path(d), compute=True, progress=True, backend=be)
        t_run = time.perf_counter() - t0
    be.close()
    n = len(recs)
    print(f"naive generate(): {n / t_naive:7.3f} items/s  ({t_naive / n:.3f} s/item, {parsed}/{n} parseable)")
    print(f"runner          : {n / t_run:7.3f} items/s  ({t_run / n:.3f} s/item, "
          f"{n - rep['abstained']}/{n} scored; tokens evaluated {be.n_evaluated} of {be.n_prompt})")
    print(f"speed-up        : {t_naive / t_run:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
