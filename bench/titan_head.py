"""Titan trainer step: LM head on the response positions only vs on the whole sequence (the baseline, measured in
the same run). RL prompts are long and vocabularies large, so the head's [B, L, V] output dominates a step.

    .venv/bin/python bench/titan_head.py [--prompt 192 --response 32 --vocab 32000 --steps 3]

Prints one line per variant and `RESULT ratio=…` (baseline seconds / response-only seconds; > 1 is faster).
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from forge_core.losses import LOSSES
from forge_core.models.titan import titan_from_hf
from forge_core.training import Trainer
from forge_core.training.config import TrainerConfig


class WholeSequenceHead(torch.nn.Module):
    """The baseline: hides response_logits, so the trainer runs the head on every position and gathers after."""

    def __init__(self, titan):
        super().__init__()
        self.titan = titan

    def forward(self, input_ids, attention_mask=None):
        return self.titan(input_ids, attention_mask)

    def get_output_embeddings(self):
        return None


def step_seconds(model, args) -> float:
    """Mean seconds of one optimizer step on a fixed batch (after one warm-up step)."""
    trainer = Trainer(model, LOSSES["grpo"](beta=0.0), TrainerConfig(lr=1e-5, micro_batch_size=args.batch), 0)
    g = torch.Generator().manual_seed(0)
    inputs = [{"tokens": torch.randint(1, args.vocab, (args.prompt + args.response,), generator=g).tolist()}
              for _ in range(args.batch)]
    targets = {"padding_mask": torch.ones(args.batch, args.response, dtype=torch.bool),
               "advantages": torch.randn(args.batch, generator=g)}
    trainer.train_step(inputs, targets)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        trainer.train_step(inputs, targets)
    return (time.perf_counter() - t0) / args.steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=192)
    p.add_argument("--response", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(2)
    config = Qwen3Config(vocab_size=args.vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False,
                         pad_token_id=0, max_position_embeddings=1024)
    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(config)
    baseline = step_seconds(WholeSequenceHead(titan_from_hf(hf)), args)
    response_only = step_seconds(titan_from_hf(hf), args)
    rows = args.batch * (args.prompt + args.response)
    print(f"whole-sequence head: {baseline:.3f} s/step, logits {rows * args.vocab * 4 / 2**20:.0f} MiB")
    print(f"response-only head:  {response_only:.3f} s/step, logits "
          f"{args.batch * args.response * args.vocab * 4 / 2**20:.0f} MiB")
    print(f"RESULT ratio={baseline / response_only:.2f}")


if __name__ == "__main__":
    main()
