"""loss.kl_gradient, by exact enumeration. One token: the standard KL term's gradient is biased for the reverse KL,
`unbiased` (× π/sg(μ)) gives, in expectation over the sampler μ, autograd's gradient of the exact KL(π || ref).
Two tokens: that expectation is the gradient of the per-position reverse KLs at μ's prefixes, Σ_t E_μ[∇ KL_t], and
not the sequence-level KL's (which adds the future terms); the weight's μ is the behaviour policy, not a recomputed
proximal one."""

from __future__ import annotations

import pytest
import torch

from forge_core.losses import LOSSES, GRPOLoss, complete_hyperparameters, get_loss
from forge_core.losses.checks import constructor_signature

V = 6
THETA = torch.tensor([0.3, -1.2, 0.8, 0.0, 2.0, -0.4], dtype=torch.float64)
REF = torch.log_softmax(torch.tensor([1.0, 0.2, -0.5, 0.7, 0.1, -1.0], dtype=torch.float64), -1)


def exact_kl_gradient() -> torch.Tensor:
    theta = THETA.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    (logp.exp() * (logp - REF)).sum().backward()
    return theta.grad


def expected_kl_gradient(gradient: str, estimator: str, sampler: torch.Tensor) -> torch.Tensor:
    """E_{y ~ sampler}[∇ KL term of y] with every outcome enumerated: Σ_y q(y) ∇ term(y) (a grpo loss's add_kl)."""
    theta = THETA.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)[:, None]  # one single-token row per outcome: [V, 1]
    loss = get_loss("grpo", beta=1.0, kl_estimator=estimator, kl_gradient=gradient)
    mask = torch.ones(V, 1, dtype=torch.bool)
    terms = loss.add_kl(torch.zeros_like(logp), logp, REF[:, None], mask, 1.0, estimator, sampler[:, None])
    (sampler.exp() * terms[:, 0]).sum().backward()
    return theta.grad


@pytest.mark.parametrize("estimator", ["k1", "k3"])
@pytest.mark.parametrize("off_policy", [False, True])
def test_the_unbiased_kl_gradient_equals_autograd_of_the_exact_kl(estimator, off_policy):
    current = torch.log_softmax(THETA, -1)
    sampler = torch.log_softmax(THETA + torch.tensor([0.5, 0.0, -0.3, 0.2, -0.6, 0.1], dtype=torch.float64), -1) \
        if off_policy else current
    exact = exact_kl_gradient()
    torch.testing.assert_close(expected_kl_gradient("unbiased", estimator, sampler), exact, rtol=1e-10, atol=1e-12)
    standard = expected_kl_gradient("standard", estimator, sampler)
    assert (standard - exact).abs().max() > 1e-2  # the standard term misses the score-function part


def test_the_unbiased_kl_gradient_leaves_the_loss_value_alone_on_policy():
    g = torch.Generator().manual_seed(0)
    logprobs, ref = -torch.rand(2, 5, generator=g), -torch.rand(2, 5, generator=g)
    mask, adv = torch.ones(2, 5, dtype=torch.bool), torch.tensor([1.0, -1.0])
    values = {grad: get_loss("grpo", beta=0.1, kl_gradient=grad)(logprobs, ref, adv, mask, old_logprobs=logprobs)
              for grad in ("standard", "unbiased")}
    torch.testing.assert_close(values["standard"], values["unbiased"])


def test_every_loss_with_a_kl_term_takes_kl_gradient_and_refuses_an_unknown_one():
    with_kl = [name for name, cls in LOSSES.items() if "beta" in constructor_signature(cls)[1]]
    assert len(with_kl) >= 6, with_kl
    for name in with_kl:
        assert "kl_gradient" in constructor_signature(LOSSES[name])[1], name
        with pytest.raises(ValueError, match=r"unknown loss.kl_gradient 'exact'; choose one of \('standard', 'unbiased'\)"):
            get_loss(name, **complete_hyperparameters(name, {"kl_gradient": "exact"}, 8))


# ---- two-token sequences over a vocabulary of V2: every one of the V2² sequences enumerated ----

V2 = 3
SEQS = torch.cartesian_prod(torch.arange(V2), torch.arange(V2))  # [V2², 2]: (y1, y2), row y1 * V2 + y2


