"""Sequence packing: a micro-batch's variable-length rows concatenated into as few rows as fit, position ids restarting
at each sequence, so the decoder spends no FLOPs on padding (HF models mask across the packed sequences from the
position ids when no attention mask is given)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedRows:
    """tokens/position_ids [R, C]; sequence b occupies row[b], columns offset[b] .. offset[b] + its length."""

    tokens: torch.Tensor
    position_ids: torch.Tensor
    row: torch.Tensor
    offset: torch.Tensor

    def columns(self, index: torch.Tensor) -> torch.Tensor:
        """Packed-row columns [B, T] of the per-sequence token indices `index` [B, T]."""
        return index + self.offset[:, None].to(index.device)


def pack_sequences(tokens: torch.Tensor, attention_mask: torch.Tensor, capacity: int, pad_id: int) -> PackedRows:
    """Pack right-padded rows tokens [B, L] (real tokens where attention_mask is 1) into rows of `capacity` >= the
    longest one, first-fit by decreasing length (ties in row order, so the packing is deterministic)."""
    lengths = attention_mask.sum(-1).tolist()
    if max(lengths) > capacity:
        raise ValueError(f"pack capacity {capacity} is below the longest sequence ({max(lengths)} tokens)")
    free: list[int] = []  # free columns left in each packed row
    row, offset = [0] * len(lengths), [0] * len(lengths)
    for b in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        slot = next((r for r, room in enumerate(free) if room >= lengths[b]), None)
        if slot is None:
            free.append(capacity)
            slot = len(free) - 1
        row[b], offset[b] = slot, capacity - free[slot]
        free[slot] -= lengths[b]
    packed = torch.full((len(free), capacity), pad_id, dtype=tokens.dtype, device=tokens.device)
    positions = torch.zeros((len(free), capacity), dtype=torch.long, device=tokens.device)
    for b, n in enumerate(lengths):
        packed[row[b], offset[b]:offset[b] + n] = tokens[b, :n]
        positions[row[b], offset[b]:offset[b] + n] = torch.arange(n, device=tokens.device)
    for r, room in enumerate(free):  # the tail is a sequence of its own (positions from 0): attends to nothing real
        positions[r, capacity - room:] = torch.arange(room, device=tokens.device)
    device = tokens.device
    return PackedRows(packed, positions, torch.tensor(row, device=device), torch.tensor(offset, device=device))
