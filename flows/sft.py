"""The `sft` flow: supervised warm-up of the configured model on the dataset's answers — in this process for one
CPU trainer, else on a trainer worker (trainer.procs ranks, FSDP / torchtitan, GPUs when offered).

    dataset ─(prompt, answer)─▶ sft_train (masked cross-entropy, AdamW, cosine) ─▶ <run>/sft (HF checkpoint)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.utilities.annotations import quote

from infra.config import dump_config
from infra.config_checks import load_config
from infra.paths import new_run_id, run_dir
from runtime.flow_runs import count_attempt, current_flow_run_id
from runtime.prefect_env import fail_for_user_error, label_flow_run
from tasks.sft import sft_train


class SFTReport:
    """After each SFT step: its loss/lr/grad norm to MLflow; a log line in the Prefect UI every 1/10 of the run."""

    def __init__(self, records, steps: int) -> None:
        self.records, self.steps, self.every = records, steps, max(1, steps // 10)

    def __call__(self, step: int, metrics: dict) -> None:
        done = step + 1
        self.records.sft_step(done, metrics)
        if done % self.every == 0 or done == self.steps:
            get_run_logger().info("sft step %d/%d loss %.4f lr %.2e grad norm %.3f", done, self.steps,
                                  metrics["loss"], metrics.get("lr", 0.0), metrics.get("grad_norm", 0.0))


@flow(name="sft", persist_result=False)
def sft_flow(config: str = "configs/sft_math_tiny.yaml", overrides: dict | None = None,
             out_dir: str | None = None, run_name: str | None = None, run_id: str | None = None,
             sweep_id: str | None = None, parent_mlflow_run_id: str | None = None) -> str:
    """SFT only; returns the checkpoint directory (<out_dir>/sft; a new run directory when out_dir is None).
    Registered as its own run (recipe sft) with the checkpoint, so GRPO runs started from it link back; its MLflow
    run (sft/loss, sft/lr, sft/grad_norm per step) nests under `parent_mlflow_run_id` (the GRPO run it warms up)."""

    from forge_core.models import load_tokenizer
    from infra import components as C
    from infra.records import RunRecords, dataset_fingerprint

    try:  # an expected user error ends the flow run with its message, not a traceback
        cfg = load_config(config, overrides)
        if cfg.sft.steps < 1:
            raise ValueError(f"{config}: sft.steps is {cfg.sft.steps}; set sft.steps >= 1 to run SFT")
    except ValueError as exc:
        return fail_for_user_error(exc)
    run_id = run_id or new_run_id()  # a rescheduled SFT deployment run starts over (SFT keeps no mid-run state)
    count_attempt(f"SFT run {run_id}")
    label_flow_run(f"sft · {run_id}", [run_id, "sft", *([sweep_id] if sweep_id else [])])
    if out_dir is None:
        out_dir = str(run_dir(run_id))
    dump_config(cfg, Path(out_dir) / "config.yaml")
    records = RunRecords(cfg, run_id, Path(out_dir), recipe="sft")
    tok = load_tokenizer(cfg.model.path)
    records.start(run_name or f"sft · {run_id}", current_flow_run_id(),
                  dataset_fingerprint(C.build_splits(cfg, tok).train), sweep_id=sweep_id,
                  parent_mlflow_run_id=parent_mlflow_run_id)
    t0 = time.perf_counter()
    try:
        path = sft_train(config, overrides, out_dir, quote(SFTReport(records, cfg.sft.steps)))
    except BaseException as exc:
        records.finish("failed", message=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    records.checkpoint(cfg.sft.steps, path, kind="sft")
    records.finish("completed")
    print(f"SFT checkpoint {path} after {cfg.sft.steps} steps in {(time.perf_counter() - t0) / 60:.1f} min")
    return path


if __name__ == "__main__":  # `python -m flows.sft …` is `forgeflow sft …`: hand over to the command line,
    import runpy  # which sits above the flows (run as a program, not imported: no arrow up the floors)

    sys.argv = ["forgeflow", "sft", *sys.argv[1:]]
    runpy.run_module("cli", run_name="__main__")
