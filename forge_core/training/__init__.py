"""Training: logprob/entropy ops, batching, the micro-batched Trainer and SFT helpers."""

from forge_core.training.batching import collate, episodes_to_train_inputs
from forge_core.training.config import SFTConfig, TrainerConfig
from forge_core.training.logprobs import gather_logprobs, sequence_logprobs, token_entropy
from forge_core.training.state_hash import state_sha256
from forge_core.training.trainer import Trainer, lr_factor

__all__ = ["SFTConfig", "Trainer", "TrainerConfig", "collate", "episodes_to_train_inputs", "gather_logprobs", "lr_factor",
           "sequence_logprobs", "state_sha256", "token_entropy"]
