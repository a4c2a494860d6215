"""Decoding back-ends for TorchGenerator: a lean Llama/Qwen-family decoder over the model's own modules with a
preallocated KV cache, and a generic fallback through the HF forward with its cache for other architectures."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

FAST_MODEL_TYPES = ("qwen3", "qwen2", "llama")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StaticCacheDecoder:
    """Runs the model's layers directly with a [layers, B, kv_heads, S_max, D] KV cache (no per-step mask building).

    Reuses the model's parameters (no copy), so weights loaded into the model are used on the next call.
    """

    def __init__(self, model) -> None:
        cfg = model.config
        if cfg.model_type not in FAST_MODEL_TYPES:
            raise ValueError(f"StaticCacheDecoder supports {FAST_MODEL_TYPES}, not {cfg.model_type!r}")
        self.model = model
        self.base = model.model
        self.num_heads = cfg.num_attention_heads
        self.num_kv = cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.supports_select = True
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.key_valid: torch.Tensor | None = None
        self.length = 0

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [B, 1, S, D] for integer positions [B, S] (same arithmetic as the HF rotary module)."""
        rotary = self.base.rotary_emb
        freqs = positions[..., None].float() * rotary.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = getattr(rotary, "attention_scaling", 1.0)
        return (emb.cos() * scale).to(dtype)[:, None], (emb.sin() * scale).to(dtype)[:, None]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """Run ids [B, S] at cache offset self.length; attn_mask [B, 1, S, length+S]; returns last logits [B, V]."""
        b, s = ids.shape
        h = self.base.embed_tokens(ids)
        cos, sin = self.rope(positions, h.dtype)
        start, end = self.length, self.length + s
        for i, layer in enumerate(self.base.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(b, s, self.num_heads, self.head_dim)
            k = attn.k_proj(x).view(b, s, self.num_kv, self.head_dim)
            v = attn.v_proj(x).view(b, s, self.num_kv, self.head_dim).transpose(1, 2)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.k_cache[i, :, :, start:end] = k
            self.v_cache[i, :, :, start:end] = v
            out = F.scaled_dot_product_attention(
                q, self.k_cache[i, :, :, :end], self.v_cache[i, :, :, :end], attn_mask=attn_mask,
                scale=attn.scaling, enable_gqa=self.num_kv != self.num_heads,
            )
            h = h + attn.o_proj(out.transpose(1, 2).reshape(b, s, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        self.length = end
        return self.model.lm_head(self.base.norm(h[:, -1]))

    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, repeat: int) -> torch.Tensor:
        """Encode left-padded prompts [B, P] once, then repeat the cache `repeat` times; returns logits [B*repeat, V]."""
        b, p = ids.shape
        total = p + max_new_tokens
        param = next(self.model.parameters())
        shape = (len(self.base.layers), b, self.num_kv, total, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=param.dtype, device=param.device)
        self.v_cache = torch.zeros(shape, dtype=param.dtype, device=param.device)
        self.length = 0
        valid = attention_mask.bool()
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.tril(torch.ones(p, p, dtype=torch.bool, device=ids.device))
        # padded query rows attend to themselves so no row is fully masked (their outputs are never used)
        mask = (causal[None] & valid[:, None, :]) | torch.eye(p, dtype=torch.bool, device=ids.device)[None]
        logits = self.forward(ids, positions, mask[:, None])
        if repeat > 1:
            self.k_cache = self.k_cache.repeat_interleave(repeat, dim=1)
            self.v_cache = self.v_cache.repeat_interleave(repeat, dim=1)
            logits = logits.repeat_interleave(repeat, dim=0)
            valid = valid.repeat_interleave(repeat, dim=0)
        self.key_valid = torch.zeros(valid.shape[0], total, dtype=torch.bool, device=ids.device)
        self.key_valid[:, :p] = valid
        self.next_position = valid.long().sum(-1)
        return logits

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append one token per row [B]; returns next logits [B, V]."""
        self.key_valid[:, self.length] = True
        mask = self.key_valid[:, None, None, : self.length + 1]
        logits = self.forward(tokens[:, None], self.next_position[:, None], mask)
        self.next_position = self.next_position + 1
        return logits

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` of the batch (drop finished sequences so they cost nothing)."""
        self.k_cache = self.k_cache[:, rows]
        self.v_cache = self.v_cache[:, rows]
        self.key_valid = self.key_valid[rows]
        self.next_position = self.next_position[rows]


class HFCacheDecoder:
    """Fallback for any HF causal LM: the model's own forward with its dynamic KV cache."""

    def __init__(self, model) -> None:
        self.model = model
        self.past = None
        self.supports_select = False
        # transformers >= 5.x names the cache argument `cache`; older releases call it `past_key_values`
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"

    def prefill(self, ids, attention_mask, max_new_tokens: int, repeat: int) -> torch.Tensor:
        if repeat > 1:
            ids, attention_mask = ids.repeat_interleave(repeat, 0), attention_mask.repeat_interleave(repeat, 0)
        self.attention_mask = attention_mask.long()
        positions = (self.attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=self.attention_mask, position_ids=positions, use_cache=True)
        self.past = getattr(out, self.cache_arg)
        self.next_position = self.attention_mask.sum(-1)
        return out.logits[:, -1]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        ones = torch.ones_like(self.attention_mask[:, :1])
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)
        out = self.model(input_ids=tokens[:, None], attention_mask=self.attention_mask,
                         position_ids=self.next_position[:, None], use_cache=True, **{self.cache_arg: self.past})
        self.past = getattr(out, self.cache_arg)
        self.next_position = self.next_position + 1
        return out.logits[:, -1]



def make_decoder(model, prefer_fast: bool = True):
    """The fastest decoder that supports this model."""
    if prefer_fast and getattr(model.config, "model_type", None) in FAST_MODEL_TYPES:
        return StaticCacheDecoder(model)
    return HFCacheDecoder(model)
