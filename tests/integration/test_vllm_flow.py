"""The vllm generator through the Prefect flow and local workers, on vLLM's CPU build: a strictly on-policy run whose
trainer recomputes vLLM's behaviour logprobs to bf16 noise at every step (weights reloaded into the live engine at
each version), and a run whose generator worker is killed with -9 mid-run: no engine process outlives it, a fresh
engine replaces it, and the run ends with the uninterrupted run's weights."""

import importlib.util

import pytest

from cli.reports import show_run
from flows.grpo import grpo_flow
from tests.integration.fault_helpers import kill_worker_when, recorded_metrics, steps_recorded, wait_until
from tests.integration.test_faults import assert_records_complete

pytestmark = pytest.mark.integration
# find_spec, not importorskip: importing vllm at collection would set its variables in every test process
if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM's CPU build is installed by `make install`", allow_module_level=True)

STEPS = 6
# strictly on-policy (one mini-batch, one epoch) with a large learning rate, so every version moves the weights
# a lot; fp32 master weights, bf16 compute in the trainer and in vLLM; the entropy bonus changes the weights at
# every step, so a step redone differently changes the final hash
RUN = {"model.path": "tiny:qwen3-arith", "model.dtype": "bfloat16", "generator.backend": "vllm", "sft.steps": 0,
       "steps": STEPS, "prompts_per_step": 4, "group_size": 4, "generator.max_new_tokens": 8, "filter_groups": False,
       "trainer.lr": 3e-3, "trainer.mini_batches": 1, "trainer.entropy_coef": 0.01, "loss.name": "grpo",
       "loss.beta": 0.0, "eval.every": 3, "eval.num_prompts": 16, "checkpoint.every": 2, "workers.threads": 1}


@pytest.fixture(scope="module")
def uninterrupted():
    """(run info, per-step metrics) of the run without a fault."""
    summary = grpo_flow(overrides=RUN, run_name="vllm-uninterrupted")
    info = show_run(summary["run_id"])
    assert info["status"] == "completed", info["message"]
    return info, recorded_metrics(summary["run_id"])


def test_vllm_behaviour_logprobs_are_the_trainers_at_every_step(uninterrupted):
    """Each step samples with the version loaded just before it: had one failed to load, the trainer's logprobs
    (the new weights) and vLLM's (stale ones) would part by far more than bf16 rounding."""
    info, metrics = uninterrupted
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    kl = [m["rollout/behaviour_kl_k3"] for m in metrics]
    assert all(0 < k < 1e-2 for k in kl), kl
    assert all(m["loss/grad_norm"] > 0 for m in metrics)  # the weights did move between versions


def test_a_killed_vllm_generator_is_replaced_by_a_fresh_engine_and_the_run_ends_exact(uninterrupted, monkeypatch):
    from infra.processes import start_time
    from workers.engine_guard import engine_processes

    engines: list[str] = []
    killed: list[int] = []
    watcher = kill_worker_when(monkeypatch, "generator", 2, killed,
                               before_kill=lambda pids: engines.extend(engine_processes(pids[0])))
    summary = grpo_flow(overrides=RUN, run_name="vllm-killed")
    watcher.join(timeout=1)
    assert killed and engines, "the generator and its engine processes were never found: no recovery exercised"
    assert [r["role"] for r in summary["recoveries"]] == ["generator"]
    info = assert_records_complete(summary["run_id"], uninterrupted[0]["final_checkpoint"]["state_sha256"])
    assert sorted(w["restarts"] for w in info["workers"] if w["name"] == "generator-0") == [0, 1]
    assert steps_recorded(summary["run_id"]) == list(range(1, STEPS + 1))
    # the killed worker's EngineCore and its worker process, stopped by the engine guard (same pid and start time)
    left = lambda: [e for e in engines if start_time(int(e.split(":")[0])) == e.split(":")[1]]  # noqa: E731
    wait_until(lambda: not left(), "the killed generator's engine processes stopping")
