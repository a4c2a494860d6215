"""The `grpo` flow: SFT warm-up (subflow, when configured), then GRPO iterations as Prefect tasks on persistent
workers.

    dataset ─prompts─▶ rollout-v ──groups──▶ score_rewards-v ──▶ score_reference-v ──▶ train_step-v ──▶ sync_weights-v+1
      (generator replicas, version v)    (reward workers)     (reference, beta>0)    (trainer: publishes v+1)
                                              every checkpoint.every: checkpoint-N   every eval.every: evaluate-N

With max_policy_age >= 1 the rollout of v+1 runs while v trains (behaviour logprobs correct the ratio).
Run it: `forgeflow grpo --config configs/grpo_math_tiny.yaml --trainer.lr 3e-5` or `python -m flows.grpo …`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.utilities.annotations import quote

from forge_core.models import load_tokenizer
from infra import components as C
from infra.config import dump_config
from infra.config_checks import load_config
from infra.paths import forgeflow_home, new_run_id, run_dir
from infra.plots import plot_curves
from infra.prefect_env import MAX_FLOW_RUN_ATTEMPTS
from infra.progress import line_for_step
from infra.records import RunRecords, dataset_fingerprint, file_sha256
from tasks import phases
from tasks.context import RunContext, register_run, unregister_run
from workers.pool import WorkerPool

log = logging.getLogger(__name__)


def run_iterations(ctx: RunContext, start: int, records: RunRecords, show) -> int:
    """GRPO steps start..cfg.steps-1 as tasks; returns the number of task calls made.

    Episode batches go into tasks wrapped in `quote`: Prefect otherwise walks every nested object of a task's
    arguments looking for futures (~90 ms per call for a 256-episode batch against ~10 ms quoted)."""
    cfg, run_id = ctx.cfg, ctx.run_id
    pipelined = cfg.max_policy_age >= 1
    calls = 0
    step = start
    pending = first_rollout(ctx, step) if pipelined and step < cfg.steps else None
    while step < cfg.steps:
        t0 = time.perf_counter()
        if pending is not None:
            groups, metrics = pending.result()
            pending = None
        else:
            groups, metrics = phases.rollout(run_id, step)
        groups, reward_metrics = phases.score_rewards(run_id, step, quote(groups))
        metrics.update(reward_metrics)
        calls += 2
        if C.needs_reference(cfg):
            groups, ref_metrics = phases.score_reference(run_id, step, quote(groups))
            metrics.update(ref_metrics)
            calls += 1
        if pipelined and step + 1 < cfg.steps:  # sample v+1's batch with weights v while v trains
            pending = phases.rollout.submit(run_id, step + 1)
        train_metrics = phases.train_step(run_id, step, quote(groups))
        calls += 1 + (pending is not None)
        if "resume_from" in train_metrics:  # a recovery rolled the trainer back to its last checkpoint
            step, pending = roll_back_to(ctx, records, train_metrics["resume_from"], pending)
            continue
        metrics.update(train_metrics)
        if pending is not None:
            pending.wait()  # the generator's connection serves one call at a time
        evaluating = bool(cfg.eval.every and (step + 1) % cfg.eval.every == 0)
        if C.syncs_at(cfg, step + 1):  # the trainer published step+1 (every sync_every, eval, checkpoint, last)
            metrics.update(phases.sync_weights(run_id, step + 1))
            calls += 1
        if evaluating:
            metrics.update(phases.evaluate(run_id, step + 1))
            calls += 1
        metrics["timing/step"] = time.perf_counter() - t0
        # recorded before its checkpoint: a crash after COMPLETE resumes after this step, so it must be on record
        # already; a crash before COMPLETE resumes earlier and the rollback drops it
        records.step(step + 1, metrics)
        if cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0:
            inflight = quote(pending.result()) if pending is not None else None  # step+1's batch, sampled ahead
            saved = phases.checkpoint(run_id, step + 1, inflight)
            calls += 1
            if saved is None:  # the trainer was lost while saving and came back from an older checkpoint: go
                # back now (the next rollout would ask the generators for a version the trainer no longer has)
                step, pending = roll_back_to(ctx, records, ctx.pool.call("trainer", "health")["step"], pending)
                continue
            records.checkpoint(step + 1, saved)
        show(line_for_step(step, cfg.steps, metrics))
        step += 1
    return calls


def roll_back_to(ctx: RunContext, records: RunRecords, step: int, pending) -> tuple:
    """A recovery restored the trainer to its checkpoint at `step`: supersede the later steps in the records and
    continue from there; returns (step, the pipelined rollout of `step` or None)."""
    if pending is not None:
        pending.wait()  # the generator's connection serves one call at a time
    log.warning("trainer restored to step %d; continuing from there", step)
    records.rollback(step)
    return step, first_rollout(ctx, step) if ctx.cfg.max_policy_age >= 1 else None


class ReadyRollout:
    """A rollout already sampled (saved with a checkpoint), used where a rollout future would be."""

    def __init__(self, value: tuple) -> None:
        self.value = value

    def result(self) -> tuple:
        return self.value

    def wait(self) -> None:
        return None


def first_rollout(ctx: RunContext, step: int):
    """The pipelined rollout of `step`: the batch saved with the checkpoint at `step` when there is one (it was
    sampled with version step-1, as in the uninterrupted run), else a new rollout task."""
    saved = ctx.checkpoint_dir / f"step-{step:06d}" / phases.INFLIGHT
    if step > 0 and saved.exists():
        import torch

        marker = json.loads((saved.parent / "COMPLETE").read_text())
        if marker.get("inflight_sha256") == file_sha256(saved):
            log.info("step %d: training on the batch saved with its checkpoint (sampled ahead)", step)
            return ReadyRollout(torch.load(saved, weights_only=False))
        log.error("%s does not match its checkpoint's sha256: sampling step %d again", saved, step)
    return phases.rollout.submit(ctx.run_id, step)


@flow(name="grpo", persist_result=False)
def grpo_flow(config: str = "configs/grpo_math_tiny.yaml", overrides: dict | None = None,
              run_name: str | None = None, resume: str | None = None, sweep_id: str | None = None,
              parent_mlflow_run_id: str | None = None) -> dict:
    """GRPO (any loss of the family) on persistent workers; returns the run summary (run id, accuracies, minutes)."""
    start_time = time.perf_counter()
    logger = get_run_logger()
    cfg = load_config(config, overrides)
    if (flow_run.run_count or 1) > MAX_FLOW_RUN_ATTEMPTS:
        raise RuntimeError(f"flow run {flow_run.id} is on attempt {flow_run.run_count}; forgeflow stops after "
                           f"{MAX_FLOW_RUN_ATTEMPTS} (see its earlier crashes); `forgeflow resume RUN_ID` continues it")
    if resume:
        check_resumable(resume)
    run_id = resume or run_id_for_flow_run()
    resume = resume or (run_id if (run_dir(run_id) / "config.yaml").exists() else None)
    out = run_dir(run_id)
    if resume:  # the resumed run keeps its recorded config (overrides on resume are not allowed to change it)
        cfg = load_config(out / "config.yaml")
    else:
        dump_config(cfg, out / "config.yaml")
    logger.info("run %s (%s) in %s", run_id, run_name or "unnamed", out)
    threads = C.configure_threads(cfg)
    init_path, sft_run = cfg.sft.init, None
    if cfg.sft.steps > 0 and not init_path:
        from flows.sft import sft_flow

        sft_dir, sft_run = out / "sft", f"{run_id}-sft"
        init_path = str(sft_dir) if (sft_dir / "config.json").exists() else \
            sft_flow(config, overrides, out_dir=str(out), run_id=sft_run, sweep_id=sweep_id)
    tok = load_tokenizer(init_path or cfg.model.path)  # the weights live in the workers
    splits = C.build_splits(cfg, tok)
    records = RunRecords(cfg, run_id, out)
    records.start(run_name, str(flow_run.id) if flow_run.id else None, dataset_fingerprint(splits.train),
                  init_checkpoint=init_path, sweep_id=sweep_id, parent_mlflow_run_id=parent_mlflow_run_id,
                  parent_run_id=sft_run)
    try:
        with WorkerPool(cfg, out, init_path=init_path, with_reference=C.needs_reference(cfg)) as pool:
            records.workers(pool)
            ctx = RunContext(run_id, cfg, pool, splits, out, records=records)
            register_run(ctx)
            try:
                start, ckpt = restore_latest(ctx)
                records.resume_at(start, ckpt)
                before = phases.evaluate(run_id, start)
                logger.info("held-out accuracy at step %d: %.3f (workers up in %.1fs, %d threads here)", start,
                            before["eval/accuracy"], max(pool.startup_s.values()), threads)
                calls = 2 + run_iterations(ctx, start, records, show_line)
                after = phases.evaluate(run_id, cfg.steps)
                last = ctx.checkpoint_dir / f"step-{cfg.steps:06d}"
                final = str(last) if (last / "COMPLETE").exists() else phases.checkpoint(run_id, cfg.steps)
                if final is None:
                    raise RuntimeError(f"the trainer was lost and rolled back while saving step {cfg.steps}; "
                                       f"`forgeflow resume {run_id}` redoes the last steps")
                records.checkpoint(cfg.steps, final, kind="final")
            finally:
                unregister_run(run_id)
    except KeyboardInterrupt:
        records.finish("interrupted", message=f"interrupted (Ctrl-C): `forgeflow resume {run_id}` continues it")
        log.warning("run %s interrupted; workers stopped. Continue it with: forgeflow resume %s", run_id, run_id)
        raise
    except BaseException as exc:
        records.finish("failed", message=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    summary = {"run_id": run_id, "run_name": run_name, "acc_before": before["eval/accuracy"],
               "acc_after": after["eval/accuracy"], "start_step": start,
               "minutes": (time.perf_counter() - start_time) / 60, "checkpoint": final,
               "flow_run_id": str(flow_run.id) if flow_run.id else None, "task_calls": calls,
               "recoveries": ctx.recoveries}
    rows = records.rows()
    if rows:
        curves = [{"step": start, **before}] + rows + [{"step": cfg.steps, **after}]
        summary["plot"] = str(plot_curves({run_name or run_id: curves}, out / "curves.png",
                                          title=f"GRPO {cfg.loss['name']} on {cfg.dataset.kind}"))
    summary["mlflow_run_id"] = records.mlflow_run_id
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    records.finish("completed", summary)
    return summary


def show_line(line: str) -> None:
    """One progress line per step on the terminal (print is captured by Prefect's log_prints) and in the run log."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    get_run_logger().info(line)


def check_resumable(run_id: str) -> None:
    """A clear error (before anything starts) when `run_id` names no grpo run directory."""
    runs = forgeflow_home() / "runs"
    if not (runs / run_id / "config.yaml").exists():
        raise ValueError(f"cannot resume {run_id!r}: no run directory with a config.yaml under {runs}; "
                         "`forgeflow runs ls` lists the runs (FORGEFLOW_HOME selects the state directory)")


def run_id_for_flow_run() -> str:
    """A new run id, remembered per Prefect flow run: a flow run rescheduled after a crash gets the same run id back
    and so resumes its own checkpoints."""
    if not flow_run.id:
        return new_run_id()
    index = forgeflow_home() / "flow_runs" / f"{flow_run.id}.json"
    if index.exists():
        return json.loads(index.read_text())["run_id"]
    run_id = new_run_id()
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(json.dumps({"run_id": run_id, "flow_run_id": str(flow_run.id)}))
    return run_id


def restore_latest(ctx: RunContext) -> tuple[int, Path | None]:
    """Load the run's latest complete checkpoint into the trainer (and its weights into the generators);
    returns (the step to continue from, that checkpoint), (0, None) for a fresh run."""
    ckpt = ctx.latest_checkpoint()
    if ckpt is None:
        return 0, None
    step = ctx.pool.call("trainer", "load_checkpoint", str(ckpt))
    ctx.pool.call("trainer", "publish_weights", step)
    ctx.pool.call_all("generator", "load_weights", step)
    log.info("resumed from %s at step %d", ckpt, step)
    return step, ckpt


if __name__ == "__main__":  # `python -m flows.grpo …` is `forgeflow grpo …`: hand over to the command line,
    import runpy  # which sits above the flows (run as a program, not imported: no arrow up the floors)

    sys.argv = ["forgeflow", "grpo", *sys.argv[1:]]
    runpy.run_module("cli", run_name="__main__")
