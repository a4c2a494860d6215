"""The `grpo` flow: SFT warm-up (subflow, when configured), then the GRPO iteration spine
(forge_core.recipes.iteration) driven with Prefect tasks over persistent workers:

    dataset ─prompts─▶ rollout-s ──groups──▶ score_rewards-s ──▶ score_reference-s ──▶ train-s ──▶ sync_weights-v
      (generator replicas)             (reward workers)     (reference, beta>0)    (trainer: publishes v = s+1)
                                              every checkpoint.every: checkpoint-v   every eval.every: evaluate-v

With max_policy_age N >= 1 the rollouts of the next steps run while s trains (as many as keep every batch at most N
versions old; the trainer clips against its proximal policy and rollout_correction weighs by behaviour). Recovery
(tasks/recovery.py) restarts a lost worker inside the failed task's retry; a rolled-back trainer ends the step with
RolledBack and the spine continues from the restored checkpoint.
Run it: `forgeflow grpo --config configs/grpo_math_tiny.yaml --trainer.lr 3e-5` or `python -m flows.grpo …`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.states import Crashed

from forge_core.models import load_tokenizer
from forge_core.protocols import RolledBack
from forge_core.recipes.iteration import run_grpo_steps
from forge_core.recipes.reward_watch import RewardFailureWatch
from forge_core.recipes.samples import sample_rows, samples_markdown
from infra import checkpoints as ckpt
from infra import components as C
from infra import sft_cache
from infra.config import dump_config
from infra.config_checks import load_config
from infra.paths import forgeflow_home, new_run_id, run_dir
from infra.records import RunRecords, dataset_fingerprint
from infra.registry import repo, session_scope
from runtime.flow_runs import count_attempt, current_flow_run_id, remembered_id
from runtime.interrupts import interrupted_by
from runtime.plots import plot_curves
from runtime.prefect_artifacts import RunArtifacts
from runtime.prefect_env import MAX_FLOW_RUN_ATTEMPTS, fail_for_user_error, label_flow_run
from runtime.progress import held_out_summary, line_for_step
from runtime.run_lock import lock_run
from tasks.context import RunContext, register_run, unregister_run
from tasks.phases import TaskCalls, task_roles
from tasks.recovery import lost_worker, restore_latest
from workers.pool import WorkerPool

log = logging.getLogger(__name__)


class FlowRecorder:
    """StepRecorder of the flow: the run's records (registry, MLflow, metrics.jsonl), a progress line a step, and
    the flow run's artifacts (progress each step; metrics table and rollout samples at evals and checkpoints)."""

    def __init__(self, records: RunRecords, artifacts: RunArtifacts) -> None:
        self.records, self.artifacts, self.cfg = records, artifacts, records.cfg
        self.tabled = -1  # the last step the metrics table artifact shows

    def step(self, version: int, metrics: dict[str, float]) -> None:
        self.records.step(version, metrics)
        show_line(line_for_step(version - 1, self.cfg.steps, metrics))
        self.artifacts.progress(version)
        if "eval/accuracy" in metrics:
            self.table()

    def table(self) -> None:
        """The metrics table artifact, when it would show a step it does not show yet."""
        rows = self.records.rows()
        if rows and rows[-1]["step"] != self.tabled:
            self.artifacts.table(rows)
            self.tabled = rows[-1]["step"]

    def samples(self, version: int, groups) -> None:
        rows = sample_rows(groups, version, self.cfg.tracking.sample_prompts, self.cfg.advantage.to_dict())
        if rows:
            self.records.samples(version, rows)
            self.artifacts.samples(version, samples_markdown(rows))

    def checkpoint(self, version: int, path: str) -> None:
        self.records.checkpoint(version, path)
        self.table()

    def rollback(self, step: int) -> None:
        self.records.rollback(step)

    def evaluation(self, version: int) -> dict[str, float]:
        """The eval/* metrics recorded at step `version` (empty when it was not evaluated): the last step's, when
        the schedule evaluated it, are the final evaluation (greedy and seeded: evaluating again gives the same)."""
        row = next((r for r in reversed(self.records.rows()) if r.get("step") == version), {})
        return {k: v for k, v in row.items() if k.startswith("eval/")}


