import pytest
import torch

from forge_core.generation import SamplingParams, TorchGenerator, filter_logits
from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer
from forge_core.training import Trainer, TrainerSettings, episodes_to_train_inputs
from forge_core.types import Episode

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
        assert tok.pad_token_id not in c.token_ids
        if c.stop_reason == "eos":
            assert c.token_ids[-1] == tok.eos_token_id and tok.eos_token_id not in c.token_ids[:-1]
        else:
            assert len(c.token_ids) == 16 and tok.eos_token_id not in c.token_ids
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
        trainer = Trainer(model, get_loss("grpo"), TrainerSettings(temperature=temperature), tok.pad_token_id)
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
