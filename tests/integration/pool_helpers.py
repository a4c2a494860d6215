"""Shared set-up for worker-pool integration tests: a tiny config and its problems."""

from __future__ import annotations

from forge_core.models import load_model_and_tokenizer
from infra import components as C
from infra.config_checks import load_config


def tiny_config(launcher: str = "local", **overrides):
    base = {"model.path": "tiny:qwen3-micro", "launcher": launcher, "sft.steps": 0, "generator.max_new_tokens": 4,
            "trainer.lr": 1e-3, "trainer.micro_batch_size": 64, "workers.start_timeout_s": 180,
            "workers.heartbeat_stale_s": 20, "eval.num_prompts": 8,
            "loss.beta": 0.0, "workers.threads": 1}
    base.update(overrides)
    return load_config("configs/grpo_math_tiny.yaml", base)


def tiny_splits(cfg):
    _, tok = load_model_and_tokenizer(cfg.model.path)
    return C.build_splits(cfg, tok)
