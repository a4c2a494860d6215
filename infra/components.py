"""Build forge_core components (model, data, prompts, generator, trainer, rewards) from a RunConfig."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from forge_core.data import build_template, load_hub_problems, load_problems, make_arith_problems
from forge_core.data.problems import Problem
from forge_core.losses import check_loss, complete_hyperparameters, get_loss
from forge_core.rewards import CombinedReward
from forge_core.schedule import Schedule
from forge_core.training import TrainerConfig
from infra.config import RunConfig
from infra.plugins import check_plugins

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# a model that is trained keeps fp32 master weights and AdamW state whatever model.dtype says; model.dtype is the
# dtype it computes in (autocast) and the one generators and the reference model hold
MASTER_DTYPE = torch.float32


def compute_dtype(cfg: RunConfig) -> torch.dtype | None:
    """The trainer's autocast dtype: None (plain fp32) for model.dtype float32, else model.dtype."""
    dtype = DTYPES[cfg.model.dtype]
    return None if dtype == MASTER_DTYPE else dtype


def prepare_trained_model(cfg: RunConfig, model):
    """The trainer section's LoRA adapters (trainer.lora.rank > 0) and speed knobs on an HF model about to be
    trained (hf backend; titan applies its own)."""
    from forge_core.models.lora import apply_lora
    from forge_core.training.speed import prepare_for_training

    if cfg.trainer.backend != "hf":
        return model
    apply_lora(model, cfg.trainer.lora)
    return prepare_for_training(model, cfg.trainer.activation_checkpointing, cfg.trainer.compile)


def configure_threads(cfg: RunConfig) -> int:
    """Set torch's intra-op threads deliberately (cfg.threads, 0 = every core) and return the number."""
    threads = cfg.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    return threads


@dataclass
class ProblemSplits:
    """Training and held-out problems with their rendered prompts."""

    train: list[Problem]
    train_prompts: list[str]
    eval: list[Problem]
    eval_prompts: list[str]
    tokenizer: object = None  # what rendered them; multi-turn episodes render their later turns with it


_SPLITS: dict[str, tuple[list[Problem], list[Problem]]] = {}  # read once per process (config check, flows, tasks)


