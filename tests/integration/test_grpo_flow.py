"""The grpo flow on the embedded Prefect API with real local workers: every phase task recorded, worker deaths
recovered without a missing or duplicated step."""

import json
import os
import signal
import threading
import time

import pytest
from mlflow.tracking import MlflowClient

from flows.grpo import grpo_flow
from infra.paths import forgeflow_home, run_dir
from infra.prefect_env import read_task_runs, wait_for_task_runs
from infra.registry import repo, session_scope
from infra.tracking import default_tracking_uri
from workers.protocol import read_rendezvous

pytestmark = pytest.mark.integration

TINY = {"model.path": "tiny:qwen3-micro", "sft.steps": 0, "generator.max_new_tokens": 4, "prompts_per_step": 4,
        "group_size": 4, "eval.num_prompts": 16, "eval.every": 2, "checkpoint.every": 2, "trainer.lr": 1e-3,
        "workers.threads": 1, "filter_groups": False, "loss.beta": 0.0}


def steps_recorded(run_id: str) -> list[int]:
    path = run_dir(run_id) / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def task_names(flow_run_id: str) -> dict[str, str]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return {r.name: r.state.type.value for r in read_task_runs(client, flow_run_id)}


def test_every_phase_task_of_every_iteration_is_recorded():
    summary = grpo_flow(overrides={**TINY, "steps": 3}, run_name="flow-records")
    assert wait_for_task_runs(summary["flow_run_id"], summary["task_calls"]) >= summary["task_calls"]
    names = task_names(summary["flow_run_id"])
    for step in range(3):
        for phase in ("rollout", "score_rewards", "train_step"):
            assert names.get(f"{phase}-{step}") == "COMPLETED", (phase, step, sorted(names))
        assert names.get(f"sync_weights-{step + 1}") == "COMPLETED"
    assert "score_reference-0" not in names  # beta = 0: no reference phase
    assert names.get("checkpoint-2") == "COMPLETED" and names.get("evaluate-2") == "COMPLETED"
    assert steps_recorded(summary["run_id"]) == [1, 2, 3]
    assert (run_dir(summary["run_id"]) / "curves.png").stat().st_size > 0


def runs_root():
    return forgeflow_home() / "runs"


def kill_when(existing: set, role: str, after_step: int, killed: list) -> threading.Thread:
    """SIGKILL the role's worker of the new run once its metrics.jsonl shows `after_step` steps."""
    def watch():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            runs = sorted(p for p in runs_root().iterdir() if p.name not in existing)
            for run in runs[-1:]:
                rows = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
                rv = read_rendezvous(run / "workers" / f"{role}-0.rendezvous.json")
                if len(rows) >= after_step and rv:
                    os.kill(rv.pid, signal.SIGKILL)
                    killed.append(rv.pid)
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("role", ["generator", "trainer"])
def test_killed_worker_mid_run_is_recovered_without_gaps(role):
    runs_root().mkdir(parents=True, exist_ok=True)
    killed: list[int] = []
    watcher = kill_when({p.name for p in runs_root().iterdir()}, role, 3, killed)
    summary = grpo_flow(overrides={**TINY, "steps": 6}, run_name=f"kill-{role}")
    watcher.join(timeout=1)
    assert killed, "the worker was never killed: the test did not exercise recovery"
    assert [r["role"] for r in summary["recoveries"]] == [role]
    assert steps_recorded(summary["run_id"]) == [1, 2, 3, 4, 5, 6]
    with session_scope() as s:  # the registry shows each step once as completed
        assert repo.completed_steps(s, summary["run_id"]) == [1, 2, 3, 4, 5, 6]
        rows = [w for w in repo.get_run(s, summary["run_id"]).workers if w.name == f"{role}-0"]
        assert sorted(w.restarts for w in rows) == [0, 1]  # the lost worker and its replacement
    history = MlflowClient(default_tracking_uri()).get_metric_history(summary["mlflow_run_id"], "reward/mean")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5, 6]  # no gap, no duplicate
    if role == "trainer":  # restored from the latest checkpoint (every 2 steps), later steps redone
        assert summary["recoveries"][0]["trainer_step"] in (2, 4)


def test_resume_continues_from_the_latest_complete_checkpoint():
    first = grpo_flow(overrides={**TINY, "steps": 4}, run_name="resume-me")
    out = run_dir(first["run_id"])
    state = out / "checkpoints" / "step-000004" / "trainer.pt"
    state.write_bytes(state.read_bytes()[:1000])  # truncated on disk: refused, the step-2 checkpoint is used
    partial = out / "checkpoints" / "step-000003"
    partial.mkdir()  # an interrupted checkpoint without COMPLETE must be ignored
    second = grpo_flow(resume=first["run_id"])
    assert second["run_id"] == first["run_id"] and second["start_step"] == 2
    assert steps_recorded(first["run_id"]) == [1, 2, 3, 4]
    assert (out / "checkpoints" / "step-000004" / "COMPLETE").exists()


@pytest.mark.slurm
def test_scancelled_generator_job_mid_run_is_recovered(slurm_cluster):
    import subprocess

    runs_root().mkdir(parents=True, exist_ok=True)
    existing = {p.name for p in runs_root().iterdir()}
    cancelled: list[str] = []

    def watch():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            new = sorted(p for p in runs_root().iterdir() if p.name not in existing)
            metrics = new[-1] / "metrics.jsonl" if new else None
            if metrics and metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
                with session_scope() as s:
                    jobs = [w.job_id for w in repo.get_run(s, new[-1].name).workers if w.name == "generator-0"]
                subprocess.run(["scancel", jobs[0]], check=True)
                cancelled.append(jobs[0])
                return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    summary = grpo_flow(overrides={**TINY, "steps": 5, "launcher": "slurm", "slurm.cpus_per_task": 1},
                        run_name="scancel-generator")
    thread.join(timeout=1)
    assert cancelled, "the generator job was never cancelled"
    assert [r["role"] for r in summary["recoveries"]] == ["generator"]
    assert steps_recorded(summary["run_id"]) == [1, 2, 3, 4, 5]
