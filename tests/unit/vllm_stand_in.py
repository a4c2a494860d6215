"""A CPU STAND-IN for `vllm.LLM` (no vLLM wheel exists for CPU): the shapes of vLLM's API — SamplingParams,
RequestOutput/CompletionOutput/Logprob, collective_rpc into workers with `model_runner.model.load_weights` — backed by
forge_core's TorchGenerator on a tiny model. It checks VLLMGenerator's contract, not vLLM itself (tests/gpu/ does).

Where vLLM V1 behaves unlike TorchGenerator, the stand-in behaves like vLLM:
- a text prompt is tokenized with the tokenizer's special tokens (a BOS where it adds one);
- logprobs are `raw_logprobs` (the model's, before temperature) unless LLM(logprobs_mode="processed_logprobs");
- collective_rpc sends a method name of the worker extension (LLM(worker_extension_cls=…)); a Python function is
  refused unless VLLM_ALLOW_INSECURE_SERIALIZATION=1;
- a request stops on the generation config's eos only, and on its `stop_token_ids`."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from forge_core.generation import SamplingParams as OurParams
from forge_core.generation import TorchGenerator
from forge_core.generation.sampling import filter_logits
from forge_core.models import load_model_and_tokenizer


@dataclass
class StandInSamplingParams:
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    logprobs: int | None
    seed: int | None
    stop_token_ids: list[int] = field(default_factory=list)


@dataclass
class StandInLogprob:
    logprob: float


class StandInModel:
    """What `load_weights` sees in a vLLM worker: an iterable of (name, tensor)."""

    def __init__(self, torch_model):
        self.torch_model = torch_model
        self.loads = 0

    def load_weights(self, weights):
        state = dict(weights)
        missing = set(self.torch_model.state_dict()) - set(state)
        tied = {"lm_head.weight"} if self.torch_model.config.tie_word_embeddings else set()
        assert missing <= tied, missing
        self.torch_model.load_state_dict(state, strict=False)
        self.loads += 1


class StandInLLM:
    """vllm.LLM's generate / collective_rpc / reset_prefix_cache over a TorchGenerator (one 'worker')."""

    def __init__(self, model, tokenizer, logprobs_mode: str = "raw_logprobs", worker_extension_cls: str = ""):
        self.inner = TorchGenerator(model.eval(), tokenizer, OurParams())
        self.model, self.logprobs_mode = model, logprobs_mode
        self.eos = [tokenizer.eos_token_id]  # what vLLM stops on by itself: the generation config's eos
        bases = (resolve(worker_extension_cls),) if worker_extension_cls else ()
        self.worker = type("StandInWorker", bases, {})()  # vLLM mixes the extension into its worker class
        self.worker.model_runner = SimpleNamespace(model=StandInModel(model))
        self.requests: list[StandInSamplingParams] = []
        self.prompt_rows: list[list[int]] = []  # the token ids each request was sampled from
        self.prefix_resets = 0

    def get_tokenizer(self):
        return self.inner.tokenizer

    def generate(self, prompts, sampling_params, use_tqdm=True):
        outputs = []
        for prompt, sp in zip(prompts, sampling_params, strict=True):
            self.requests.append(sp)
            assert sp.logprobs == 0, "the adapter must ask for the sampled tokens' logprobs"
            params = OurParams(temperature=sp.temperature, top_p=sp.top_p, top_k=max(sp.top_k, 0),
                               max_new_tokens=sp.max_tokens)
            # like vLLM: a TokensPrompt is sampled from its ids as given; a text prompt is tokenized with the
            # tokenizer's special tokens (a BOS where the tokenizer adds one), which is why the adapter sends ids
            if isinstance(prompt, dict):
                ids = list(prompt["prompt_token_ids"])
            else:
                ids = self.inner.tokenizer(prompt)["input_ids"]
            self.prompt_rows.append(ids)
            self.inner.end_ids = self.eos + [t for t in sp.stop_token_ids if t not in self.eos]
            comps = self.inner.generate([""], n=sp.n, seed=sp.seed, params=params, prompt_ids=[ids])[0]
            outputs.append(SimpleNamespace(prompt=prompt, outputs=[SimpleNamespace(
                text=c.text, token_ids=tuple(c.token_ids),
                logprobs=[{t: StandInLogprob(lp), -1: StandInLogprob(-99.0)}
                          for t, lp in zip(c.token_ids, self.reported(ids, c, params), strict=True)],
                finish_reason="stop" if c.stop_reason == "eos" else "length") for c in comps]))
        return outputs

    def reported(self, prompt_ids: list[int], completion, params: OurParams) -> list[float]:
        """The sampled tokens' logprobs as vLLM reports them: processed (after temperature and top-k/top-p, the
        distribution it sampled from, renormalised) or raw (the model's own distribution, temperature 1)."""
        ids = list(completion.token_ids)
        tokens = torch.tensor([prompt_ids + ids])
        with torch.no_grad():
            logits = self.model(input_ids=tokens).logits[0, len(prompt_ids) - 1:-1].float()
        if self.logprobs_mode == "processed_logprobs":
            logits = filter_logits(logits / params.temperature, params.top_k, params.top_p)
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist()

    def collective_rpc(self, method, args=()):
        if callable(method):
            if os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") != "1":
                raise TypeError(f"Object of type {type(method)} is not serializable; set "
                                "VLLM_ALLOW_INSECURE_SERIALIZATION=1 to allow pickle-based serialization")
            return [method(self.worker, *args)]
        return [getattr(self.worker, method)(*args)]

    def reset_prefix_cache(self):
        self.prefix_resets += 1
        return True


def resolve(qualname: str):
    """A class from its full dotted name, as vLLM resolves worker_extension_cls."""
    module, name = qualname.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def stand_in_vllm_module():
    """A module that stands for `vllm` (LLM opens the checkpoint at `model` with forge_core's loader)."""

    def llm(model: str, **kwargs):
        torch_model, tok = load_model_and_tokenizer(model, seed=kwargs.get("seed", 0))
        unknown = set(kwargs) - {"tensor_parallel_size", "dtype", "seed", "gpu_memory_utilization", "max_model_len",
                                 "enable_prefix_caching", "logprobs_mode", "worker_extension_cls"}
        assert not unknown, unknown
        return StandInLLM(torch_model, tok, kwargs.get("logprobs_mode", "raw_logprobs"),
                          kwargs.get("worker_extension_cls", ""))

    return SimpleNamespace(LLM=llm, SamplingParams=StandInSamplingParams)
