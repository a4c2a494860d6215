#!/usr/bin/env bash
# UNTESTED here (no AMD GPU was available to the project): forgeflow on a ROCm machine. torch from the ROCm index;
# vLLM for ROCm is built from source or taken from AMD's container images, so the vllm extra is left out
# (generator.backend: torch works; set it in the config).
set -euo pipefail
export TORCH_INDEX="${ROCM:-rocm6.4}" EXTRAS="dev,hub"
export VERIFY="import torch, forge_core; assert torch.cuda.is_available(), 'ROCm GPU not usable'; print('OK', torch.__version__, torch.version.hip)"
exec "$(dirname "$0")/install.sh"