def table(seed: int) -> torch.Tensor:
    """Logits of a tabular two-step policy as one vector: first token [V2], then the second given y1 [V2, V2]."""
    return torch.randn(V2 + V2 * V2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


POLICY, REF2, BEHAVIOUR, PROXIMAL = table(1), table(2), table(3), table(4)


def conditionals(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(y1) [V2], log π(y2 | y1) [V2, V2]) of a table."""
    return torch.log_softmax(logits[:V2], -1), torch.log_softmax(logits[V2:].view(V2, V2), -1)


def token_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """Per-token logprobs [V2², 2] of every sequence."""
    first, second = conditionals(logits)
    return torch.stack([first[SEQS[:, 0]], second[SEQS[:, 0], SEQS[:, 1]]], -1)


def kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dimension."""
    return (logp.exp() * (logp - logq)).sum(-1)


def gradient(objective) -> torch.Tensor:
    theta = POLICY.clone().requires_grad_(True)
    objective(theta).backward()
    return theta.grad


def per_position_gradient(sampler: torch.Tensor) -> torch.Tensor:
    """Σ_t E_{y<t ~ sampler}[∇ KL(π(·|y<t) || ref(·|y<t))]: each position's exact KL at the sampler's prefixes,
    which carry no gradient."""
    (ref1, ref2), prefix = conditionals(REF2), conditionals(sampler)[0].exp()

    def objective(theta):
        first, second = conditionals(theta)
        return kl(first, ref1) + (prefix * kl(second, ref2)).sum()
    return gradient(objective)


def sequence_gradient() -> torch.Tensor:
    """∇ KL(π(y1, y2) || ref(y1, y2)) of whole sequences."""
    return gradient(lambda theta: kl(token_logprobs(theta).sum(-1), token_logprobs(REF2).sum(-1)))


def future_term() -> torch.Tensor:
    """E_π[∇log π(y1) · KL(π(·|y1) || ref(·|y1))]: how the first token moves the second position's KL."""
    second_kl = kl(conditionals(POLICY)[1], conditionals(REF2)[1])
    return gradient(lambda theta: (conditionals(theta)[0].exp() * second_kl).sum())


def expected_loss_gradient(name: str, estimator: str, kl_gradient: str, sampler: torch.Tensor,
                           old: torch.Tensor | None, behaviour: torch.Tensor | None) -> torch.Tensor:
    """E_{y ~ sampler}[∇ loss(y)] = Σ_y sampler(y) ∇ loss(y), each sequence one row of a loss's forward (advantages 0:
    only its KL term; aggregation seq-mean-token-sum-norm with max_len 1: the row's token sum; a loss with a fixed
    seq-mean-token-mean (GSPO) gives half of it, every row having two tokens)."""
    options = {"aggregation": "seq-mean-token-sum-norm", "max_len": 1} \
        if "aggregation" in constructor_signature(LOSSES[name])[1] else {}
    loss = get_loss(name, beta=1.0, kl_estimator=estimator, kl_gradient=kl_gradient, **options)
    probs = token_logprobs(sampler).sum(-1).exp() * (2.0 if loss.aggregation == "seq-mean-token-mean" else 1.0)
    ref, mask = token_logprobs(REF2), torch.ones(1, 2, dtype=torch.bool)
    extra = {} if behaviour is None else {"behaviour_logprobs": token_logprobs(behaviour)}

    def objective(theta):
        lp, total = token_logprobs(theta), 0.0
        for i in range(len(SEQS)):
            rows = {k: v[i:i + 1] for k, v in extra.items()}
            value = loss(lp[i:i + 1], ref[i:i + 1], torch.zeros(1, dtype=torch.float64), mask,
                         old_logprobs=None if old is None else token_logprobs(old)[i:i + 1], **rows)
            total = total + probs[i] * value
        return total
    return gradient(objective)


KL_LOSSES = ["grpo", "dr_grpo", "dapo", "cispo", "sapo", "reinforce", "simple_grpo", "gspo", "gspo_token"]


@pytest.mark.parametrize("estimator", ["k1", "k3"])
@pytest.mark.parametrize("name", KL_LOSSES)
def test_on_policy_the_unbiased_kl_gradient_is_the_per_position_one_and_not_the_sequence_kls(name, estimator):
    """Sampled from π itself: E[∇ Σ_t w_t k_t] = Σ_t E_π[∇ KL_t], which misses the sequence KL's future term."""
    got = expected_loss_gradient(name, estimator, "unbiased", POLICY, None, POLICY)
    per_position = per_position_gradient(POLICY)
    torch.testing.assert_close(got, per_position, rtol=1e-10, atol=1e-12)
    sequence = sequence_gradient()
    torch.testing.assert_close(sequence, per_position + future_term(), rtol=1e-10, atol=1e-12)  # the identity
    assert (got - sequence).abs().max() > 1e-2  # the estimator is not the sequence-level KL's gradient
    standard = expected_loss_gradient(name, estimator, "standard", POLICY, None, POLICY)
    assert (standard - per_position).abs().max() > 1e-2  # nor is the standard term the per-position one


@pytest.mark.parametrize("estimator", ["k1", "k3"])
@pytest.mark.parametrize("name", KL_LOSSES)
def test_after_a_proximal_recompute_the_kl_weight_is_the_behaviour_policys(name, estimator):
    """Sampled from the behaviour policy, trained against a recomputed proximal one (old_logprobs): the expectation is
    the per-position gradient at the behaviour policy's prefixes; weighing by the proximal policy (what the loss did
    with old_logprobs alone) is not."""
    got = expected_loss_gradient(name, estimator, "unbiased", BEHAVIOUR, PROXIMAL, BEHAVIOUR)
    want = per_position_gradient(BEHAVIOUR)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert (want - per_position_gradient(POLICY)).abs().max() > 1e-2  # the prefixes' distribution matters
    if name != "simple_grpo":  # simple_grpo ignores old_logprobs
        by_proximal = expected_loss_gradient(name, estimator, "unbiased", BEHAVIOUR, PROXIMAL, None)
        assert (by_proximal - want).abs().max() > 1e-2


class RecordingGRPOLoss(GRPOLoss):
    """GRPO that keeps what each call got as old and behaviour logprobs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []

    def forward(self, logprobs, ref_logprobs, advantages, padding_mask, old_logprobs=None, *, num_tokens=None,
                num_seqs=None, token_weights=None, behaviour_logprobs=None):
        self.calls.append((old_logprobs, behaviour_logprobs))
        return super().forward(logprobs, ref_logprobs, advantages, padding_mask, old_logprobs, num_tokens=num_tokens,
                               num_seqs=num_seqs, token_weights=token_weights, behaviour_logprobs=behaviour_logprobs)


class OldContractGRPOLoss(GRPOLoss):
    """A loss written before behaviour_logprobs: its add_kl can only weigh by old_logprobs."""

    def forward(self, logprobs, ref_logprobs, advantages, padding_mask, old_logprobs=None, *, num_tokens=None,
                num_seqs=None, token_weights=None):
        return super().forward(logprobs, ref_logprobs, advantages, padding_mask, old_logprobs, num_tokens=num_tokens,
                               num_seqs=num_seqs, token_weights=token_weights)


def test_the_update_hands_the_loss_the_behaviour_logprobs_beside_the_recomputed_proximal_ones():
    from forge_core.training.correction import mismatch_metrics
    from forge_core.training.update import update_policy
    from tests.unit.test_policy_update import fresh
    from tests.unit.test_trainer import make_batch

    loss = RecordingGRPOLoss(beta=0.1, kl_gradient="unbiased")
    trainer, tok = fresh(loss, lr=1e-3, recompute_proximal="always", micro_batch_size=64)
    inputs, targets = make_batch(tok)
    targets["ref_logprobs"] = torch.where(targets["padding_mask"], -2.0, 0.0)
    mask = targets["padding_mask"]
    proximal = trainer.proximal_logprobs(inputs, mask)
    metrics = update_policy(trainer, inputs, targets, seed=0)
    (old, behaviour), = loss.calls
    torch.testing.assert_close(behaviour, targets["old_logprobs"])  # the generator's: they sampled the tokens
    torch.testing.assert_close(old, proximal)  # the clip's reference: the recomputed proximal policy
    assert (proximal - targets["old_logprobs"])[mask].abs().min() > 0.1
    # the mismatch is the proximal/behaviour one measured before the step, not measured again by the step
    want = mismatch_metrics(proximal, targets["old_logprobs"], mask)["rollout/behaviour_kl_k3"]
    assert metrics["rollout/behaviour_kl_k3"] == pytest.approx(want, rel=1e-6)
    assert "rollout/behaviour_kl_k3_max" not in metrics

    old_contract, tok = fresh(OldContractGRPOLoss(beta=0.1, kl_gradient="unbiased"), recompute_proximal="always")
    with pytest.raises(ValueError, match="kl_gradient: unbiased weighs the KL by the behaviour policy"):
        update_policy(old_contract, inputs, targets, seed=0)
    old_contract.loss_fn.kl_gradient = "standard"  # a standard KL needs no sampler: the old contract trains
    update_policy(old_contract, inputs, targets, seed=0)
