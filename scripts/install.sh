#!/usr/bin/env bash
# Install forgeflow on a CUDA GPU machine: CUDA torch, vLLM, the torchtitan extra, the hub extra; then verify.
#   scripts/install.sh            # into ./.venv (created if missing)
#   CUDA=cu128 scripts/install.sh # another CUDA build of torch (default cu128)
# A CPU machine needs none of this: `make test` / `make run` install the CPU build through pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA="${CUDA:-cu128}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, from the CUDA index, so vllm and torchtitan resolve against it instead of pulling another build
.venv/bin/python -m pip install -q "torch>=2.13,<2.15" --index-url "https://download.pytorch.org/whl/${CUDA}"
.venv/bin/python -m pip install -q -e ".[dev,vllm,titan,hub]"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || { echo "no GPU visible (nvidia-smi failed)"; exit 1; }
.venv/bin/python -c "import torch, forge_core, vllm; assert torch.cuda.is_available(), 'CUDA not usable'; print('OK', torch.__version__, vllm.__version__, torch.cuda.get_device_name())"
echo "next: .venv/bin/python bench/gpu_check.py   and   .venv/bin/python -m pytest tests/gpu"
