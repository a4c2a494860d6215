"""Real `prefect server start` + `prefect worker start`: deploy, run grpo-math and sweep-losses deployments from the
CLI, and survive a killed flow-run process through the crash Automation."""

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.integration.fault_helpers import TINY, held_at, hold_step_env, release, wait_until
from tests.integration.prefect_helpers import (
    BIN,
    ROOT,
    api,
    flow_run_logs,
    flow_runs_of,
    run_deployment_cli,
    serving_stack,
    task_runs_of,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def prefect_stack(tmp_path_factory):
    with serving_stack(tmp_path_factory.mktemp("prefect-server")) as stack:
        yield stack


def test_plain_prefect_deploy_runs_the_flows_from_the_checkout(prefect_stack):
    """`forgeflow deploy` runs plain `prefect deploy --all` from the checkout (no environment variable needed); the
    recorded pull step puts the worker in this checkout, where the entrypoints and config paths resolve."""
    (dep,) = api(prefect_stack, "/deployments/filter", {"deployments": {"name": {"any_": ["grpo-math"]}}})
    assert dep["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]
    assert (ROOT / dep["entrypoint"].split(":")[0]).exists()
    assert (ROOT / dep["parameters"]["config"]).exists()


def test_deployment_run_completes_with_every_phase_recorded(prefect_stack):
    out = run_deployment_cli(prefect_stack, "grpo/grpo-math", {"overrides": {**TINY, "steps": 2}})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = flow_runs_of(prefect_stack, "grpo-math")[0]
    assert run["state"]["type"] == "COMPLETED"
    names = task_runs_of(prefect_stack, run["id"])
    for version in (1, 2):
        for phase in ("rollout", "score_rewards", "train", "sync_weights"):
            assert names.get(f"{phase}-{version}") == "COMPLETED", sorted(names)


def test_a_killed_flow_run_is_rescheduled_and_driven_once(prefect_stack):
    """A killed flow-run process is rescheduled by the crash Automation and its run resumed to the end. Prefect's
    process worker can report that crash twice, the second time while the rescheduled attempt runs; the Automation
    then starts a third process on the same flow run (CI saw the two start rival workers and crash the run). The
    later one waits for the run lock and returns the run's summary."""
    hold = hold_step_env(4, 6)
    cmd = [str(BIN / "prefect"), "deployment", "run", "grpo/grpo-math", "-p",
           "overrides=" + json.dumps({**TINY, "steps": 8}), "--job-variable", "env=" + json.dumps(hold)]
    subprocess.run(cmd, cwd=ROOT, env=prefect_stack["env"], check=True, capture_output=True)
    run = flow_runs_of(prefect_stack, "grpo-math")[0]
    url = f"{prefect_stack['url']}/flow_runs/{run['id']}"
    wait_until(lambda: held_at(hold, 4) and httpx.get(url, timeout=10).json().get("infrastructure_pid"),
               "attempt 1 holding step 4")
    os.kill(int(str(httpx.get(url, timeout=10).json()["infrastructure_pid"]).split(":")[-1]), signal.SIGKILL)
    wait_until(lambda: held_at(hold, 6), "attempt 2 (rescheduled after the kill) holding step 6")
    # the late second crash report, as the process worker sends it
    api(prefect_stack, f"/flow_runs/{run['id']}/set_state",
        {"state": {"type": "CRASHED", "message": "Flow run infrastructure exited with non-zero status code -9."},
         "force": True})
    waiting = "this execution waits for it to end"
    wait_until(lambda: waiting in (prefect_stack["logs"] / "worker.log").read_text(), "attempt 3 waiting for the run")
    release(hold, 6)
    wait_until(lambda: httpx.get(url, timeout=10).json()["state"]["type"] == "COMPLETED", "the flow run completing",
               patience_s=400)
    wait_until(lambda: "was completed by the other execution" in flow_run_logs(prefect_stack, run["id"], limit=200),
               "attempt 3 returning the run's summary")
    index = json.loads((Path(os.environ["FORGEFLOW_HOME"]) / "flow_runs" / f"{run['id']}.json").read_text())
    assert index["attempts"] == 2  # the waiting executions are not attempts: two more crashes are still allowed
    out = Path(os.environ["FORGEFLOW_HOME"]) / "runs" / index["run_id"]
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == list(range(1, 9))
    # workers were started by attempts 1 and 2 only (trainer, generator, reward each): no rival set
    assert len(list((out / "workers" / "jobs").glob("*_submitted.pkl"))) == 6


def test_a_killed_sweep_continues_its_own_sweep(prefect_stack):
    """The sweep's flow-run process dies while its second child (a subflow) runs: the rescheduled flow run keeps
    the sweep id, keeps the finished child and resumes the other one, instead of starting the whole sweep again."""
    from infra.registry import repo, session_scope

    hold = hold_step_env(4)  # only the 6-step child reaches step 4
    cmd = [str(BIN / "prefect"), "deployment", "run", "grpo-sweep/sweep-losses", "-p", "use_deployments=false",
           "-p", "grid=" + json.dumps({"steps": [2, 6]}), "-p", "overrides=" + json.dumps(TINY),
           "--job-variable", "env=" + json.dumps(hold)]
    subprocess.run(cmd, cwd=ROOT, env=prefect_stack["env"], check=True, capture_output=True)
    run = flow_runs_of(prefect_stack, "sweep-losses")[0]
    url = f"{prefect_stack['url']}/flow_runs/{run['id']}"
    wait_until(lambda: held_at(hold, 4) and httpx.get(url, timeout=10).json().get("infrastructure_pid"),
               "the sweep's second child holding step 4")
    index = Path(os.environ["FORGEFLOW_HOME"]) / "flow_runs" / f"{run['id']}.json"
    sweep_id = json.loads(index.read_text())["sweep_id"]
    with session_scope() as s:
        before = {r.name: (r.id, r.status) for r in repo.list_runs(s, sweep_id=sweep_id) if r.recipe == "grpo"}
    assert sorted(status for _, status in before.values()) == ["completed", "running"], before
    os.kill(int(str(httpx.get(url, timeout=10).json()["infrastructure_pid"]).split(":")[-1]), signal.SIGKILL)
    wait_until(lambda: httpx.get(url, timeout=10).json()["state"]["type"] == "COMPLETED", "the sweep completing",
               patience_s=400)
    assert json.loads(index.read_text())["sweep_id"] == sweep_id
    with session_scope() as s:
        after = {r.name: (r.id, r.status) for r in repo.list_runs(s, sweep_id=sweep_id) if r.recipe == "grpo"}
    assert {name: rid for name, (rid, _) in after.items()} == {name: rid for name, (rid, _) in before.items()}
    assert all(status == "completed" for _, status in after.values()), after
    rows = json.loads((Path(os.environ["FORGEFLOW_HOME"]) / "sweeps" / sweep_id / "sweep.json").read_text())["rows"]
    assert sorted(r["run_id"] for r in rows) == sorted(rid for rid, _ in before.values())
    resumed = next(rid for rid, status in before.values() if status == "running")
    steps = [json.loads(x)["step"] for x in
             (Path(os.environ["FORGEFLOW_HOME"]) / "runs" / resumed / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 7))


def test_dapo_vs_gspo_sweep_survives_its_own_crash_and_a_childs(prefect_stack):
    """`sweep-losses` compares DAPO and GSPO as grpo-math deployment runs (linked to the sweep, with its job
    variables). Its process is killed while the DAPO child runs, then that child's process is killed too. The
    rescheduled sweep finds its child again (one flow run per point, by idempotency key) instead of starting a
    duplicate, waits through the child's reschedule instead of failing on its Crashed state, and completes."""
    from infra.registry import repo, session_scope

    hold = hold_step_env(4)  # the first child to reach step 4 (dapo) waits there, once
    cmd = [str(BIN / "prefect"), "deployment", "run", "grpo-sweep/sweep-losses",
           "-p", "grid=" + json.dumps({"loss.name": ["dapo", "gspo"]}), "-p", "overrides=" + json.dumps(
               {**TINY, "steps": 6}), "--job-variable", "env=" + json.dumps(hold)]
    subprocess.run(cmd, cwd=ROOT, env=prefect_stack["env"], check=True, capture_output=True)
    sweep_run = flow_runs_of(prefect_stack, "sweep-losses")[0]
    sweep_url = f"{prefect_stack['url']}/flow_runs/{sweep_run['id']}"
    wait_until(lambda: held_at(hold, 4), "the DAPO child holding step 4")
    index = Path(os.environ["FORGEFLOW_HOME"]) / "flow_runs" / f"{sweep_run['id']}.json"
    sweep_id = json.loads(index.read_text())["sweep_id"]

    def children() -> list[dict]:
        return [r for r in flow_runs_of(prefect_stack, "grpo-math") if sweep_id in r["tags"]]

    os.kill(int(str(httpx.get(sweep_url, timeout=10).json()["infrastructure_pid"]).split(":")[-1]), signal.SIGKILL)
    wait_until(lambda: json.loads(index.read_text()).get("attempts") == 2, "the sweep rescheduled and running again")
    (held,) = [r for r in children() if r["state"]["type"] == "RUNNING"]
    os.kill(int(str(held["infrastructure_pid"]).split(":")[-1]), signal.SIGKILL)
    wait_until(lambda: httpx.get(sweep_url, timeout=10).json()["state"]["type"] == "COMPLETED",
               "the sweep completing", patience_s=400)
    kids = children()
    assert len(kids) == 2, [(r["name"], r["state"]["type"]) for r in kids]  # no duplicate child
    assert all(r["state"]["type"] == "COMPLETED" and r["parent_task_run_id"] for r in kids)
    assert httpx.get(f"{prefect_stack['url']}/flow_runs/{held['id']}", timeout=10).json()["run_count"] >= 2
    with session_scope() as s:
        runs = [r for r in repo.list_runs(s, sweep_id=sweep_id) if r.recipe == "grpo"]
        assert len(runs) == 2 and all(r.status == "completed" for r in runs), [(r.id, r.status) for r in runs]
    out = Path(os.environ["FORGEFLOW_HOME"]) / "sweeps" / sweep_id
    assert [r["point"] for r in json.loads((out / "sweep.json").read_text())["rows"]] == \
        ["loss.name=dapo", "loss.name=gspo"]
    assert (out / "comparison.png").stat().st_size > 0


@pytest.mark.parametrize("overrides", [
    lambda marker: {"loss": {"name": "subprocess:Popen", "args": ["touch", marker]}},
    lambda marker: {"rewards": [{"name": "subprocess:Popen", "args": ["touch", marker]}]},
    lambda marker: {"plugins": ["subprocess:Popen"], "loss": {"name": "subprocess:Popen", "args": ["touch", marker]}},
], ids=["loss", "reward", "plugins-override"])
def test_deployment_override_cannot_run_code(prefect_stack, tmp_path, overrides):
    """Anyone who can reach the Prefect API sets `overrides`: an import path the config file does not list is
    refused before anything is imported, so the command never runs."""
    marker = tmp_path / "pwned"
    out = run_deployment_cli(prefect_stack, "grpo/grpo-math", {"overrides": {**TINY, "steps": 1,
                                                                             **overrides(str(marker))}})
    assert out.returncode != 0
    run = flow_runs_of(prefect_stack, "grpo-math")[0]
    assert run["state"]["type"] == "FAILED"
    assert "plugins" in run["state"]["message"], run["state"]["message"]
    assert not marker.exists()
