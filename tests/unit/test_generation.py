import pytest
import torch

from forge_core.generation import SamplingParams, TorchGenerator, filter_logits, sample_next
from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer
from forge_core.training import Trainer, TrainerConfig, episodes_to_train_inputs
from forge_core.types import Episode
from tests.unit.graph_capture_stand_in import count_captures

PROMPTS = ["Q: 1+2=", "Q: 12+34=", "7-3=", "Q: 99-100=-"]


@pytest.fixture(scope="module")
def model_and_tok():
    return load_model_and_tokenizer("tiny:qwen3-micro", seed=0)


def boost_eos(model, tok, amount):
    """Make EOS likely so completions of different lengths appear (forward hook on the LM head)."""
    def hook(_module, _inputs, output):
        output[..., tok.eos_token_id] += amount
        return output
    return model.lm_head.register_forward_hook(hook)


def flatten(groups):
    return [c for g in groups for c in g]


def test_fast_decoder_matches_hf_forward(model_and_tok):
    model, tok = model_and_tok
    handle = boost_eos(model, tok, 3.0)
    try:
        params = SamplingParams(temperature=0.9, max_new_tokens=12)
        fast = flatten(TorchGenerator(model, tok, params).generate(PROMPTS, n=3, seed=5))
        slow = flatten(TorchGenerator(model, tok, params, prefer_fast=False).generate(PROMPTS, n=3, seed=5))
    finally:
        handle.remove()
    assert [c.token_ids for c in fast] == [c.token_ids for c in slow]
    for a, b in zip(fast, slow):
        assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0.0) < 1e-4


def test_seeded_sampling_is_reproducible(model_and_tok):
    model, tok = model_and_tok
    gen = TorchGenerator(model, tok, SamplingParams(max_new_tokens=10))
    a = flatten(gen.generate(PROMPTS, n=2, seed=1))
    b = flatten(gen.generate(PROMPTS, n=2, seed=1))
    c = flatten(gen.generate(PROMPTS, n=2, seed=2))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]


def test_left_padding_does_not_change_results(model_and_tok):
    model, tok = model_and_tok
    gen = TorchGenerator(model, tok, SamplingParams(temperature=0.0, max_new_tokens=8))
    batched = flatten(gen.generate(PROMPTS, n=1))
    for prompt, together in zip(PROMPTS, batched):
        (alone,) = flatten(gen.generate([prompt], n=1))
        assert alone.token_ids == together.token_ids
        assert max(abs(x - y) for x, y in zip(alone.logprobs, together.logprobs)) < 1e-5


