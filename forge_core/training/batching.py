"""Turn the trainer contract's inputs/targets into padded tensors, and episodes into that contract."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from forge_core.types import Episode


@dataclass
class PolicyBatch:
    """tokens/attention_mask [B, L] right-padded; positions [B, T] index of each response token in `tokens`."""

    tokens: torch.Tensor
    attention_mask: torch.Tensor
    positions: torch.Tensor
    response_mask: torch.Tensor


def response_lengths(padding_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real response token + 1 per row [B] (0 for an empty row)."""
    t = padding_mask.shape[1]
    idx = torch.arange(1, t + 1, device=padding_mask.device).expand_as(padding_mask)
    return torch.where(padding_mask.bool(), idx, torch.zeros_like(idx)).max(-1).values


def collate(inputs: list[dict], padding_mask: torch.Tensor, pad_id: int) -> PolicyBatch:
    """Right-pad `inputs[i]["tokens"]` (prompt + response); the response is the last len_i tokens of each row."""
    if len(inputs) != padding_mask.shape[0]:
        raise ValueError(f"{len(inputs)} inputs but padding_mask has {padding_mask.shape[0]} rows")
    lengths = response_lengths(padding_mask)
    seqs = [torch.as_tensor(x["tokens"], dtype=torch.long) for x in inputs]
    width = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    t = padding_mask.shape[1]
    positions = torch.zeros((len(seqs), t), dtype=torch.long)
    for i, s in enumerate(seqs):
        n = int(lengths[i])
        if n > len(s) - 1:
            raise ValueError(f"row {i}: response of {n} tokens does not fit in {len(s)} input tokens (prompt needed)")
        tokens[i, :len(s)] = s
        attn[i, :len(s)] = 1
        start = len(s) - n
        positions[i] = (start + torch.arange(t)).clamp(max=len(s) - 1)
    return PolicyBatch(tokens, attn, positions, padding_mask.bool())


def episode_advantages(episodes: list[Episode], t: int) -> torch.Tensor:
    """[B] advantages, or [B, T] when any episode has per-token ones (env.credit: turn; the others' broadcast)."""
    scalar = torch.tensor([e.advantage for e in episodes])
    if all(e.token_advantages is None for e in episodes):
        return scalar
    out = scalar.unsqueeze(1).repeat(1, t)
    for i, e in enumerate(episodes):
        if e.token_advantages is not None:
            out[i, :len(e.token_advantages)] = torch.tensor(e.token_advantages)
    return out


def episodes_to_train_inputs(episodes: list[Episode], pad_id: int) -> tuple[list[dict], dict]:
    """Trainer contract (inputs, targets) from scored episodes: prompt + completion tokens, advantages, logprobs."""
    t = max(1, max(len(e.completion.token_ids) for e in episodes))
    b = len(episodes)
    response = torch.full((b, t), pad_id, dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.bool)
    old = torch.zeros((b, t))
    ref = torch.zeros((b, t)) if all(e.ref_logprobs is not None for e in episodes) else None
    # multi-turn episodes: tokens an environment inserted are part of the row but never of the loss
    masked = any(e.completion.loss_mask is not None for e in episodes)
    keep = torch.zeros((b, t), dtype=torch.bool) if masked else None
    inputs = []
    for i, e in enumerate(episodes):
        ids = e.completion.token_ids
        n = len(ids)
        response[i, :n] = torch.tensor(ids, dtype=torch.long)
        mask[i, :n] = True
        old[i, :n] = torch.tensor(e.completion.logprobs)
        if ref is not None:
            ref[i, :n] = torch.tensor(e.ref_logprobs)
        if keep is not None:
            keep[i, :n] = torch.tensor(e.completion.loss_mask, dtype=torch.bool) if e.completion.loss_mask else True
        inputs.append({"tokens": torch.tensor(e.prompt_ids + ids, dtype=torch.long)})
    targets = {
        "response": response, "padding_mask": mask, "old_logprobs": old, "ref_logprobs": ref,
        "advantages": episode_advantages(episodes, t),
    }
    if keep is not None:
        targets["loss_mask"] = keep
    return inputs, targets
