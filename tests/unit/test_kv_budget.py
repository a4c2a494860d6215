"""A KV cache budget splits generation into chunks that fit it, with the same samples as one big batch."""

from __future__ import annotations

import pytest

from forge_core.generation import SamplingParams, TorchGenerator
from forge_core.generation.kv_budget import kv_bytes_per_token, plan_chunks
from forge_core.models import load_model_and_tokenizer

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8)


def test_chunks_fit_the_budget_and_the_row_limit():
    # 10 bytes per token: a prompt of length L with n=2 and 8 new tokens costs 2 * (L + 8) * 10 bytes
    lengths = [2, 2, 4, 4, 12]
    assert plan_chunks(lengths, 2, 8, 10, None, 512) == [5]
    assert plan_chunks(lengths, 2, 8, 10, None, 4) == [2, 2, 1]  # 4 rows: 2 prompts of 2 samples
    sizes = plan_chunks(lengths, 2, 8, 10, 700, 512)
    assert sizes == [2, 2, 1]  # (2, 2, 4) padded to 4 tokens would take 3 × 2 × 12 × 10 = 720 > 700
    at = 0
    for size in sizes:
        chunk = lengths[at:at + size]
        at += size
        assert size * 2 * (max(chunk) + 8) * 10 <= 700
    with pytest.raises(ValueError, match=r"needs 0.00 GiB of KV cache, over the budget .* raise generator.kv_cache_gb"):
        plan_chunks(lengths, 2, 8, 10, 300, 512)  # the 12-token prompt alone needs 400 bytes


def test_a_small_budget_samples_exactly_what_one_batch_samples(monkeypatch):
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    prompts = ["1+2=", "13+24=", "7-3=", "100+200=", "5*6="]
    whole = TorchGenerator(model, tok, PARAMS).generate(prompts, n=3, seed=9)
    per_token = kv_bytes_per_token(model)
    budget = 80 * per_token  # 80 cached positions: 3 samples of 8 new tokens leave room for 1 or 2 prompts
    small = TorchGenerator(model, tok, PARAMS, kv_cache_gb=budget / 2**30)
    chunks = []
    real = small.generate_chunk
    monkeypatch.setattr(small, "generate_chunk", lambda rows, n, *a: chunks.append((len(rows) * n, max(map(len, rows))))
                        or real(rows, n, *a))
    chunked = small.generate(prompts, n=3, seed=9)
    assert len(chunks) > 1
    assert all(rows * (longest + 8) * per_token <= budget for rows, longest in chunks)
    assert [[c.token_ids for c in g] for g in chunked] == [[c.token_ids for c in g] for g in whole]
    for g, w in zip(chunked, whole, strict=True):  # other padding, other rounding: equal to float precision
        for c, d in zip(g, w, strict=True):
            assert c.logprobs == pytest.approx(d.logprobs, abs=1e-5)
