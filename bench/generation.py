"""TorchGenerator vs Hugging Face `generate` on the same tiny model: batch 128, sampling, same thread count.

EOS is masked out in both (forward hook on the LM head) so both produce exactly batch × new_tokens tokens.
Prints a table and ends with `RESULT ratio=… ours_tok_s=… hf_tok_s=…` (ratio at 128 new tokens).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from forge_core.generation import SamplingParams, TorchGenerator  # noqa: E402
from forge_core.models import load_model_and_tokenizer  # noqa: E402


def no_eos(model, eos_id):
    def hook(_m, _i, out):
        out[..., eos_id] = float("-inf")
        return out
    return model.lm_head.register_forward_hook(hook)


def time_ours(gen: TorchGenerator, prompts, new_tokens: int) -> float:
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    start = time.perf_counter()
    out = gen.generate(prompts, n=1, seed=0, params=params)
    elapsed = time.perf_counter() - start
    assert all(len(g[0].token_ids) == new_tokens for g in out)
    return elapsed


@torch.inference_mode()
def time_hf(model, tok, prompts, new_tokens: int) -> float:
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    start = time.perf_counter()
    out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, pad_token_id=tok.pad_token_id)
    elapsed = time.perf_counter() - start
    assert out.shape[1] - enc["input_ids"].shape[1] == new_tokens
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="tiny:qwen3-arith")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer(args.model, seed=0)
    model.eval()
    prompts = [f"{a}+{b}=" for a, b in zip(range(args.batch), range(args.batch, 0, -1))]
    gen = TorchGenerator(model, tok)
    handle = no_eos(model, tok.eos_token_id)
    rows = []
    for new_tokens in (32, 128):
        time_ours(gen, prompts[:8], 4), time_hf(model, tok, prompts[:8], 4)  # warm-up
        ours = min(time_ours(gen, prompts, new_tokens) for _ in range(args.repeats))
        hf = min(time_hf(model, tok, prompts, new_tokens) for _ in range(args.repeats))
        n = args.batch * new_tokens
        rows.append((new_tokens, n / ours, n / hf))
    handle.remove()
    print(f"{'new_tokens':>10} {'ours tok/s':>12} {'hf tok/s':>12} {'ratio':>7}   (batch {args.batch}, "
          f"{args.threads} threads, best of {args.repeats})")
    for new_tokens, ours, hf in rows:
        print(f"{new_tokens:>10} {ours:>12.0f} {hf:>12.0f} {ours / hf:>7.2f}")
    _, ours, hf = rows[-1]
    print(f"RESULT ratio={ours / hf:.2f} ours_tok_s={ours:.0f} hf_tok_s={hf:.0f}")


if __name__ == "__main__":
    main()
