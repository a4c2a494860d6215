"""LoRA adapters (forge_core/models/lora.py): merged = unmerged, adapters off = the base model, only adapters
train, the reference policy from the same weights, and the config's refusals."""

from __future__ import annotations

import copy

import pytest
import torch

from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer, save_model_and_tokenizer
from forge_core.models.lora import (
    LoRAConfig,
    LoRALinear,
    adapters_disabled,
    apply_lora,
    merged_state_dict,
    plain_model,
)
from forge_core.training import Trainer, TrainerConfig
from forge_core.training.update import update_policy
from infra.config_checks import load_config
from tests.unit.test_trainer import make_batch

IDS = torch.tensor([[5, 9, 17, 30, 41, 7], [12, 3, 8, 44, 2, 19]])


def lora_model(rank=4, seed=0):
    """(base model, a deep copy with adapters whose B is random, so that the adapters change the output, tok)."""
    base, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=seed)
    wrapped = apply_lora(copy.deepcopy(base), LoRAConfig(rank=rank, alpha=8.0))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in wrapped.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.copy_(0.05 * torch.randn(m.lora_B.shape, generator=g))
    return base.eval(), wrapped.eval(), tok


def logits(model):
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_new_adapters_start_as_the_base_model():
    base, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    wrapped = apply_lora(copy.deepcopy(base), LoRAConfig(rank=8))
    assert torch.equal(logits(base.eval()), logits(wrapped.eval()))  # B = 0
    names = [n for n, m in wrapped.named_modules() if isinstance(m, LoRALinear)]
    assert len(names) == 2 * 7 and all(n.rsplit(".", 1)[-1] in LoRAConfig().target_modules for n in names)


def test_merged_weights_equal_the_adapted_model_and_disabled_adapters_equal_the_base():
    base, wrapped, _ = lora_model()
    adapted = logits(wrapped)
    assert not torch.allclose(adapted, logits(base), atol=1e-3)  # the adapters do something
    merged = plain_model(wrapped)
    assert type(merged) is type(base) and set(merged.state_dict()) == set(base.state_dict())
    torch.testing.assert_close(logits(merged.eval()), adapted, atol=1e-5, rtol=1e-5)
    with adapters_disabled(wrapped):
        assert torch.equal(logits(wrapped), logits(base))
    assert torch.equal(logits(wrapped), adapted)  # on again after the block
    state = merged_state_dict(wrapped)
    assert not any("lora_" in k or ".base." in k for k in state)


def test_only_adapter_parameters_get_gradients():
    _, wrapped, _ = lora_model()
    wrapped.train()
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    wrapped(input_ids=IDS).logits.float().logsumexp(-1).mean().backward()
    for name, p in wrapped.named_parameters():
        assert (p.grad is not None) == (name in trainable), name


def test_a_lora_trainer_steps_the_adapters_only_and_scores_the_reference_as_its_base():
    base, wrapped, tok = lora_model()
    frozen = {n: p.detach().clone() for n, p in wrapped.named_parameters() if not p.requires_grad}
    trainer = Trainer(wrapped, get_loss("grpo", beta=0.1), TrainerConfig(lr=1e-2), tok.pad_token_id)
    trainer.reference_from_base = True
    inputs, targets = make_batch(tok)
    reference = trainer.reference_logprobs(inputs, targets["padding_mask"])
    by_base = Trainer(base, get_loss("grpo"), TrainerConfig(), tok.pad_token_id).proximal_logprobs(
        inputs, targets["padding_mask"])
    assert torch.equal(reference, by_base)
    metrics = update_policy(trainer, inputs, targets, seed=0)  # ref_logprobs None: filled from the base model
    assert metrics["kl_mean"] > 0.0 and trainer.step == 1
    for name, p in wrapped.named_parameters():
        if name in frozen:
            assert torch.equal(p, frozen[name]), name
    assert any(not torch.equal(a, b) for a, b in zip(merged_state_dict(wrapped).values(),
                                                      base.state_dict().values()))


def test_a_saved_lora_model_is_a_plain_hf_directory(tmp_path):
    from transformers import AutoModelForCausalLM

    _, wrapped, tok = lora_model()
    save_model_and_tokenizer(plain_model(wrapped), tok, tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(reloaded), logits(wrapped), atol=1e-5, rtol=1e-5)


def test_lora_settings_are_checked_and_what_cannot_work_yet_is_refused():
    base, _ = load_model_and_tokenizer("tiny:qwen3-micro")
    with pytest.raises(ValueError, match="matches no linear layer.*named"):
        apply_lora(base, LoRAConfig(rank=2, target_modules=["nope"]))
    with pytest.raises(ValueError, match=r"trainer.lora.rank must be an integer >= 0"):
        load_config("configs/grpo_math_tiny.yaml", {"trainer.lora.rank": -1})
    with pytest.raises(ValueError, match=r"trainer.lora.alpha must be a number > 0"):
        load_config("configs/grpo_math_tiny.yaml", {"trainer.lora.rank": 4, "trainer.lora.alpha": 0})
    with pytest.raises(ValueError, match=r"needs trainer.backend: hf"):
        load_config("configs/grpo_math_tiny.yaml", {"trainer.lora.rank": 8, "trainer.backend": "titan"})
    cfg = load_config("configs/grpo_math_tiny.yaml", {"trainer.lora.rank": 8, "loss.beta": 0.04})
    from infra import components as C

    assert cfg.trainer.lora.rank == 8 and not C.needs_reference(cfg) and C.reference_from_base(cfg)


def test_sft_with_lora_saves_a_plain_model_with_the_adapters_merged(tmp_path):
    from safetensors.torch import load_file

    from infra import components as C
    from runtime.sft import sft_phase

    cfg = load_config("configs/grpo_math_tiny.yaml", {"model.path": "tiny:qwen3-micro", "sft.steps": 3,
                                                      "sft.batch_size": 4, "sft.lr": 1e-2, "trainer.lora.rank": 4})
    model, tok = load_model_and_tokenizer(cfg.model.path, seed=0)
    base_q = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    saved = sft_phase(cfg, model, tok, C.build_splits(cfg, tok), tmp_path, show=False)
    weights = load_file(saved / "model.safetensors")
    assert not any("lora_" in k or ".base." in k for k in weights)
    assert not torch.equal(weights["model.layers.0.self_attn.q_proj.weight"], base_q)  # the adapters' change
    torch.testing.assert_close(weights["model.layers.0.self_attn.q_proj.weight"],
                               merged_state_dict(model)["model.layers.0.self_attn.q_proj.weight"])
