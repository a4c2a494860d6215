"""Token sampling: temperature, top-k, top-p, and the logprobs the trainer will reproduce."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingParams:
    """temperature 0 = greedy. Reported logprobs are log_softmax(logits / temperature) of the sampled token
    (before top-k/top-p filtering), which is exactly what the trainer recomputes."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 32

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"generator.temperature must be >= 0; got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"generator.top_p must be in (0, 1]; got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"generator.top_k must be >= 0 (0 = off); got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"generator.max_new_tokens must be >= 1; got {self.max_new_tokens}")


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus to -inf. logits: [B, V]."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


MASK32 = 0xFFFFFFFF
GOLDEN32 = 0x9E3779B9


def mix32(x):
    """Mueller's 32-bit integer hash of x in [0, 2**32): a Python int, or an int64 tensor (elementwise; products
    stay below 2**63, so no overflow on any device)."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & MASK32
    return (x >> 16) ^ x


def stream_keys(seed: int, prompt_keys, n: int) -> list[int]:
    """The random-stream key of each row (row p*n + j: sample j of prompt p). Prompt p is seeded with
    seed + prompt_keys[p], the per-request seed vLLM gets, so a sample depends on its own prompt's seed only."""
    keys = []
    for key in prompt_keys:
        s = (seed + key) % 2**64
        base = mix32(mix32(s & MASK32) ^ (s >> 32))
        keys.extend(mix32(base ^ mix32((j * GOLDEN32 + 1) & MASK32)) for j in range(n))
    return keys


def stream_uniforms(keys: torch.Tensor, t: int) -> torch.Tensor:
    """U[0, 1) float32 [B] for step t of the streams `keys` [B] (int64): counter-based, computed where `keys` lives
    with no generator state, so a row's draw at step t depends on nothing but (key, t)."""
    h = mix32(mix32(keys ^ mix32((t * GOLDEN32 + 7) & MASK32)))
    return (h >> 8).to(torch.float32) * 2.0**-24  # 24 bits: exact in float32, the resolution of its CDF


def sample_next(logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor | None = None):
    """(tokens [B], logprobs [B]) for next-token logits [B, V]: inverse-CDF sampling, one uniform [B] per row
    (`uniforms`: stream_uniforms; None draws from torch's global generator)."""
    logits = logits.float()
    if params.temperature == 0:
        tokens = logits.argmax(-1)
        return tokens, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits / params.temperature
    logprobs = torch.log_softmax(scaled, -1)
    filtered = filter_logits(scaled, params.top_k, params.top_p)
    probs = filtered.softmax(-1) if filtered is not scaled else logprobs.exp()
    if uniforms is None:
        uniforms = torch.rand(probs.shape[0], device=probs.device)
    cdf = probs.cumsum(-1)
    target = (uniforms * cdf[:, -1])[:, None]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)
    # a parallel scan's rounding can land a draw on a token of probability 0 (filtered out): take the mode
    # instead; this happens about once in 2**24 draws and needs no host synchronisation
    picked = probs.gather(-1, tokens[:, None]).squeeze(-1)
    tokens = torch.where(picked > 0, tokens, probs.argmax(-1))
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
