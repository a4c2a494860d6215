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


def exponential_noise(rows: int, vocab: int, generator: torch.Generator | None, device=None) -> torch.Tensor:
    """Exp(1) noise [rows, vocab]; drawn for every row of the original batch so a row's sample does not depend on
    which other rows are still decoding."""
    return torch.empty(rows, vocab, device=device).exponential_(generator=generator)


def sample_next(logits: torch.Tensor, params: SamplingParams, noise: torch.Tensor | None = None):
    """(tokens [B], logprobs [B]) for next-token logits [B, V]; `noise` [B, V] Exp(1) draws (exponential race:
    argmax p/E is a sample from p)."""
    logits = logits.float()
    if params.temperature == 0:
        tokens = logits.argmax(-1)
        return tokens, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    scaled = logits / params.temperature
    logprobs = torch.log_softmax(scaled, -1)
    filtered = filter_logits(scaled, params.top_k, params.top_p)
    probs = filtered.softmax(-1) if filtered is not scaled else logprobs.exp()
    if noise is None:
        noise = exponential_noise(*probs.shape, None, probs.device)
    tokens = (probs / noise).argmax(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
