"""Decoding back-ends for TorchGenerator: a lean Llama/Qwen-family decoder over the model's own modules with a
preallocated KV cache, and a generic fallback through the HF forward with its cache for other architectures."""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from forge_core.models.loading import cache_keyword

FAST_MODEL_TYPES = ("qwen3", "qwen2", "llama")
# held while a CUDA graph is captured: other threads (the weight-broadcast receiver) take it around their device
# allocations, which would otherwise land in the capture
GRAPH_CAPTURE = threading.Lock()
LENGTH_BUCKET = 64  # fixed-shape decode attends over the cache up to the next multiple of this


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class KVArena:
    """The fixed-shape decoder's persistent buffers: storage for `slots` cached positions (rows × length), kept for
    the decoder's life and laid out as k/v [layers, rows, kv_heads, length, head_dim] (+ valid [rows, length] and
    position [rows]) for the chunk at hand. One storage serves chunks of every shape: it takes the largest chunk's
    rows × length, not the most rows of any chunk × the longest length of any. A layout is a view at fixed
    addresses, so graphs captured on it stay valid while the storage lives."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, slots: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.dims, self.slots = (layers, kv_heads, head_dim), slots
        self.k_store = torch.zeros(layers * slots * kv_heads * head_dim, dtype=dtype, device=device)
        self.v_store = torch.zeros_like(self.k_store)
        self.valid_store = torch.zeros(slots, dtype=torch.bool, device=device)
        self.position_store = torch.zeros(slots, dtype=torch.long, device=device)
        self.write_at = torch.zeros(1, dtype=torch.long, device=device)
        self.length = 0  # positions per row of the layout in use (0: none yet)
        self.k = self.v = self.valid = self.position = None  # the layout's views (lay_out)

    def holds(self, rows: int, total: int) -> bool:
        """Whether the layout in use has `rows` rows of at least `total` positions."""
        return self.length >= total and rows * self.length <= self.slots

    def lay_out(self, length: int) -> None:
        """View the storage as rows of `length` positions (as many rows as fit)."""
        layers, kv_heads, head_dim = self.dims
        rows = self.slots // length
        size = layers * rows * kv_heads * length * head_dim
        self.k = self.k_store[:size].view(layers, rows, kv_heads, length, head_dim)
        self.v = self.v_store[:size].view(layers, rows, kv_heads, length, head_dim)
        self.valid = self.valid_store[:rows * length].view(rows, length)
        self.position = self.position_store[:rows]
        self.length = length


class StaticCacheDecoder:
    """Runs the model's layers directly with a [layers, B, kv_heads, S_max, D] KV cache (no per-step mask building).

    Reuses the model's parameters (no copy), so weights loaded into the model are used on the next call.
    """

    def __init__(self, model, fixed_shapes: bool = False, cuda_graphs: bool = False,
                 length_bucket: int | None = None) -> None:
        cfg = model.config
        if cfg.model_type not in FAST_MODEL_TYPES:
            raise ValueError(f"StaticCacheDecoder supports {FAST_MODEL_TYPES}, not {cfg.model_type!r}")
        self.model = model
        # fixed shapes: a decode step writes the cache at a position held on the device and attends over the cache
        # up to a multiple of length_bucket, so its shapes repeat and it can be captured as a CUDA graph
        self.fixed_shapes = fixed_shapes or cuda_graphs
        self.graphs = DecodeGraphs(self) if cuda_graphs else None
        self.length_bucket = length_bucket or LENGTH_BUCKET
        self.base = model.model
        self.num_heads = cfg.num_attention_heads
        self.num_kv = cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.supports_select = True
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.arena: KVArena | None = None  # fixed shapes: buffers kept across chunks (into_arena)
        self.kv_budget: int | None = None  # bytes the arena may take (reserve_for), None: no limit
        self.key_valid: torch.Tensor | None = None
        self.length = 0

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [B, 1, S, D] for integer positions [B, S] (same arithmetic as the HF rotary module)."""
        rotary = self.base.rotary_emb
        freqs = positions[..., None].float() * rotary.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = getattr(rotary, "attention_scaling", 1.0)
        return (emb.cos() * scale).to(dtype)[:, None], (emb.sin() * scale).to(dtype)[:, None]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, attn_mask: torch.Tensor,
                write_at: torch.Tensor | None = None, kv_len: int | None = None) -> torch.Tensor:
        """Run ids [B, S] at cache offset self.length (or, fixed shapes, at the device position `write_at` [1]
        attending over the first kv_len slots); attn_mask [B, 1, S, keys]; returns last logits [B, V]."""
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
            if write_at is None:
                self.k_cache[i, :, :, start:end] = k
                self.v_cache[i, :, :, start:end] = v
                keys, values = self.k_cache[i, :, :, :end], self.v_cache[i, :, :, :end]
            else:
                self.k_cache[i].index_copy_(2, write_at, k)
                self.v_cache[i].index_copy_(2, write_at, v)
                keys, values = self.k_cache[i, :, :, :kv_len], self.v_cache[i, :, :, :kv_len]
            out = attend(q, keys, values, attn_mask, attn.scaling)
            h = h + attn.o_proj(out.transpose(1, 2).reshape(b, s, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        if write_at is None:
            self.length = end
        return self.model.lm_head(self.base.norm(h[:, -1]))

    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int, repeat: int) -> torch.Tensor:
        """Encode left-padded prompts [B, P] once, then repeat the cache `repeat` times; returns logits [B*repeat, V]."""
        b, p = ids.shape
        total = p + max_new_tokens
        param = next(self.model.parameters())
        # fixed shapes: the prompts' cache is only passed on into the persistent buffers, so it holds the prompts
        shape = (len(self.base.layers), b, self.num_kv, p if self.fixed_shapes else total, self.head_dim)
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
            logits = logits.repeat_interleave(repeat, dim=0)
            valid = valid.repeat_interleave(repeat, dim=0)
        if self.fixed_shapes:
            self.into_arena(self.k_cache, self.v_cache, valid, repeat, total)
        else:
            if repeat > 1:
                self.k_cache = self.k_cache.repeat_interleave(repeat, dim=1)
                self.v_cache = self.v_cache.repeat_interleave(repeat, dim=1)
            self.key_valid = torch.zeros(valid.shape[0], total, dtype=torch.bool, device=ids.device)
            self.key_valid[:, :p] = valid
            self.next_position = valid.long().sum(-1)
            self.write_at = torch.full((1,), p, dtype=torch.long, device=ids.device)
        return logits

    def reserve_for(self, shapes: list[tuple[int, int]], budget: int | None) -> None:
        """A call's chunks, as (rows, positions) each, and the bytes of KV cache they may take: when the most rows
        by the longest length fit the budget, one layout serves every chunk (and its graphs); else one storage, of
        the largest chunk's rows × positions, serves each chunk on a layout of its own. Either way the storage
        grows at most once per call, here."""
        self.kv_budget = budget
        if budget is not None and self.reserved_bytes() > budget:
            self.release()  # reserved under a larger budget (an earlier call's share of free memory)
        rows, total = max(r for r, _ in shapes), max(t for _, t in shapes)
        if budget is None or self.kv_bytes(rows * self.bucketed(total)) <= budget:
            self.reserve(rows, total)
        else:
            self.grow(max(r * self.layout_length(r, t) for r, t in shapes))

    def reserve(self, rows: int, total: int) -> KVArena:
        """The persistent buffers laid out for `rows` rows of at least `total` positions: the layout in use when it
        has them (the graphs captured on it stay valid), else rows of layout_length positions."""
        arena = self.arena
        if arena is not None and arena.holds(rows, total):
            return arena
        length = self.layout_length(rows, total)
        arena = self.grow(rows * length)
        arena.lay_out(length)
        return arena

    def layout_length(self, rows: int, total: int) -> int:
        """Positions per row of a layout for `rows` rows of `total`: rounded up to the length bucket (fewer
        attended lengths, so fewer graphs), or exactly `total` where the rounding would pass the budget (plan_chunks
        fits rows × total in it)."""
        length = self.bucketed(total)
        fits = self.kv_budget is None or self.kv_bytes(rows * length) <= self.kv_budget
        return length if fits else total

    def grow(self, slots: int) -> KVArena:
        """Storage for at least `slots` positions: the one held when it has them, else a new one of exactly that
        many, allocated after the old one is released (the two never coexist)."""
        if self.arena is not None and self.arena.slots >= slots:
            return self.arena
        self.release()
        param = next(self.model.parameters())
        self.arena = KVArena(len(self.base.layers), self.num_kv, self.head_dim, slots, param.dtype, param.device)
        return self.arena

    def release(self) -> None:
        """Drop the persistent buffers, every view of them, and the graphs that read them."""
        if self.graphs is not None:
            self.graphs.clear()
        self.arena = self.k_cache = self.v_cache = self.key_valid = None
        self.next_position = self.write_at = None

    def bucketed(self, total: int) -> int:
        """`total` rounded up to the length bucket."""
        return -(-total // self.length_bucket) * self.length_bucket

    def kv_bytes(self, positions: int) -> int:
        """Bytes of keys and values `positions` cached positions take (all layers)."""
        element = next(self.model.parameters()).element_size()
        return 2 * len(self.base.layers) * self.num_kv * self.head_dim * element * positions

    def reserved_bytes(self) -> int:
        """Bytes of keys and values the persistent buffers hold (0: none)."""
        return 0 if self.arena is None else self.kv_bytes(self.arena.slots)

    def into_arena(self, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, repeat: int, total: int) -> None:
        """Fixed shapes: move the prompts' cache into the decoder's persistent buffers (laid out for this chunk),
        whose first rows the decode steps then use: a CUDA graph captured for (rows, attended length, layout) reads
        them where they are, so it serves every later chunk of that size, not just this one."""
        rows, p = valid.shape
        arena = self.reserve(rows, total)
        self.k_cache, self.v_cache = arena.k[:, :rows], arena.v[:, :rows]
        for cache, prompt in ((self.k_cache, k[:, :, :, :p]), (self.v_cache, v[:, :, :, :p])):
            cache[:, :, :, :p].copy_(prompt.repeat_interleave(repeat, dim=1) if repeat > 1 else prompt)
        self.key_valid = arena.valid[:rows]
        self.key_valid.zero_()
        self.key_valid[:, :p] = valid
        self.next_position = arena.position[:rows]
        self.next_position.copy_(valid.long().sum(-1))
        self.write_at = arena.write_at
        self.write_at.fill_(p)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append one token per row [B]; returns next logits [B, V]."""
        if not self.fixed_shapes:
            self.key_valid[:, self.length] = True
            mask = self.key_valid[:, None, None, : self.length + 1]
            logits = self.forward(tokens[:, None], self.next_position[:, None], mask)
        else:
            kv_len = min(self.k_cache.shape[3], -(-(self.length + 1) // self.length_bucket) * self.length_bucket)
            logits = self.graphs.run(tokens, kv_len) if self.graphs is not None else self.step(tokens, kv_len)
            self.length += 1
            self.write_at.add_(1)
        self.next_position.add_(1)  # in place: a captured graph reads it where it is
        return logits

    def step(self, tokens: torch.Tensor, kv_len: int) -> torch.Tensor:
        """One fixed-shape decode step (what a CUDA graph captures): cache written at self.write_at, attention over
        the first kv_len slots, device state only."""
        self.key_valid.index_fill_(1, self.write_at, True)
        mask = self.key_valid[:, None, None, :kv_len]
        return self.forward(tokens[:, None], self.next_position[:, None], mask, self.write_at, kv_len)

    def should_compact(self, live: int, rows: int) -> bool:
        """Whether to drop finished rows now: always, except with CUDA graphs (a new batch size is a new capture),
        where only once half the rows are done."""
        return self.graphs is None or live <= rows // 2

    def compact_size(self, live: int) -> int:
        """How many rows a compaction keeps for `live` unfinished ones: exactly those, or with CUDA graphs the next
        power of two (some finished rows ride along) so few batch sizes, each captured once, recur."""
        return live if self.graphs is None else 1 << (live - 1).bit_length()

    def select(self, rows: torch.Tensor) -> None:
        """Keep only `rows` of the batch (drop finished sequences so they cost nothing); with fixed shapes, in place
        in the first rows of the persistent buffers (graphs of that many rows stay valid)."""
        if not self.fixed_shapes:
            self.k_cache, self.v_cache = self.k_cache[:, rows], self.v_cache[:, rows]
            self.key_valid, self.next_position = self.key_valid[rows], self.next_position[rows]
            return
        n, arena = len(rows), self.arena
        for buffer in (arena.k, arena.v):
            buffer[:, :n].copy_(buffer[:, rows])  # index_select copies first: no overlap hazard
        arena.valid[:n].copy_(arena.valid[rows])
        arena.position[:n].copy_(arena.position[rows])
        self.k_cache, self.v_cache = arena.k[:, :n], arena.v[:, :n]
        self.key_valid, self.next_position = arena.valid[:n], arena.position[:n]


class DecodeGraphs:
    """CUDA graphs of StaticCacheDecoder.step, one per (batch size, attended length, layout of the buffers), captured
    on first use: a decode step becomes one graph launch instead of hundreds of kernel launches. They read the
    decoder's persistent buffers where they are, so they serve every later chunk and compaction of their size, and
    weights loaded in place keep them valid; only a new storage (a growth) clears them."""

    def __init__(self, decoder: StaticCacheDecoder) -> None:
        self.decoder = decoder
        self.entries: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        self.pool = None

    def clear(self) -> None:
        self.entries.clear()

    def run(self, tokens: torch.Tensor, kv_len: int) -> torch.Tensor:
        """The step's logits [B, V] (a buffer the next replay overwrites)."""
        key = (tokens.shape[0], kv_len, self.decoder.k_cache.shape[3])  # rows, attended length, layout
        if key not in self.entries:
            self.entries[key] = self.capture(tokens, kv_len)
        graph, static_tokens, logits = self.entries[key]
        static_tokens.copy_(tokens)
        graph.replay()
        return logits

    def capture(self, tokens: torch.Tensor, kv_len: int):
        # warm-up and capture run the step at the current slot with these tokens: the replay that follows writes
        # the same slot again, so nothing they leave behind survives
        static_tokens = tokens.clone()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=tokens.device)
        stream.wait_stream(torch.cuda.current_stream(tokens.device))
        with torch.cuda.stream(stream):
            self.decoder.step(static_tokens, kv_len)
        torch.cuda.current_stream(tokens.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work of other threads of this process (the weight-broadcast receiver) does not
        # invalidate the capture; GRAPH_CAPTURE keeps them from allocating on the device meanwhile
        with GRAPH_CAPTURE, torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            logits = self.decoder.step(static_tokens, kv_len)
        return graph, static_tokens, logits


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
           scale: float) -> torch.Tensor:
    """Attention of q [B, H, S, D] over keys/values [B, KV, L, D] (KV divides H: grouped-query) with a boolean
    mask [B, 1, S, L]; returns [B, H, S, D]. One decode step (S = 1) folds each KV head's H / KV query heads into
    the query length, so the cache is never repeated per head and no `enable_gqa` flag keeps SDPA on its math path
    (the memory-efficient kernels take the mask as it is)."""
    b, h, s, d = q.shape
    kv = keys.shape[1]
    if kv == h:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    if s > 1:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
    # query head i uses KV head i // (H / KV) (HF's repeat_interleave): heads of one group are adjacent
    grouped = q.reshape(b, kv, h // kv, d)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(b, h, 1, d)


class HFCacheDecoder:
    """Fallback for any HF causal LM: the model's own forward with its dynamic KV cache."""

    def __init__(self, model) -> None:
        self.model = model
        self.past = None
        self.supports_select = False
        self.cache_arg = cache_keyword(model) or "past_key_values"

    def reserved_bytes(self) -> int:
        """Bytes of KV cache kept across chunks: none (each chunk's cache goes with its decoder)."""
        return 0

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



def make_decoder(model, prefer_fast: bool = True, cuda_graphs: bool = False, fixed_shapes: bool = False):
    """The fastest decoder that supports this model (CUDA graphs of the decode step when asked and on CUDA)."""
    if prefer_fast and getattr(model.config, "model_type", None) in FAST_MODEL_TYPES:
        on_cuda = next(model.parameters()).is_cuda
        return StaticCacheDecoder(model, fixed_shapes=fixed_shapes, cuda_graphs=cuda_graphs and on_cuda)
    return HFCacheDecoder(model)
