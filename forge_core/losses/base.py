"""Shared pieces of the policy losses: ratios, KL estimators, aggregation over tokens/sequences, diagnostics."""

from __future__ import annotations

import torch
from torch import nn

AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
# standard: the estimator's own gradient (GRPO/DeepSeekMath, TRL, verl); unbiased: the estimator × π_θ/sg(μ), μ the
# behaviour (sampling) policy. With k1 or k3 its expectation over sequences sampled from μ is the gradient of the sum of
# per-position reverse KLs at μ's prefixes, Σ_t E_μ[∇ KL(π_θ(·|y<t) || π_ref(·|y<t))], not the sequence-level KL's
# gradient (which adds the future terms); see PolicyLoss.add_kl
KL_GRADIENTS = ("standard", "unbiased")


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of x over positions where mask is true; masked positions (even NaN/inf) never contribute."""
    zeros = torch.zeros((), dtype=x.dtype, device=x.device)
    x = torch.where(mask, x, zeros)
    return x.sum() if dim is None else x.sum(dim)


def broadcast_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Advantages [B], [B, 1] or [B, T] -> [B, T] matching `like`."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    if advantages.dim() != 2 or advantages.shape[0] != like.shape[0]:
        raise ValueError(
            f"advantages must be [B], [B, 1] or [B, T] with B={like.shape[0]}; got shape {tuple(advantages.shape)}"
        )
    return advantages.to(like.dtype).expand_as(like)


def log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """Per-token log importance ratio [B, T]; on-policy (old None) gives lp - sg(lp): value 0, gradient 1."""
    old = logprobs.detach() if old_logprobs is None else old_logprobs.to(logprobs.dtype)
    diff = logprobs - old
    # zero masked positions so padding garbage cannot overflow exp() or leak NaN into gradients
    return torch.where(mask, diff, torch.zeros_like(diff))


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str, mask: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate [B, T]: k1 = lp-ref, k2 = (lp-ref)^2/2, k3 = exp(ref-lp)-(ref-lp)-1."""
    delta = ref_logprobs.to(logprobs.dtype) - logprobs
    delta = torch.where(mask, delta, torch.zeros_like(delta))
    if estimator == "k1":
        return -delta
    if estimator == "k2":
        return 0.5 * delta.square()
    if estimator == "k3":
        return torch.exp(delta) - delta - 1.0
    raise ValueError(f"unknown kl_estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    max_len: int | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar.

    `num_tokens`/`num_seqs` are the global normalisers of the whole batch when the trainer splits it into
    micro-batches (so the micro-batch losses sum to the full-batch loss); by default this batch's own counts.
    Sequence means count only sequences with at least one real token.
    """
    lengths = mask.sum(-1)
    if mode == "token-mean":
        denom = num_tokens if num_tokens is not None else lengths.sum().clamp(min=1)
        return masked_sum(per_token, mask) / denom
    seq_denom = num_seqs if num_seqs is not None else (lengths > 0).sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        per_seq = masked_sum(per_token, mask, dim=-1) / lengths.clamp(min=1)
        return per_seq.sum() / seq_denom
    if mode == "seq-mean-token-sum-norm":
        if max_len is None:
            raise ValueError("aggregation 'seq-mean-token-sum-norm' needs loss.max_len (usually generator.max_new_tokens)")
        return masked_sum(per_token, mask) / (seq_denom * max_len)
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {AGGREGATIONS}")


def ratio_metrics(ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Detached mean/min/max of a ratio tensor over real tokens, as 0-dim tensors (1 with no real token); no host
    synchronisation (the trainer reads every metric of a step at once)."""
    r, mask = ratio.detach(), mask.bool()
    n = mask.sum()
    one = torch.ones((), dtype=r.dtype, device=r.device)
    mean = masked_sum(r, mask) / n.clamp(min=1)
    low = torch.where(mask, r, torch.full_like(r, float("inf"))).amin()
    high = torch.where(mask, r, torch.full_like(r, float("-inf"))).amax()
    empty = n == 0
    return {"ratio_mean": torch.where(empty, one, mean), "ratio_min": torch.where(empty, one, low),
            "ratio_max": torch.where(empty, one, high)}


def masked_fraction(flags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Fraction of real tokens where `flags` holds, a 0-dim tensor (0 with no real token)."""
    mask = mask.bool()
    return (flags & mask).sum() / mask.sum().clamp(min=1)


class PolicyLoss(nn.Module):
    """Base class: holds the aggregation settings and the `metrics` dict of the last call.

    A loss's hyperparameters are its constructor's keyword arguments; their checks are its `check` classmethod,
    which the constructor calls and the controller calls without building the loss (`check_loss`)."""

    # the advantage estimator a config with this loss gets unless it names one (Dr. GRPO: mean-only advantages)
    implied_advantage: str | None = None

    def __init__(self, aggregation: str = "seq-mean-token-mean", max_len: int | None = None) -> None:
        super().__init__()
        self.check(aggregation=aggregation, max_len=max_len)
        self.aggregation = aggregation
        self.max_len = max_len
        # what the last call measured: 0-dim tensors or floats (the trainer reads them once per optimizer step)
        self.metrics: dict[str, torch.Tensor | float] = {}

    @classmethod
    def check(cls, **hyperparams) -> None:
        """Refuse bad values of the keys every loss family shares: aggregation and max_len, kl_estimator, and a clip
        range (clip_low/clip_high >= 0); a key not given is not checked. Subclasses add their own keys."""
        aggregation = hyperparams.get("aggregation")
        if aggregation is not None and aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown loss.aggregation {aggregation!r}; choose one of {AGGREGATIONS}")
        max_len = hyperparams.get("max_len")
        if aggregation == "seq-mean-token-sum-norm" and (max_len is None or max_len <= 0):
            raise ValueError("aggregation 'seq-mean-token-sum-norm' needs a positive loss.max_len "
                             "(usually generator.max_new_tokens)")
        if "kl_estimator" in hyperparams and hyperparams["kl_estimator"] not in KL_ESTIMATORS:
            raise ValueError(f"unknown loss.kl_estimator {hyperparams['kl_estimator']!r}; choose one of {KL_ESTIMATORS}")
        if "kl_gradient" in hyperparams and hyperparams["kl_gradient"] not in KL_GRADIENTS:
            raise ValueError(f"unknown loss.kl_gradient {hyperparams['kl_gradient']!r}; choose one of {KL_GRADIENTS}")
        clips = [hyperparams.get(k) for k in ("clip_low", "clip_high") if hyperparams.get(k) is not None]
        if any(c < 0 for c in clips):
            raise ValueError(f"loss.clip_low/clip_high must be >= 0; got {hyperparams.get('clip_low')}, "
                             f"{hyperparams.get('clip_high')}")

    def reduce(self, per_token: torch.Tensor, mask: torch.Tensor, num_tokens=None, num_seqs=None) -> torch.Tensor:
        return aggregate(per_token, mask, self.aggregation, self.max_len, num_tokens, num_seqs)

    @staticmethod
    def weigh(per_token: torch.Tensor, token_weights: torch.Tensor | None) -> torch.Tensor:
        """The policy-gradient term of each token times its detached rollout-correction weight [B, T] (TIS)."""
        return per_token if token_weights is None else per_token * token_weights.detach().to(per_token.dtype)

    def add_kl(self, per_token, logprobs, ref_logprobs, mask, beta: float, estimator: str,
               sampler_logprobs: torch.Tensor | None = None) -> torch.Tensor:
        """Add beta * KL(ref) to the per-token loss [B, T] and record `kl_mean`; ref may be None only when beta == 0.
        kl_gradient "unbiased": each token's k is × w = π_θ/sg(μ), μ = `sampler_logprobs` [B, T], the behaviour policy
        that sampled the tokens (None: the current one, w = 1 in value). With k1 or k3 and y ~ μ,
        E[∇ Σ_t w_t k_t] = Σ_t E_{y<t ~ μ}[∇_θ KL(π_θ(·|x, y<t) || π_ref(·|x, y<t))]: per-position reverse KLs at μ's
        prefixes, not ∇ KL(π_θ(·|x) || π_ref(·|x)) of whole sequences (that adds E_π[Σ_t ∇log π_t · Σ_{s>t} k_s])."""
        if ref_logprobs is None:
            if beta != 0.0:
                raise ValueError(
                    f"loss.beta={beta} needs reference logprobs; set ref_model.enabled: true or loss.beta: 0.0"
                )
            return per_token
        kl = kl_penalty(logprobs, ref_logprobs, estimator, mask)
        n = mask.sum().clamp(min=1)
        self.metrics["kl_mean"] = masked_sum(kl.detach(), mask) / n
        if getattr(self, "kl_gradient", "standard") == "unbiased":
            # Given the prefix s_t, E_{a~μ}[∇(π_θ(a)/μ(a) · k(a))] = ∇_θ Σ_a π_θ(a|s_t) k(a, s_t), and for k1 and k3
            # Σ_a π_θ k = KL(π_θ(·|s_t) || π_ref(·|s_t)) (k2: not the KL, so biased). The prefix distribution is μ's and
            # gets no gradient: the future terms of the sequence KL are left out. Exact when a token's coefficient in
            # the aggregation does not depend on the sampled tokens (seq-mean-token-sum-norm); the length means
            # (1/|y|, 1/num_tokens) do depend on them, so there it is not exact. The weight is untruncated: the KL's whole
            # correction (a TIS/MIS weight is for the policy-gradient term); tokens MIS/rejection drop leave it too.
            # Tang & Munos 2025 (arXiv:2506.09477); NeMo-RL's use_on_policy_kl_approximation weighs by
            # π_θ/π_generation (NVIDIA/reinforcer#174, cited in NVIDIA-NeMo/RL#196; with its gradient since
            # NVIDIA-NeMo/RL#2506)
            kl = kl * torch.exp(log_ratio(logprobs, sampler_logprobs, mask))
        return per_token + beta * kl if beta != 0.0 else per_token


def sampling_logprobs(old_logprobs: torch.Tensor | None, behaviour_logprobs: torch.Tensor | None):
    """The logprobs [B, T] of the policy that sampled the tokens, for the unbiased KL's weight: the behaviour ones
    when the trainer passes them (a recomputed proximal policy is not the sampler), else old_logprobs."""
    return behaviour_logprobs if behaviour_logprobs is not None else old_logprobs


def check_shapes(logprobs: torch.Tensor, mask: torch.Tensor, **others: torch.Tensor | None) -> torch.Tensor:
    """Validate [B, T] inputs; returns the mask as bool."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T]; got shape {tuple(logprobs.shape)}")
    if mask.shape != logprobs.shape:
        raise ValueError(f"padding_mask shape {tuple(mask.shape)} != logprobs shape {tuple(logprobs.shape)}")
    for name, t in others.items():
        if t is not None and t.shape != logprobs.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logprobs shape {tuple(logprobs.shape)}")
    return mask.bool()
