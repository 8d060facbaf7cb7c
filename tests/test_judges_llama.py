"""SmolLM2-135M through llama.cpp on a few items: plumbing and determinism, never accuracy.

Needs the `llama` extra and the SmolLM2 weight package (scripts/install_models.sh); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from src.judges import weights  # noqa: E402
from src.judges.frames import load_frame  # noqa: E402

try:
    weights.resolve("smollm2-135m")
except (ModuleNotFoundError, FileNotFoundError) as e:  # pragma: no cover
    pytest.skip(f"SmolLM2 weights not installed: {e}", allow_module_level=True)

from src.judges.backends.llamacpp import LlamaCppBackend  # noqa: E402

pytestmark = pytest.mark.slow
FIX = Path(__file__).parent / "fixtures" / "judges"
REPO = Path(__file__).resolve().parents[1]


def items() -> list[dict]:
    return [json.loads(x) for x in (FIX / "mini.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def smol():
    b = LlamaCppBackend(model="smollm2-135m", template="chatml", n_ctx=1024, n_threads=2, mass_floor=0.05)
    yield b
    b.close()


def test_constrained_scores_are_valid_and_deterministic(smol):
    f = load_frame("def_on")
    its = [it for it in items() if it["frame"] == "def_on"]
    a = smol.score(f, its)
    b = smol.score(f, its)
    for x, y in zip(a, b):
        assert x["vote"] in (0, 1) and x["abstain"] is None
        assert 0.0 <= x["p_hal"] <= 1.0 and 0.05 <= x["mass"] <= 1.0
        assert x["vote"] == int(x["p_hal"] > 0.5)
        assert x["logodds"] == pytest.approx(y["logodds"], abs=1e-9)
        assert x["p_hal"] == y["p_hal"] and not x["truncated"]
    # the verdict tokens are real single tokens of both classes
    s, h = smol.verdict_ids(f)
    assert len(s) >= 2 and len(h) >= 2 and not set(s) & set(h)


def test_prefix_reuse_equals_full_evaluation(smol):
    f = load_frame("claim")
    its = [it for it in items() if it["frame"] == "claim"]
    full = LlamaCppBackend(model="smollm2-135m", template="chatml", n_ctx=1024, n_threads=2, prefix_reuse=False)
    try:
        ev0 = smol.n_evaluated
        reused = smol.score(f, its)
        saved = smol.n_prompt - smol.n_evaluated
        scratch = full.score(f, its)
        assert full.n_evaluated == full.n_prompt  # no reuse there
        assert smol.n_evaluated - ev0 < sum(len(smol.prompt_tokens(f.render(i))[0]) for i in its) + 200
        assert saved > 0
        for a, b in zip(reused, scratch):
            assert a["logodds"] == pytest.approx(b["logodds"], abs=1e-3)
            assert a["vote"] == b["vote"]
    finally:
        full.close()


def test_context_cap_truncates_document_and_flags(smol):
    f = load_frame("claim")
    it = dict(items()[6])
    it["evidence"] = " ".join(["The Amazon River is long and wide."] * 400)  # ~3600 tokens
    small = LlamaCppBackend(model="smollm2-135m", template="chatml", n_ctx=256, n_threads=2)
    try:
        r = small.score(f, [it])[0]
        assert r["truncated"] is True and r["n_prompt_tokens"] > 256 and r["vote"] in (0, 1)
        prefix, suffix, trunc, n = small.prompt_tokens(f.render(it))
        assert len(prefix) + len(suffix) == 255 and trunc
        it["candidate"] = "word " * 400  # cannot fit even without its document -> counted abstention
        r2 = small.score(f, [it])[0]
        assert r2["vote"] is None and r2["abstain"] == "too_long"
    finally:
        small.close()
    assert smol.score(f, [items()[6]])[0]["truncated"] is False


def test_free_generation_parses_answer_or_abstains(smol):
    f = load_frame("def_on")
    gen = LlamaCppBackend(
        model="smollm2-135m", template="chatml", n_ctx=1024, n_threads=2, mode="generate", max_new_tokens=4
    )
    try:
        recs = gen.score(f, items()[:4])
        for r in recs:
            assert "answer" in r
            if r["vote"] is None:
                assert r["abstain"] == "unparseable"
            else:
                assert r["vote"] in (0, 1)
        assert recs == [dict(x, seconds=y["seconds"]) for x, y in zip(gen.score(f, items()[:4]), recs)]
        assert gen.identity() != smol.identity()  # generation settings are part of the identity
    finally:
        gen.close()


def _cli(cache: Path, tables: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "src.judges",
        "--roster",
        "tiny",
        "--datasets",
        "mini",
        "--items-dir",
        str(FIX),
        "--cache-dir",
        str(cache),
        "--tables-dir",
        str(tables),
        "--compute",
        "--no-progress",
        "--threads",
        "1",
    ]


def _records(cache: Path) -> dict[str, dict]:
    out = {}
    for p in sorted(cache.glob("*/*/*.jsonl")):
        lines = p.read_bytes().splitlines()
        keys = [json.loads(x)["key"] for x in lines]
        assert len(keys) == len(set(keys)), f"duplicates in {p}"
        for x in lines:
            r = json.loads(x)
            out[r["key"]] = {k: v for k, v in r.items() if k not in ("seconds", "created")}
    return out


def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    ref_cache, ref_tab = tmp_path / "ref", tmp_path / "ref_tables"
    subprocess.run(_cli(ref_cache, ref_tab), cwd=REPO, check=True, env=env, capture_output=True, timeout=300)
    ref = _records(ref_cache)
    assert len(ref) == 24  # 12 items x 2 members

    cache, tab = tmp_path / "c", tmp_path / "c_tables"
    p = subprocess.Popen(_cli(cache, tab), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    smol_dir = cache / "mini" / "smollm135m"
    deadline = time.time() + 240
    while time.time() < deadline:  # kill once the LLM member has cached a few items, mid-run
        files = list(smol_dir.glob("*.jsonl"))
        if files and len(files[0].read_bytes().splitlines()) >= 3:
            break
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    f = next(smol_dir.glob("*.jsonl"))
    n_before = len(f.read_bytes().splitlines())
    assert 3 <= n_before < 12, "the run was not interrupted mid-way"
    with open(f, "ab") as fh:  # and a record torn by the kill
        fh.write(b'{"key": "torn", "vote": 1, "p_h')
    out = subprocess.run(_cli(cache, tab), cwd=REPO, check=True, env=env, capture_output=True, text=True, timeout=300)
    assert f"computed {12 - n_before}" in out.stderr  # only the missing items were scored
    got = _records(cache)
    assert got.keys() == ref.keys()
    for k in ref:
        _same(got[k], ref[k])
    # a third run recomputes nothing and reports hits
    out = subprocess.run(_cli(cache, tab), cwd=REPO, check=True, env=env, capture_output=True, text=True, timeout=300)
    assert "computed 0" in out.stderr and "computed 1" not in out.stderr
    t = (tab / "tiny" / "mini.csv").read_text().splitlines()
    assert t[0].startswith("item_id,cluster_id,dataset,gold,smollm135m") and len(t) == 13


def _same(a: dict, b: dict) -> bool:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], float):
            assert a[k] == pytest.approx(b[k], abs=1e-6), k
        else:
            assert a[k] == b[k], k
    return True
