"""VLLMGenerator: the TorchGenerator interface over a vLLM engine (GPU only; `vllm` is imported lazily).

n samples per prompt, the sampled tokens' logprobs, tensor parallelism, seeded requests, and weights replaced in place
at each policy version: every vLLM worker (one per tensor-parallel rank) reads the version's safetensors file from the
weight store itself and hands it to its model's `load_weights`, which shards it for that rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from forge_core.generation.sampling import SamplingParams
from forge_core.types import Completion

log = logging.getLogger(__name__)

FINISH_REASONS = {"stop": "eos", "length": "length", "abort": "length"}


def load_weights_on_worker(worker, path: str) -> int:
    """Runs inside each vLLM worker (collective_rpc): load a safetensors file into its model; returns tensors read."""
    from safetensors.torch import load_file

    state = load_file(path)
    worker.model_runner.model.load_weights(weights=state.items())
    return len(state)


class VLLMGenerator:
    """generate(prompts, n, seed, params) -> n Completions per prompt, like TorchGenerator."""

    def __init__(self, llm, tokenizer, params: SamplingParams, sampling_params_cls: Callable | None = None) -> None:
        self.llm, self.tokenizer, self.params = llm, tokenizer, params
        if sampling_params_cls is None:
            from vllm import SamplingParams as sampling_params_cls  # noqa: N813 (vLLM's class)
        self.sampling_params_cls = sampling_params_cls
        self.policy_version = 0

    @classmethod
    def from_pretrained(cls, path: str, params: SamplingParams, tensor_parallel_size: int = 1,
                        dtype: str = "bfloat16", seed: int = 0, gpu_memory_utilization: float = 0.85,
                        max_model_len: int | None = None) -> VLLMGenerator:
        """Start a vLLM engine for the HF checkpoint at `path` (GPU, `pip install forgeflow[vllm]`)."""
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ValueError("generator.backend: vllm needs vLLM on a CUDA machine (scripts/install.sh, or pip install "
                             "'forgeflow[vllm]'); on CPU use generator.backend: torch") from exc
        # processed logprobs: after temperature / top-k / top-p, the distribution the trainer reproduces
        llm = LLM(model=path, tensor_parallel_size=tensor_parallel_size, dtype=dtype, seed=seed,
                  gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                  enable_prefix_caching=True, logprobs_mode="processed_logprobs")
        return cls(llm, llm.get_tokenizer(), params)

    def vllm_params(self, params: SamplingParams, n: int, seed: int | None):
        """vLLM SamplingParams for one request of n samples (logprobs=0: the sampled token's logprob only)."""
        return self.sampling_params_cls(n=n, temperature=params.temperature, top_p=params.top_p,
                                        top_k=params.top_k if params.top_k > 0 else -1,
                                        max_tokens=params.max_new_tokens, logprobs=0, seed=seed)

    def tokenize(self, prompts: list[str]) -> list[list[int]]:
        """Each prompt's token ids (no special tokens added: a chat template already holds its own)."""
        return [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]

    def generate(self, prompts: list[str], n: int = 1, seed: int | None = None,
                 params: SamplingParams | None = None, prompt_keys: list[int] | None = None,
                 prompt_ids: list[list[int]] | None = None) -> list[list[Completion]]:
        """n completions for each prompt; prompt i is its own request seeded with seed + prompt_keys[i] (default i),
        as TorchGenerator seeds it. Token-in: vLLM gets `prompt_token_ids` (the given `prompt_ids`, else this
        tokenizer's ids without special tokens), never text, so it adds no BOS of its own."""
        params = params or self.params
        params.validate()
        keys = list(range(len(prompts))) if prompt_keys is None else list(prompt_keys)
        if len(keys) != len(prompts):
            raise ValueError(f"prompt_keys has {len(keys)} entries for {len(prompts)} prompts; give one per prompt")
        rows = self.tokenize(list(prompts)) if prompt_ids is None else [list(r) for r in prompt_ids]
        if len(rows) != len(prompts) or any(len(r) == 0 for r in rows):
            raise ValueError("every prompt needs a non-empty token row (prompt_ids: one row per prompt)")
        requests = [self.vllm_params(params, n, None if seed is None else seed + k) for k in keys]
        outputs = self.llm.generate([{"prompt_token_ids": r} for r in rows], requests, use_tqdm=False)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} results for {len(prompts)} prompts")
        return [[self.to_completion(c) for c in out.outputs] for out in outputs]

    def to_completion(self, out) -> Completion:
        """A vLLM CompletionOutput as a Completion stamped with the current policy version."""
        token_ids = list(out.token_ids)
        if out.logprobs is None or len(out.logprobs) != len(token_ids):
            raise RuntimeError("vLLM returned no per-token logprobs; the request must set logprobs=0")
        logprobs = [float(step[tok].logprob) for step, tok in zip(out.logprobs, token_ids, strict=True)]
        return Completion(out.text, token_ids, logprobs, policy_version=self.policy_version,
                          stop_reason=FINISH_REASONS.get(out.finish_reason, "length"))

    def load_weights_file(self, path: str, version: int) -> None:
        """Replace the engine's weights in place from a weight-store file (every tensor-parallel rank reads it)."""
        counts = self.llm.collective_rpc(load_weights_on_worker, args=(str(path),))
        if not counts or min(counts) == 0:
            raise RuntimeError(f"vLLM workers loaded no tensors from {path}")
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.policy_version = version
