"""SFT of a RunConfig's model in this process (or through any object with the Trainer's `train_step`), with a
progress bar; the in-process main job and the `sft_train` task both call it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from forge_core.data.teacher import teach
from forge_core.losses import get_loss
from forge_core.models import save_model_and_tokenizer
from forge_core.models.lora import merge_lora
from forge_core.models.tokenizer import end_token_ids
from forge_core.recipes.sft import make_env_sft_examples, make_sft_examples, run_sft
from forge_core.training import Trainer
from infra import components as C
from infra.config import RunConfig

StepReport = Callable[[int, dict], None]


def sft_phase(cfg: RunConfig, model, tok, splits, out: Path, show: bool, report: StepReport | None = None) -> Path:
    """Run cfg.sft.steps of SFT here with a progress bar; save the HF checkpoint to out/sft. With LoRA the adapters
    are merged into `model` in place: it goes on (to generation, to RL's fresh adapters and reference) as the plain
    SFT model that out/sft holds, the same model a process that reloads out/sft starts from."""
    trained = model
    if cfg.trainer.backend == "titan":  # one process: torchtitan's definition of the same weights
        from forge_core.models.titan import titan_from_hf

        trained = titan_from_hf(model)
    else:
        C.prepare_trained_model(cfg, model)
    config, options = C.trainer_arguments(cfg, sft=True)
    run_sft_steps(cfg, Trainer(trained, get_loss("sft"), config, tok.pad_token_id, **options), tok, splits, show,
                  report)
    if trained is not model:
        model.load_state_dict(trained.to_hf_state_dict())  # the HF model goes on to generate and to disk
    return save_model_and_tokenizer(merge_lora(model), tok, out / "sft")


def run_sft_steps(cfg: RunConfig, trainer, tok, splits, show: bool, report: StepReport | None = None) -> None:
    """cfg.sft.steps SFT steps of `trainer` (a Trainer, or the trainer worker behind the same interface) on the
    training split's answers, with a progress bar; `report(step, metrics)` after each (step 0-based)."""
    # RL with verifiable rewards as used in practice: SFT on a small labelled subset, RL on every prompt
    n = cfg.sft.examples or len(splits.train)
    if cfg.env.enabled:  # demonstrated episodes in the run's environment, through the multi-turn token layer
        examples = make_env_sft_examples(splits.train[:n], cfg.env, tok, end_token_ids(tok, None), cfg.sft.tool_use,
                                         cfg.dataset.seed)
    else:  # drop_carry 0: the true answers
        demonstrations = teach(splits.train[:n], cfg.sft.drop_carry, cfg.dataset.seed, cfg.dataset.solution)
        examples = make_sft_examples(demonstrations, splits.train_prompts[:n], tok, cfg.sft.response)
    bar = tqdm(total=cfg.sft.steps, desc="sft", disable=not show, dynamic_ncols=True)

    def on_step(step, metrics):
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}")
        if report is not None:
            report(step, metrics)

    run_sft(trainer, examples, cfg.sft.steps, cfg.sft.batch_size, cfg.seed, tok.pad_token_id, on_step)
    bar.close()
