"""Multi-turn tool episodes on real worker processes: env workers hold the environments, generator workers sample
each turn, the token layer runs in the controller; the same episodes as one process playing them alone; the
calculator recipe through the grpo flow; a killed env worker mid-run changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from forge_core.envs.episodes import env_metrics, sample_env_groups
from forge_core.generation import TorchGenerator
from forge_core.models import load_model_and_tokenizer
from infra import components as C
from infra.config_checks import load_config
from workers.episodes import remote_episodes
from workers.pool import WorkerPool

pytestmark = pytest.mark.integration

# the calculator recipe, shrunk: a micro model that learned the tool-call format in 120 SFT steps (~20 s)
CALC = {"model.path": "tiny:qwen3-micro", "dataset.train_size": 512, "sft.steps": 120, "sft.batch_size": 32,
        "sft.lr": 1e-2, "sft.warmup_steps": 10, "sft.tool_use": 1.0, "threads": 1, "workers.threads": 1,
        "prompts_per_step": 4, "group_size": 4, "filter_groups": False, "eval.num_prompts": 8, "eval.every": 2,
        "checkpoint.every": 2, "loss.beta": 0.0, "trainer.mini_batches": 1, "generator.max_new_tokens": 96,
        "env.num_replicas": 2, "workers.start_timeout_s": 180, "workers.heartbeat_stale_s": 20}


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory) -> Path:
    """A micro model SFT-trained on calculator demonstrations (every one calls the tool)."""
    from runtime.sft import sft_phase

    cfg = load_config("configs/grpo_calculator_tool.yaml", CALC)
    model, tok = load_model_and_tokenizer(cfg.model.path, seed=cfg.seed)
    torch.set_num_threads(1)
    return sft_phase(cfg, model, tok, C.build_splits(cfg, tok), tmp_path_factory.mktemp("tool"), show=False)


def test_episodes_on_env_and_generator_workers_equal_one_process_playing_them(tool_model, tmp_path):
    cfg = load_config("configs/grpo_calculator_tool.yaml", {**CALC, "model.path": str(tool_model), "sft.steps": 0,
                                                               "generator.num_replicas": 2})
    model, tok = load_model_and_tokenizer(str(tool_model), seed=cfg.seed)
    problems = C.build_splits(cfg, tok).train[:6]
    torch.set_num_threads(1)  # as each worker computes
    alone = sample_env_groups(TorchGenerator(model.eval(), tok, cfg.generator), problems, 3, 17, cfg.generator,
                              cfg.env)
    with WorkerPool(cfg, tmp_path / "run") as pool:
        assert {h["role"] for h in pool.health()["env"]} == {"env"} and len(pool.health()["env"]) == 2
        remote = remote_episodes(pool, tok, problems, 3, 17)
    flat = lambda groups: [e for g in groups for e in g.episodes]  # noqa: E731
    assert len(flat(remote)) == len(flat(alone)) == 18
    for a, b in zip(flat(alone), flat(remote), strict=True):
        assert a.prompt_ids == b.prompt_ids and a.completion.token_ids == b.completion.token_ids
        assert a.completion.loss_mask == b.completion.loss_mask and a.reward == b.reward
        assert a.completion.metadata["status"] == b.completion.metadata["status"]
    assert env_metrics(flat(remote))["env/turns_mean"] > 1  # the tool was called and answered


def test_the_calculator_recipe_runs_three_steps_through_the_flow(tool_model):
    from flows.grpo import grpo_flow
    from tests.integration.fault_helpers import recorded_metrics

    summary = grpo_flow(config="configs/grpo_calculator_tool.yaml", run_name="calculator-flow",
                        overrides={**CALC, "sft.init": str(tool_model), "sft.steps": 0, "steps": 3})
    rows = recorded_metrics(summary["run_id"])
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("env/turns_mean" in r for r in rows), sorted(rows[0])
    assert all(r["env/turns_mean"] > 1 and r["env/tool_calls_mean"] > 0 for r in rows)
    assert all(sum(v for k, v in r.items() if k.startswith("env/status_")) == pytest.approx(1.0) for r in rows)
    assert "eval/turns_mean" in rows[1] and "loss/loss" in rows[0]
    # the samples people read show whole conversations, the environment's messages marked as not trained on
    from cli.reports import read_samples

    samples = read_samples(summary["run_id"])["rows"]
    called = [r for r in samples if r["turns"] > 1]
    assert called and "⟦tool: " in called[0]["completion"]
    assert [m["role"] for m in called[0]["conversation"]][:3] == ["user", "assistant", "tool"]
    assert [m["generated"] for m in called[0]["conversation"]][:3] == [False, True, False]


CONFIG = "configs/grpo_calculator_tool.yaml"


@pytest.fixture(scope="module")
def faulted_run(tool_model) -> tuple[dict, str]:
    """Overrides of a pipelined calculator run (step v+1's episodes are played while v trains) and the final
    state_sha256 of its uninterrupted run."""
    from cli.reports import show_run
    from flows.grpo import grpo_flow

    # the entropy bonus moves the weights at every step, so a step replayed differently changes the final hash
    run = {**CALC, "sft.init": str(tool_model), "sft.steps": 0, "steps": 4, "trainer.entropy_coef": 0.01,
           "env.num_replicas": 1, "max_policy_age": 1}
    reference = show_run(grpo_flow(config=CONFIG, overrides=run, run_name="env-uninterrupted")["run_id"])
    return run, reference["final_checkpoint"]["state_sha256"]


def test_a_killed_env_worker_mid_run_ends_with_the_uninterrupted_runs_weights(faulted_run, monkeypatch):
    from cli.reports import show_run
    from flows.grpo import grpo_flow
    from tests.integration.fault_helpers import kill_worker_when, steps_recorded

    run, reference_sha = faulted_run
    killed: list[int] = []
    watcher = kill_worker_when(monkeypatch, "env", 2, killed)
    summary = grpo_flow(config=CONFIG, overrides=run, run_name="env-killed")
    watcher.join(timeout=1)
    assert killed, "the env worker was never killed: the test did not exercise recovery"
    assert [r["role"] for r in summary["recoveries"]] == ["env"]
    info = show_run(summary["run_id"])
    assert info["status"] == "completed" and steps_recorded(summary["run_id"]) == [1, 2, 3, 4]
    assert info["final_checkpoint"]["state_sha256"] == reference_sha


def test_a_flow_process_killed_with_episodes_in_flight_resumes_with_the_uninterrupted_runs_weights(faulted_run):
    import os
    import signal

    from cli.reports import show_run
    from flows.grpo import grpo_flow
    from runtime.orphan_guard import leftover_servers
    from tests.integration.fault_helpers import (
        existing_runs,
        held_at,
        output_of,
        start_cli_run,
        steps_recorded,
        stop_group,
        wait_for_new_run,
        wait_until,
    )
    from workers.protocol import pid_alive

    run, reference_sha = faulted_run
    existing = existing_runs()
    # held before recording step 3: step 4's episodes, started before step 3 trained, are in flight or done and
    # recorded nowhere but in the dead process
    proc = start_cli_run(run, "--config", CONFIG, "--run-name", "env-flow-killed", hold_step=3)
    new = wait_for_new_run(existing, 2, proc)
    wait_until(lambda: held_at(proc.hold, 3), "the run reaching step 3's record", patience_s=300)
    live = show_run(new.name)
    pids = [w["pid"] for w in live["workers"] if w["state"] == "running"]
    assert "env" in {w["role"] for w in live["workers"]} and pids
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=300)
    wait_until(lambda: not leftover_servers(proc.pid), "the embedded Prefect server of the killed CLI exiting")
    stop_group(proc)
    wait_until(lambda: not any(pid_alive(p) for p in pids), "every worker of the killed run exiting")
    assert steps_recorded(new.name) == [1, 2], output_of(proc)[-8000:]
    summary = grpo_flow(resume=new.name)
    assert summary["run_id"] == new.name and summary["start_step"] == 2
    info = show_run(new.name)
    assert info["status"] == "completed" and steps_recorded(new.name) == [1, 2, 3, 4]
    assert info["final_checkpoint"]["state_sha256"] == reference_sha
