"""TitanCausalLM (torchtitan Qwen3/Llama3 definitions) computes what the HF model computes, in HF layout in and out."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from forge_core.models import load_model_and_tokenizer
from forge_core.models.titan import TitanCausalLM, architecture_of, titan_from_hf
from infra.config_checks import load_config


def tiny_llama(rope: dict) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, rope_parameters=rope, pad_token_id=0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return LlamaForCausalLM(config)


LLAMA_ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
}


def hf_models():
    qwen3, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    return {"qwen3": qwen3, **{f"llama-{k}": tiny_llama(v) for k, v in LLAMA_ROPES.items()}}


@pytest.mark.parametrize("name", ["qwen3", "llama-default", "llama3"])
def test_titan_logits_and_hf_round_trip_equal_hf(name):
    hf = hf_models()["llama-llama3" if name == "llama3" else name]
    titan = titan_from_hf(hf)
    tokens = torch.randint(1, hf.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (hf(input_ids=tokens).logits - titan(input_ids=tokens).logits).abs().max().item()
    assert diff < 1e-5
    back = titan.to_hf_state_dict()
    assert set(back) == set(hf.state_dict())
    assert all(torch.equal(back[k], v) for k, v in hf.state_dict().items())


def test_titan_gradients_equal_hf_including_the_pad_row():
    # an untrained policy can sample the pad token; HF's embedding gives its row no lookup gradient, titan must too
    hf = hf_models()["qwen3"]
    titan = titan_from_hf(hf)
    tokens = torch.randint(1, hf.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    tokens[0, 5] = hf.config.pad_token_id
    grads = []
    for model, name in ((hf, "model.embed_tokens.weight"), (titan, "decoder.tok_embeddings.weight")):
        model(input_ids=tokens).logits.float().logsumexp(-1).sum().backward()
        grads.append(dict(model.named_parameters())[name].grad)
    assert (grads[0] - grads[1]).abs().max().item() < 1e-4


def test_titan_response_logprobs_skip_the_prompt_and_equal_hf():
    from forge_core.training.logprobs import sequence_logprobs

    hf = hf_models()["llama-default"]  # untied: the head's own gradient is checked too
    titan = titan_from_hf(hf)
    tokens = torch.randint(1, 100, (2, 30), generator=torch.Generator().manual_seed(2))
    attention = torch.ones_like(tokens)
    positions = torch.tensor([list(range(22, 30)), [25, 26, 27, 28, 29, 29, 29, 29]])  # the responses
    head_rows = []
    titan.decoder.lm_head.register_forward_hook(lambda _m, inputs, _out: head_rows.append(inputs[0].shape[1]))
    out = {}
    for name, model, head in ((("hf", hf, "lm_head.weight"), ("titan", titan, "decoder.lm_head.weight"))):
        lp, _ = sequence_logprobs(model, tokens, attention, positions)
        lp.sum().backward()
        out[name] = (lp.detach(), dict(model.named_parameters())[head].grad)
    assert head_rows == [8]  # the head saw the 8 response positions, not the 30 of the sequence
    assert (out["hf"][0] - out["titan"][0]).abs().max().item() < 1e-5
    assert (out["hf"][1] - out["titan"][1]).abs().max().item() < 1e-5


def test_titan_keeps_dtype_and_the_complex_rope_cache():
    hf = hf_models()["llama-default"].to(torch.bfloat16)
    titan = titan_from_hf(hf)
    assert {p.dtype for p in titan.parameters()} == {torch.bfloat16}
    assert any(b.is_complex() for b in titan.buffers())  # Module.to(dtype) would have cast it to real


def test_titan_refuses_left_padding_and_unknown_architectures():
    titan = titan_from_hf(hf_models()["qwen3"])
    tokens = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="right-padded"):
        titan(input_ids=tokens, attention_mask=torch.tensor([[0, 1, 1, 1]]))
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="trainer.backend: hf"):
        architecture_of(GPT2Config())
    with pytest.raises(ValueError, match="tied embeddings"):
        TitanCausalLM(LlamaConfig(tie_word_embeddings=True, num_hidden_layers=1, hidden_size=64,
                                  intermediate_size=64, num_attention_heads=4, vocab_size=32))


@pytest.mark.parametrize("overrides, message", [
    ({"trainer.backend": "titan", "trainer.procs": 4, "trainer.pipeline_parallel_degree": 2,
      "trainer.tensor_parallel_degree": 2}, "not supported yet; use one of them"),
    ({"trainer.backend": "titan", "trainer.procs": 3, "trainer.pipeline_parallel_degree": 2}, "must equal"),
    ({"trainer.backend": "titan", "trainer.procs": 3, "trainer.tensor_parallel_degree": 2}, "must equal"),
    ({"trainer.backend": "titan", "trainer.procs": 4, "trainer.data_parallel_shard_degree": 3}, "must equal"),
    ({"trainer.tensor_parallel_degree": 2, "trainer.procs": 2}, "need trainer.backend: titan"),
    ({"trainer.backend": "titan", "trainer.activation_checkpointing": "some"}, "activation_checkpointing"),
])
def test_titan_layout_errors_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("configs/grpo_math_tiny.yaml", overrides)


def test_titan_layout_accepts_fsdp_times_tp():
    cfg = load_config("configs/grpo_math_tiny.yaml", {"trainer.backend": "titan", "trainer.procs": 4,
                                                      "trainer.tensor_parallel_degree": 2})
    from workers.plan import titan_layout

    assert titan_layout(cfg) == " (FSDP 2 x TP 2, activation checkpointing none)"
    cfg = load_config("configs/grpo_math_tiny.yaml", {"trainer.backend": "titan", "trainer.procs": 4,
                                                      "trainer.pipeline_parallel_degree": 2})
    assert titan_layout(cfg) == " (FSDP 2 x TP 1 x PP 2, activation checkpointing none)"


def test_sft_phase_with_titan_backend_equals_hf_backend(tmp_path):
    from infra import components as C
    from runtime.sft import sft_phase

    saved = {}
    for backend in ("hf", "titan"):
        cfg = load_config("configs/grpo_math_tiny.yaml", {"model.path": "tiny:qwen3-micro", "sft.steps": 3,
                                                          "sft.batch_size": 8, "trainer.backend": backend})
        model, tok = load_model_and_tokenizer(cfg.model.path, seed=0)
        before = model.state_dict()["model.norm.weight"].clone()
        path = sft_phase(cfg, model, tok, C.build_splits(cfg, tok), tmp_path / backend, show=False)
        saved[backend], _ = load_model_and_tokenizer(str(path))
        assert not torch.equal(model.state_dict()["model.norm.weight"], before)  # the HF model got the new weights
    a, b = saved["hf"].state_dict(), saved["titan"].state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
