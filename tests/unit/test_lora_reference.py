"""LoRA's KL reference is the model RL starts from on every path: after an in-process SFT warm-up with adapters
(whose adapters are merged before RL adds fresh ones) as after reloading the saved SFT model (the flow, a cache hit)."""

from __future__ import annotations

import copy

import torch

from forge_core.models import load_model_and_tokenizer
from forge_core.models.lora import LoRAConfig, LoRALinear, apply_lora, has_lora
from infra import components as C
from infra.config_checks import load_config
from runtime import inprocess
from runtime.sft import sft_phase
from tests.unit.test_trainer import make_batch

SETTINGS = {"model.path": "tiny:qwen3-micro", "sft.steps": 3, "sft.batch_size": 4, "sft.lr": 3e-2,
            "trainer.lora.rank": 4, "loss.beta": 0.1, "steps": 1, "threads": 1, "eval.num_prompts": 4,
            "eval.samples": 0, "dataset.train_size": 64}


class CapturedLoop:
    """Stands in for GRPOLoop: keeps what grpo_phase built (the trainer, the reference copy) and runs no step."""

    last = None

    def __init__(self, generator, trainer, reward, *args, **kwargs):
        self.trainer, self.ref_model = trainer, args[6]
        CapturedLoop.last = self

    def run(self, on_step):
        return None


def rl_start(cfg, model, tok, splits, monkeypatch):
    """The trainer grpo_phase builds on `model` (no RL step taken)."""
    monkeypatch.setattr(inprocess, "GRPOLoop", CapturedLoop)
    inprocess.grpo_phase(cfg, model, tok, splits, show=False)
    assert CapturedLoop.last.ref_model is None  # LoRA: the trainer scores the reference itself
    return CapturedLoop.last.trainer


def test_in_process_and_reloaded_sft_models_give_rl_the_same_reference(tmp_path, monkeypatch):
    cfg = load_config("configs/grpo_math_tiny.yaml", SETTINGS)
    model, tok = load_model_and_tokenizer(cfg.model.path, seed=cfg.seed, dtype=C.MASTER_DTYPE)
    before_sft = copy.deepcopy(model)
    splits = C.build_splits(cfg, tok)
    saved = sft_phase(cfg, model, tok, splits, tmp_path, show=False)
    inputs, targets = make_batch(tok)
    mask = targets["padding_mask"]

    in_process = rl_start(cfg, model, tok, splits, monkeypatch)  # runtime/inprocess.py: the SFT'd model itself
    reloaded_model, _ = load_model_and_tokenizer(str(saved), seed=cfg.seed, dtype=C.MASTER_DTYPE)
    reloaded = rl_start(cfg, reloaded_model, tok, splits, monkeypatch)  # the flow, an SFT-cache hit
    ref_in_process = in_process.reference_logprobs(inputs, mask)
    ref_reloaded = reloaded.reference_logprobs(inputs, mask)
    torch.testing.assert_close(ref_in_process, ref_reloaded, atol=1e-6, rtol=0)

    # the reference is the SFT model (what RL starts from: fresh adapters change nothing yet), not the model before
    policy = in_process.proximal_logprobs(inputs, mask)
    torch.testing.assert_close(ref_in_process, policy, atol=1e-6, rtol=0)
    base_trainer = rl_start(cfg, before_sft, tok, splits, monkeypatch)
    before = base_trainer.proximal_logprobs(inputs, mask)
    assert (before - ref_in_process).abs().max() > 1e-3  # SFT moved the model, so the test can tell them apart
    # and RL trains only its own fresh adapters (B = 0), none left over from SFT
    fresh = [m for m in in_process.model.modules() if isinstance(m, LoRALinear)]
    assert fresh and all(torch.count_nonzero(m.lora_B) == 0 for m in fresh)


def test_merging_adapters_in_place_gives_the_plain_model_with_the_same_outputs():
    from forge_core.models.lora import merge_lora

    model, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    wrapped = apply_lora(model, LoRAConfig(rank=4, alpha=8.0))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in wrapped.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.copy_(0.05 * torch.randn(m.lora_B.shape, generator=g))
    ids = torch.tensor([[5, 9, 17, 30, 41, 7]])
    with torch.no_grad():
        adapted = wrapped(input_ids=ids).logits
    merged = merge_lora(wrapped)
    assert merged is wrapped and not has_lora(merged)
    assert all(p.requires_grad for p in merged.parameters())  # a plain model, as one loaded from disk
    assert not any("lora_" in k or ".base." in k for k in merged.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted, atol=1e-5, rtol=1e-5)


def test_applying_lora_to_an_adapted_model_merges_the_old_adapters_and_starts_fresh_ones():
    model, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    apply_lora(model, LoRAConfig(rank=4, alpha=8.0))
    name, first = next((n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear))
    with torch.no_grad():
        first.lora_B.fill_(0.1)
    expected = first.base.weight + (first.lora_B @ first.lora_A) * first.scale
    apply_lora(model, LoRAConfig(rank=4, alpha=8.0))
    again = model.get_submodule(name)
    assert isinstance(again, LoRALinear) and not isinstance(again.base, LoRALinear)
    assert torch.count_nonzero(again.lora_B) == 0
    torch.testing.assert_close(again.base.weight, expected.detach())

