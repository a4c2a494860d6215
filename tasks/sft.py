"""The `sft_train` task: SFT of the configured model in this process for one CPU trainer, else on a trainer worker
(trainer.procs ranks, FSDP / torchtitan, GPUs when offered)."""

from __future__ import annotations

import sys
from pathlib import Path

from prefect import task
from prefect.cache_policies import NONE

from forge_core.models import load_model_and_tokenizer, load_tokenizer
from infra import components as C
from infra.config_checks import load_config
from runtime.sft import StepReport, run_sft_steps, sft_phase
from workers.plan import sft_in_workers
from workers.pool import WorkerPool
from workers.remote import RemoteSFTTrainer


@task(name="sft_train", cache_policy=NONE, persist_result=False)
def sft_train(config: str, overrides: dict | None, out_dir: str, report: StepReport | None = None) -> str:
    """cfg.sft.steps of SFT from cfg.model.path; returns the saved HF checkpoint directory. `report(step,
    metrics)` after each step (the flow's MLflow curves and log lines)."""
    cfg = load_config(config, overrides)
    C.configure_threads(cfg)
    show = sys.stderr.isatty()
    if not sft_in_workers(cfg):
        model, tok = load_model_and_tokenizer(cfg.model.path, seed=cfg.seed, dtype=C.MASTER_DTYPE)
        return str(sft_phase(cfg, model, tok, C.build_splits(cfg, tok), Path(out_dir), show,
                             report))
    # the model lives on the trainer worker's ranks (FSDP / torchtitan layout, GPUs); here only the tokenizer
    tok = load_tokenizer(cfg.model.path)
    with WorkerPool(cfg, Path(out_dir), roles=("trainer",)) as pool:
        run_sft_steps(cfg, RemoteSFTTrainer(pool), tok, C.build_splits(cfg, tok), show, report)
        return pool.call("trainer", "save_pretrained", str(Path(out_dir) / "sft"))
