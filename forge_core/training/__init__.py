"""Training: logprob/entropy ops, batching, the micro-batched Trainer and SFT helpers."""

from forge_core.training.batching import collate, episodes_to_train_inputs
from forge_core.training.logprobs import gather_logprobs, sequence_logprobs, token_entropy
from forge_core.training.state_hash import state_sha256
from forge_core.training.trainer import Trainer, TrainerSettings, lr_factor

__all__ = ["Trainer", "TrainerSettings", "collate", "episodes_to_train_inputs", "gather_logprobs", "lr_factor",
           "sequence_logprobs", "state_sha256", "token_entropy"]
