#!/usr/bin/env bash
# Install forgeflow on a GPU machine: the accelerator build of torch, the extras, then verify.
#   scripts/install.sh                 # CUDA (cu128): torch + vllm, titan, hub extras; checks `import vllm`
#   CUDA=cu126 scripts/install.sh      # another CUDA build of torch
#   scripts/install_rocm.sh            # ROCm (untested here): see that file
# A CPU machine needs none of this: `make test` / `make run` install the CPU build through pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_INDEX="${TORCH_INDEX:-${CUDA:-cu128}}"
EXTRAS="${EXTRAS:-dev,vllm,titan,hub}"
VERIFY="${VERIFY:-import torch, forge_core, vllm; assert torch.cuda.is_available(), 'no usable GPU'; print('OK', torch.__version__, vllm.__version__, torch.cuda.get_device_name())}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first, from the accelerator index, so the extras resolve against it instead of pulling another build
.venv/bin/python -m pip install -q "torch>=2.13,<2.15" --index-url "https://download.pytorch.org/whl/${TORCH_INDEX}"
.venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
.venv/bin/python -c "${VERIFY}"
echo "next: .venv/bin/python bench/gpu_check.py   and   .venv/bin/python -m pytest tests/gpu"
