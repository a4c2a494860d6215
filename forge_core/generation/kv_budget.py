"""How many prompts a generation chunk may hold: the KV cache of its rows must fit a memory budget.

A chunk of prompts with n samples each, padded to its longest prompt P, holds n × prompts rows of P + max_new_tokens
cached positions; each position costs 2 (keys, values) × layers × kv heads × head dim × the element size. A
Qwen3-1.7B batch of 512 × 1024 new tokens needs ~72 GB of it, more than one GPU has: chunks are planned to fit.
The fixed-shape decoder's buffers, kept across chunks and calls, take the largest chunk's rows × positions, so they
fit the budget too (decoder.KVArena).
"""

from __future__ import annotations

import torch

CUDA_FREE_SHARE = 0.8  # with no budget configured, on CUDA: this share of the memory free at the call


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one cached position takes in `model` (all layers)."""
    c = model.config
    heads = getattr(c, "num_attention_heads", 1)
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    element = next(model.parameters()).element_size()
    return 2 * c.num_hidden_layers * kv_heads * head_dim * element


def kv_budget_bytes(kv_cache_gb: float, device: torch.device, held: int = 0) -> int | None:
    """The budget: `kv_cache_gb` when set, else on CUDA CUDA_FREE_SHARE of the memory free now plus the `held`
    bytes of KV cache the caller would release for it, else none."""
    if kv_cache_gb > 0:
        return int(kv_cache_gb * 2**30)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int((free + held) * CUDA_FREE_SHARE)
    return None


def plan_chunks(lengths: list[int], n: int, new_tokens: int, per_token: int, budget: int | None,
                max_rows: int) -> list[int]:
    """Sizes (in prompts) of consecutive chunks of prompts with these token lengths (ascending: a chunk is padded
    to its last one), each within `max_rows` rows and, with a budget, within `budget` bytes of KV cache.
    ValueError when one prompt's n rows alone exceed the budget."""
    sizes: list[int] = []
    count = 0
    for length in lengths:
        fits_rows = (count + 1) * n <= max(max_rows, n)
        fits_memory = budget is None or (count + 1) * n * (length + new_tokens) * per_token <= budget
        if count and not (fits_rows and fits_memory):
            sizes.append(count)
            count = 0
        need = n * (length + new_tokens) * per_token
        if budget is not None and need > budget:
            raise ValueError(f"one prompt of {length} tokens with {n} samples of up to {new_tokens} new tokens needs "
                             f"{need / 2**30:.2f} GiB of KV cache, over the budget of {budget / 2**30:.2f} GiB: raise "
                             "generator.kv_cache_gb, or lower group_size or generator.max_new_tokens")
        count += 1
    return sizes + ([count] if count else [])
