"""MLflow tracking and the registry as the grpo/sft/sweep flows write them; the reporting CLI reads them back."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flows.grpo import grpo_flow
from flows.sweep import sweep_flow
from infra.checkpoints import file_sha256
from infra.paths import run_dir
from infra.registry import repo, session_scope
from infra.tracking import default_tracking_uri

pytestmark = pytest.mark.integration
TINY = {"model.path": "tiny:qwen3-micro", "sft.steps": 0, "generator.max_new_tokens": 4, "prompts_per_step": 4,
        "group_size": 4, "eval.num_prompts": 16, "eval.every": 2, "checkpoint.every": 2, "trainer.lr": 1e-3,
        "workers.threads": 1, "filter_groups": False,
        "loss.name": "grpo", "trainer.mini_batches": 1}  # one update per batch unless a test says otherwise
CLI = [str(Path(sys.executable).parent / "forgeflow")]


def cli_json(*args) -> object:
    out = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_sft_then_grpo_run_is_tracked_registered_and_linked(monkeypatch):
    import infra.checkpoints
    import infra.records

    read_back: list[str] = []  # checkpoint files the controller hashes (the trainer hashes what it writes)

    def counting_sha256(path):
        read_back.append(str(path))
        return file_sha256(path)

    monkeypatch.setattr(infra.checkpoints, "file_sha256", counting_sha256)
    monkeypatch.setattr(infra.records, "file_sha256", counting_sha256)
    summary = grpo_flow(overrides={**TINY, "steps": 4, "sft.steps": 5, "sft.schedule_steps": 5,
                                   "sft.batch_size": 16}, run_name="records-e2e")
    client = MlflowClient(default_tracking_uri())
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["trainer.lr"] == "0.001" and run.data.params["loss.name"] == "grpo"
    assert run.data.tags["forgeflow.run_id"] == summary["run_id"]
    assert run.data.tags["prefect.flow_run_id"] == summary["flow_run_id"]
    assert run.data.tags["forgeflow.code_version"]
    for key in ("reward/mean", "loss/loss", "loss/grad_norm", "rollout/response_len_mean", "timing/train"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2, 3, 4], key
    # the initial weights (step 0), the eval of step 2, and the end (step 4, also an eval step: one point)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/accuracy")] == [0, 2, 4]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "summary.json", "curves.png", "checkpoint"} <= artifacts
    assert "model.safetensors" in {a.path.split("/")[-1] for a in client.list_artifacts(run.info.run_id, "checkpoint")}
    assert run.data.tags["forgeflow.checkpoint_uri"] == summary["checkpoint"]

    assert not [p for p in read_back if p.endswith("trainer.pt")], read_back  # checkpoints are never read back
    info = cli_json("runs", "show", summary["run_id"])
    assert info["status"] == "completed" and info["steps_completed"] == 4
    final = info["final_checkpoint"]
    assert final["step"] == 4 and final["sha256"] == file_sha256(Path(final["path"]) / "trainer.pt")
    assert {w["role"] for w in info["workers"]} == {"trainer", "generator", "reward", "reference"}  # beta 0.04
    assert all(w["state"] == "stopped" for w in info["workers"])
    chain = cli_json("lineage", summary["run_id"])
    assert chain[-1]["recipe"] == "sft" and chain[-1]["kind"] == "sft"  # GRPO checkpoint ← … ← SFT checkpoint
    sft = cli_json("runs", "show", chain[-1]["run"])
    assert sft["status"] == "completed" and (sft["steps_completed"], sft["steps_total"]) == (5, 5)
    listed = {r["run_id"]: r for r in cli_json("runs", "ls")}
    assert listed[chain[-1]["run"]]["steps"] == 5 and listed[summary["run_id"]]["steps"] == 4
    assert chain[0]["run"] == summary["run_id"]

    # the same warm-up again (only RL's settings differ): it comes from the SFT cache, linked to the SFT run above
    again = grpo_flow(overrides={**TINY, "steps": 2, "sft.steps": 5, "sft.schedule_steps": 5, "sft.batch_size": 16,
                                 "loss.name": "dapo"}, run_name="records-cached")
    assert not (run_dir(again["run_id"]) / "sft").exists()  # no SFT trained
    assert cli_json("lineage", again["run_id"])[-1]["run"] == chain[-1]["run"]
    assert f"{again['run_id']}-sft" not in {r["run_id"] for r in cli_json("runs", "ls")}


def test_dapo_vs_gspo_sweep_is_nested_in_mlflow_linked_in_registry_and_compared(tmp_path):
    result = sweep_flow(grid={"loss.name": ["dapo", "gspo"]}, overrides={**TINY, "steps": 3})
    run_ids = [r["run_id"] for r in result["rows"]]
    client = MlflowClient(default_tracking_uri())
    with session_scope() as s:
        sweep = s.get(repo.Sweep, result["sweep_id"])
        assert sweep.status == "completed" and sorted(r.id for r in sweep.runs) == sorted(run_ids)
        mlflow_ids = {r.id: r.mlflow_run_id for r in sweep.runs}
        parent = sweep.mlflow_run_id
    for rid in run_ids:
        child = client.get_run(mlflow_ids[rid])
        assert child.data.tags["mlflow.parentRunId"] == parent
        assert len(client.get_metric_history(child.info.run_id, "reward/mean")) >= 3
    assert {client.get_run(mlflow_ids[r]).data.params["loss.name"] for r in run_ids} == {"dapo", "gspo"}
    png = tmp_path / "cmp.png"
    data = cli_json("compare", *run_ids, "--metric", "reward/mean", "--metric", "loss/loss", "--out", str(png))
    assert [r["loss"] for r in data["runs"]] == ["dapo", "gspo"]
    assert all(r["reward/mean points"] == 3 for r in data["runs"])
    assert png.stat().st_size > 10_000
    text = subprocess.run([*CLI, "runs", "ls"], capture_output=True, text=True, check=True).stdout
    assert all(rid in text for rid in run_ids) and result["sweep_id"] in text


def test_each_step_reaches_mlflow_when_recorded_and_a_rollback_keeps_one_point(tmp_path):
    """Live curves: a step is in MLflow as soon as it is recorded; a rollback tags the run and the redone step keeps
    one point (MLflow cannot retract the first)."""
    import uuid

    from infra.config_checks import load_config
    from infra.records import RunRecords

    records = RunRecords(load_config("configs/grpo_math_tiny.yaml", TINY), f"live-{uuid.uuid4().hex[:8]}", tmp_path)
    records.start("live-curves", None, None)
    client = MlflowClient(default_tracking_uri())
    records.step(1, {"reward/mean": 0.1, "timing/step": 1.0})
    assert [m.step for m in client.get_metric_history(records.mlflow_run_id, "reward/mean")] == [1]
    records.step(2, {"reward/mean": 0.2, "timing/step": 1.0})
    records.rollback(1)
    records.step(2, {"reward/mean": 0.2, "timing/step": 1.0})
    records.step(3, {"reward/mean": 0.3, "timing/step": 1.0})
    records.finish("completed")
    history = client.get_metric_history(records.mlflow_run_id, "reward/mean")
    assert sorted(m.step for m in history) == [1, 2, 3]
    assert client.get_run(records.mlflow_run_id).data.tags["forgeflow.rollbacks"] == "2->1"
    assert [r["step"] for r in records.rows()] == [1, 2, 3]


def test_a_run_restarted_after_its_sft_failed_keeps_one_mlflow_run(tmp_path):
    """The GRPO MLflow run is opened before SFT (which nests under it): an SFT failure ends it FAILED, not left
    RUNNING, and the restarted run reopens that run instead of making a second one."""
    import uuid

    from infra.config_checks import load_config
    from infra.records import RunRecords

    cfg, run_id = load_config("configs/grpo_math_tiny.yaml", TINY), f"sft-fails-{uuid.uuid4().hex[:8]}"
    first = RunRecords(cfg, run_id, tmp_path)
    opened = first.open_mlflow_run("grpo · sft-fails")
    first.end_unstarted("FAILED")
    client = MlflowClient(default_tracking_uri())
    assert client.get_run(opened).info.status == "FAILED"
    again = RunRecords(cfg, run_id, tmp_path)  # the restart: a new process, the same run id
    assert again.open_mlflow_run("grpo · sft-fails") == opened
    assert client.get_run(opened).info.status == "RUNNING"
    again.start("sft-fails", None, None, mlflow_name="grpo · sft-fails")
    assert again.mlflow_run_id == opened and client.get_run(opened).data.params["loss.name"] == "grpo"
    experiment = client.get_run(opened).info.experiment_id
    assert len(client.search_runs([experiment], f"tags.`forgeflow.run_id` = '{run_id}'")) == 1
    again.finish("completed")


def test_two_runs_starting_at_once_share_the_experiment_the_other_made(monkeypatch):
    """Both looked the experiment up before either made it (two deployment runs starting together): the second
    create fails with RESOURCE_ALREADY_EXISTS, and the Tracker takes the experiment the first made."""
    import uuid

    from infra.tracking import EXPERIMENT_KIND, Tracker

    name = f"race-{uuid.uuid4().hex[:8]}"
    first = Tracker(experiment=name)  # the other run: it made the experiment
    real_lookup = MlflowClient.get_experiment_by_name
    lookups = []

    def stale_lookup(self, wanted):  # the first lookup happened before the other run's create
        lookups.append(wanted)
        return None if len(lookups) == 1 else real_lookup(self, wanted)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", stale_lookup)
    second = Tracker(experiment=name)
    assert second.experiment_id == first.experiment_id and len(lookups) == 2
    monkeypatch.undo()
    assert MlflowClient(default_tracking_uri()).get_experiment(first.experiment_id).tags[EXPERIMENT_KIND]


def test_appending_to_the_samples_table_draws_no_download_bar(capfd, tmp_path):
    import uuid

    from infra.tracking import Tracker

    tracker = Tracker(experiment=f"table-{uuid.uuid4().hex[:8]}")
    run_id = tracker.client.create_run(tracker.experiment_id).info.run_id
    for step in (1, 2):  # the second append reads the table back first: MLflow would draw "Downloading artifacts"
        tracker.log_table(run_id, [{"step": step, "prompt": "q", "completion": "a"}], "rollout_samples.json")
    assert "Downloading artifacts" not in capfd.readouterr().err
    table = json.loads(Path(tracker.client.download_artifacts(run_id, "rollout_samples.json", str(tmp_path))).read_text())
    assert [row[table["columns"].index("step")] for row in table["data"]] == [1, 2]  # both appends kept
