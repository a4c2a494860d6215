"""trainer.pack: sequences packed into shared rows give the padded batch's logprobs and gradients."""

import pytest
import torch

from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer
from forge_core.training import Trainer, TrainerConfig, collate
from forge_core.training.packing import pack_sequences
from infra.config_checks import load_config


def test_first_fit_by_decreasing_length():
    lengths = [5, 3, 2, 4]
    tokens = torch.zeros(4, 5, dtype=torch.long)
    mask = torch.zeros(4, 5, dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.arange(1, n + 1) + 10 * b
        mask[b, :n] = 1
    packed = pack_sequences(tokens, mask, 6, pad_id=-1)
    assert packed.row.tolist() == [0, 2, 1, 1] and packed.offset.tolist() == [0, 0, 4, 0]
    assert packed.tokens.tolist() == [[1, 2, 3, 4, 5, -1], [31, 32, 33, 34, 21, 22], [11, 12, 13, -1, -1, -1]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0], [0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 1, 2]]
    with pytest.raises(ValueError, match="below the longest sequence"):
        pack_sequences(tokens, mask, 4, pad_id=-1)


def batch_of(tok, lengths, seed=0):
    """Trainer inputs: prompt + response rows of different lengths, and their padding mask."""
    g = torch.Generator().manual_seed(seed)
    inputs, t = [], max(r for _, r in lengths)
    mask = torch.zeros(len(lengths), t, dtype=torch.bool)
    for i, (prompt, response) in enumerate(lengths):
        inputs.append({"tokens": torch.randint(2, 100, (prompt + response,), generator=g)})
        mask[i, :response] = True
    return inputs, mask


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_packed_logprobs_and_gradients_equal_padded_ones(dtype):
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    inputs, mask = batch_of(tok, [(4, 9), (7, 2), (3, 5), (2, 1), (6, 7)])
    grads = {}
    for pack in (False, True):
        config = TrainerConfig(pack=pack, share_prompts=False)
        trainer = Trainer(model, get_loss("grpo"), config, tok.pad_token_id, compute_dtype=dtype)
        model.zero_grad(set_to_none=True)
        lp, ent = trainer.logprobs(inputs, mask, with_entropy=True)
        (lp * mask).sum().backward()
        grads[pack] = (lp.detach(), ent, {n: p.grad.clone() for n, p in model.named_parameters()})
    (lp0, ent0, g0), (lp1, ent1, g1) = grads[False], grads[True]
    tol = 1e-5 if dtype is None else 2e-2
    assert torch.allclose(lp0[mask], lp1[mask], atol=tol) and torch.allclose(ent0[mask], ent1[mask], atol=tol)
    for name in g0:
        assert torch.allclose(g0[name], g1[name], atol=tol * 10), name
    batch = collate(inputs, mask, tok.pad_token_id)
    packed = pack_sequences(batch.tokens, batch.attention_mask, batch.tokens.shape[1], tok.pad_token_id)
    assert packed.tokens.numel() < batch.tokens.numel()  # fewer token slots than the padded batch


def test_pack_is_an_hf_backend_knob():
    assert load_config("configs/grpo_math_tiny.yaml", {"trainer.pack": True}).trainer.pack
