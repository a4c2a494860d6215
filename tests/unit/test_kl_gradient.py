"""loss.kl_gradient: the standard KL term's gradient is biased for the reverse KL; `unbiased` (× π/sg(π_sampler))
gives, in expectation over the sampler, autograd's gradient of the exact KL(π || ref) on a tiny categorical."""

from __future__ import annotations

import pytest
import torch

from forge_core.losses import LOSSES, complete_hyperparameters, get_loss
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
