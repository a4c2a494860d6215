#!/usr/bin/env bash
# UNTESTED here (no AMD GPU was available to the project): install forgeflow on a ROCm machine.
# torch from the ROCm index; vLLM for ROCm is built from source or taken from AMD's container images, so this
# script installs forgeflow without the vllm extra (generator.backend: torch works; set it in the config).
set -euo pipefail
cd "$(dirname "$0")/.."
ROCM="${ROCM:-rocm6.4}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch>=2.13,<2.15" --index-url "https://download.pytorch.org/whl/${ROCM}"
.venv/bin/python -m pip install -q -e ".[dev,hub]"
.venv/bin/python -c "import torch, forge_core; assert torch.cuda.is_available(), 'ROCm GPU not usable'; print('OK', torch.__version__, torch.version.hip)"
