"""End-to-end: a short SFT then a few GRPO steps on an easy split raise the policy's reward on its training prompts."""

import statistics

import pytest
import torch

from forge_core.data import ArithSpec, PlainTemplate, make_arith_problems
from forge_core.generation import SamplingParams, TorchGenerator
from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer
from forge_core.recipes import steps
from forge_core.recipes.config import EvalConfig, GRPOConfig
from forge_core.recipes.grpo import GRPOLoop
from forge_core.recipes.sft import make_sft_examples, run_sft
from forge_core.rewards import CombinedReward
from forge_core.training import Trainer, TrainerConfig


def mean_reward(generator, problems, prompts, reward, params) -> float:
    groups = steps.rollout(generator, problems, prompts, 16, seed=12345, params=params)
    steps.score_rewards(groups, reward)
    return statistics.fmean(e.reward for g in groups for e in g.episodes)


@pytest.mark.slow
def test_grpo_raises_training_reward_on_easy_split():
    torch.manual_seed(0)
    spec = ArithSpec(max_value=9, ops=("+",))
    problems = make_arith_problems(60, seed=0, spec=spec)
    template = PlainTemplate(prefix="")
    prompts = [template.render(p.question) for p in problems]
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    sft = Trainer(model, get_loss("sft"),
                  TrainerConfig(lr=3e-3, schedule="cosine", micro_batch_size=64), tok.pad_token_id, total_steps=400)
    run_sft(sft, make_sft_examples(problems, prompts, tok), steps=90, batch_size=32, seed=0, pad_id=tok.pad_token_id)

    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    reward = CombinedReward.from_config([{"name": "math"}])
    generator = TorchGenerator(model, tok, params)
    before = mean_reward(generator, problems, prompts, reward, params)
    trainer = Trainer(model, get_loss("grpo"), TrainerConfig(lr=2e-4, micro_batch_size=256), tok.pad_token_id)
    loop = GRPOLoop(generator, trainer, reward, problems, prompts, problems[:8], prompts[:8],
                    GRPOConfig(steps=40, prompts_per_step=16, group_size=8), tok.pad_token_id,
                    eval=EvalConfig(every=0))
    history = loop.run()
    after = mean_reward(generator, problems, prompts, reward, params)
    assert 0.05 < before < 0.9, f"SFT should leave room to learn (reward {before:.3f})"
    assert after > before + 0.05, f"GRPO did not raise reward: {before:.3f} -> {after:.3f}"
    assert all("loss/loss" in h or "loss/skipped" in h for h in history)