def load_splits(cfg: RunConfig) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) problems for cfg.dataset; eval is capped at cfg.eval.num_prompts. A dataset is read once per
    process: the config check, the SFT and GRPO flows and their tasks share it (until a file on disk changes)."""
    files = [Path(p) for p in (cfg.dataset.path, cfg.dataset.eval_path) if p and Path(p).is_file()]
    key = json.dumps([dataclasses.asdict(cfg.dataset), cfg.eval.num_prompts,
                      [(str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files]], sort_keys=True, default=str)
    if key not in _SPLITS:
        _SPLITS[key] = read_splits(cfg)
    train, held_out = _SPLITS[key]
    return list(train), list(held_out)


def read_splits(cfg: RunConfig) -> tuple[list[Problem], list[Problem]]:
    """(train, eval) problems read from cfg.dataset (see `load_splits`)."""
    ds, n_eval = cfg.dataset, cfg.eval.num_prompts
    if ds.kind == "arith":
        train = make_arith_problems(ds.train_size, seed=ds.seed, split="train", spec=ds)
        return train, make_arith_problems(n_eval, seed=ds.seed, split="test", spec=ds)
    if ds.kind == "hub":
        fmt = "gsm8k"
        train = load_hub_problems(ds.path, ds.split, fmt, on_error=ds.on_error).problems
        return train, load_hub_problems(ds.path, ds.eval_split, fmt, on_error=ds.on_error).problems[:n_eval]
    train = load_problems(ds.path, fmt=ds.kind, on_error=ds.on_error).problems
    if ds.eval_path:
        return train, load_problems(ds.eval_path, fmt=ds.kind, on_error=ds.on_error).problems[:n_eval]
    if len(train) <= n_eval:
        raise ValueError(f"dataset.path {ds.path} has {len(train)} rows: set dataset.eval_path or lower eval.num_prompts")
    # no separate eval file: hold out the last rows, which training never samples
    return train[:-n_eval], train[-n_eval:]


def build_splits(cfg: RunConfig, tokenizer) -> ProblemSplits:
    """Problems plus prompts rendered with the configured template."""
    train, held_out = load_splits(cfg)
    if cfg.dataset.template == "plain":
        kwargs = {"prefix": cfg.dataset.prompt_prefix}
    else:
        kwargs = {} if cfg.dataset.system_prompt is None else {"system_prompt": cfg.dataset.system_prompt}
    template = build_template(cfg.dataset.template, **kwargs)
    render = lambda ps: [template.render(p.question, tokenizer) for p in ps]  # noqa: E731
    return ProblemSplits(train, render(train), held_out, render(held_out), tokenizer)


def reward_entries(cfg: RunConfig) -> list[dict]:
    """The rewards section as CombinedReward entries ({name, weight, key?, **kwargs}); import paths only when the
    config file lists them (checked again here: every process that builds a component refuses unlisted code)."""
    check_plugins(cfg, "config")
    return [r.to_dict() for r in cfg.rewards]


def build_reward(cfg: RunConfig) -> CombinedReward:
    """The configured reward functions, weighted and summed."""
    return CombinedReward.from_config(reward_entries(cfg))


def loss_arguments(cfg: RunConfig) -> tuple[str, dict]:
    """(loss.name, its hyperparameters), max_len filled from generator.max_new_tokens when the loss needs it."""
    return cfg.loss.name, complete_hyperparameters(cfg.loss.name, cfg.loss.params, cfg.generator.max_new_tokens)


def build_loss(cfg: RunConfig):
    """The configured policy loss: built once, by the process that trains; an import path only when the config
    file lists it (checked again here: the process that builds a component refuses unlisted code)."""
    check_plugins(cfg, "config")
    name, params = loss_arguments(cfg)
    return get_loss(name, **params)


def check_loss_config(cfg: RunConfig) -> None:
    """The configured loss's name and hyperparameters, checked without building it (the controller's check, after
    its plugin check)."""
    name, params = loss_arguments(cfg)
    check_loss(name, **params)


def trainer_arguments(cfg: RunConfig, sft: bool = False) -> tuple[TrainerConfig, dict]:
    """(the trainer section, the Trainer's keyword arguments that other sections decide) of the GRPO trainer, or
    with `sft` of the SFT warm-up (the sft section's lr, batch and schedule on the same trainer)."""
    if sft:
        return cfg.sft.trainer_config(cfg.trainer), {"total_steps": cfg.sft.total_steps,
                                                     "compute_dtype": compute_dtype(cfg)}
    return cfg.trainer, {"total_steps": cfg.steps, "temperature": cfg.generator.temperature,
                         "compute_dtype": compute_dtype(cfg)}


def wants_reference(cfg: RunConfig) -> bool:
    """Whether the loss gets reference logprobs: `auto` means when loss.beta > 0."""
    if cfg.ref_model.enabled == "auto":
        return cfg.loss.beta > 0
    return cfg.ref_model.enabled == "true"


def needs_reference(cfg: RunConfig) -> bool:
    """Whether a reference model is scored by a reference worker (or a reference copy in-process); with LoRA the
    trainer scores it itself, with its adapters disabled (`reference_from_base`), so there is none."""
    return wants_reference(cfg) and not cfg.trainer.lora.enabled


def reference_from_base(cfg: RunConfig) -> bool:
    """Whether the trainer scores the reference policy as its base model, adapters off (LoRA runs)."""
    return wants_reference(cfg) and cfg.trainer.lora.enabled


def run_schedule(cfg: RunConfig) -> Schedule:
    """The Schedule of a GRPO run: when the generators sync, when it evaluates and checkpoints, how far ahead."""
    return Schedule(steps=cfg.steps, sync_every=cfg.weightsync.sync_every, eval_every=cfg.eval.every,
                    checkpoint_every=cfg.checkpoint.every, max_policy_age=cfg.max_policy_age)
