"""Per-token logprobs and entropy from a causal LM without keeping a full-vocabulary log_softmax alive."""

from __future__ import annotations

import logging

import torch

from forge_core.training.fused_head import head_logprobs
from forge_core.training.packing import pack_sequences

log = logging.getLogger(__name__)


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """x in float32 when it is of a lower precision (bf16/fp16 logits), unchanged when float32 or float64."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                    chunk_rows: int = 16) -> torch.Tensor:
    """log softmax(logits / temperature)[targets] as [B, T] from logits [B, T, V], computed in row chunks."""
    out = []
    for start in range(0, logits.shape[0], chunk_rows):
        chunk = at_least_fp32(logits[start:start + chunk_rows])
        if temperature != 1.0:
            chunk = chunk / temperature
        picked = chunk.gather(-1, targets[start:start + chunk_rows, :, None]).squeeze(-1)
        out.append(picked - torch.logsumexp(chunk, dim=-1))
    return torch.cat(out, 0)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_rows: int = 16) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) per position, [B, T] from [B, T, V], in row chunks."""
    out = []
    for start in range(0, logits.shape[0], chunk_rows):
        chunk = at_least_fp32(logits[start:start + chunk_rows]) / temperature
        lse = torch.logsumexp(chunk, dim=-1)
        out.append(lse - (chunk.softmax(-1) * chunk).sum(-1))
    return torch.cat(out, 0)


def response_hidden(model, tokens: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
                    pack_pad_id: int | None = None):
    """(hidden states [B, T, H] predicting the tokens at `positions` [B, T], the LM head), or None when the model
    must be run whole (decoder_and_head). With `pack_pad_id`, the rows run packed (forge_core.training.packing)."""
    parts = decoder_and_head(model)
    if parts is None:
        return None
    decoder, head = parts
    return pick_positions(decoder, tokens, attention_mask, positions, pack_pad_id), head


def decoder_and_head(model):
    """(decoder, LM head) of a model whose head can run apart from its decoder (fused with the log-softmax), or None
    when the model must run whole: it picks positions itself (TitanCausalLM), is an FSDP2-sharded root (it gathers
    its embedding and head parameters only inside its own forward), or its head is wrapped or hooked."""
    if hasattr(model, "response_logits"):
        return None
    if hasattr(model, "reshard"):
        # running the decoder and head apart would skip the root's FSDP hooks, which gather the head's shards
        # and reduce its gradients: the model runs whole, full-vocabulary logits included (said once)
        if not getattr(model, "_forgeflow_said_unfused", False):
            log.info("fused LM head off: the model is an FSDP2-sharded root; logits are computed whole")
            model._forgeflow_said_unfused = True
        return None
    decoder, head = getattr(model, "get_decoder", lambda: None)(), model.get_output_embeddings()
    # the fused path reads head.weight itself: a wrapped head (LoRA) or one with hooks must run as a module
    if decoder is None or type(head) is not torch.nn.Linear or head._forward_hooks or head._forward_pre_hooks:
        return None
    return decoder, head


def main_output(out) -> torch.Tensor:
    """A decoder's last hidden state, or a whole model's logits [B, T, ·]."""
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits


def pick_positions(run, tokens, attention_mask, positions, pack_pad_id: int | None = None) -> torch.Tensor:
    """run(...)'s output [B, T, ·] at positions - 1 (what predicts each response token); run is a decoder (last
    hidden state) or a whole model (logits). With `pack_pad_id` the rows are packed into as few as fit."""
    prev = (positions - 1).clamp(min=0)
    if pack_pad_id is None:
        out = main_output(run(input_ids=tokens, attention_mask=attention_mask))
        return out.gather(1, prev[..., None].expand(-1, -1, out.shape[-1]))
    packed = pack_sequences(tokens, attention_mask, tokens.shape[1], pack_pad_id)
    # no attention mask and no cache: HF builds the block-diagonal causal mask from the position ids
    out = main_output(run(input_ids=packed.tokens, position_ids=packed.position_ids, use_cache=False))
    return out[packed.row[:, None], packed.columns(prev)]


def response_logits(model, tokens: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor,
                    pack_pad_id: int | None = None) -> torch.Tensor:
    """Logits [B, T, V] predicting the tokens at `positions` [B, T] (so computed at positions - 1).

    Only the response positions go through the LM head, so prompt positions cost no vocabulary projection.
    """
    if hasattr(model, "response_logits"):  # a model that picks the positions itself (TitanCausalLM)
        return model.response_logits(tokens, attention_mask, (positions - 1).clamp(min=0))
    picked = response_hidden(model, tokens, attention_mask, positions, pack_pad_id)
    if picked is None:
        return pick_positions(model, tokens, attention_mask, positions, pack_pad_id)
    hidden, head = picked
    return head(hidden)


def sequence_logprobs(model, tokens, attention_mask, positions, temperature: float = 1.0,
                      with_entropy: bool = False, entropy_grad: bool = False, pack_pad_id: int | None = None,
                      response_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs [B, T], entropy [B, T] or None) of tokens[b, positions[b, t]] under `model` (inputs are moved to
    the model's device). Where the LM head can be run apart, it runs fused with the log-softmax in chunks of
    positions (forge_core.training.fused_head): no [B, T, V] logits are kept for the backward. With
    `pack_pad_id` (trainer.pack) the rows run packed, without padding; with `response_mask` [B, T] the fused head
    skips padded response slots (they read 0)."""
    device = next(model.parameters()).device
    tokens, attention_mask, positions = tokens.to(device), attention_mask.to(device), positions.to(device)
    targets = tokens.gather(1, positions)
    picked = response_hidden(model, tokens, attention_mask, positions, pack_pad_id)
    if picked is not None:
        return head_logprobs(*picked, targets, temperature, with_entropy, entropy_grad, mask=response_mask)
    logits = response_logits(model, tokens, attention_mask, positions, pack_pad_id)
    lp = gather_logprobs(logits, targets, temperature)
    ent = token_entropy(logits if entropy_grad else logits.detach(), temperature) if with_entropy else None
    return lp, ent
