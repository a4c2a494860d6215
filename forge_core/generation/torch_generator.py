"""TorchGenerator: batched sampling of n completions per prompt with a KV cache and per-token logprobs."""

from __future__ import annotations

import logging

import torch

from forge_core.generation.decoder import make_decoder
from forge_core.generation.sampling import SamplingParams, exponential_noise, sample_next
from forge_core.types import Completion

log = logging.getLogger(__name__)


class TorchGenerator:
    """Generates with a HF causal LM in this process; `policy_version` is stamped on every completion."""

    def __init__(self, model, tokenizer, params: SamplingParams | None = None, max_batch: int = 512,
                 prefer_fast: bool = True) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs pad and eos tokens (set tokenizer.pad_token = tokenizer.eos_token)")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.params = params or SamplingParams()
        self.params.validate()
        self.max_batch, self.prefer_fast = max_batch, prefer_fast
        self.policy_version = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Replace the weights and bump the policy version."""
        self.model.load_state_dict(state_dict)
        self.policy_version = version

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids and attention mask [B, P]."""
        rows = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        if any(len(r) == 0 for r in rows):
            raise ValueError("empty prompt after tokenization; every prompt needs at least one token")
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
        return ids, mask

    @torch.inference_mode()
    def generate(self, prompts: list[str], n: int = 1, seed: int | None = None,
                 params: SamplingParams | None = None) -> list[list[Completion]]:
        """n completions for each prompt (list per prompt); seeded calls are reproducible."""
        params = params or self.params
        params.validate()
        gen = torch.Generator(device=self.device).manual_seed(seed) if seed is not None else None
        per_chunk = max(1, self.max_batch // n)
        out: list[list[Completion]] = []
        for start in range(0, len(prompts), per_chunk):
            chunk = prompts[start:start + per_chunk]
            out.extend(self.generate_chunk(chunk, n, params, gen))
        return out

    def generate_chunk(self, prompts, n, params, gen) -> list[list[Completion]]:
        ids, mask = self.encode_prompts(prompts)
        device = self.device
        ids, mask = ids.to(device), mask.to(device)
        decoder = make_decoder(self.model, self.prefer_fast)
        logits = decoder.prefill(ids, mask, params.max_new_tokens, n)
        batch = logits.shape[0]
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        tokens = torch.full((batch, params.max_new_tokens), pad, dtype=torch.long, device=device)
        logprobs = torch.zeros((batch, params.max_new_tokens), device=device)
        lengths = torch.full((batch,), params.max_new_tokens, dtype=torch.long, device=device)
        active = torch.arange(batch, device=device)  # original row of each row still held by the decoder
        alive = torch.ones(batch, dtype=torch.bool, device=device)
        for t in range(params.max_new_tokens):
            noise = None if params.temperature == 0 else exponential_noise(batch, logits.shape[-1], gen, device)[active]
            next_tokens, next_lp = sample_next(logits, params, noise)
            tokens[active[alive], t] = next_tokens[alive]
            logprobs[active[alive], t] = next_lp[alive]
            done = alive & (next_tokens == eos)
            lengths[active[done]] = t + 1
            alive = alive & ~done
            if not alive.any() or t + 1 == params.max_new_tokens:
                break
            if done.any() and decoder.supports_select:
                keep = alive.nonzero().squeeze(-1)
                decoder.select(keep)
                active, next_tokens, alive = active[keep], next_tokens[keep], alive[keep]
            # finished rows of a decoder that cannot drop them keep decoding pads; their outputs are ignored
            logits = decoder.decode(torch.where(alive, next_tokens, torch.full_like(next_tokens, pad)))
        return self.package(tokens.cpu(), logprobs.cpu(), lengths.cpu(), len(prompts), n, eos)

    def package(self, tokens, logprobs, lengths, num_prompts, n, eos) -> list[list[Completion]]:
        """Turn padded [B, T] results into Completions grouped by prompt."""
        groups: list[list[Completion]] = []
        for p in range(num_prompts):
            group = []
            for j in range(n):
                row = p * n + j
                length = int(lengths[row])
                ids = tokens[row, :length].tolist()
                stop = "eos" if ids and ids[-1] == eos else "length"
                group.append(Completion(
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    token_ids=ids, logprobs=logprobs[row, :length].tolist(),
                    metadata={"prompt_index": p, "sample_index": j}, policy_version=self.policy_version,
                    stop_reason=stop,
                ))
            groups.append(group)
        return groups
