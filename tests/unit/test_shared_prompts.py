"""trainer.share_prompts: each distinct prompt runs once and its responses run against its cached keys/values; the
logprobs, entropies and gradients equal the padded batch's, and the decoder sees fewer tokens."""

import pytest
import torch

from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer
from forge_core.models.lora import LoRAConfig, apply_lora
from forge_core.training import Trainer, TrainerConfig
from forge_core.training.shared_prompts import can_share_prompts, split_shared_prompts
from infra.config_checks import load_config


def grouped_batch(groups, seed=0):
    """Trainer inputs of GRPO groups: (prompt length, [response lengths]) each; the rows of a group share a prompt."""
    g = torch.Generator().manual_seed(seed)
    inputs, lengths = [], []
    for prompt_len, responses in groups:
        prompt = torch.randint(2, 100, (prompt_len,), generator=g)
        for n in responses:
            inputs.append({"tokens": torch.cat([prompt, torch.randint(2, 100, (n,), generator=g)])})
            lengths.append(n)
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    return inputs, mask


GROUPS = [(5, [3, 7, 1, 7]), (9, [2, 4]), (3, [6, 6, 5])]  # prompts of different lengths, ragged responses


def test_split_finds_each_distinct_prompt_once():
    inputs, mask = grouped_batch(GROUPS + [GROUPS[0]])  # the same prompt in two groups (seeded alike) counts once
    inputs[-4:] = inputs[:4]
    mask[-4:] = mask[:4]
    batch = split_shared_prompts(inputs, mask, pad_id=0)
    assert batch.prompt_of.tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 2, 0, 0, 0, 0]
    assert batch.prompt_lengths.tolist() == [5, 9, 3]
    assert batch.prompts[2, :6].tolist() == [0] * 6  # left-padded: every prompt ends in the last column
    for i, x in enumerate(inputs):
        n = int(mask[i].sum())
        assert batch.responses[i, :n].tolist() == x["tokens"][-n:].tolist()
    with pytest.raises(ValueError, match="prompt needed"):
        split_shared_prompts([{"tokens": torch.tensor([5, 6])}], torch.ones(1, 2, dtype=torch.bool), 0)


def logprobs_and_grads(model, tok, inputs, mask, share: bool, dtype=None):
    trainer = Trainer(model, get_loss("grpo"), TrainerConfig(share_prompts=share), tok.pad_token_id,
                      compute_dtype=dtype)
    model.zero_grad(set_to_none=True)
    lp, ent = trainer.logprobs(inputs, mask, with_entropy=True)
    (lp * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent, grads


BF16_EPS = 2.0 ** -7  # bfloat16's machine epsilon: 8 significand bits


def relative_errors(got: dict, want: dict) -> dict[str, float]:
    """‖got - want‖ / ‖want‖ of each parameter's gradient."""
    assert got.keys() == want.keys()
    return {n: ((got[n] - want[n]).norm() / want[n].norm()).item() for n in want}


def assert_gradients_match(got: dict, want: dict, tol: float) -> None:
    worst = max(relative_errors(got, want).items(), key=lambda kv: kv[1])
    assert worst[1] <= tol, f"{worst[0]}: relative error {worst[1]:.3g} > {tol:.3g}"


# fp32: both paths do the same arithmetic in another order, a few float32 roundings apart (measured ≤ 7e-7 relative);
# bf16: each path rounds its activations to bf16 (relative error ~ eps each), so the two differ by up to ~2 eps
# relative to a gradient's norm (measured ≤ 0.0077 = 0.98 eps); logprobs: fp32 log-softmax of bf16 logits
TOLERANCES = {None: {"logprobs": 1e-5, "gradients": 1e-5}, torch.bfloat16: {"logprobs": BF16_EPS, "gradients": 2 * BF16_EPS}}


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_shared_prompt_logprobs_and_gradients_equal_padded_ones(dtype):
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    inputs, mask = grouped_batch(GROUPS)
    lp0, ent0, g0 = logprobs_and_grads(model, tok, inputs, mask, share=False, dtype=dtype)
    lp1, ent1, g1 = logprobs_and_grads(model, tok, inputs, mask, share=True, dtype=dtype)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(lp1[mask], lp0[mask], rtol=0, atol=tol["logprobs"])
    torch.testing.assert_close(ent1[mask], ent0[mask], rtol=0, atol=tol["logprobs"])
    assert (lp1[~mask] == 0).all()  # padded response slots read 0, as on the padded path
    assert_gradients_match(g1, g0, tol["gradients"])


def test_the_bf16_gradient_check_fails_on_a_wrong_gradient():
    """What the bf16 tolerance lets through: not a 3% error (a wrong normaliser), which the former atol 0.3 accepted,
    nor the gradient of a batch missing one response token."""
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    inputs, mask = grouped_batch(GROUPS)
    _, _, padded = logprobs_and_grads(model, tok, inputs, mask, share=False, dtype=torch.bfloat16)
    _, _, shared = logprobs_and_grads(model, tok, inputs, mask, share=True, dtype=torch.bfloat16)
    scaled = {n: 1.03 * g for n, g in shared.items()}
    assert all(torch.allclose(padded[n], scaled[n], atol=0.3, rtol=1e-3) for n in padded)  # the former check
    one_token_less = mask.clone()
    one_token_less[1, 3] = False
    _, _, missing = logprobs_and_grads(model, tok, inputs, one_token_less, share=True, dtype=torch.bfloat16)
    for wrong in (scaled, missing):
        with pytest.raises(AssertionError, match="relative error"):
            assert_gradients_match(wrong, padded, TOLERANCES[torch.bfloat16]["gradients"])


def test_lora_adapters_get_the_same_gradients_shared_or_not():
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    apply_lora(model, LoRAConfig(rank=4, alpha=8))
    for p in model.parameters():  # non-zero B so that the adapters change the outputs
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    inputs, mask = grouped_batch(GROUPS, seed=3)
    lp0, _, g0 = logprobs_and_grads(model, tok, inputs, mask, share=False)
    lp1, _, g1 = logprobs_and_grads(model, tok, inputs, mask, share=True)
    assert torch.allclose(lp0[mask], lp1[mask], atol=1e-5)
    assert g0.keys() == g1.keys() and all("lora" in n for n in g0)
    assert all(torch.allclose(g0[n], g1[n], atol=1e-4) for n in g0)


def test_shared_prompts_runs_fewer_decoder_tokens():
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    seen = []
    model.get_decoder().register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].numel()),
                                                  with_kwargs=True)
    inputs, mask = grouped_batch([(20, [4] * 8), (18, [4] * 8)])
    for share in (False, True):
        seen.clear()
        logprobs_and_grads(model, tok, inputs, mask, share=share)
        tokens = sum(seen)
        if not share:
            padded = tokens
    assert padded == 16 * 24 and tokens == 2 * 20 + 16 * 4  # 2 prompts once each, then 16 responses


def test_models_that_cannot_share_run_the_padded_path():
    model, _ = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    assert can_share_prompts(model)
    model.get_decoder().gradient_checkpointing = True  # HF drops the cache under gradient checkpointing
    assert not can_share_prompts(model)


def test_share_prompts_is_on_for_rl_and_can_be_turned_off():
    from infra.components import trainer_arguments

    cfg = load_config("configs/grpo_math_tiny.yaml", {})
    assert trainer_arguments(cfg)[0].share_prompts and not trainer_arguments(cfg, sft=True)[0].share_prompts
    off = load_config("configs/grpo_math_tiny.yaml", {"trainer.share_prompts": False})
    assert not trainer_arguments(off)[0].share_prompts
