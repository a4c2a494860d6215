"""The chunked LM head + log-softmax: exact values and gradients, no [N, V] tensor kept for the backward."""

import pytest
import torch

from forge_core.models import load_model_and_tokenizer
from forge_core.training.fused_head import ChunkedHeadLogprobs, head_logprobs
from forge_core.training.logprobs import gather_logprobs, sequence_logprobs, token_entropy


def plain(hidden, head, targets, temperature):
    logits = head(hidden)
    return gather_logprobs(logits, targets, temperature), token_entropy(logits, temperature)


@pytest.mark.parametrize("bias", [False, True])
def test_gradients_match_finite_differences_in_float64(bias):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True) if bias else None
    targets = torch.randint(11, (7,), generator=g)
    fn = lambda h, w, bb: ChunkedHeadLogprobs.apply(h, w, bb, targets, 0.7, 3, True)  # noqa: E731 (chunks 3+3+1)
    assert torch.autograd.gradcheck(fn, (hidden, weight, b))


def test_values_and_gradients_equal_the_plain_head():
    g = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(3, 9, 16, generator=g, requires_grad=True)
    targets = torch.randint(50, (3, 9), generator=g)
    weights = torch.randn(3, 9, generator=g)
    lp, ent = head_logprobs(hidden, head, targets, 0.8, with_entropy=True, entropy_grad=True, chunk_tokens=4)
    ((lp * weights).sum() + 0.1 * ent.sum()).backward()
    got = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    want_lp, want_ent = plain(hidden, head, targets, 0.8)
    ((want_lp * weights).sum() + 0.1 * want_ent.sum()).backward()
    assert torch.allclose(lp, want_lp, atol=1e-5) and torch.allclose(ent, want_ent, atol=1e-5)
    assert torch.allclose(got[0], hidden.grad, atol=1e-5) and torch.allclose(got[1], head.weight.grad, atol=1e-5)


def test_entropy_without_entropy_grad_adds_no_gradient():
    head = torch.nn.Linear(8, 20, bias=False)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    targets = torch.randint(20, (2, 5))
    lp, ent = head_logprobs(hidden, head, targets, with_entropy=True, entropy_grad=False)
    assert not ent.requires_grad
    lp.sum().backward()
    with_ent = hidden.grad.clone()
    hidden.grad = None
    head_logprobs(hidden, head, targets)[0].sum().backward()
    assert torch.equal(with_ent, hidden.grad)


def saved_shapes(fn):
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
        fn()
    return shapes


def test_the_trainer_path_keeps_no_vocabulary_sized_activation():
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    vocab = model.config.vocab_size
    tokens = torch.randint(2, vocab, (4, 12))
    mask = torch.ones_like(tokens)
    positions = torch.arange(6, 12).expand(4, -1)
    fused = saved_shapes(lambda: sequence_logprobs(model, tokens, mask, positions, 0.9, with_entropy=True))
    assert fused and not [s for s in fused if s[-1] == vocab]
    head = model.lm_head.register_forward_hook(lambda *_: None)  # a hooked head runs as a module: the plain path
    try:
        hooked = saved_shapes(lambda: sequence_logprobs(model, tokens, mask, positions, 0.9, with_entropy=True))
    finally:
        head.remove()
    assert [s for s in hooked if s[-1] == vocab]  # the plain path does keep [B, T, V] logits


def test_bf16_autocast_tracks_the_float32_head():
    g = torch.Generator().manual_seed(2)
    head = torch.nn.Linear(32, 64, bias=False)
    hidden = torch.randn(2, 6, 32, generator=g, requires_grad=True)
    targets = torch.randint(64, (2, 6), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = head_logprobs(hidden, head, targets)
    lp.sum().backward()
    want, _ = plain(hidden.detach(), head, targets, 1.0)
    assert lp.dtype == torch.float32 and head.weight.grad.dtype == torch.float32
    assert 0 < (lp - want).abs().max() < 0.1  # bf16 matmul: close, not equal


def test_masked_positions_skip_the_head_and_keep_the_gradients():
    g = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(8, 30, bias=False)
    hidden = torch.randn(3, 5, 8, generator=g, requires_grad=True)
    targets = torch.randint(30, (3, 5), generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    lp, ent = head_logprobs(hidden, head, targets, with_entropy=True, entropy_grad=True, mask=mask)
    (lp.sum() + ent.sum()).backward()
    got = hidden.grad.clone()
    hidden.grad = None
    full_lp, full_ent = head_logprobs(hidden, head, targets, with_entropy=True, entropy_grad=True)
    ((full_lp * mask).sum() + (full_ent * mask).sum()).backward()
    assert torch.equal(lp[~mask], torch.zeros(int((~mask).sum()))) and torch.allclose(lp[mask], full_lp[mask])
    assert torch.allclose(ent[mask], full_ent[mask]) and torch.allclose(got, hidden.grad, atol=1e-6)
    assert torch.equal(got[~mask], torch.zeros_like(got[~mask]))  # padded slots get no gradient
