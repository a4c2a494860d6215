"""TorchGenerator vs Hugging Face `generate` on the same tiny model: batch 128, sampling, same thread count.

HF is measured with its dynamic cache and with `cache_implementation="static"` (which HF compiles on CUDA); the
ratio is against the faster of the two. EOS is masked out everywhere (forward hook on the LM head) so every run
produces exactly batch × new_tokens tokens. Prints a table and ends with
`RESULT ratio=… ours_tok_s=… hf_tok_s=… hf_dynamic_tok_s=… hf_static_tok_s=…` (at 128 new tokens).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from forge_core.generation import SamplingParams, TorchGenerator  # noqa: E402
from forge_core.models import load_model_and_tokenizer  # noqa: E402


def no_eos(model, end_ids):
    """Mask every end id's logit (an int or a list: TorchGenerator.end_ids), so each row runs to its length."""
    ids = [end_ids] if isinstance(end_ids, int) else list(end_ids)

    def hook(_m, _i, out):
        out[..., ids] = float("-inf")
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
def time_hf(model, tok, prompts, new_tokens: int, cache: str = "dynamic") -> float:
    """Seconds for HF generate; `cache`: dynamic or static (preallocated, compiled by HF on CUDA)."""
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    start = time.perf_counter()
    out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, pad_token_id=tok.pad_token_id, **extra)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
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
    handle = no_eos(model, gen.end_ids)
    rows = []
    for new_tokens in (32, 128):
        time_ours(gen, prompts[:8], 4)  # warm-up
        for cache in ("dynamic", "static"):
            time_hf(model, tok, prompts[:8], 4, cache)
        ours = min(time_ours(gen, prompts, new_tokens) for _ in range(args.repeats))
        hf = {cache: min(time_hf(model, tok, prompts, new_tokens, cache) for _ in range(args.repeats))
              for cache in ("dynamic", "static")}
        n = args.batch * new_tokens
        rows.append((new_tokens, n / ours, n / hf["dynamic"], n / hf["static"]))
    handle.remove()
    print(f"{'new_tokens':>10} {'ours tok/s':>12} {'hf dynamic':>12} {'hf static':>12} {'ratio':>7}   "
          f"(batch {args.batch}, {args.threads} threads, best of {args.repeats}; ratio vs the faster HF)")
    for new_tokens, ours, dynamic, static in rows:
        print(f"{new_tokens:>10} {ours:>12.0f} {dynamic:>12.0f} {static:>12.0f} {ours / max(dynamic, static):>7.2f}")
    _, ours, dynamic, static = rows[-1]
    best = max(dynamic, static)
    print(f"RESULT ratio={ours / best:.2f} ours_tok_s={ours:.0f} hf_tok_s={best:.0f} hf_dynamic_tok_s={dynamic:.0f} "
          f"hf_static_tok_s={static:.0f}")


if __name__ == "__main__":
    main()
