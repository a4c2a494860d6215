"""VLLMGenerator: the TorchGenerator interface over a vLLM engine (GPU only; `vllm` is imported lazily).

n samples per prompt, the sampled tokens' logprobs, tensor parallelism, seeded requests, and weights replaced in place
at each policy version: every vLLM worker (one per tensor-parallel rank) reads the version's safetensors file from the
weight store itself and hands it to its model's `load_weights`, which shards it for that rank (WeightLoaderExtension,
called by name). Rows stop on every end id, and multi-turn episodes run on it as on TorchGenerator (`end_ids`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from forge_core.generation.sampling import SamplingParams
from forge_core.models.tokenizer import end_token_ids
from forge_core.types import Completion

log = logging.getLogger(__name__)

FINISH_REASONS = {"stop": "eos", "length": "length", "abort": "length"}


class WeightLoaderExtension:
    """Mixed into every vLLM worker (LLM(worker_extension_cls=…)): what collective_rpc calls by name. vLLM V1 sends
    a method name and string arguments with its own serializer; a Python function would need pickling, which it
    refuses unless VLLM_ALLOW_INSECURE_SERIALIZATION=1 (which would let any pickled callable run in the engine)."""

    def forgeflow_load_weights(self, path: str) -> int:
        """Load a safetensors file into this worker's model (sharded for its rank); returns the tensors read."""
        from safetensors.torch import load_file

        state = load_file(path)
        self.model_runner.model.load_weights(weights=state.items())
        return len(state)


EXTENSION = f"{__name__}.WeightLoaderExtension"


def generation_eos(path: str):
    """The eos id(s) of the checkpoint's generation_config.json, or None without one."""
    config = Path(path) / "generation_config.json"
    return json.loads(config.read_text()).get("eos_token_id") if config.is_file() else None


class VLLMGenerator:
    """generate(prompts, n, seed, params) -> n Completions per prompt, like TorchGenerator."""

    def __init__(self, llm, tokenizer, params: SamplingParams, sampling_params_cls: Callable | None = None,
                 end_ids: list[int] | None = None) -> None:
        self.llm, self.tokenizer, self.params = llm, tokenizer, params
        if sampling_params_cls is None:
            from vllm import SamplingParams as sampling_params_cls  # noqa: N813 (vLLM's class)
        self.sampling_params_cls = sampling_params_cls
        # every id that ends a turn, as TorchGenerator stops on (vLLM alone stops on its generation config's eos
        # only, not on a chat template's end of turn)
        self.end_ids = list(end_ids) if end_ids else end_token_ids(tokenizer, None)
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
        # processed logprobs: after temperature / top-k / top-p, the distribution the trainer reproduces (vLLM's
        # default, raw logprobs, would bias TIS/MIS whenever top_p < 1 or temperature != 1)
        llm = LLM(model=path, tensor_parallel_size=tensor_parallel_size, dtype=dtype, seed=seed,
                  gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                  enable_prefix_caching=True, logprobs_mode="processed_logprobs", worker_extension_cls=EXTENSION)
        return cls(llm, llm.get_tokenizer(), params, end_ids=end_token_ids(llm.get_tokenizer(), generation_eos(path)))

    def vllm_params(self, params: SamplingParams, n: int, seed: int | None):
        """vLLM SamplingParams for one request of n samples (logprobs=0: the sampled token's logprob only)."""
        return self.sampling_params_cls(n=n, temperature=params.temperature, top_p=params.top_p,
                                        top_k=params.top_k if params.top_k > 0 else -1,
                                        max_tokens=params.max_new_tokens, logprobs=0, seed=seed,
                                        stop_token_ids=list(self.end_ids))

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
        counts = self.llm.collective_rpc("forgeflow_load_weights", args=(str(path),))
        if not counts or min(counts) == 0:
            raise RuntimeError(f"vLLM workers loaded no tensors from {path}")
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.policy_version = version
