"""TorchGenerator: batched sampling of n completions per prompt with a KV cache and per-token logprobs."""

from __future__ import annotations

import itertools
import logging

import torch

from forge_core.generation.decoder import make_decoder
from forge_core.generation.kv_budget import kv_budget_bytes, kv_bytes_per_token, plan_chunks
from forge_core.generation.sampling import SamplingParams, sample_next, stream_keys, stream_uniforms
from forge_core.models.tokenizer import end_token_ids
from forge_core.types import Completion

log = logging.getLogger(__name__)


class TorchGenerator:
    """Generates with a HF causal LM in this process; `policy_version` is stamped on every completion."""

    def __init__(self, model, tokenizer, params: SamplingParams | None = None, max_batch: int = 512,
                 prefer_fast: bool = True, check_every: int = 0, cuda_graphs: bool | None = None,
                 fixed_shapes: bool = False, end_ids: list[int] | None = None, kv_cache_gb: float = 0.0) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs pad and eos tokens (set tokenizer.pad_token = tokenizer.eos_token)")
        self.model, self.tokenizer = model.eval(), tokenizer
        # a row stops at any of these: the tokenizer's eos, generation_config's eos list, the chat end of turn
        configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.end_ids = list(end_ids) if end_ids else end_token_ids(tokenizer, configured)
        self.params = params or SamplingParams()
        self.params.validate()
        self.max_batch, self.prefer_fast = max_batch, prefer_fast
        self.kv_cache_gb = kv_cache_gb  # the KV cache budget of a chunk (0: on CUDA a share of free memory)
        self.check_every = check_every  # decode steps between looks for finished rows; 0: 1 on CPU, 8 on CUDA
        # CUDA graphs of the decode step (None: on when the model is on CUDA); fixed_shapes runs the graph's
        # fixed-shape step without capturing it (what CPU tests check)
        self.cuda_graphs, self.fixed_shapes = cuda_graphs, fixed_shapes
        self._decoder = None  # see decoder()
        self.policy_version = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Replace the weights and bump the policy version."""
        self.model.load_state_dict(state_dict)
        self.policy_version = version

    def tokenize(self, prompts: list[str]) -> list[list[int]]:
        """Each prompt's token ids (no special tokens); ValueError for a prompt with none."""
        rows = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        if any(len(r) == 0 for r in rows):
            raise ValueError("empty prompt after tokenization; every prompt needs at least one token")
        return rows

    def encode_prompts(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids and attention mask [B, P] of token rows."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
        return ids, mask

    @torch.inference_mode()
    def generate(self, prompts: list[str], n: int = 1, seed: int | None = None,
                 params: SamplingParams | None = None, prompt_keys: list[int] | None = None,
                 prompt_ids: list[list[int]] | None = None) -> list[list[Completion]]:
        """n completions for each prompt (list per prompt). Prompt i is seeded with seed + prompt_keys[i] (default
        seed + i, as each vLLM request is), so its samples do not depend on which prompts share its batch, chunk
        or replica; seeded calls are reproducible. `prompt_ids`: the prompts already tokenized (token-in: they are
        sampled from as given, never re-tokenized)."""
        params = params or self.params
        params.validate()
        keys = list(range(len(prompts))) if prompt_keys is None else list(prompt_keys)
        if len(keys) != len(prompts):
            raise ValueError(f"prompt_keys has {len(keys)} entries for {len(prompts)} prompts; give one per prompt")
        if seed is None:
            seed = int(torch.randint(2**31 - 1, ()).item())
        # chunks of prompts of similar length (less left padding), as many as max_batch rows and the KV cache
        # budget allow; the keyed streams make the order and the chunking irrelevant
        rows = self.tokenize(prompts) if prompt_ids is None else checked_rows(prompt_ids, len(prompts))
        order = sorted(range(len(prompts)), key=lambda i: len(rows[i]))
        decoder = self.decoder()
        # the buffers this generator holds count as free: the decoder releases them when a chunk needs the room
        budget = kv_budget_bytes(self.kv_cache_gb, self.device, held=decoder.reserved_bytes())
        sizes = plan_chunks([len(rows[i]) for i in order], n, params.max_new_tokens, kv_bytes_per_token(self.model),
                            budget, self.max_batch)
        bounds = list(itertools.accumulate(sizes, initial=0))
        chunks = [order[a:b] for a, b in zip(bounds, bounds[1:])]
        if chunks and getattr(decoder, "fixed_shapes", False):  # rows × positions of each chunk (ascending lengths)
            decoder.reserve_for([(len(c) * n, len(rows[c[-1]]) + params.max_new_tokens) for c in chunks], budget)
        out: list[list[Completion]] = [None] * len(prompts)  # type: ignore[list-item]
        for chunk in chunks:
            groups = self.generate_chunk([rows[i] for i in chunk], n, params,
                                         stream_keys(seed, [keys[i] for i in chunk], n), chunk)
            for i, group in zip(chunk, groups, strict=True):
                out[i] = group
        return out

    def generate_chunk(self, prompt_rows: list[list[int]], n, params, row_keys: list[int],
                       prompt_indices: list[int] | None = None) -> list[list[Completion]]:
        """One batch of len(prompt_rows) * n rows (prompts as token ids); finished rows are found on the host every
        `check_every` steps only (one synchronisation), then dropped from the decoder."""
        ids, mask = self.encode_prompts(prompt_rows)
        device = self.device
        ids, mask = ids.to(device), mask.to(device)
        decoder = self.decoder()
        logits = decoder.prefill(ids, mask, params.max_new_tokens, n)
        batch, steps = logits.shape[0], params.max_new_tokens
        pad = self.tokenizer.pad_token_id
        ends = torch.tensor(self.end_ids, dtype=torch.long, device=device)
        tokens = torch.full((batch, steps), pad, dtype=torch.long, device=device)
        logprobs = torch.zeros((batch, steps), device=device)
        lengths = torch.full((batch,), steps, dtype=torch.long, device=device)
        rows = torch.arange(batch, device=device)  # the original row of each row the decoder still holds
        keys = torch.tensor(row_keys, dtype=torch.long, device=device)
        alive = torch.ones(batch, dtype=torch.bool, device=device)
        check_every = self.check_every or (1 if device.type == "cpu" else 8)
        for t in range(steps):
            uniforms = None if params.temperature == 0 else stream_uniforms(keys, t)
            next_tokens, next_lp = sample_next(logits, params, uniforms)
            # rows finished since the last check keep decoding pads until it drops them; nothing of theirs is kept
            next_tokens = torch.where(alive, next_tokens, pad)
            tokens[:, t].index_copy_(0, rows, next_tokens)
            logprobs[:, t].index_copy_(0, rows, torch.where(alive, next_lp, 0.0))
            done = alive & torch.isin(next_tokens, ends)
            lengths.index_copy_(0, rows, torch.where(done, t + 1, lengths.index_select(0, rows)))
            alive = alive & ~done
            if t + 1 == steps:
                break
            if (t + 1) % check_every == 0:
                live = int(alive.sum())  # the only host synchronisation of the loop
                if live == 0:
                    break
                if live < len(alive) and decoder.supports_select and decoder.should_compact(live, len(alive)):
                    keep = rows_to_keep(alive, decoder.compact_size(live))
                    decoder.select(keep)
                    rows, keys, alive, next_tokens = rows[keep], keys[keep], alive[keep], next_tokens[keep]
            logits = decoder.decode(next_tokens)
        return self.package(tokens.cpu(), logprobs.cpu(), lengths.cpu(), prompt_indices or range(len(prompt_rows)), n)

    def decoder(self):
        """The decoder of this generator's chunks: with fixed shapes (CUDA graphs) one kept for the generator's
        life, whose buffers and captured graphs every chunk reuses; else a fresh one per chunk."""
        graphs = self.device.type == "cuda" if self.cuda_graphs is None else self.cuda_graphs
        if self._decoder is None or not getattr(self._decoder, "fixed_shapes", False):
            self._decoder = make_decoder(self.model, self.prefer_fast, cuda_graphs=graphs,
                                         fixed_shapes=self.fixed_shapes)
        return self._decoder

    def package(self, tokens, logprobs, lengths, prompt_indices, n) -> list[list[Completion]]:
        """Turn padded [B, T] results into Completions grouped by prompt (metadata: its index in the call)."""
        groups: list[list[Completion]] = []
        for p, index in enumerate(prompt_indices):
            group = []
            for j in range(n):
                row = p * n + j
                length = int(lengths[row])
                ids = tokens[row, :length].tolist()
                stop = "eos" if ids and ids[-1] in self.end_ids else "length"
                group.append(Completion(
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    token_ids=ids, logprobs=logprobs[row, :length].tolist(),
                    metadata={"prompt_index": index, "sample_index": j}, policy_version=self.policy_version,
                    stop_reason=stop,
                ))
            groups.append(group)
        return groups


def rows_to_keep(alive: torch.Tensor, size: int) -> torch.Tensor:
    """Indices [size] of the rows a compaction keeps: every live one, then finished ones to make up `size`."""
    order = torch.argsort((~alive).to(torch.int8), stable=True)  # live rows first, in order
    return order[:size]


def checked_rows(prompt_ids: list[list[int]], num_prompts: int) -> list[list[int]]:
    """Token rows given with the prompts, checked: one non-empty row per prompt."""
    rows = [list(r) for r in prompt_ids]
    if len(rows) != num_prompts or any(len(r) == 0 for r in rows):
        raise ValueError(f"prompt_ids needs one non-empty token row per prompt; got {len(rows)} rows for "
                         f"{num_prompts} prompts")
    return rows
