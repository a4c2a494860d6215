"""Trainer speed knobs on an HF model: full activation checkpointing and per-layer torch.compile change no numbers."""

import pytest
import torch

from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer
from forge_core.training import Trainer, TrainerConfig
from forge_core.training.speed import prepare_for_training
from infra.config_checks import load_config


def one_step_grads(model, tokens):
    """Gradients of a plain next-token loss over `tokens` [B, S] (a fresh copy of the grads)."""
    model.zero_grad(set_to_none=True)
    model.train()
    logits = model(input_ids=tokens).logits
    torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_full_activation_checkpointing_recomputes_layers_with_the_same_gradients():
    tokens = torch.randint(2, 100, (3, 16), generator=torch.Generator().manual_seed(0))
    plain, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    checkpointed, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    prepare_for_training(checkpointed, "full")
    assert checkpointed.model.layers[0].gradient_checkpointing and not plain.model.layers[0].gradient_checkpointing
    calls = []
    # a pre-hook: the recompute stops early once the last saved tensor it needs is back, before forward hooks
    hook = checkpointed.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    got = one_step_grads(checkpointed, tokens)
    hook.remove()
    want = one_step_grads(plain, tokens)
    assert len(calls) == 2  # forward, then again in the backward: the activations were not kept
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-6), name


def test_compiled_layers_train_like_eager_ones():
    pytest.importorskip("torch._inductor")
    tokens = torch.randint(2, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    eager, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    compiled, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    prepare_for_training(compiled, compile_layers=True)
    assert all(layer._compiled_call_impl is not None for layer in compiled.model.layers)
    got, want = one_step_grads(compiled, tokens), one_step_grads(eager, tokens)
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-4), name
    assert set(compiled.state_dict()) == set(eager.state_dict())  # checkpoints keep their names


def test_knobs_are_checked_against_the_backend():
    with pytest.raises(ValueError, match="selective needs trainer.backend: titan"):
        load_config("configs/grpo_math_tiny.yaml", {"trainer.activation_checkpointing": "selective"})
    cfg = load_config("configs/grpo_math_tiny.yaml", {"trainer.activation_checkpointing": "full",
                                                        "trainer.compile": True})
    assert cfg.trainer.compile is True
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    with pytest.raises(ValueError, match="an HF model supports none or full"):
        prepare_for_training(model, "selective")
    # the in-process trainer takes the prepared model as it is
    trainer = Trainer(prepare_for_training(model, "full"), get_loss("grpo"), TrainerConfig(), tok.pad_token_id)
    assert trainer.model.model.layers[0].gradient_checkpointing
