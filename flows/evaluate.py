"""The `evaluate` flow: held-out greedy (and sampled) accuracy of one checkpoint, in this process.

    checkpoint (HF dir) ─▶ evaluate_checkpoint (TorchGenerator, greedy) ─▶ eval/accuracy (+ eval/sampled_accuracy)
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NONE

from infra.config import load_config


@task(name="evaluate_checkpoint", cache_policy=NONE, persist_result=False, timeout_seconds=3600)
def evaluate_checkpoint(checkpoint: str, config: str, overrides: dict | None) -> dict:
    from forge_core.generation import TorchGenerator
    from forge_core.models import load_model_and_tokenizer
    from forge_core.recipes.steps import evaluate
    from infra import components as C

    cfg = load_config(config, overrides)
    C.configure_threads(cfg)
    model, tok = load_model_and_tokenizer(checkpoint, seed=cfg.seed)
    splits = C.build_splits(cfg, tok)
    gen = TorchGenerator(model.eval(), tok, C.sampling_params(cfg))
    metrics = evaluate(gen, splits.eval, splits.eval_prompts, cfg.generator.max_new_tokens, samples=cfg.eval.samples,
                       temperature=cfg.generator.temperature, seed=cfg.seed)
    return {"checkpoint": checkpoint, "num_prompts": len(splits.eval), **metrics}


@flow(name="evaluate", persist_result=False)
def evaluate_flow(checkpoint: str, config: str = "configs/grpo_math_tiny.yaml", overrides: dict | None = None) -> dict:
    """Accuracy of `checkpoint` on the config's held-out split; also written to <checkpoint>/eval.json."""
    path = Path(checkpoint)
    if not (path / "config.json").exists():
        raise ValueError(f"checkpoint {checkpoint} is not an HF model directory (no config.json); pass e.g. "
                         "<run>/checkpoints/step-000300/hf or <run>/sft")
    result = evaluate_checkpoint(checkpoint, config, overrides)
    (path / "eval.json").write_text(json.dumps(result, indent=2))
    print(f"{checkpoint}: accuracy {result['eval/accuracy']:.3f} on {result['num_prompts']} held-out prompts")
    return result