def test_eos_is_kept_and_ends_the_completion(model_and_tok):
    model, tok = model_and_tok
    handle = boost_eos(model, tok, 2.5)
    try:
        gen = TorchGenerator(model, tok, SamplingParams(max_new_tokens=16))
        gen.policy_version = 7
        comps = flatten(gen.generate(PROMPTS, n=4, seed=0))
    finally:
        handle.remove()
    eos_ended = [c for c in comps if c.stop_reason == "eos"]
    assert eos_ended and any(c.stop_reason == "length" for c in comps)
    for c in comps:
        assert len(c.token_ids) == len(c.logprobs) and c.policy_version == 7
        # the buffer's padding (logprob 0.0) never leaks in; pad itself is an ordinary token of this vocabulary
        assert all(-50.0 < lp < 0.0 for lp in c.logprobs)
        # every end id stops a row: the tokenizer's eos and the chat template's <|im_end|>
        assert gen.end_ids == [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]
        if c.stop_reason == "eos":
            assert c.token_ids[-1] in gen.end_ids and not set(gen.end_ids) & set(c.token_ids[:-1])
        else:
            assert len(c.token_ids) == 16 and not set(gen.end_ids) & set(c.token_ids)
    assert len({len(c.token_ids) for c in eos_ended}) > 1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generator_and_trainer_logprobs_agree(model_and_tok, temperature):
    model, tok = model_and_tok
    handle = boost_eos(model, tok, 3.0)
    try:
        gen = TorchGenerator(model, tok, SamplingParams(temperature=temperature, max_new_tokens=10))
        comps = flatten(gen.generate(PROMPTS, n=3, seed=11))
        episodes = []
        for i, c in enumerate(comps):
            prompt = PROMPTS[i // 3]
            episodes.append(Episode(prompt, "0", tok(prompt, add_special_tokens=False)["input_ids"], c))
        inputs, targets = episodes_to_train_inputs(episodes, tok.pad_token_id)
        trainer = Trainer(model, get_loss("grpo"), TrainerConfig(), tok.pad_token_id, temperature=temperature)
        with torch.no_grad():
            lp, _ = trainer.logprobs(inputs, targets["padding_mask"])
    finally:
        handle.remove()
    mask = targets["padding_mask"]
    diff = (lp - targets["old_logprobs"]).abs()[mask]
    assert len({len(c.token_ids) for c in comps}) > 1
    assert diff.max().item() < 1e-4


def test_top_k_and_top_p_filtering():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.isinf(filter_logits(logits, 2, 1.0)).tolist() == [[True, False, False, True]]
    # softmax ≈ [0.087, 0.644, 0.237, 0.032]: nucleus 0.7 keeps the top two
    assert torch.isinf(filter_logits(logits, 0, 0.7)).tolist() == [[True, False, False, True]]
    assert torch.isinf(filter_logits(logits, 0, 0.01)).tolist() == [[True, False, True, True]]


def test_top_k_one_is_greedy(model_and_tok):
    model, tok = model_and_tok
    greedy = flatten(TorchGenerator(model, tok, SamplingParams(temperature=0.0, max_new_tokens=6)).generate(PROMPTS))
    top1 = flatten(TorchGenerator(model, tok, SamplingParams(top_k=1, max_new_tokens=6)).generate(PROMPTS, seed=3))
    assert [c.token_ids for c in greedy] == [c.token_ids for c in top1]


def test_bad_sampling_params():
    with pytest.raises(ValueError, match="generator.top_p"):
        SamplingParams(top_p=0.0).validate()
    with pytest.raises(ValueError, match="generator.max_new_tokens"):
        SamplingParams(max_new_tokens=0).validate()


def test_a_prompt_samples_the_same_whatever_shares_its_batch(model_and_tok):
    """Prompt i is seeded with seed + key_i: alone, in another chunking, or on another replica (prompt_keys),
    its samples are the same, the property that lets replicas split a step's prompts."""
    model, tok = model_and_tok
    handle = boost_eos(model, tok, 2.0)
    try:
        params = SamplingParams(temperature=1.0, max_new_tokens=10)
        together = TorchGenerator(model, tok, params).generate(PROMPTS, n=3, seed=5)
        alone = [TorchGenerator(model, tok, params).generate([p], n=3, seed=5 + i)[0] for i, p in enumerate(PROMPTS)]
        chunked = TorchGenerator(model, tok, params, max_batch=3).generate(PROMPTS, n=3, seed=5)
        odd = TorchGenerator(model, tok, params).generate(PROMPTS[1::2], n=3, seed=5, prompt_keys=[1, 3])
    finally:
        handle.remove()
    ids = lambda groups: [[c.token_ids for c in g] for g in groups]  # noqa: E731
    assert ids(together) == ids(alone) == ids(chunked)
    assert ids(odd) == ids(together)[1::2]
    assert len({len(c.token_ids) for g in together for c in g}) > 1  # rows finished at different steps
    with pytest.raises(ValueError, match="prompt_keys has 1 entries for 2 prompts"):
        TorchGenerator(model, tok, params).generate(PROMPTS[:2], seed=0, prompt_keys=[0])


def test_checking_for_finished_rows_every_k_steps_changes_nothing(model_and_tok):
    model, tok = model_and_tok
    handle = boost_eos(model, tok, 2.5)
    try:
        params = SamplingParams(temperature=1.0, max_new_tokens=12)
        every = [flatten(TorchGenerator(model, tok, params, check_every=k).generate(PROMPTS, n=4, seed=3))
                 for k in (1, 5, 64)]
    finally:
        handle.remove()
    assert len({len(c.token_ids) for c in every[0]}) > 1
    for other in every[1:]:
        assert [c.token_ids for c in other] == [c.token_ids for c in every[0]]
        assert [c.stop_reason for c in other] == [c.stop_reason for c in every[0]]
        for a, b in zip(other, every[0]):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)


def test_stream_uniforms_are_uniform_and_independent_of_the_batch():
    from forge_core.generation.sampling import stream_keys, stream_uniforms

    keys = torch.tensor(stream_keys(11, range(500), 8))
    u = torch.stack([stream_uniforms(keys, t) for t in range(50)])  # [T, B]
    assert u.min() >= 0.0 and u.max() < 1.0
    counts = torch.histc(u, bins=20, min=0.0, max=1.0)
    expected = u.numel() / 20
    assert ((counts - expected) ** 2 / expected).sum() < 60  # chi-square, 19 dof: p < 1e-5 to fail by chance
    lag = torch.corrcoef(torch.stack([u[:-1].flatten(), u[1:].flatten()]))[0, 1]
    assert abs(lag) < 0.02  # consecutive steps of a stream are uncorrelated
    assert len(set(stream_keys(11, range(500), 8))) == 4000  # every row its own stream
    assert torch.equal(stream_uniforms(keys[7:9], 3), u[3, 7:9])  # a row's draw ignores the other rows


def test_inverse_cdf_sampling_follows_the_filtered_distribution():
    from forge_core.generation.sampling import stream_keys, stream_uniforms

    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0, 0.5]]).repeat(40000, 1)
    uniforms = stream_uniforms(torch.tensor(stream_keys(3, range(40000), 1)), 0)
    tokens, lp = sample_next(logits, SamplingParams(temperature=1.0), uniforms)
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    assert torch.allclose(freq, logits[0].softmax(-1), atol=0.01)
    assert torch.allclose(lp, logits[0].log_softmax(-1)[tokens])  # unfiltered logprob of the sampled token
    top2, _ = sample_next(logits, SamplingParams(temperature=1.0, top_k=2), uniforms)
    assert set(top2.tolist()) == {0, 2}  # filtered-out tokens are never drawn