@flow(name="grpo", persist_result=False)
def grpo_flow(config: str = "configs/grpo_math_tiny.yaml", overrides: dict | None = None,
              run_name: str | None = None, resume: str | None = None, sweep_id: str | None = None,
              parent_mlflow_run_id: str | None = None) -> dict:
    """GRPO (any loss of the family) on persistent workers; returns the run summary (run id, accuracies, minutes)."""
    start_time = time.perf_counter()
    logger = get_run_logger()
    try:  # an expected user error ends the flow run with its message, not a traceback
        cfg = load_config(config, overrides)
        if resume:
            check_resumable(resume)
    except ValueError as exc:
        return fail_for_user_error(exc)
    run_id = resume or remembered_id("run_id", new_run_id)  # a rescheduled flow run resumes its own run
    try:  # one driver per run: a duplicate execution of this flow run waits, any other driver is refused
        lock = lock_run(run_dir(run_id), run_id, current_flow_run_id())
    except ValueError as exc:
        return fail_for_user_error(exc)
    with lock:
        if not resume and (done := completed_summary(cfg, run_id)):  # executed again (a late crash report)
            logger.info("run %s was completed by %s execution of this flow run", run_id,
                        "the other" if lock.waited else "an earlier")
            return done
        # attempts that drove the run, not Prefect's run_count: the process worker reports a crash twice, and the
        # executions started by the second report only wait here
        count_attempt(f"run {run_id}")
        return drive_run(cfg, run_id, resume, start_time, config=config, overrides=overrides, run_name=run_name,
                         sweep_id=sweep_id, parent_mlflow_run_id=parent_mlflow_run_id)


def completed_summary(cfg, run_id: str) -> dict | None:
    """The summary of run `run_id` when its records say completed (else None)."""
    path = run_dir(run_id) / "summary.json"
    if not path.exists():
        return None
    with session_scope(cfg.tracking.registry_url) as s:
        if repo.get_run(s, run_id).status != "completed":
            return None
    return json.loads(path.read_text())


def drive_run(cfg, run_id: str, resume: str | None, start_time: float, *, config: str, overrides: dict | None,
              run_name: str | None, sweep_id: str | None, parent_mlflow_run_id: str | None) -> dict:
    """The run itself (new, or resumed from its directory), with its lock held; returns the run summary."""
    cfg, out = open_run_dir(cfg, run_id, resume)
    name_flow_run(cfg, run_id, run_name, sweep_id)
    get_run_logger().info("run %s (%s) in %s", run_id, run_name or "unnamed", out)  # under the flow run's new name
    threads = C.configure_threads(cfg)
    records = RunRecords(cfg, run_id, out)
    # the distinguishing part first (MLflow cuts names to ~20 characters); the date is in its Created column
    mlflow_name = run_name or f"{cfg.loss.name} · {run_id.split('-', 1)[-1]}"
    start = warm_start(cfg, records, run_id, out, mlflow_name, config=config, overrides=overrides,
                       sweep_id=sweep_id, parent_mlflow_run_id=parent_mlflow_run_id)
    init_path = start.path
    splits = C.build_splits(cfg, load_tokenizer(init_path or cfg.model.path))  # the weights live in the workers
    records.start(run_name, current_flow_run_id(), dataset_fingerprint(splits.train),
                  init_checkpoint=start.lineage_checkpoint, sweep_id=sweep_id,
                  parent_mlflow_run_id=parent_mlflow_run_id, parent_run_id=start.sft_run, mlflow_name=mlflow_name)
    try:
        outcome = train_on_workers(cfg, run_id, out, records, splits, init_path, threads)
    except BaseException as exc:
        return end_unfinished(run_id, records, exc)
    return finish_run(cfg, run_id, out, records, outcome, run_name=run_name, start_time=start_time,
                      init_model=init_path)


def open_run_dir(cfg, run_id: str, resume: str | None):
    """(the run's config, its directory): a resumed run keeps its recorded config (overrides on resume may not
    change it); a new one records its config there."""
    out = run_dir(run_id)
    if resume or (out / "config.yaml").exists():
        return load_config(out / "config.yaml"), out
    dump_config(cfg, out / "config.yaml")
    return cfg, out


def name_flow_run(cfg, run_id: str, run_name: str | None, sweep_id: str | None) -> None:
    """The flow run's name and tags in the Prefect UI: a chosen --run-name shows there too; a sweep child's name is
    its grid point, shown by its sweep."""
    named = f"{run_name} · " if run_name and not sweep_id else ""
    label_flow_run(f"grpo · {named}{cfg.loss.name} · {run_id}",
                   [run_id, cfg.loss.name, *([sweep_id] if sweep_id else [])])


@dataclass
class WarmStart:
    """Where GRPO starts: the model directory the workers load (None: the base model), the SFT run that trained it
    and its recorded checkpoint (the run's lineage; a cached warm-up loads from the cache)."""

    path: str | None = None
    sft_run: str | None = None
    lineage_checkpoint: str | None = None


