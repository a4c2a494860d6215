"""The `sft` flow: supervised warm-up of the configured model on the dataset's answers — in this process for one
CPU trainer, else on a trainer worker (trainer.procs ranks, FSDP / torchtitan, GPUs when offered).

    dataset ─(prompt, answer)─▶ sft_train (masked cross-entropy, AdamW, cosine) ─▶ <run>/sft (HF checkpoint)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NONE

from infra.config import dump_config, load_config
from infra.paths import new_run_id, run_dir


@task(name="sft_train", cache_policy=NONE, persist_result=False, timeout_seconds=6 * 3600)
def sft_train(config: str, overrides: dict | None, out_dir: str) -> str:
    """cfg.sft.steps of SFT from cfg.model.path; returns the saved HF checkpoint directory."""
    from pathlib import Path

    from flows.inprocess import run_sft_steps, sft_phase
    from forge_core.models import load_model_and_tokenizer, load_tokenizer
    from infra import components as C
    from infra.launcher import WorkerPool
    from infra.launcher.plan import sft_in_workers
    from workers.remote import RemoteSFTTrainer

    cfg = load_config(config, overrides)
    C.configure_threads(cfg)
    show = sys.stderr.isatty()
    if not sft_in_workers(cfg):
        model, tok = load_model_and_tokenizer(cfg.model.path, seed=cfg.seed, dtype=C.DTYPES[cfg.model.dtype])
        return str(sft_phase(cfg, model, tok, C.build_splits(cfg, tok), Path(out_dir), show))
    # the model lives on the trainer worker's ranks (FSDP / torchtitan layout, GPUs); here only the tokenizer
    tok = load_tokenizer(cfg.model.path)
    with WorkerPool(cfg, Path(out_dir), roles=("trainer",)) as pool:
        run_sft_steps(cfg, RemoteSFTTrainer(pool), tok, C.build_splits(cfg, tok), show)
        return pool.call("trainer", "save_pretrained", str(Path(out_dir) / "sft"))


@flow(name="sft", persist_result=False)
def sft_flow(config: str = "configs/sft_math_tiny.yaml", overrides: dict | None = None,
             out_dir: str | None = None, run_name: str | None = None, run_id: str | None = None,
             sweep_id: str | None = None) -> str:
    """SFT only; returns the checkpoint directory (<out_dir>/sft; a new run directory when out_dir is None).
    Registered as its own run (recipe sft) with the checkpoint, so GRPO runs started from it link back."""
    from prefect.runtime import flow_run

    from forge_core.models import load_tokenizer
    from infra import components as C
    from infra.records import RunRecords, dataset_fingerprint

    cfg = load_config(config, overrides)
    if cfg.sft.steps < 1:
        raise ValueError(f"{config}: sft.steps is {cfg.sft.steps}; set sft.steps >= 1 to run SFT")
    run_id = run_id or new_run_id()
    if out_dir is None:
        out_dir = str(run_dir(run_id))
    dump_config(cfg, Path(out_dir) / "config.yaml")
    records = RunRecords(cfg, run_id, Path(out_dir), recipe="sft")
    tok = load_tokenizer(cfg.model.path)
    records.start(run_name or run_id, str(flow_run.id) if flow_run.id else None,
                  dataset_fingerprint(C.build_splits(cfg, tok).train), sweep_id=sweep_id)
    t0 = time.perf_counter()
    try:
        path = sft_train(config, overrides, out_dir)
    except BaseException as exc:
        records.finish("failed", message=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    records.checkpoint(cfg.sft.steps, path, kind="sft")
    records.finish("completed")
    print(f"SFT checkpoint {path} after {cfg.sft.steps} steps in {(time.perf_counter() - t0) / 60:.1f} min")
    return path


if __name__ == "__main__":
    from flows.cli import main

    sys.exit(main(["sft", *sys.argv[1:]]))
