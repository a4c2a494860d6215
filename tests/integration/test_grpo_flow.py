"""The grpo flow on the embedded Prefect API with real local workers: every phase task of every iteration recorded.
(Crashes and resumes: test_faults.py.)"""

import pytest

from flows.grpo import grpo_flow
from infra.paths import run_dir
from infra.prefect_env import read_task_runs, wait_for_task_runs
from tests.integration.fault_helpers import TINY, steps_recorded

pytestmark = pytest.mark.integration

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