def warm_start(cfg, records: RunRecords, run_id: str, out, mlflow_name: str, *, config: str,
               overrides: dict | None, sweep_id: str | None, parent_mlflow_run_id: str | None) -> WarmStart:
    """sft.init; this run's SFT checkpoint from an earlier attempt; an identical earlier warm-up from the SFT cache;
    or the SFT subflow, run now (nested under this run in MLflow) and then cached; or the base model."""
    if cfg.sft.init or cfg.sft.steps <= 0:
        return WarmStart(cfg.sft.init, None, cfg.sft.init)
    from flows.sft import sft_flow

    sft_dir, sft_run = out / "sft", f"{run_id}-sft"
    if (sft_dir / "config.json").exists():
        return WarmStart(str(sft_dir), sft_run, str(sft_dir))
    inputs, hit = sft_cache.find_cached_sft(cfg) if cfg.sft.cache else (None, None)
    if hit is not None:
        get_run_logger().info(sft_cache.hit_message(hit))
        source = hit.source_run if registered(cfg, hit.source_run) else None
        return WarmStart(str(hit.path), source, hit.source_checkpoint if source else None)
    records.open_mlflow_run(mlflow_name, parent_mlflow_run_id)  # the SFT run nests under this one
    try:
        path = sft_flow(config, overrides, out_dir=str(out), run_id=sft_run, sweep_id=sweep_id,
                        run_name=f"sft · {mlflow_name}", parent_mlflow_run_id=records.mlflow_run_id)
    except BaseException:
        records.end_unstarted("KILLED" if interrupted_by(sys.exc_info()[1]) else "FAILED")
        raise
    if inputs is not None and isinstance(path, str):
        sft_cache.store(Path(path), inputs, sft_run)
    return WarmStart(path, sft_run, path)


def registered(cfg, run_id: str | None) -> bool:
    """Whether the run registry holds `run_id` (a cached warm-up may come from another registry's run)."""
    if run_id is None:
        return False
    with session_scope(cfg.tracking.registry_url) as s:
        return s.get(repo.Run, run_id) is not None


@dataclass
class RunOutcome:
    """What the GRPO steps on the workers leave for the summary."""

    start: int  # the step this execution started (or resumed) at
    before: dict  # held-out metrics at `start`
    after: dict  # held-out metrics at the end
    final: str  # the final checkpoint
    task_calls: int
    recoveries: int


def train_on_workers(cfg, run_id: str, out, records: RunRecords, splits, init_path: str | None,
                     threads: int) -> RunOutcome:
    """Start the workers, resume from the latest checkpoint, evaluate, run the steps to the end, evaluate again and
    record the final checkpoint."""
    logger = get_run_logger()
    with WorkerPool(cfg, out, init_path=init_path, with_reference=C.needs_reference(cfg)) as pool:
        worker_rows = records.workers(pool)
        ctx = RunContext(run_id, cfg, pool, splits, out, records=records)
        register_run(ctx)
        calls = TaskCalls()
        roles = task_roles(run_id, ctx.checkpoint_dir, C.needs_reference(cfg), calls,
                           scored_in_rollout=ctx.roles.generator.scored_in_rollout, with_teacher=cfg.distill.enabled)
        try:
            start, latest = restore_latest(ctx)
            records.resume_at(start, latest)
            artifacts = RunArtifacts(run_id, cfg.steps)
            artifacts.links(records.mlflow_url or "(no MLflow run)", str(out))
            artifacts.workers(worker_rows)
            before = roles.generator.evaluate(start)
            records.eval_point(start, before)
            logger.info("held-out accuracy at step %d: %.3f (workers up in %.1fs, %d threads here)", start,
                        before["eval/accuracy"], max(pool.startup_s.values()), threads)
            recorder = FlowRecorder(records, artifacts)
            after, final = run_to_end(ctx, roles, start, recorder)
            recorder.table()
            records.eval_point(cfg.steps, after)
            logger.info("held-out accuracy at the end (step %d): %.3f (%+.3f)", cfg.steps,
                        after["eval/accuracy"], after["eval/accuracy"] - before["eval/accuracy"])
            records.checkpoint(cfg.steps, final, kind="final")
            if ctx.recoveries:  # the replacements' nodes
                artifacts.workers(records.workers(pool))
        finally:
            unregister_run(run_id)
    return RunOutcome(start, before, after, final, calls.count, ctx.recoveries)


