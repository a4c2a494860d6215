"""`trainer.share_prompts` on the main job's train step: SmolLM2-135M-Instruct, 8 GRPO groups x 8 samples of the
main job's chat prompts (configs/grpo_smollm2.yaml) with 16-token responses, one optimizer step over the 64 rows.

Padded (every row runs its prompt) against shared (each prompt once, its 8 responses against its cached keys and
values), in fp32 and under bf16 autocast, best of `--repeats` after a warm-up, in this process. Also prints the
largest logprob difference between the two paths. Last line: `RESULT ratio_bf16=<padded s / shared s>
ratio_fp32=…`.

    .venv/bin/python bench/shared_prompts.py [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from train_step import best_step_seconds  # noqa: E402  (bench/ is the script's directory)

from forge_core.losses import get_loss  # noqa: E402
from forge_core.models import load_model_and_tokenizer  # noqa: E402
from forge_core.training import Trainer, TrainerConfig, episodes_to_train_inputs  # noqa: E402
from forge_core.types import Completion, Episode  # noqa: E402
from infra import components as C  # noqa: E402
from infra.config_checks import load_config  # noqa: E402

CONFIG = "configs/grpo_smollm2.yaml"


def grpo_batch(cfg, tok, response: int) -> list[Episode]:
    """prompts_per_step groups of group_size episodes: the config's first training prompts, random responses."""
    splits = C.build_splits(cfg, tok)
    g = torch.Generator().manual_seed(0)
    out = []
    for i, prompt in enumerate(splits.train_prompts[:cfg.prompts_per_step]):
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        for j in range(cfg.group_size):
            comp = Completion("", torch.randint(100, len(tok), (response,), generator=g).tolist(), [-3.0] * response)
            out.append(Episode(prompt, "0", ids, comp, advantage=1.0 if (i + j) % 2 else -1.0))
    return out


def best_step(model, tok, eps, share: bool, dtype, repeats: int) -> tuple[float, torch.Tensor]:
    """(best seconds of one train_step over the batch, the logprobs [B, T] before it)."""
    config = TrainerConfig(lr=1e-9, micro_batch_size=len(eps), share_prompts=share)
    trainer = Trainer(model, get_loss("dapo"), config, tok.pad_token_id, compute_dtype=dtype)
    inputs, targets = episodes_to_train_inputs(eps, tok.pad_token_id)
    with torch.no_grad():
        lp, _ = trainer.logprobs(inputs, targets["padding_mask"])
    return best_step_seconds(trainer, inputs, targets, repeats), lp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--response", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(CONFIG, {})
    model, tok = load_model_and_tokenizer(cfg.model.path, dtype=torch.float32)
    eps = grpo_batch(cfg, tok, args.response)
    prompt_tokens = sum(len(e.prompt_ids) for e in eps)
    print(f"SmolLM2-135M-Instruct, {cfg.prompts_per_step} groups x {cfg.group_size} rows, prompts "
          f"{prompt_tokens // len(eps)} tokens, responses {args.response}; {args.threads} threads")
    print(f"{'compute':<8} {'padded s':>9} {'shared s':>9} {'ratio':>6} {'max |Δ logprob|':>16}")
    ratios = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", None)):
        padded_s, padded_lp = best_step(model, tok, eps, False, dtype, args.repeats)
        shared_s, shared_lp = best_step(model, tok, eps, True, dtype, args.repeats)
        ratios[name] = padded_s / shared_s
        diff = (padded_lp - shared_lp).abs().max().item()
        print(f"{name:<8} {padded_s:>9.2f} {shared_s:>9.2f} {ratios[name]:>6.2f} {diff:>16.2e}")
    print(f"RESULT ratio_bf16={ratios['bf16']:.2f} ratio_fp32={ratios['fp32']:.2f}")


if __name__ == "__main__":
    main()
