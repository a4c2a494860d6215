"""A KV cache budget splits generation into chunks that fit it, with the same samples as one big batch."""

from __future__ import annotations

import pytest

from forge_core.generation import SamplingParams, TorchGenerator
from forge_core.generation.kv_budget import kv_bytes_per_token, plan_chunks
from forge_core.models import load_model_and_tokenizer
from tests.unit.graph_capture_stand_in import count_captures

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


SHORT = [f"{a}+{b}=" for a in range(1, 10) for b in range(10, 17)]  # 63 prompts of 5 tokens (one per character)
LONG = "1+2=" * 500  # 2,000 tokens


def held_kv_bytes(decoder) -> int:
    """Bytes of the storage behind the decoder's key and value buffers (each storage once)."""
    arena = decoder.arena
    tensors = [decoder.k_cache, decoder.v_cache]
    if arena is not None:
        tensors += [arena["k"], arena["v"]] if isinstance(arena, dict) else [arena.k, arena.v]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(storages.values())


def generate_measuring(gen, prompts, n, seed, monkeypatch) -> tuple[list, list[int]]:
    """gen.generate(...) and the bytes its decoder's KV buffers hold after each chunk."""
    held = []
    real = gen.generate_chunk
    monkeypatch.setattr(gen, "generate_chunk", lambda *a: (real(*a), held.append(held_kv_bytes(gen._decoder)))[0])
    out = gen.generate(prompts, n=n, seed=seed)
    monkeypatch.setattr(gen, "generate_chunk", real)
    return out, held


def test_fixed_shape_buffers_stay_within_the_budget_with_one_long_prompt_among_short_ones(monkeypatch):
    """63 short prompts and one of 2,000 tokens: the buffers kept across chunks and calls hold the largest chunk's
    rows × positions, not the most rows × the longest prompt (~50× the budget here), with the samples unchanged."""
    from forge_core.generation import decoder

    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    captured = count_captures(monkeypatch)
    prompts = SHORT + [LONG]
    budget = 5 * 2048 * kv_bytes_per_token(model)  # the long prompt's 4 rows, its length rounded up to 2,048
    gen = TorchGenerator(model, tok, PARAMS, fixed_shapes=True, kv_cache_gb=budget / 2**30)
    gen._decoder = decoder.StaticCacheDecoder(model, cuda_graphs=True)  # what make_decoder gives on CUDA
    first, held = generate_measuring(gen, prompts, 4, 9, monkeypatch)
    assert len(held) == 2 and max(held) <= budget  # a chunk of the 63 short prompts, then the long one
    storage, after_first = gen._decoder.arena.k_store.data_ptr(), len(captured)
    second, held = generate_measuring(gen, prompts, 4, 9, monkeypatch)
    assert max(held) <= budget
    assert gen._decoder.arena.k_store.data_ptr() == storage and len(captured) == after_first  # graphs kept
    sliced = TorchGenerator(model, tok, PARAMS, kv_cache_gb=budget / 2**30).generate(prompts, n=4, seed=9)
    for run in (first, second):
        assert [[c.token_ids for c in g] for g in run] == [[c.token_ids for c in g] for g in sliced]


def test_chunks_share_one_layout_of_the_buffers_when_the_budget_allows(monkeypatch):
    """With room for the most rows × the longest length, every chunk decodes on one layout (one set of graphs);
    without it, each chunk on its own (what the budget allows)."""
    from forge_core.generation import decoder

    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    count_captures(monkeypatch)
    prompts = SHORT[:6] + ["1+2=" * 20]
    per_token = kv_bytes_per_token(model)
    layouts = {}
    for name, budget in (("tight", 6 * 128 * per_token), ("roomy", 64 * 128 * per_token)):
        gen = TorchGenerator(model, tok, PARAMS, max_batch=8, fixed_shapes=True, kv_cache_gb=budget / 2**30)
        gen._decoder = decoder.StaticCacheDecoder(model, cuda_graphs=True)
        _, held = generate_measuring(gen, prompts, 4, 9, monkeypatch)
        assert len(held) == 4 and max(held) <= budget  # 6 short prompts in 3 chunks of 2 (8 rows), then the long one
        layouts[name] = {length for _, _, length in gen._decoder.graphs.entries}
    assert layouts["roomy"] == {128}  # the long prompt's 80 + 8 positions, rounded up to the bucket of 64
    assert layouts["tight"] == {64, 128}
