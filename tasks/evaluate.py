"""The `evaluate_checkpoint` task: held-out greedy (and sampled) accuracy of one HF checkpoint, in this process."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from forge_core.generation import TorchGenerator
from forge_core.models import load_model_and_tokenizer
from forge_core.recipes.steps import evaluate
from infra import components as C
from infra.config_checks import load_config


@task(name="evaluate_checkpoint", cache_policy=NONE, persist_result=False, timeout_seconds=3600)
def evaluate_checkpoint(checkpoint: str, config: str, overrides: dict | None) -> dict:
    """{checkpoint, num_prompts, eval/accuracy (, eval/sampled_accuracy), timing/eval} of `checkpoint`."""
    cfg = load_config(config, overrides)
    C.configure_threads(cfg)
    model, tok = load_model_and_tokenizer(checkpoint, seed=cfg.seed)
    splits = C.build_splits(cfg, tok)
    gen = TorchGenerator(model.eval(), tok, cfg.generator)
    metrics = evaluate(gen, splits.eval, splits.eval_prompts, cfg.generator.max_new_tokens, samples=cfg.eval.samples,
                       temperature=cfg.generator.temperature, seed=cfg.seed, env=cfg.env)
    return {"checkpoint": checkpoint, "num_prompts": len(splits.eval), **metrics}
