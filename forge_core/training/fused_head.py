"""Logprobs (and entropy) of target tokens through the LM head, chunked over positions with a backward that
recomputes each chunk: no [N, V] logits tensor outlives its chunk, forward or backward.

The plain path (head over every response position, then log_softmax) keeps [B, T, V] logits plus their float32
copies alive until the backward; for a 150k vocabulary at 32 × 1024 tokens that is tens of GB. Here only the hidden
states [N, H], the head weight and two floats per position are saved.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_CHUNK_TOKENS = 512


def compute_dtype_of(t: torch.Tensor) -> torch.dtype:
    """The dtype the head's matmul runs in: autocast's when it is on for t's device, else t's own."""
    device = t.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return t.dtype


class ChunkedHeadLogprobs(torch.autograd.Function):
    """(logprobs [N], entropy [N]) of softmax((hidden @ weight.T + bias) / temperature) at `targets` [N]."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature: float, chunk: int, with_entropy: bool):
        dtype = compute_dtype_of(hidden)
        w = weight.to(dtype)
        lps, lses, ents = [], [], []
        for start in range(0, hidden.shape[0], chunk):
            z = head_chunk(hidden[start:start + chunk], w, bias, dtype, temperature)
            lse = z.logsumexp(-1)
            lps.append(z.gather(-1, targets[start:start + chunk, None]).squeeze(-1) - lse)
            lses.append(lse)
            if with_entropy:  # p = exp(z - lse) written over a copy once, then one product: [n, V] passes cost
                ents.append(lse - ((z - lse[:, None]).exp_() * z).sum(-1))
        lp, lse = torch.cat(lps), torch.cat(lses)
        ent = torch.cat(ents) if with_entropy else lp.new_zeros(0)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent)
        ctx.temperature, ctx.chunk, ctx.dtype, ctx.with_entropy = temperature, chunk, dtype, with_entropy
        ctx.set_materialize_grads(False)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        dtype, chunk, temperature = ctx.dtype, ctx.chunk, ctx.temperature
        w = weight.to(dtype)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) \
            if bias is not None and ctx.needs_input_grad[2] else None
        use_ent = g_ent is not None and ctx.with_entropy
        for start in range(0, hidden.shape[0], chunk):
            sl = slice(start, start + chunk)
            h = hidden[sl]
            z = head_chunk(h, w, bias, dtype, temperature)
            # d lp / dz = onehot(target) - p;  d entropy / dz = -p (log p + entropy). In place where the entropy
            # needs no gradient: each fresh [n, V] float32 tensor costs a pass and its page faults
            if use_ent:
                logp = z - lse[sl, None]
                p = logp.exp()
                gz = torch.zeros_like(z) if g_lp is None else -p * g_lp[sl, None]
                gz -= p * (logp + ent[sl, None]) * g_ent[sl, None]
            elif g_lp is None:
                gz = torch.zeros_like(z)
            else:
                gz = z.sub_(lse[sl, None]).exp_().mul_(-g_lp[sl, None])
            if g_lp is not None:
                gz.scatter_add_(-1, targets[sl, None], g_lp[sl, None].to(gz.dtype))
            if temperature != 1.0:
                gz.div_(temperature)
            gz = gz.to(dtype)
            if grad_h is not None:
                grad_h[sl] = (gz @ w).to(hidden.dtype)
            if grad_w is not None:
                grad_w += (gz.t() @ h.to(dtype)).float()
            if grad_b is not None:
                grad_b += gz.float().sum(0)
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None)


def head_chunk(h: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
               temperature: float) -> torch.Tensor:
    """float32 (at least) logits / temperature [n, V] of hidden states h [n, H] under head weight w [V, H]."""
    z = F.linear(h.to(dtype), w, None if bias is None else bias.to(dtype))
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    return z / temperature if temperature != 1.0 else z


def head_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, temperature: float = 1.0,
                  with_entropy: bool = False, entropy_grad: bool = False, mask: torch.Tensor | None = None,
                  chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs [B, T], entropy [B, T] or None) of targets [B, T] given hidden states [B, T, H] before `head`;
    with `mask` [B, T] only those positions go through the head (the others read 0); entropy carries a gradient
    only with entropy_grad (an entropy bonus in the loss)."""
    b, t, width = hidden.shape
    if mask is None:
        flat_hidden, flat_targets = hidden.reshape(b * t, width), targets.reshape(-1)
    else:
        mask = mask.to(hidden.device).bool()
        flat_hidden, flat_targets = hidden[mask], targets[mask]
    lp, ent = ChunkedHeadLogprobs.apply(flat_hidden, head.weight, head.bias, flat_targets, float(temperature),
                                        chunk_tokens, with_entropy)
    if not entropy_grad:
        ent = ent.detach()
    if mask is None:
        return lp.view(b, t), ent.view(b, t) if with_entropy else None
    spread = lambda x: x.new_zeros(b, t).masked_scatter(mask, x)  # noqa: E731
    return spread(lp), spread(ent) if with_entropy else None
