"""Every loss's value and gradient against the published formulas, written here as plain per-sequence loops."""

import math

import pytest
import torch

from forge_core.losses import LOSSES, get_loss

B, T = 5, 7
LENGTHS = [7, 3, 0, 5, 1]  # unequal lengths and one fully masked row


def make_inputs(seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    lp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    # old differs strongly so many tokens are clipped and some ratios exceed 3
    old = lp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * scale
    old[0, 0] = lp[0, 0].item() - 1.5  # r = e^1.5 > 3
    ref = lp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.tensor([1.0, -0.7, 0.4, -1.3, 2.0], dtype=torch.float64)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = True
    # garbage in padded positions must not matter
    lp_data = lp.detach().clone()
    lp_data[~mask] = -1e4
    lp = lp_data.requires_grad_(True)
    return lp, old, ref, adv, mask


def k3(lp, ref):
    return math.exp(ref - lp) - (ref - lp) - 1


def seq_mean_token_mean(per_token_rows):
    rows = [sum(r) / len(r) for r in per_token_rows if r]
    return sum(rows) / len(rows)


def token_mean(per_token_rows):
    flat = [x for r in per_token_rows for x in r]
    return sum(flat) / len(flat)


def rows(fn, lp, old, ref, adv, mask):
    """Apply fn(lp_t, old_t, ref_t, A) to every real token, as autograd-carrying scalars."""
    out = []
    for i in range(B):
        out.append([fn(lp[i, t], old[i, t].item(), ref[i, t].item(), adv[i].item()) for t in range(T) if mask[i, t]])
    return out


def clip(x, lo, hi):
    return torch.clamp(x, lo, hi)


def ref_grpo(lp, old, ref, adv, mask, cl=0.2, ch=0.2, beta=0.0, agg="seq", max_len=None, c=None):
    def tok(x, o, rf, a):
        r = torch.exp(x - o)
        v = torch.maximum(-a * r, -a * clip(r, 1 - cl, 1 + ch))
        if c is not None and a < 0:
            v = torch.minimum(v, torch.tensor(-a * c, dtype=x.dtype))
        return v + beta * (torch.exp(rf - x) - (rf - x) - 1)

    rws = rows(tok, lp, old, ref, adv, mask)
    if agg == "seq":
        return seq_mean_token_mean(rws)
    if agg == "tok":
        return token_mean(rws)
    n_seq = sum(1 for r in rws if r)
    return sum(x for r in rws for x in r) / (n_seq * max_len)


def ref_gspo(lp, old, adv, mask, cl=3e-4, ch=4e-4):
    per_seq = []
    for i in range(B):
        idx = [t for t in range(T) if mask[i, t]]
        if not idx:
            continue
        s = torch.exp(sum(lp[i, t] - old[i, t] for t in idx) / len(idx))
        a = adv[i].item()
        per_seq.append(torch.maximum(-a * s, -a * clip(s, 1 - cl, 1 + ch)))
    return sum(per_seq) / len(per_seq)


def ref_gspo_token(lp, old, adv, mask, cl=3e-4, ch=4e-4):
    out = []
    for i in range(B):
        idx = [t for t in range(T) if mask[i, t]]
        if not idx:
            out.append([])
            continue
        s = math.exp(sum((lp[i, t] - old[i, t]).item() for t in idx) / len(idx))
        a = adv[i].item()
        row = []
        for t in idx:
            st = s * torch.exp(lp[i, t] - lp[i, t].detach())
            row.append(torch.maximum(-a * st, -a * clip(st, 1 - cl, 1 + ch)))
        out.append(row)
    return seq_mean_token_mean(out)


def ref_cispo(lp, old, ref, adv, mask, cl=None, ch=4.0):
    def tok(x, o, rf, a):
        r = math.exp(x.item() - o)
        w = min(r, 1 + ch) if cl is None else min(max(r, 1 - cl), 1 + ch)
        return -w * a * x

    return token_mean(rows(tok, lp, old, ref, adv, mask))


def ref_sapo(lp, old, ref, adv, mask, tp=1.0, tn=1.05):
    def tok(x, o, rf, a):
        tau = tp if a > 0 else tn
        r = torch.exp(x - o)
        return -torch.sigmoid(tau * (r - 1)) * 4 / tau * a

    return seq_mean_token_mean(rows(tok, lp, old, ref, adv, mask))


def ref_reinforce(lp, old, ref, adv, mask, c=None):
    def tok(x, o, rf, a):
        w = 1.0 if c is None else min(math.exp(x.item() - o), c)
        return -a * x * w

    return token_mean(rows(tok, lp, old, ref, adv, mask))


def ref_simple(lp, old, ref, adv, mask, beta=0.1):
    def tok(x, o, rf, a):
        return -(torch.exp(x - x.detach()) * a - beta * (torch.exp(rf - x) - (rf - x) - 1))

    return seq_mean_token_mean(rows(tok, lp, old, ref, adv, mask))


def ref_sft(lp, old, ref, adv, mask):
    return token_mean(rows(lambda x, o, rf, a: -x, lp, old, ref, adv, mask))


CASES = {
    "grpo": ({}, lambda *x: ref_grpo(*x)),
    "grpo_beta_k3": ({"beta": 0.05}, lambda *x: ref_grpo(*x, beta=0.05)),
    "grpo_token_mean": ({"aggregation": "token-mean"}, lambda *x: ref_grpo(*x, agg="tok")),
    "grpo_dual_clip": ({"clip_ratio_c": 1.5}, lambda *x: ref_grpo(*x, c=1.5)),
    "dr_grpo": ({"max_len": 9}, lambda *x: ref_grpo(*x, agg="norm", max_len=9)),
    "dapo": ({}, lambda *x: ref_grpo(*x, ch=0.28, agg="tok")),
    "gspo": ({}, lambda lp, old, ref, adv, mask: ref_gspo(lp, old, adv, mask)),
    "gspo_wide": ({"clip_low": 0.1, "clip_high": 0.2}, lambda lp, o, r, a, m: ref_gspo(lp, o, a, m, 0.1, 0.2)),
    "gspo_token": ({}, lambda lp, old, ref, adv, mask: ref_gspo_token(lp, old, adv, mask)),
    "cispo": ({}, lambda *x: ref_cispo(*x)),
    "cispo_low": ({"clip_low": 0.3, "clip_high": 0.5}, lambda *x: ref_cispo(*x, cl=0.3, ch=0.5)),
    "sapo": ({}, lambda *x: ref_sapo(*x)),
    "reinforce": ({}, lambda *x: ref_reinforce(*x)),
    "reinforce_tis": ({"clip_ratio": 2.0}, lambda *x: ref_reinforce(*x, c=2.0)),
    "simple_grpo": ({}, lambda *x: ref_simple(*x)),
    "sft": ({}, lambda *x: ref_sft(*x)),
}


def loss_name(case):
    for suffix in ("_beta_k3", "_token_mean", "_dual_clip", "_wide", "_low", "_tis"):
        if case.endswith(suffix):
            return case[: -len(suffix)]
    return case


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_value_and_gradient_match_formula(case, seed):
    kwargs, reference = CASES[case]
    lp, old, ref, adv, mask = make_inputs(seed)
    loss = get_loss(loss_name(case), **kwargs)
    got = loss(lp, ref, adv, mask, old_logprobs=old)
    (g_got,) = torch.autograd.grad(got, lp)

    lp2 = lp.detach().clone().requires_grad_(True)
    want = reference(lp2, old, ref, adv, mask)
    (g_want,) = torch.autograd.grad(want, lp2)
    assert torch.isfinite(got)
    assert got.item() == pytest.approx(want.item(), rel=1e-6, abs=1e-12)
    torch.testing.assert_close(g_got, g_want, rtol=1e-6, atol=1e-12)
    assert torch.all(g_got[~mask] == 0), "padding must get no gradient"


def test_inputs_exercise_clipping_and_large_ratios():
    lp, old, ref, adv, mask = make_inputs(0)
    loss = get_loss("grpo")
    loss(lp, ref, adv, mask, old_logprobs=old)
    m = loss.metrics
    assert m["ratio_max"] > 3
    assert m["clip_frac_low"] + m["clip_frac_high"] > 0
    assert 0 <= m["clip_frac_low"] <= 1 and 0 <= m["clip_frac_high"] <= 1


@pytest.mark.parametrize("name", sorted(set(LOSSES) - {"sft", "simple_grpo"}))
def test_on_policy_ratio_is_one(name):
    lp, _, ref, adv, mask = make_inputs(3)
    kwargs = {"max_len": T} if name == "dr_grpo" else {}
    loss = get_loss(name, **kwargs)
    out = loss(lp, None, adv, mask)
    assert torch.isfinite(out)
    assert loss.metrics["ratio_mean"] == pytest.approx(1.0)
    assert loss.metrics["clip_frac_high"] == 0.0


def test_cispo_never_zeroes_gradient():
    lp, old, ref, adv, mask = make_inputs(0, scale=3.0)
    out = get_loss("cispo", clip_low=0.1, clip_high=0.1)(lp, None, adv, mask, old_logprobs=old)
    (g,) = torch.autograd.grad(out, lp)
    assert torch.all(g[mask] != 0)


def test_grpo_clipped_tokens_have_zero_gradient():
    lp, old, ref, adv, mask = make_inputs(0, scale=3.0)
    loss = get_loss("grpo")
    out = loss(lp, None, adv, mask, old_logprobs=old)
    (g,) = torch.autograd.grad(out, lp)
    r = torch.exp(lp.detach() - old)
    a = adv[:, None].expand_as(r)
    clipped = mask & (((r > 1.2) & (a > 0)) | ((r < 0.8) & (a < 0)))
    assert clipped.any()
    assert torch.all(g[clipped] == 0)


def test_gspo_token_equals_gspo_value_with_sequence_advantages():
    lp, old, ref, adv, mask = make_inputs(1, scale=0.0001)
    a = get_loss("gspo")(lp, None, adv, mask, old_logprobs=old)
    b = get_loss("gspo_token")(lp, None, adv, mask, old_logprobs=old)
    assert a.item() == pytest.approx(b.item(), rel=1e-9)


@pytest.mark.parametrize("estimator,fn", [
    ("k1", lambda lp, ref: lp - ref),
    ("k2", lambda lp, ref: 0.5 * (lp - ref) ** 2),
    ("k3", lambda lp, ref: math.exp(ref - lp) - (ref - lp) - 1),
])
def test_kl_estimators(estimator, fn):
    lp, _, ref, adv, mask = make_inputs(2)
    zero_adv = torch.zeros_like(adv)
    loss = get_loss("grpo", beta=1.0, kl_estimator=estimator, aggregation="token-mean")
    out = loss(lp, ref, zero_adv, mask)
    want = [fn(lp[i, t].item(), ref[i, t].item()) for i in range(B) for t in range(T) if mask[i, t]]
    assert out.item() == pytest.approx(sum(want) / len(want), rel=1e-9)
    assert loss.metrics["kl_mean"] == pytest.approx(sum(want) / len(want), rel=1e-9)