def test_fixed_shape_decode_step_samples_what_the_sliced_one_does(model_and_tok, monkeypatch):
    """The step CUDA graphs capture (cache written at a device position, attention over a length bucket) gives the
    sliced decoder's samples: here on CPU, without the capture."""
    from forge_core.generation import decoder

    monkeypatch.setattr(decoder, "LENGTH_BUCKET", 4)  # several attended lengths within a dozen tokens
    model, tok = model_and_tok
    handle = boost_eos(model, tok, 2.0)
    try:
        params = SamplingParams(temperature=1.0, max_new_tokens=12)
        sliced = TorchGenerator(model, tok, params, max_batch=8).generate(PROMPTS, n=4, seed=9)
        fixed = TorchGenerator(model, tok, params, max_batch=8, fixed_shapes=True).generate(PROMPTS, n=4, seed=9)
    finally:
        handle.remove()
    assert [[c.token_ids for c in g] for g in fixed] == [[c.token_ids for c in g] for g in sliced]
    assert len({len(c.token_ids) for g in fixed for c in g}) > 1  # rows were dropped along the way
    for a, b in zip(flatten(fixed), flatten(sliced)):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_chunks_hold_prompts_of_similar_length_and_results_keep_the_call_order(model_and_tok, monkeypatch):
    model, tok = model_and_tok
    prompts = ["1+1=", "Q: 12+34+56+78=", "3=", "Q: 99-100=-", "45+6=", "Q: 1+2+3+4+5+6="]
    gen = TorchGenerator(model, tok, SamplingParams(temperature=1.0, max_new_tokens=4), max_batch=4)
    chunks = []
    run_chunk = gen.generate_chunk
    monkeypatch.setattr(gen, "generate_chunk", lambda ps, *a: chunks.append([len(p) for p in ps]) or run_chunk(ps, *a))
    out = gen.generate(prompts, n=2, seed=4)
    assert chunks == [[2, 4], [5, 11], [15, 15]]  # chunks of token rows, by length (one character, one token)
    assert [c.metadata["prompt_index"] for g in out for c in g] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    monkeypatch.undo()
    alone = [gen.generate([p], n=2, seed=4 + i)[0] for i, p in enumerate(prompts)]
    assert [[c.token_ids for c in g] for g in out] == [[c.token_ids for c in g] for g in alone]


def test_grouped_decode_attention_equals_repeated_heads_without_enable_gqa(monkeypatch):
    """A decode step folds each KV head's query heads into the query length: the same numbers as repeating the
    cache per head, and SDPA is never asked for enable_gqa (which keeps it on the math path)."""
    import torch.nn.functional as F

    from forge_core.generation.decoder import attend

    g = torch.Generator().manual_seed(0)
    q, keys, values = (torch.randn(3, 8, 1, 16, generator=g), torch.randn(3, 2, 10, 16, generator=g),
                       torch.randn(3, 2, 10, 16, generator=g))
    mask = torch.rand(3, 1, 1, 10, generator=g) > 0.3
    mask[:, :, :, 0] = True
    repeated = F.scaled_dot_product_attention(q, keys.repeat_interleave(4, 1), values.repeat_interleave(4, 1),
                                              attn_mask=mask, scale=0.25)
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(k) or real(*a, **k))
    torch.testing.assert_close(attend(q, keys, values, mask, 0.25), repeated, rtol=1e-6, atol=1e-6)
    assert calls and not any(k.get("enable_gqa") for k in calls)


def test_decode_graphs_are_captured_once_per_generator_not_once_per_chunk(model_and_tok, monkeypatch):
    """One decoder per generator keeps its buffers: a graph of (rows, attended length) serves every later chunk and
    compaction of that size. On CPU a stand-in for the capture (it replays by running the step on the same
    buffers) counts captures; the samples equal the fixed-shape decoder without graphs."""
    from forge_core.generation import decoder

    captured = count_captures(monkeypatch)
    monkeypatch.setattr(decoder, "LENGTH_BUCKET", 4)
    model, tok = model_and_tok
    handle = boost_eos(model, tok, 2.0)
    try:
        params = SamplingParams(temperature=1.0, max_new_tokens=12)
        graphs = TorchGenerator(model, tok, params, max_batch=8, fixed_shapes=True)
        graphs._decoder = decoder.StaticCacheDecoder(model, cuda_graphs=True)  # what make_decoder gives on CUDA
        first = graphs.generate(PROMPTS, n=4, seed=9)
        after_first = len(captured)
        second = graphs.generate(PROMPTS, n=4, seed=9)
        plain = TorchGenerator(model, tok, params, max_batch=8, fixed_shapes=True).generate(PROMPTS, n=4, seed=9)
    finally:
        handle.remove()
    assert after_first > 0 and len(captured) == after_first  # the second call captured nothing
    assert len(captured) == len(set(captured))  # each (rows, length) once
    assert all(rows & (rows - 1) == 0 for rows, _ in captured)  # compactions land on powers of two
    for run in (first, second):
        assert [[c.token_ids for c in g] for g in run] == [[c.token_ids for c in g] for g in plain]
