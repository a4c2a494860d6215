"""VLLMGenerator's contract, checked against a CPU stand-in for vllm.LLM (tests/unit/vllm_stand_in.py)."""

import torch

from forge_core.generation import SamplingParams, TorchGenerator
from forge_core.generation.vllm_generator import VLLMGenerator
from forge_core.models import load_model_and_tokenizer
from infra.weightsync import FSWeightStore
from tests.unit.vllm_stand_in import StandInLLM, StandInSamplingParams

PARAMS = SamplingParams(temperature=0.9, top_p=0.95, top_k=0, max_new_tokens=6)


def adapter(seed=0):
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=seed)
    return VLLMGenerator(StandInLLM(model, tok), tok, PARAMS, StandInSamplingParams), model, tok


def test_samples_logprobs_and_finish_reasons_are_mapped():
    gen, model, tok = adapter()
    prompts = ["1+2=", "7-3="]
    got = gen.generate(prompts, n=3, seed=11)
    reference = TorchGenerator(model, tok, PARAMS)
    for i, (prompt, comps) in enumerate(zip(prompts, got)):
        assert len(comps) == 3
        want = reference.generate([prompt], n=3, seed=11 + i)[0]  # one request per prompt, seed + index
        assert [c.token_ids for c in comps] == [w.token_ids for w in want]
        assert [c.logprobs for c in comps] == [w.logprobs for w in want]  # the sampled token's, not another's
        assert [c.stop_reason for c in comps] == [w.stop_reason for w in want]
    sent = gen.llm.requests[0]
    assert (sent.n, sent.max_tokens, sent.top_k, sent.logprobs, sent.seed) == (3, 6, -1, 0, 11)


def test_weights_are_replaced_in_place_from_the_store(tmp_path):
    gen, _, tok = adapter(seed=0)
    trained, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=1)  # "the trainer's" different weights
    store = FSWeightStore(tmp_path)
    store.publish(5, trained.state_dict())
    gen.load_weights_file(store.path_for(5), 5)
    assert gen.policy_version == 5 and gen.llm.prefix_resets == 1
    got = gen.generate(["2+2="], n=2, seed=3)[0]
    want = TorchGenerator(trained, tok, PARAMS).generate(["2+2="], n=2, seed=3)[0]
    assert [c.token_ids for c in got] == [w.token_ids for w in want]
    assert all(c.policy_version == 5 for c in got)
    for name, value in trained.state_dict().items():
        assert torch.equal(gen.llm.worker.model_runner.model.torch_model.state_dict()[name], value)


def test_prompts_go_to_vllm_as_token_ids_so_it_adds_no_bos_of_its_own():
    """vLLM tokenizes a text prompt with the tokenizer's special tokens (a BOS where it adds one); the adapter
    sends the ids the trainer trains on instead. With a tokenizer that adds a BOS, text would differ."""
    from tokenizers.processors import TemplateProcessing

    gen, _, tok = adapter()
    bos = tok.convert_tokens_to_ids("<|endoftext|>")
    tok._tokenizer.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    assert tok("1+2=")["input_ids"][0] == bos  # what vLLM would sample from, given the text
    prompts = ["1+2=", "7-3="]
    gen.generate(prompts, n=1, seed=0)
    assert gen.llm.prompt_rows == [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    given = [[5, 6, 7], [8, 9]]  # ids from the caller (the rollout's single tokenization) are sent as given
    gen.generate(prompts, n=1, seed=0, prompt_ids=given)
    assert gen.llm.prompt_rows[-2:] == given
