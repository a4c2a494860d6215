"""Tokens an environment inserted (loss_mask 0) change neither any loss nor its gradients: the same episode with
that span removed gives the same loss, the same gradients on the generated tokens, and none on the span."""

from __future__ import annotations

import pytest
import torch

from forge_core.losses import LOSSES, complete_hyperparameters, get_loss
from forge_core.losses.checks import constructor_signature
from forge_core.training.batching import episodes_to_train_inputs
from forge_core.types import Completion, Episode

T, SPAN = 12, slice(4, 8)  # row 0's tokens 4..7 are a tool result


def loss_and_grad(loss_fn, tensors: dict[str, torch.Tensor], mask: torch.Tensor):
    logprobs = tensors["logprobs"].clone().requires_grad_(True)
    loss = loss_fn(logprobs, tensors["ref"], tensors["adv"], mask, old_logprobs=tensors["old"],
                   num_tokens=mask.sum().item(), num_seqs=float((mask.sum(-1) > 0).sum()))
    loss.backward()
    return loss.detach(), logprobs.grad


def with_span_removed(t: torch.Tensor) -> torch.Tensor:
    """Row 0 without the span's columns, right-padded back to T with zeros."""
    out = torch.zeros_like(t)
    kept = torch.cat([t[0, :SPAN.start], t[0, SPAN.stop:]])
    out[0, :len(kept)] = kept
    out[1:] = t[1:]
    return out


@pytest.mark.parametrize("name", sorted(n for n in LOSSES if n != "sft"))
def test_a_masked_tool_span_changes_neither_the_loss_nor_the_gradients(name):
    g = torch.Generator().manual_seed(0)
    shape = (3, T)
    tensors = {"logprobs": -torch.rand(shape, generator=g) * 2, "ref": -torch.rand(shape, generator=g) * 2,
               "old": -torch.rand(shape, generator=g) * 2, "adv": torch.tensor([1.0, -0.5, 0.3])}
    lengths = [T, 9, 6]
    padding = torch.zeros(shape, dtype=torch.bool)
    for i, n in enumerate(lengths):
        padding[i, :n] = True
    masked = padding.clone()
    masked[0, SPAN] = False
    # garbage where the span is: the environment's tokens have no meaningful logprobs
    for key in ("logprobs", "ref", "old"):
        tensors[key][0, SPAN] = torch.tensor([5.0, -40.0, 0.0, 3.0])
    _, defaults = constructor_signature(LOSSES[name])
    params = complete_hyperparameters(name, {"beta": 0.04} if "beta" in defaults else {}, T)
    loss_fn = get_loss(name, **params)
    loss, grad = loss_and_grad(loss_fn, tensors, masked)

    removed = {k: (with_span_removed(v) if v.dim() == 2 else v) for k, v in tensors.items()}
    short = padding.clone()
    short[0] = False
    short[0, :T - (SPAN.stop - SPAN.start)] = True
    loss_removed, grad_removed = loss_and_grad(get_loss(name, **params), removed, short)

    torch.testing.assert_close(loss, loss_removed, rtol=1e-6, atol=1e-7)
    assert torch.count_nonzero(grad[0, SPAN]) == 0
    torch.testing.assert_close(with_span_removed(grad), grad_removed, rtol=1e-6, atol=1e-8)


def test_episodes_carry_their_loss_mask_into_the_batch():
    multi = Episode("p", "1", [1, 2], Completion("", [5, 6, 7, 8], [-1.0, 0.0, 0.0, -1.0], loss_mask=[1, 0, 0, 1]),
                    advantage=1.0)
    plain = Episode("p", "1", [1, 2], Completion("", [5, 6], [-1.0, -1.0]), advantage=-1.0)
    inputs, targets = episodes_to_train_inputs([multi, plain], pad_id=0)
    assert targets["padding_mask"].tolist() == [[True] * 4, [True, True, False, False]]
    assert targets["loss_mask"].tolist() == [[True, False, False, True], [True, True, False, False]]
    _, single = episodes_to_train_inputs([plain], pad_id=0)
    assert "loss_mask" not in single  # single-turn batches are exactly as before
