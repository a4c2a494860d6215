"""A CPU STAND-IN for `vllm.LLM` (no vLLM wheel exists for CPU): the shapes of vLLM's API — SamplingParams,
RequestOutput/CompletionOutput/Logprob, collective_rpc into workers with `model_runner.model.load_weights` — backed by
forge_core's TorchGenerator on a tiny model. It checks VLLMGenerator's contract, not vLLM itself (tests/gpu/ does)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from forge_core.generation import SamplingParams as OurParams
from forge_core.generation import TorchGenerator


@dataclass
class StandInSamplingParams:
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    logprobs: int | None
    seed: int | None


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

    def __init__(self, model, tokenizer):
        self.inner = TorchGenerator(model.eval(), tokenizer, OurParams())
        self.worker = SimpleNamespace(model_runner=SimpleNamespace(model=StandInModel(model)))
        self.requests: list[StandInSamplingParams] = []
        self.prompt_rows: list[list[int]] = []  # the token ids each request was sampled from
        self.prefix_resets = 0

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
            comps = self.inner.generate([""], n=sp.n, seed=sp.seed, params=params, prompt_ids=[ids])[0]
            outputs.append(SimpleNamespace(prompt=prompt, outputs=[SimpleNamespace(
                text=c.text, token_ids=tuple(c.token_ids),
                logprobs=[{t: StandInLogprob(lp), -1: StandInLogprob(-99.0)} for t, lp in zip(c.token_ids, c.logprobs)],
                finish_reason="stop" if c.stop_reason == "eos" else "length") for c in comps]))
        return outputs

    def collective_rpc(self, method, args=()):
        return [method(self.worker, *args)]

    def reset_prefix_cache(self):
        self.prefix_resets += 1
        return True
