"""Shared by tests/unit/test_mixed_precision.py (CPU) and tests/gpu (CUDA): short training runs in one precision
setup and how far their weight change is from an fp32 run's. Imports only torch and forge_core (the GPU machine has
no prefect or mlflow)."""

import torch

from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer
from forge_core.training import Trainer, TrainerConfig
from tests.unit.test_trainer import make_batch

STEPS, LR = 100, 1e-5
# measured on this CPU: bf16 compute with fp32 masters ends 0.7% (relative L2) from the fp32 run's weight change;
# bf16 parameters end 95% away (84% of the weights never move)
TRACKS, LOST = 0.10, 0.5


def train(param_dtype: torch.dtype, compute_dtype: torch.dtype | None, device: str = "cpu") -> tuple[dict, dict]:
    """(initial fp32 weights, final weights as fp32, on the CPU) after STEPS reinforce steps on one fixed batch."""
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0, dtype=param_dtype)
    model = model.to(device)
    start = {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model, get_loss("reinforce"),
                      TrainerConfig(lr=LR, micro_batch_size=64), tok.pad_token_id, compute_dtype=compute_dtype)
    inputs, targets = make_batch(tok)
    for _ in range(STEPS):
        trainer.train_step(inputs, targets)
    return start, {k: v.detach().float().cpu() for k, v in model.state_dict().items()}


def relative_gap(run: tuple[dict, dict], reference: tuple[dict, dict]) -> float:
    """‖Δrun − Δref‖ / ‖Δref‖ over all weights (Δ = final − initial)."""
    num = den = 0.0
    for k, ref_end in reference[1].items():
        d_ref = ref_end - reference[0][k]
        num += (run[1][k] - run[0][k] - d_ref).pow(2).sum().item()
        den += d_ref.pow(2).sum().item()
    return (num / den) ** 0.5


def moved_fraction(run: tuple[dict, dict]) -> float:
    changed = sum((run[1][k] != run[0][k]).sum().item() for k in run[0])
    return changed / sum(v.numel() for v in run[0].values())