def end_unfinished(run_id: str, records: RunRecords, exc: BaseException):
    """The records of a run the steps did not finish, by cause: workers lost beyond recovery end the flow run
    Crashed (returned, resumable); Ctrl-C leaves it interrupted and a failure failed (both raised again)."""
    if not interrupted_by(exc):
        if (lost := lost_worker(exc)) is not None:  # infrastructure, not the run's fault: kept resumable and
            return end_crashed(run_id, records, lost)  # ended Crashed, which the crash Automation reschedules
        records.finish("failed", message=f"{type(exc).__name__}: {exc}"[:2000])
        raise exc
    # said first: finishing the records may fail too once Ctrl-C has stopped the embedded servers
    log.warning("run %s interrupted; workers stopped. Continue it with: forgeflow resume %s", run_id, run_id)
    records.finish("interrupted", message=f"interrupted (Ctrl-C): `forgeflow resume {run_id}` continues it")
    raise exc


def finish_run(cfg, run_id: str, out, records: RunRecords, outcome: RunOutcome, *, run_name: str | None,
               start_time: float, init_model: str | None = None) -> dict:
    """The run's summary (summary.json, curves.png), and its records marked completed; returns the summary.
    `init_model`: the model RL started from (the SFT model, cached or trained by this run), when not model.path."""
    before, after = outcome.before, outcome.after
    summary = {"run_id": run_id, "run_name": run_name, **held_out_summary(before, after), "start_step": outcome.start,
               "minutes": (time.perf_counter() - start_time) / 60, "checkpoint": outcome.final,
               "flow_run_id": current_flow_run_id(), "task_calls": outcome.task_calls,
               "recoveries": outcome.recoveries, "init_model": None if init_model is None else str(init_model)}
    rows = records.rows()
    if rows:
        curves = [{"step": outcome.start, **before}] + rows + [{"step": cfg.steps, **after}]
        summary["plot"] = str(plot_curves({run_name or run_id: curves}, out / "curves.png",
                                          title=f"GRPO {cfg.loss.name} on {cfg.dataset.kind}"))
    summary["mlflow_run_id"] = records.mlflow_run_id
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    records.finish("completed", summary)
    return summary


def end_crashed(run_id: str, records: RunRecords, lost: BaseException):
    """The final state of a run that lost workers beyond recovery: records say interrupted (resumable), and the flow
    run ends Crashed, like a killed flow process, so the crash Automation reschedules it into a resume."""
    message = (f"infrastructure failure after the task's retries: {lost}. The run is resumable: a deployment run is "
               f"rescheduled by the crash Automation (at most {MAX_FLOW_RUN_ATTEMPTS} attempts); otherwise "
               f"`forgeflow resume {run_id}` continues it")
    log.error(message)
    records.finish("interrupted", message=message[:2000])
    return Crashed(message=message[:2000])


def show_line(line: str) -> None:
    """One progress line per step in the flow run's log: the Prefect UI, and the terminal (ConsoleFilter)."""
    get_run_logger().info(line)


def check_resumable(run_id: str) -> None:
    """A clear error (before anything starts) when `run_id` names no grpo run directory."""
    runs = forgeflow_home() / "runs"
    if not (runs / run_id / "config.yaml").exists():
        raise ValueError(f"cannot resume {run_id!r}: no run directory with a config.yaml under {runs}; "
                         "`forgeflow runs ls` lists the runs (FORGEFLOW_HOME selects the state directory)")


def run_to_end(ctx: RunContext, roles, start: int, recorder: FlowRecorder) -> tuple[dict, str]:
    """Steps start..steps-1, then the final evaluation and checkpoint; a trainer rolled back by a recovery during
    those last two redoes the steps after its checkpoint. Returns (final eval metrics, final checkpoint path)."""
    step = start
    watch = RewardFailureWatch(ctx.cfg.reward.max_failed_steps)
    while True:
        run_grpo_steps(roles, C.run_schedule(ctx.cfg), step, recorder, watch)
        try:
            after = recorder.evaluation(ctx.cfg.steps) or roles.generator.evaluate(ctx.cfg.steps)
            return after, final_checkpoint(ctx, roles)
        except RolledBack as back:
            log.warning("trainer restored to step %d after the last step; redoing the steps from there", back.step)
            step = back.step
            recorder.rollback(step)


def final_checkpoint(ctx: RunContext, roles) -> str:
    """The checkpoint of the last step: already saved when the schedule checkpointed it, else saved now
    (RolledBack when the trainer is no longer at the last step)."""
    last = ckpt.step_dir(ctx.checkpoint_dir, ctx.cfg.steps)
    if ckpt.is_complete(last):
        return str(last)
    return roles.trainer.checkpoint(ctx.cfg.steps, None)


if __name__ == "__main__":  # `python -m flows.grpo …` is `forgeflow grpo …`: hand over to the command line,
    import runpy  # which sits above the flows (run as a program, not imported: no arrow up the floors)

    sys.argv = ["forgeflow", "grpo", *sys.argv[1:]]
    runpy.run_module("cli", run_name="__main__")
