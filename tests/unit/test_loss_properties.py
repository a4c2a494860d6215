"""Masking/aggregation invariants (hypothesis), micro-batch equivalence, the registry and custom losses."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forge_core.losses import LOSSES, get_loss

NAMES = sorted(LOSSES)


def build(name, max_len=16):
    return get_loss(name, max_len=max_len) if name == "dr_grpo" else get_loss(name)


def random_batch(seed, b, t, lengths):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 2
    old = lp + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.3
    ref = lp + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    return lp, old, ref, adv, mask


batches = st.integers(1, 6).flatmap(
    lambda b: st.tuples(st.just(b), st.integers(1, 8).flatmap(
        lambda t: st.tuples(st.just(t), st.lists(st.integers(0, t), min_size=b, max_size=b))))
)


@settings(max_examples=30, deadline=None)
@given(spec=batches, seed=st.integers(0, 10_000), name=st.sampled_from(NAMES))
def test_padding_values_and_extra_columns_do_not_matter(spec, seed, name):
    b, (t, lengths) = spec
    lp, old, ref, adv, mask = random_batch(seed, b, t, lengths)
    loss = build(name)
    base = loss(lp, ref, adv, mask, old_logprobs=old)
    # overwrite padding with garbage and append 3 padded columns
    def pad(x, v):
        return torch.cat([torch.where(mask, x, torch.full_like(x, v)), torch.full((b, 3), v, dtype=x.dtype)], 1)
    mask2 = torch.cat([mask, torch.zeros(b, 3, dtype=torch.bool)], 1)
    other = loss(pad(lp, -50.0), pad(ref, 7.0), adv, mask2, old_logprobs=pad(old, 30.0))
    assert torch.isfinite(base)
    torch.testing.assert_close(other, base, rtol=1e-10, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(spec=batches, seed=st.integers(0, 10_000), name=st.sampled_from(NAMES))
def test_row_permutation_invariance(spec, seed, name):
    b, (t, lengths) = spec
    lp, old, ref, adv, mask = random_batch(seed, b, t, lengths)
    perm = torch.randperm(b, generator=torch.Generator().manual_seed(seed))
    loss = build(name)
    a = loss(lp, ref, adv, mask, old_logprobs=old)
    c = loss(lp[perm], ref[perm], adv[perm], mask[perm], old_logprobs=old[perm])
    torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(spec=batches, seed=st.integers(0, 10_000), name=st.sampled_from(NAMES), cut=st.integers(1, 5))
def test_micro_batches_with_global_normalisers_sum_to_full_batch(spec, seed, name, cut):
    b, (t, lengths) = spec
    lp, old, ref, adv, mask = random_batch(seed, b, t, lengths)
    cut = min(cut, b)
    loss = build(name)
    full_lp = lp.clone().requires_grad_(True)
    full = loss(full_lp, ref, adv, mask, old_logprobs=old)
    (g_full,) = torch.autograd.grad(full, full_lp)
    n_tok, n_seq = mask.sum().clamp(min=1).item(), (mask.sum(-1) > 0).sum().clamp(min=1).item()
    part_lp = lp.clone().requires_grad_(True)
    total = sum(
        loss(part_lp[s], ref[s], adv[s], mask[s], old_logprobs=old[s], num_tokens=n_tok, num_seqs=n_seq)
        for s in (slice(0, cut), slice(cut, b)) if s.start < b
    )
    (g_part,) = torch.autograd.grad(total, part_lp)
    torch.testing.assert_close(total, full, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_part, g_full, rtol=1e-10, atol=1e-12)


def test_dapo_micro_batches_with_unequal_token_counts():
    # micro-batch 1 has 3 tokens, micro-batch 2 has 17: a per-micro-batch mean would weight them wrongly
    lp, old, ref, adv, mask = random_batch(7, 4, 10, [1, 2, 10, 7])
    dapo = get_loss("dapo")
    full = dapo(lp, None, adv, mask, old_logprobs=old)
    n = mask.sum().item()
    summed = dapo(lp[:2], None, adv[:2], mask[:2], old_logprobs=old[:2], num_tokens=n) + dapo(
        lp[2:], None, adv[2:], mask[2:], old_logprobs=old[2:], num_tokens=n)
    naive = (dapo(lp[:2], None, adv[:2], mask[:2], old_logprobs=old[:2])
             + dapo(lp[2:], None, adv[2:], mask[2:], old_logprobs=old[2:])) / 2
    assert summed.item() == pytest.approx(full.item(), rel=1e-12)
    assert naive.item() != pytest.approx(full.item(), rel=1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_all_masked_batch_is_zero_not_nan(name):
    lp, old, ref, adv, _ = random_batch(0, 3, 4, [4, 4, 4])
    mask = torch.zeros(3, 4, dtype=torch.bool)
    lp = lp.requires_grad_(True)
    out = build(name)(lp, ref, adv, mask, old_logprobs=old)
    out.backward()
    assert out.item() == 0.0
    assert torch.all(lp.grad == 0)


@pytest.mark.parametrize("shape", ["B", "B1", "BT"])
def test_advantage_shapes_agree(shape):
    lp, old, ref, adv, mask = random_batch(1, 3, 5, [5, 2, 4])
    a = {"B": adv, "B1": adv[:, None], "BT": adv[:, None].expand(3, 5)}[shape]
    for name in NAMES:
        loss = build(name)
        torch.testing.assert_close(loss(lp, ref, a, mask, old_logprobs=old), loss(lp, ref, adv, mask, old_logprobs=old))


def test_unknown_loss_lists_names():
    with pytest.raises(ValueError, match="unknown loss.name 'ppo'.*dapo.*gspo"):
        get_loss("ppo")


def test_bad_hyperparameters_are_named():
    with pytest.raises(ValueError, match="rejected hyperparameters.*clip_hgh"):
        get_loss("grpo", clip_hgh=0.3)
    with pytest.raises(ValueError, match="kl_estimator 'k4'"):
        get_loss("grpo", kl_estimator="k4")
    with pytest.raises(ValueError, match="max_len"):
        get_loss("dr_grpo")


def test_beta_without_reference_is_a_clear_error():
    lp, old, ref, adv, mask = random_batch(1, 2, 3, [3, 3])
    with pytest.raises(ValueError, match="ref_model.enabled"):
        get_loss("grpo", beta=0.1)(lp, None, adv, mask)


def test_shape_mismatch_is_a_clear_error():
    lp, old, ref, adv, mask = random_batch(1, 2, 3, [3, 3])
    with pytest.raises(ValueError, match="padding_mask shape"):
        get_loss("grpo")(lp, None, adv, mask[:, :2])
    with pytest.raises(ValueError, match="advantages must be"):
        get_loss("grpo")(lp, None, adv[:1], mask)


def test_custom_loss_by_import_path():
    lp, old, ref, adv, mask = random_batch(1, 2, 3, [3, 1])
    loss = get_loss("tests.unit.custom_loss_example:ScaledReinforceLoss", scale=2.0)
    want = get_loss("reinforce")(lp, None, adv, mask) * 2.0
    torch.testing.assert_close(loss(lp, None, adv, mask), want)
    assert loss.metrics == {"scale": 2.0}


def test_custom_loss_bad_paths():
    with pytest.raises(ValueError, match="cannot import module 'no_such_pkg.mod'"):
        get_loss("no_such_pkg.mod:Loss")
    with pytest.raises(ValueError, match="has no attribute 'Nope'"):
        get_loss("tests.unit.custom_loss_example:Nope")
