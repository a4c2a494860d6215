"""Shared set-up for worker-pool integration tests: a tiny config and its problems."""

from __future__ import annotations

from forge_core.models import load_model_and_tokenizer
from infra import components as C
from infra.config_checks import load_config


def tiny_config(launcher: str = "local", config: str = "configs/grpo_math_tiny.yaml", **overrides):
    """`config` (the tiny math recipe unless given) with the small settings of the pool tests and `overrides`."""
    base = {"model.path": "tiny:qwen3-micro", "launcher": launcher, "sft.steps": 0, "generator.max_new_tokens": 4,
            "trainer.lr": 1e-3, "trainer.micro_batch_size": 64, "workers.start_timeout_s": 180,
            "workers.heartbeat_stale_s": 20, "eval.num_prompts": 8,
            "loss.beta": 0.0, "workers.threads": 1, "loss.name": "grpo", "trainer.mini_batches": 1}
    base.update(overrides)
    return load_config(config, base)


def tiny_splits(cfg):
    _, tok = load_model_and_tokenizer(cfg.model.path)
    return C.build_splits(cfg, tok)


def alternating_reward_groups(cfg, prompts: int = 8, group_size: int = 4) -> list:
    """Groups sampled from the seed-0 tiny model on the first training prompts, rewarded 0, 1, 0, 1, … in each group
    (every group informative)."""
    from forge_core.generation import TorchGenerator
    from forge_core.recipes import steps

    splits = tiny_splits(cfg)
    model, tok = load_model_and_tokenizer(cfg.model.path, seed=0)
    groups = steps.rollout(TorchGenerator(model, tok), splits.train[:prompts], splits.train_prompts[:prompts],
                           group_size, seed=0)
    for g in groups:
        for i, e in enumerate(g.episodes):
            e.reward = float(i % 2)
    return groups


def run_pool_iteration(pool, splits, n: int, group_size: int, step: int) -> dict:
    """Step `step` of the iteration spine over the pool's workers on the first `n` training problems (all of them
    each step), with the pool config's sync schedule and no evaluation or checkpoint; returns the step's metrics.
    Rollouts sample with whatever the generators hold (the pool tests restart workers by hand, without the
    recovery that would bring them to the schedule's version)."""
    import dataclasses

    from forge_core.recipes.iteration import Roles, run_iteration
    from forge_core.recipes.local import HistoryRecorder
    from workers.remote import RemoteGenerator, RemoteModelScorer, RemoteRewardScorer, RemoteTrainer

    class UnpinnedGenerator(RemoteGenerator):
        def behaviour_version(self, step: int) -> None:
            return None

    cfg = pool.cfg
    schedule = dataclasses.replace(C.run_schedule(cfg), eval_every=0, checkpoint_every=0)
    part = C.ProblemSplits(splits.train[:n], splits.train_prompts[:n], splits.eval, splits.eval_prompts)
    reference = RemoteModelScorer(pool) if C.needs_reference(cfg) else None
    roles = Roles(UnpinnedGenerator(pool, part, schedule, n, group_size, cfg.seed), RemoteRewardScorer(pool),
                  RemoteTrainer(pool, pool.run_dir / "checkpoints"), reference)
    recorder = HistoryRecorder()
    run_iteration(roles, schedule, step, [], recorder)
    return recorder.history[-1]
