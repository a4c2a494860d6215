import pytest
import torch

from forge_core.models import (
    build_char_tokenizer,
    load_model_and_tokenizer,
    load_tokenizer,
    save_model_and_tokenizer,
)


def test_char_tokenizer_round_trip_and_specials():
    tok = build_char_tokenizer()
    text = "Q: 12+7=\n<answer>19</answer>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.eos_token_id != tok.pad_token_id
    assert tok.decode([tok.eos_token_id] + ids[:2], skip_special_tokens=True) == "Q:"


def test_chat_template_renders_roles():
    tok = build_char_tokenizer()
    text = tok.apply_chat_template([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3


def test_tiny_preset_is_qwen3_with_gqa():
    model, tok = load_model_and_tokenizer("tiny:qwen3-arith")
    cfg = model.config
    assert cfg.model_type == "qwen3" and cfg.hidden_size == 256 and cfg.num_hidden_layers == 4
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    assert cfg.vocab_size == len(tok)
    assert cfg.tie_word_embeddings
    untied, _ = load_model_and_tokenizer("tiny:qwen3-arith-untied")
    assert not untied.config.tie_word_embeddings and untied.config.hidden_size == 256
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()


def test_save_and_load_with_transformers_directly(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=3)
    out = save_model_and_tokenizer(model, tok, tmp_path / "ckpt")
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    again = AutoModelForCausalLM.from_pretrained(out)
    tok2 = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok2("Q: 1+2=", add_special_tokens=False)["input_ids"]])
    torch.testing.assert_close(again(ids).logits, model(ids).logits)
    model3, tok3 = load_model_and_tokenizer(str(out))
    assert tok3.padding_side == "left" and tok3.eos_token_id == tok.eos_token_id
    torch.testing.assert_close(model3(ids).logits, model(ids).logits)


def test_tiny_presets_are_seeded():
    a, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=1)
    b, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=1)
    c, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=2)
    pa, pb, pc = (next(m.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_load_errors_name_the_path(tmp_path):
    with pytest.raises(ValueError, match="unknown tiny preset 'nope'"):
        load_model_and_tokenizer("tiny:nope")
    with pytest.raises(ValueError, match="unknown tiny preset .nope."):
        load_tokenizer("tiny:nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without config.json"):
        load_model_and_tokenizer(str(tmp_path / "empty"))


def test_a_tokenizer_without_a_pad_token_pads_with_its_eos_and_generates(tmp_path):
    from forge_core.generation import SamplingParams, TorchGenerator

    model, tok = load_model_and_tokenizer("tiny:qwen3-micro")
    tok.pad_token = None  # as many pretrained tokenizers ship (Llama 3, GPT-2)
    save_model_and_tokenizer(model, tok, tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token_id == loaded.eos_token_id and loaded.padding_side == "left"
    model2, tok2 = load_model_and_tokenizer(str(tmp_path))
    out = TorchGenerator(model2, tok2, SamplingParams(max_new_tokens=3)).generate(["1+2=", "10+20="], n=2, seed=0)
    assert [len(g) for g in out] == [2, 2] and all(1 <= len(c.token_ids) <= 3 for g in out for c in g)
