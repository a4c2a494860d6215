"""The main job in one process (no Prefect): SFT warm-up then GRPO, with progress, records and a RESULT line.

`forgeflow grpo --in-process` (debugging, benchmarks) runs this; it drives the same iteration spine as the flow.
"""

from __future__ import annotations

import json
import logging
import time

import torch
from tqdm import tqdm

from forge_core.distill import load_teacher
from forge_core.generation import TorchGenerator
from forge_core.models import load_model_and_tokenizer, save_model_and_tokenizer
from forge_core.models.lora import plain_model
from forge_core.recipes.grpo import GRPOLoop
from forge_core.recipes.steps import evaluate
from forge_core.training import Trainer
from infra import checkpoints as ckpt
from infra import components as C
from infra import sft_cache
from infra.config import RunConfig, dump_config
from infra.paths import new_run_id, run_dir
from runtime.plots import plot_curves
from runtime.progress import held_out_summary, line_for_step
from runtime.sft import sft_phase

log = logging.getLogger(__name__)


def grpo_phase(cfg: RunConfig, model, tok, splits, show: bool) -> list[dict]:
    """Run cfg.steps GRPO steps in-process; returns the metric history (each row has 'step')."""
    # the generator section is its SamplingParams
    generator = TorchGenerator(model, tok, cfg.generator, kv_cache_gb=cfg.generator.kv_cache_gb)
    config, options = C.trainer_arguments(cfg)
    trainer = Trainer(C.prepare_trained_model(cfg, model), C.build_loss(cfg), config, tok.pad_token_id, **options)
    trainer.reference_from_base = C.reference_from_base(cfg)  # LoRA: the model RL starts from, adapters off
    ref_model = None
    if C.needs_reference(cfg):
        ref_model, _ = load_model_and_tokenizer(cfg.model.path, seed=cfg.seed)
        ref_model.load_state_dict(model.state_dict())
        ref_model.eval().requires_grad_(False)
    reward = C.build_reward(cfg)
    teacher = load_teacher(cfg.distill, tok, seed=cfg.seed) if cfg.distill.enabled else None
    loop = GRPOLoop(generator, trainer, reward, splits.train, splits.train_prompts, splits.eval, splits.eval_prompts,
                    cfg, tok.pad_token_id, ref_model, teacher, cfg.distill, advantage=cfg.advantage.to_dict(),
                    eval=cfg.eval, correction=cfg.rollout_correction, env=cfg.env,
                    max_failed_reward_steps=cfg.reward.max_failed_steps)
    bar = tqdm(total=cfg.steps, desc="grpo", disable=not show, dynamic_ncols=True)
    history: list[dict] = []

    def on_step(step, metrics):
        history.append({"step": step + 1, **metrics})
        bar.update(1)
        bar.set_postfix(reward=f"{metrics.get('reward/mean', 0):.3f}")
        (tqdm.write if show else log.info)(line_for_step(step, cfg.steps, metrics))

    loop.run(on_step=on_step)
    bar.close()
    return history


def run_main_job(cfg: RunConfig, run_name: str | None = None, show: bool = True) -> dict:
    """SFT (when configured) then GRPO; writes config, metrics, curves and checkpoints; returns the summary."""
    if cfg.generator.backend != "torch":  # one model trains and samples here: the generator is that model
        raise ValueError(f"generator.backend {cfg.generator.backend!r} runs in a generator worker; --in-process samples "
                         "with the trained model itself (generator.backend: torch): drop --in-process, or set "
                         "generator.backend: torch")
    start = time.perf_counter()
    threads = C.configure_threads(cfg)
    torch.manual_seed(cfg.seed)
    run_id = new_run_id()
    out = run_dir(run_id)
    dump_config(cfg, out / "config.yaml")
    log.info("run %s (%s) in %s with %d threads", run_id, run_name or "unnamed", out, threads)
    trains_sft = cfg.sft.steps > 0 and not cfg.sft.init
    inputs, hit = sft_cache.find_cached_sft(cfg) if trains_sft and cfg.sft.cache else (None, None)
    if hit is not None:
        log.info(sft_cache.hit_message(hit))
    model_path = str(hit.path) if hit is not None else cfg.sft.init or cfg.model.path
    # one model trains and generates here: fp32 master weights, bf16 compute in the trainer when model.dtype says so
    model, tok = load_model_and_tokenizer(model_path, seed=cfg.seed, dtype=C.MASTER_DTYPE)
    splits = C.build_splits(cfg, tok)
    if trains_sft and hit is None:
        sft_path = sft_phase(cfg, model, tok, splits, out, show)
        log.info("SFT checkpoint: %s", sft_path)
        if inputs is not None:
            sft_cache.store(sft_path, inputs, run_id)
    generator = TorchGenerator(model, tok, cfg.generator, kv_cache_gb=cfg.generator.kv_cache_gb)
    judge = lambda: evaluate(generator, splits.eval, splits.eval_prompts, cfg.generator.max_new_tokens,  # noqa: E731
                             samples=cfg.eval.samples, temperature=cfg.generator.temperature, seed=cfg.seed)
    before = judge()
    history = grpo_phase(cfg, model, tok, splits, show) if cfg.steps > 0 else []
    after = judge()
    final = save_model_and_tokenizer(plain_model(model), tok, out / ckpt.FINAL_DIR)  # LoRA: adapters merged
    summary = {
        "run_id": run_id, "run_name": run_name, **held_out_summary(before, after),
        "minutes": (time.perf_counter() - start) / 60, "checkpoint": str(final),
    }
    with (out / "metrics.jsonl").open("w") as f:
        for row in history:
            f.write(json.dumps(row) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if history:
        rows = [{"step": 0, **before}] + history + [{"step": cfg.steps, **after}]
        summary["plot"] = str(plot_curves({run_name or run_id: rows}, out / "curves.png",
                                          title=f"GRPO {cfg.loss.name} on {cfg.dataset.kind}"))
    return summary
