"""Shared-prompt logprobs (`trainer.share_prompts`): the G samples of a GRPO group share their prompt, so the decoder
runs each distinct prompt once, keeps its key/value cache (with gradient), and runs every response against its
prompt's cache. Same logprobs and gradients as the padded batch (to float rounding), with the prompt tokens computed
once per group instead of once per sample: for 8 × 8 rows of a 44-token prompt and 16 response tokens the decoder
sees 1376 tokens instead of 3840.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from forge_core.models.loading import cache_keyword
from forge_core.training.batching import response_lengths
from forge_core.training.fused_head import head_logprobs
from forge_core.training.logprobs import decoder_and_head


@dataclass
class SharedPromptBatch:
    """prompts/prompt_mask [U, P] left-padded distinct prompts; prompt_of [B] row -> its prompt; responses [B, T]
    right-padded response tokens, response_mask [B, T] the real ones."""

    prompts: torch.Tensor
    prompt_mask: torch.Tensor
    prompt_of: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor

    @property
    def prompt_lengths(self) -> torch.Tensor:
        """Real tokens of each distinct prompt [U]."""
        return self.prompt_mask.sum(-1)


def split_shared_prompts(inputs: list[dict], padding_mask: torch.Tensor, pad_id: int) -> SharedPromptBatch:
    """The trainer contract's rows (prompt + response tokens, the response being the last len_i tokens where
    padding_mask [B, T] is set) as distinct prompts and the responses that follow each."""
    if len(inputs) != padding_mask.shape[0]:
        raise ValueError(f"{len(inputs)} inputs but padding_mask has {padding_mask.shape[0]} rows")
    lengths = response_lengths(padding_mask).tolist()
    index: dict[tuple[int, ...], int] = {}
    prompts: list[torch.Tensor] = []
    prompt_of = []
    responses = torch.full(padding_mask.shape, pad_id, dtype=torch.long)
    for i, (x, n) in enumerate(zip(inputs, lengths, strict=True)):
        seq = torch.as_tensor(x["tokens"], dtype=torch.long)
        if n > len(seq) - 1:
            raise ValueError(f"row {i}: response of {n} tokens does not fit in {len(seq)} input tokens (prompt needed)")
        prompt = seq[:len(seq) - n]
        key = tuple(prompt.tolist())
        if key not in index:
            index[key] = len(prompts)
            prompts.append(prompt)
        prompt_of.append(index[key])
        responses[i, :n] = seq[len(seq) - n:]
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for u, p in enumerate(prompts):  # left-padded: every prompt ends at column width - 1, where its cache ends
        tokens[u, width - len(p):] = p
        mask[u, width - len(p):] = 1
    return SharedPromptBatch(tokens, mask, torch.tensor(prompt_of), responses, padding_mask.bool())


def can_share_prompts(model) -> bool:
    """Whether `model` can run its prompts apart from its responses: an HF-style decoder with a separate LM head
    (decoder_and_head) that takes a key/value cache and does not drop it (gradient checkpointing does)."""
    parts = decoder_and_head(model)
    if parts is None:
        return False
    decoder = parts[0]
    return cache_keyword(decoder) is not None and not getattr(decoder, "gradient_checkpointing", False)


def shared_prompt_logprobs(model, batch: SharedPromptBatch, temperature: float = 1.0, with_entropy: bool = False,
                           entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs [B, T], entropy [B, T] or None) of batch.responses under `model` (can_share_prompts), the prompts
    run once each; padded response slots read 0."""
    decoder, head = decoder_and_head(model)
    keyword = cache_keyword(decoder)
    device = next(model.parameters()).device
    prompts, prompt_mask = batch.prompts.to(device), batch.prompt_mask.to(device)
    prompt_of, responses = batch.prompt_of.to(device), batch.responses.to(device)
    prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    first = decoder(input_ids=prompts, attention_mask=prompt_mask, position_ids=prompt_positions, use_cache=True)
    cache = getattr(first, keyword, None)  # the output names the cache as the forward's argument does
    if cache is None:
        raise RuntimeError(f"{type(decoder).__name__} returned no key/value cache; set trainer.share_prompts: false")
    cache.batch_select_indices(prompt_of)  # each row gets its prompt's keys/values; the gradient flows back
    b, t = responses.shape
    # every response slot attends to its prompt and the slots before it; padded slots are read by no real token
    attention = torch.cat([prompt_mask[prompt_of], torch.ones((b, t), dtype=prompt_mask.dtype, device=device)], 1)
    positions = batch.prompt_lengths.to(device)[prompt_of, None] + torch.arange(t, device=device)
    out = decoder(input_ids=responses, attention_mask=attention, position_ids=positions, use_cache=True,
                  **{keyword: cache})
    # response token 0 is predicted by the prompt's last position, token j by response position j - 1
    hidden = torch.cat([first.last_hidden_state[prompt_of, -1:], out.last_hidden_state[:, :-1]], 1)
    return head_logprobs(hidden, head, responses, temperature, with_entropy, entropy_grad,
                         mask=batch.response_mask.to(device))
