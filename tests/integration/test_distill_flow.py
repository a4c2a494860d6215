"""On-policy distillation through the Prefect flow and its workers: the teacher worker scores every batch, the run
gives the in-process run's numbers, and a killed teacher is replaced without changing the final weights."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from cli.reports import compare_runs, show_run
from flows.grpo import grpo_flow
from infra.config_checks import load_config
from infra.tracking import default_tracking_uri
from runtime.inprocess import run_main_job
from tests.integration.fault_helpers import TINY, kill_worker_when, recorded_metrics

pytestmark = pytest.mark.integration

STEPS = 4
COMPARED = ("reward/mean", "distill/reverse_kl", "distill/teacher_logprob", "loss/loss", "loss/grad_norm")


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    """A tiny model of the student's family (same tokenizer), other weights: a teacher the student is far from."""
    from forge_core.models import save_model_and_tokenizer
    from forge_core.models.loading import build_tiny_model
    from forge_core.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    return str(save_model_and_tokenizer(build_tiny_model("qwen3-micro", tok, seed=7), tok,
                                        tmp_path_factory.mktemp("teacher")))


@pytest.fixture(scope="module")
def distill_run(teacher_dir) -> dict:
    """Overrides of a tiny distillation run and its uninterrupted flow run's summary."""
    overrides = {**TINY, "steps": STEPS, "trainer.entropy_coef": 0.01, "eval.every": 0, "checkpoint.every": 2,
                 "distill.teacher": teacher_dir, "distill.coef": 1.0, "distill.reward_weight": 0.5}
    return {"overrides": overrides, "summary": grpo_flow(overrides=overrides, run_name="distill-uninterrupted")}


def test_the_flow_scores_with_a_teacher_worker_and_matches_the_in_process_run(distill_run):
    flow_rows = recorded_metrics(distill_run["summary"]["run_id"])
    assert [r["step"] for r in flow_rows] == list(range(1, STEPS + 1))
    assert all(r["distill/reverse_kl"] > 0 and r["timing/teacher"] > 0 for r in flow_rows)
    info = show_run(distill_run["summary"]["run_id"])
    assert {w["role"] for w in info["workers"]} == {"trainer", "generator", "reward", "teacher"}
    history = MlflowClient(default_tracking_uri()).get_metric_history(info["mlflow_run_id"], "distill/reverse_kl")
    assert sorted(m.step for m in history) == list(range(1, STEPS + 1))  # in MLflow, a point per step
    row = compare_runs([info["run_id"]], ["distill/reverse_kl"])["runs"][0]
    assert row["teacher"] == distill_run["overrides"]["distill.teacher"] and row["distill/reverse_kl points"] == STEPS
    # the flow's default recipe file with the same overrides
    cfg = load_config("configs/grpo_math_tiny.yaml", distill_run["overrides"])
    local = run_main_job(cfg, run_name="distill-in-process", show=False)
    local_rows = recorded_metrics(local["run_id"])
    for flow, here in zip(flow_rows, local_rows, strict=True):
        for key in COMPARED:
            assert flow[key] == pytest.approx(here[key], rel=1e-4, abs=1e-6), (flow["step"], key)
    assert local["acc_after"] == pytest.approx(distill_run["summary"]["acc_after"])


def test_a_killed_teacher_worker_is_replaced_and_the_run_ends_bitwise_identical(distill_run, monkeypatch):
    reference = show_run(distill_run["summary"]["run_id"])["final_checkpoint"]["state_sha256"]
    killed: list[int] = []
    watcher = kill_worker_when(monkeypatch, "teacher", 1, killed)
    summary = grpo_flow(overrides=distill_run["overrides"], run_name="distill-kill-teacher")
    watcher.join(timeout=1)
    assert killed, "the teacher was never killed: the test did not exercise recovery"
    assert [r["role"] for r in summary["recoveries"]] == ["teacher"]
    info = show_run(summary["run_id"])
    assert info["status"] == "completed" and info["final_checkpoint"]["state_sha256"] == reference
    assert sorted(w["restarts"] for w in info["workers"] if w["name"] == "teacher-0") == [0, 1]
    assert [r["step"] for r in recorded_metrics(summary["run_id"])] == list(range(1, STEPS + 1))


def test_two_teacher_replicas_split_the_batch_and_give_one_teachers_numbers(distill_run):
    """distill.num_replicas 2: each teacher worker scores half of every batch (contiguous shards, at the same time);
    the run's numbers are those of one teacher."""
    summary = grpo_flow(overrides={**distill_run["overrides"], "distill.num_replicas": 2}, run_name="distill-two")
    info = show_run(summary["run_id"])
    teachers = [w for w in info["workers"] if w["role"] == "teacher"]
    assert sorted(w["name"] for w in teachers) == ["teacher-0", "teacher-1"]
    one = recorded_metrics(distill_run["summary"]["run_id"])
    for two, single in zip(recorded_metrics(summary["run_id"]), one, strict=True):
        for key in COMPARED:
            assert two[key] == pytest.approx(single[key], rel=1e-4, abs=1e-6), (two["step"], key)
