"""VLLMGenerator's contract, checked against a CPU stand-in for vllm.LLM (tests/unit/vllm_stand_in.py) that behaves
like vLLM V1 where it differs from TorchGenerator; the adapter is built by its own from_pretrained."""

import sys

import pytest
import torch

from forge_core.generation import SamplingParams, TorchGenerator
from forge_core.generation.vllm_generator import VLLMGenerator
from forge_core.models import load_model_and_tokenizer
from infra.weightsync import FSWeightStore
from tests.unit.vllm_stand_in import StandInLLM, StandInSamplingParams, stand_in_vllm_module

# RL samples the whole distribution (top_p 1: vLLM's logprobs then equal the trainer's at the temperature)
PARAMS = SamplingParams(temperature=0.9, top_p=1.0, top_k=0, max_new_tokens=6)


def adapter(tmp_path, monkeypatch, seed=0):
    """VLLMGenerator.from_pretrained on a tiny checkpoint on disk, `vllm` being the stand-in module."""
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=seed)
    path = tmp_path / f"ckpt-{seed}"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    monkeypatch.setitem(sys.modules, "vllm", stand_in_vllm_module())
    gen = VLLMGenerator.from_pretrained(str(path), PARAMS, seed=seed)
    return gen, gen.llm.model, gen.tokenizer


def test_samples_logprobs_and_finish_reasons_are_mapped(tmp_path, monkeypatch):
    gen, model, tok = adapter(tmp_path, monkeypatch)
    prompts = ["1+2=", "7-3="]
    got = gen.generate(prompts, n=3, seed=11)
    reference = TorchGenerator(model, tok, PARAMS)
    for i, (prompt, comps) in enumerate(zip(prompts, got)):
        assert len(comps) == 3
        want = reference.generate([prompt], n=3, seed=11 + i)[0]  # one request per prompt, seed + index
        assert [c.token_ids for c in comps] == [w.token_ids for w in want]
        for c, w in zip(comps, want, strict=True):  # the sampled token's, at the temperature (not raw)
            assert c.logprobs == pytest.approx(w.logprobs, abs=1e-5)
        assert [c.stop_reason for c in comps] == [w.stop_reason for w in want]
    sent = gen.llm.requests[0]
    assert (sent.n, sent.max_tokens, sent.top_k, sent.logprobs, sent.seed) == (3, 6, -1, 0, 11)
    assert sent.stop_token_ids == reference.end_ids  # every end id, as TorchGenerator stops on


def test_weights_are_replaced_in_place_from_the_store(tmp_path, monkeypatch):
    """By a method name of the worker extension: vLLM V1 refuses to send a Python function."""
    gen, _, tok = adapter(tmp_path, monkeypatch, seed=0)
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


def test_prompts_go_to_vllm_as_token_ids_so_it_adds_no_bos_of_its_own(tmp_path, monkeypatch):
    """vLLM tokenizes a text prompt with the tokenizer's special tokens (a BOS where it adds one); the adapter
    sends the ids the trainer trains on instead. With a tokenizer that adds a BOS, text would differ."""
    from tokenizers.processors import TemplateProcessing

    gen, _, tok = adapter(tmp_path, monkeypatch)
    bos = tok.convert_tokens_to_ids("<|endoftext|>")
    tok._tokenizer.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    assert tok("1+2=")["input_ids"][0] == bos  # what vLLM would sample from, given the text
    prompts = ["1+2=", "7-3="]
    gen.generate(prompts, n=1, seed=0)
    assert gen.llm.prompt_rows == [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    given = [[5, 6, 7], [8, 9]]  # ids from the caller (the rollout's single tokenization) are sent as given
    gen.generate(prompts, n=1, seed=0, prompt_ids=given)
    assert gen.llm.prompt_rows[-2:] == given


def test_the_stand_in_refuses_what_vllm_v1_refuses(tmp_path, monkeypatch):
    """What the adapter must avoid, as the stand-in shows: raw logprobs differ from the trainer's at temperature
    0.9, and a Python function cannot go through collective_rpc without insecure serialization."""
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    raw = VLLMGenerator(StandInLLM(model, tok), tok, PARAMS, StandInSamplingParams)
    got = raw.generate(["1+2="], n=1, seed=5)[0][0]
    want = TorchGenerator(model, tok, PARAMS).generate(["1+2="], n=1, seed=5)[0][0]
    assert got.token_ids == want.token_ids and max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs)) > 1e-3
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    with pytest.raises(TypeError, match="VLLM_ALLOW_INSECURE_SERIALIZATION"):
        raw.llm.collective_rpc(lambda worker: 0)


def test_vllm_with_top_p_below_one_is_refused_at_load():
    from infra.config_checks import load_config

    with pytest.raises(ValueError, match=r"generator.backend vllm with generator.top_p = 0.9 .* set generator.top_p: "
                                         r"1.0 and generator.top_k: 0"):
        load_config("configs/grpo_qwen3_1_7b.yaml", {"generator.top_p": 0.9})


def test_multi_turn_episodes_run_on_the_vllm_adapter(tmp_path, monkeypatch):
    """The token layer needs `end_ids` and token-in prompts: the calculator episodes of a vLLM generator equal the
    TorchGenerator's (greedy)."""
    from forge_core.data.problems import Problem
    from forge_core.envs import EnvConfig
    from forge_core.envs.episodes import sample_env_groups

    gen, model, tok = adapter(tmp_path, monkeypatch)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    problems = [Problem("12*34=", "12*34=408", "408"), Problem("56*78=", "56*78=4368", "4368")]
    config = EnvConfig(name="calculator", max_turns=2, max_tokens=40)
    ours = sample_env_groups(gen, problems, 2, 3, greedy, config)
    torch_groups = sample_env_groups(TorchGenerator(model, tok, greedy), problems, 2, 3, greedy, config)
    for a, b in zip(ours, torch_groups, strict=True):
        for x, y in zip(a.episodes, b.episodes, strict=True):
            assert x.completion.token_ids == y.completion.token_ids and x.completion.loss_mask == y.completion.loss_mask
