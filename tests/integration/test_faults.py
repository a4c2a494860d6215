"""Fault injection on real runs: kill any process of a run at a step, and the run finishes with final weights
bitwise-identical to an uninterrupted run of the same config and seed, every record consistent."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from cli.reports import show_run
from flows.grpo import grpo_flow
from infra.checkpoints import latest_good_checkpoint
from infra.paths import run_dir
from infra.registry import repo, session_scope
from infra.tracking import default_tracking_uri
from runtime.orphan_guard import leftover_servers
from tests.integration.fault_helpers import (
    ROOT,
    TINY,
    existing_runs,
    kill_worker_when,
    output_of,
    runs_root,
    start_cli_run,
    steps_recorded,
    stop_group,
    wait_for_new_run,
    wait_until,
)
from tests.plugin_config import write_plugin_config
from workers.protocol import pid_alive, read_rendezvous

pytestmark = pytest.mark.integration

STEPS = 6
# the entropy bonus moves the weights at every step, so a step redone wrongly changes the final hash
RUN = {**TINY, "steps": STEPS, "trainer.entropy_coef": 0.01}


# pipelined: step v+1 is sampled with weights v while v trains; its batch is saved with each checkpoint
PIPELINED = {**RUN, "max_policy_age": 1}
# off-policy: two batches in flight (both saved with each checkpoint), four PPO mini-batches per step, TIS
OFF_POLICY = {**RUN, "max_policy_age": 2, "trainer.mini_batches": 4, "rollout_correction.mode": "tis"}
# a KL term: the reference worker scores every batch
KL = {**RUN, "loss.beta": 0.04}
# LoRA adapters with a KL term: the trainer scores the reference as its base model (adapters off), no reference worker
LORA = {**RUN, "trainer.lora.rank": 4, "loss.beta": 0.04}
MODES = {"on-policy": RUN, "pipelined": PIPELINED, "off-policy": OFF_POLICY, "kl": KL, "lora": LORA}
_REFERENCES: dict[str, str] = {}


def uninterrupted_sha(mode: str) -> str:
    """state_sha256 of the final checkpoint of an uninterrupted run (computed once per mode)."""
    if mode not in _REFERENCES:
        summary = grpo_flow(overrides=MODES[mode], run_name=f"uninterrupted-{mode}")
        info = show_run(summary["run_id"])
        assert info["final_checkpoint"]["step"] == STEPS and info["final_checkpoint"]["state_sha256"]
        _REFERENCES[mode] = info["final_checkpoint"]["state_sha256"]
    return _REFERENCES[mode]


@pytest.fixture(scope="module")
def reference_sha():
    return uninterrupted_sha("on-policy")


def assert_records_complete(run_id: str, reference_sha: str) -> dict:
    """Each step once everywhere; the final state equals the uninterrupted run's."""
    info = show_run(run_id)
    assert info["status"] == "completed", info["message"]
    assert info["final_checkpoint"]["state_sha256"] == reference_sha, "final weights differ from the uninterrupted run"
    assert steps_recorded(run_id) == list(range(1, STEPS + 1))
    with session_scope() as s:
        assert repo.completed_steps(s, run_id) == list(range(1, STEPS + 1))
    client = MlflowClient(default_tracking_uri())
    for key in ("reward/mean", "loss/loss"):
        history = client.get_metric_history(info["mlflow_run_id"], key)
        assert sorted(m.step for m in history) == list(range(1, STEPS + 1)), key  # no gap, no duplicate
    return info


@pytest.mark.parametrize("mode", ["on-policy", "pipelined", "off-policy"])
@pytest.mark.parametrize("role", ["generator", "trainer"])
def test_killed_worker_run_ends_bitwise_identical(role, mode, monkeypatch):
    run_with_killed_worker(monkeypatch, role, MODES[mode], f"kill-{role}-{mode}", uninterrupted_sha(mode))


def test_killed_lora_trainer_run_ends_bitwise_identical(monkeypatch):
    # the checkpoint holds the adapters, their AdamW state and the RNG; the replacement trainer wraps the base model
    # in fresh adapters and loads them back
    run_with_killed_worker(monkeypatch, "trainer", MODES["lora"], "kill-trainer-lora", uninterrupted_sha("lora"))


@pytest.mark.parametrize("role", ["generator", "trainer"])
def test_killed_worker_with_broadcast_sync_ends_identical_to_the_fs_run(role, monkeypatch):
    # the pool forms a new weight-broadcast group with the replacement and the trainer republishes its version
    run_with_killed_worker(monkeypatch, role, {**RUN, "weightsync.backend": "broadcast"}, f"kill-{role}-broadcast",
                           uninterrupted_sha("on-policy"))


@pytest.mark.parametrize("mode", ["on-policy", "pipelined"])
def test_trainer_killed_while_saving_a_checkpoint_rolls_back_at_once(mode, monkeypatch):
    """The trainer dies as step 4's checkpoint starts: the recovery restores step 2, the checkpoint task reports
    nothing saved, and the flow goes back to step 2 right away. With broadcast sync the next rollout would otherwise
    wait for weight version 4, which the restored trainer never publishes (a hang until the call timeout)."""
    from tasks import phases

    real, killed = phases.checkpoint, []

    def kill_trainer_then_checkpoint(run_id, step, inflight=None):
        if step == 4 and not killed:
            launch = sorted((run_dir(run_id) / "workers").glob("trainer-0.*.rendezvous.json"))[-1]
            pid = read_rendezvous(launch).pid
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not pid_alive(pid), "the trainer exiting")
            killed.append(pid)
        return real(run_id, step, inflight)
    monkeypatch.setattr(phases, "checkpoint", kill_trainer_then_checkpoint)
    overrides = {**(PIPELINED if mode == "pipelined" else RUN), "weightsync.backend": "broadcast",
                 "workers.call_timeout_s": 120}  # a regression fails in minutes instead of hanging
    summary = grpo_flow(overrides=overrides, run_name=f"kill-trainer-in-checkpoint-{mode}")
    assert killed and [(r["role"], r["trainer_step"]) for r in summary["recoveries"]] == [("trainer", 2)]
    info = assert_records_complete(summary["run_id"], uninterrupted_sha(mode))
    assert info["superseded_attempts"] == 2  # steps 3 and 4, recorded before the lost checkpoint, were redone


def test_node_lost_during_a_weight_sync_rolls_back_at_once(monkeypatch):
    """The trainer and the generator die together while version 4 is being loaded (CI caught it at random): the
    recovery restores step 2 and deletes the later versions, so the retried sync must not ask for version 4 but
    report the rollback, and the flow goes back to step 2."""
    from tasks import phases

    real, killed = phases.sync_weights, []

    def kill_node_then_sync(run_id, version):
        if version == 4 and not killed:
            for role in ("trainer", "generator"):
                launch = sorted((run_dir(run_id) / "workers").glob(f"{role}-0.*.rendezvous.json"))[-1]
                pid = read_rendezvous(launch).pid
                os.kill(pid, signal.SIGKILL)
                wait_until(lambda pid=pid: not pid_alive(pid), f"the {role} exiting")
                killed.append(pid)
        return real(run_id, version)
    monkeypatch.setattr(phases, "sync_weights", kill_node_then_sync)
    summary = grpo_flow(overrides=RUN, run_name="kill-node-in-sync")
    assert len(killed) == 2
    assert sorted((r["role"], r["trainer_step"]) for r in summary["recoveries"]) == [("generator", 2), ("trainer", 2)]
    info = assert_records_complete(summary["run_id"], uninterrupted_sha("on-policy"))
    assert info["superseded_attempts"] == 1  # version 3, recorded before the lost sync of version 4, was redone


# generators sync every 3 versions (and at each checkpoint, every 3): versions 1, 2, 4, 5 are never published
SPACED = {**RUN, "weightsync.sync_every": 3, "max_policy_age": 3, "checkpoint.every": 3, "eval.every": 0}


@pytest.mark.parametrize("role,after_step", [("generator", 4), ("trainer", 2)])
def test_killed_worker_with_spaced_syncs_ends_bitwise_identical(role, after_step, monkeypatch):
    """weightsync.sync_every 3: the trainer publishes (gathers, writes) only the versions the generators load, every
    rollout is pinned to the version the uninterrupted schedule samples with, and a lost worker changes nothing."""
    reference = grpo_flow(overrides=SPACED, run_name="uninterrupted-spaced")
    rows = [json.loads(x) for x in (run_dir(reference["run_id"]) / "metrics.jsonl").read_text().splitlines()]
    assert [r["weights/published"] for r in rows] == [0, 0, 1, 0, 0, 1]
    # step s samples with the last sync <= s - 1 (sampled while s - 1 trains): versions 0, 0, 0, 0, 3, 3
    assert [r["rollout/policy_staleness"] for r in rows] == [0, 1, 2, 3, 1, 2]
    killed: list[int] = []
    watcher = kill_worker_when(monkeypatch, role, after_step, killed)
    summary = grpo_flow(overrides=SPACED, run_name=f"kill-{role}-spaced")
    watcher.join(timeout=1)
    assert killed and [r["role"] for r in summary["recoveries"]] == [role]
    assert_records_complete(summary["run_id"], show_run(reference["run_id"])["final_checkpoint"]["state_sha256"])


def run_with_killed_worker(monkeypatch, role: str, overrides: dict, run_name: str, reference_sha: str) -> None:
    killed: list[int] = []
    watcher = kill_worker_when(monkeypatch, role, 2, killed)
    summary = grpo_flow(overrides=overrides, run_name=run_name)
    watcher.join(timeout=1)
    assert killed, "the worker was never killed: the test did not exercise recovery"
    assert [r["role"] for r in summary["recoveries"]] == [role]
    info = assert_records_complete(summary["run_id"], reference_sha)
    rows = [w for w in info["workers"] if w["name"] == f"{role}-0"]
    assert sorted(w["restarts"] for w in rows) == [0, 1]  # the lost worker and its replacement
    if role == "trainer":  # restored from the latest checkpoint (every 2 steps; 0 if killed saving step 2), redone
        assert summary["recoveries"][0]["trainer_step"] in (0, 2, 4)


# pipelined: the rollout ahead and the train task both lose their worker, and their recoveries take turns
@pytest.mark.parametrize("roles,mode", [(("generator", "reward"), "on-policy"), (("trainer", "generator"), "pipelined"),
                                        (("trainer", "reference"), "kl")], ids=lambda v: "+".join(v) if
                         isinstance(v, tuple) else v)
def test_two_roles_killed_at_once_recover_exactly(roles, mode, monkeypatch):
    """A lost node takes several roles: every dead one is restarted and restored, the run ends bit-exact."""
    killed: list[int] = []
    watcher = kill_worker_when(monkeypatch, roles, 3, killed)
    summary = grpo_flow(overrides=MODES[mode], run_name=f"kill-{'-'.join(roles)}")
    watcher.join(timeout=1)
    assert len(killed) == 2, "the workers were never killed: the test did not exercise recovery"
    assert set(roles) <= {r["role"] for r in summary["recoveries"]}
    info = assert_records_complete(summary["run_id"], uninterrupted_sha(mode))
    for role in roles:
        assert sorted(w["restarts"] for w in info["workers"] if w["name"] == f"{role}-0") == [0, 1]


def test_unrecoverable_worker_loss_ends_crashed_and_resumes_exactly(monkeypatch, reference_sha):
    """WorkerLost beyond recovery is infrastructure: the flow run ends Crashed (what the crash Automation
    reschedules), the run stays resumable, and the resume ends bit-exact."""
    from prefect.client.orchestration import get_client

    import tasks.recovery

    def node_gone(ctx, role, reason="", job_id=None):
        raise RuntimeError(f"{role}'s node is gone for good")

    monkeypatch.setattr(tasks.recovery, "recover_role", node_gone)
    existing = existing_runs()
    killed: list[int] = []
    watcher = kill_worker_when(monkeypatch, "generator", 2, killed)
    with pytest.raises(Exception, match="infrastructure failure"):
        grpo_flow(overrides=RUN, run_name="node-gone")
    watcher.join(timeout=1)
    (run,) = [p for p in runs_root().iterdir() if p.name not in existing]
    info = show_run(run.name)
    assert info["status"] == "interrupted" and f"forgeflow resume {run.name}" in info["message"]
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(info["prefect_flow_run_id"]).state.type.value == "CRASHED"
    monkeypatch.undo()
    summary = grpo_flow(resume=run.name)
    assert_records_complete(summary["run_id"], reference_sha)


# (kill -9 of an on-policy run is covered by ctrl-c, on-policy, and kill-9-pipelined, the harder resume)
@pytest.mark.parametrize("sig,mode", [(signal.SIGINT, "on-policy"), (signal.SIGKILL, "pipelined")],
                         ids=["ctrl-c", "kill-9-pipelined"])
def test_interrupted_flow_process_resumes_bitwise_identical(sig, mode):
    reference_sha = uninterrupted_sha(mode)
    existing = existing_runs()
    proc = start_cli_run(PIPELINED if mode == "pipelined" else RUN, "--run-name", f"flow-{sig.name}-{mode}",
                         hold_step=4)  # killed in step 4 or, if that is done first, before it is recorded
    run = wait_for_new_run(existing, 3, proc)
    live = show_run(run.name)  # while live, the registry lists the workers an operator could kill
    pids = [w["pid"] for w in live["workers"] if w["state"] == "running"]
    assert {w["role"] for w in live["workers"]} == {"generator", "trainer", "reward"} and pids
    assert leftover_servers(proc.pid), "the CLI's embedded Prefect server carries no owner mark"
    if sig == signal.SIGINT:  # Ctrl-C in a terminal reaches the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=300)
    output = output_of(proc)
    # Prefect stops its server on Ctrl-C; after a SIGKILL the orphan guard does
    wait_until(lambda: not leftover_servers(proc.pid), "the embedded Prefect server of the stopped CLI exiting")
    stop_group(proc)
    wait_until(lambda: not any(pid_alive(p) for p in pids), "every worker of the interrupted run exiting")
    if sig == signal.SIGINT:
        assert proc.returncode == 130, output[-12000:]
        assert f"forgeflow resume {run.name}" in output
        with session_scope() as s:
            r = repo.get_run(s, run.name)
            assert r.status == "interrupted" and f"forgeflow resume {run.name}" in r.status_message
            assert all(w.state != "running" for w in r.workers)
    # the resumed pool starts with an empty weight store: a pipelined run must use the batch saved ahead
    summary = grpo_flow(resume=run.name)
    assert summary["run_id"] == run.name and summary["start_step"] in (2, 4)
    assert_records_complete(run.name, reference_sha)


def test_corrupted_latest_checkpoint_is_skipped_and_resume_is_identical(reference_sha):
    first = grpo_flow(overrides=RUN, run_name="resume-me")
    out = run_dir(first["run_id"])
    state = out / "checkpoints" / f"step-{STEPS:06d}" / "trainer.pt"
    state.write_bytes(state.read_bytes()[:1000])  # truncated on disk: refused, the step-4 checkpoint is used
    partial = out / "checkpoints" / f"step-{STEPS - 1:06d}"
    partial.mkdir()  # an interrupted checkpoint without COMPLETE must be ignored
    second = grpo_flow(resume=first["run_id"])
    assert second["run_id"] == first["run_id"] and second["start_step"] == STEPS - 2
    assert (out / "checkpoints" / f"step-{STEPS:06d}" / "COMPLETE").exists()
    assert_records_complete(first["run_id"], reference_sha)


class InjectedCrash(Exception):
    """Stands for the controller dying at one exact point of a step's checkpoint."""


@pytest.mark.parametrize("point", ["before-complete", "after-complete"])
def test_a_crash_around_a_checkpoint_loses_no_step_on_resume(point, monkeypatch, reference_sha):
    """A crash while step 4's checkpoint is being written (resume from step 2 redoes 3-4) or right after its COMPLETE
    marker, before the registry heard of it (resume from step 4 must still have step 4 on record)."""
    from infra import checkpoints
    from infra.records import RunRecords

    if point == "before-complete":
        real = checkpoints.mark_complete

        def crash_in_checkpoint(path, *args, **kwargs):  # the state is written, its COMPLETE marker is not
            if "step-000004" in str(path):
                raise InjectedCrash(point)
            return real(path, *args, **kwargs)
        monkeypatch.setattr(checkpoints, "mark_complete", crash_in_checkpoint)
    else:
        real = RunRecords.checkpoint

        def crash_after_complete(self, step, path, kind="trainer"):
            if step == 4:
                assert (Path(path) / "COMPLETE").exists()
                raise InjectedCrash(point)
            return real(self, step, path, kind)
        monkeypatch.setattr(RunRecords, "checkpoint", crash_after_complete)
    existing = existing_runs()
    with pytest.raises(InjectedCrash):
        grpo_flow(overrides=RUN, run_name=f"crash-{point}")
    monkeypatch.undo()
    (run,) = [p.name for p in runs_root().iterdir() if p.name not in existing]
    assert steps_recorded(run) == [1, 2, 3, 4]
    second = grpo_flow(resume=run)
    assert second["start_step"] == (2 if point == "before-complete" else 4)
    info = assert_records_complete(run, reference_sha)
    with session_scope() as s:
        steps = sorted(c.step for c in repo.get_run(s, run).checkpoints if c.kind == "trainer")
    assert steps == [2, 4, 6], "every checkpoint on disk is in the registry, once"
    assert info["status"] == "completed"


@pytest.mark.slurm
def test_scancelled_generator_job_mid_run_is_recovered(slurm_cluster, reference_sha, monkeypatch):
    from infra.records import RunRecords

    cancelled: list[str] = []
    real_step = RunRecords.step

    def cancel_generator_after_step_1(self, step, metrics):
        # scancel is asynchronous and a tiny step takes milliseconds: the run waits here until SLURM has ended the
        # job, so the next rollout meets a dead generator whatever the machine's speed
        real_step(self, step, metrics)
        if step != 1:
            return
        with session_scope() as s:
            (job,) = [w.job_id for w in repo.get_run(s, self.run_id).workers if w.name == "generator-0"]
        subprocess.run(["scancel", job], check=True)
        wait_until(lambda: not subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip(),
                   f"SLURM ending job {job}")
        cancelled.append(job)

    monkeypatch.setattr(RunRecords, "step", cancel_generator_after_step_1)
    summary = grpo_flow(overrides={**RUN, "launcher": "slurm", "slurm.cpus_per_task": 1}, run_name="scancel")
    monkeypatch.undo()
    assert cancelled, "the generator job was never cancelled"
    assert [r["role"] for r in summary["recoveries"]] == ["generator"]
    assert_records_complete(summary["run_id"], reference_sha)


def test_hanging_and_raising_rewards_are_counted_and_the_run_completes(tmp_path):
    plugins = ["tests.unit.reward_examples:hangs_on_some_prompts", "tests.unit.reward_examples:raises_on_boom"]
    rewards = [{"name": "math", "weight": 1.0}, {"name": plugins[0], "key": "slow", "weight": 0.0},
               {"name": plugins[1], "key": "flaky", "weight": 0.0}]
    summary = grpo_flow(write_plugin_config(tmp_path, plugins),
                        overrides={**TINY, "steps": 2, "rewards": rewards, "reward.timeout_s": 0.3},
                        run_name="bad-rewards")
    rows = [json.loads(line) for line in (run_dir(summary["run_id"]) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert sum(r["reward/timeouts"] for r in rows) > 0  # each hung episode scored the fallback, counted
    assert all(r["reward/errors"] >= r["reward/timeouts"] for r in rows)
    assert show_run(summary["run_id"])["status"] == "completed"


def test_a_reward_function_that_always_raises_ends_the_run_with_its_error(tmp_path):
    """Scoring every episode 0 would train nothing and still "succeed": after reward.max_failed_steps steps in a row
    the run fails, quoting the function's error, with the steps before it on record."""
    plugin = "tests.unit.reward_examples:always_raises"
    rewards = [{"name": plugin, "key": "verifier"}]
    existing = existing_runs()
    with pytest.raises(Exception, match="reward function 'verifier' raised on every episode of 2 steps"):
        grpo_flow(write_plugin_config(tmp_path, [plugin]), run_name="broken-verifier",
                  overrides={**TINY, "steps": 6, "rewards": rewards, "reward.max_failed_steps": 2})
    (run,) = [p for p in runs_root().iterdir() if p.name not in existing]
    info = show_run(run.name)
    assert info["status"] == "failed", info
    assert "ModuleNotFoundError: No module named 'sympy_verifier'" in info["message"]
    assert steps_recorded(run.name) == [1] and info["steps_completed"] == 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["reward/failed/verifier"] == 1.0


def test_nan_loss_stops_the_run_naming_the_step_and_keeps_the_last_checkpoint(tmp_path):
    plugin = "tests.unit.custom_loss_example:NaNAtCallLoss"
    overrides = {**TINY, "steps": 4, "loss": {"name": plugin, "at": 3}}
    existing = existing_runs()
    with pytest.raises(Exception, match="non-finite loss"):
        grpo_flow(write_plugin_config(tmp_path, [plugin]), overrides=overrides, run_name="diverges")
    (run,) = [p for p in runs_root().iterdir() if p.name not in existing]
    info = show_run(run.name)
    assert info["status"] == "failed" and "non-finite loss" in info["message"] and "at step 2" in info["message"]
    assert steps_recorded(run.name) == [1, 2] and info["steps_completed"] == 2
    assert latest_good_checkpoint(run / "checkpoints") == run / "checkpoints" / "step-000002"  # intact, verified


def test_a_run_driven_by_another_process_is_refused_and_left_alone(reference_sha):
    """Two drivers of one run would start rival workers: `resume` of a run another process holds is refused, naming
    that process, and nothing of the run changes (a second execution of one flow run waits: test_deployments)."""
    summary = grpo_flow(overrides=RUN, run_name="held")
    out = run_dir(summary["run_id"])
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != "driver.lock"}
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from runtime.run_lock import lock_run; lock_run(Path(sys.argv[1]), 'r', 'other-flow-run'); "
                               "print('held', flush=True); time.sleep(300)", str(out)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Exception, match=rf"run {summary['run_id']} is being driven by pid {holder.pid} .*"
                                            rf"flow run other-flow-run"):
            grpo_flow(resume=summary["run_id"])
        cli = subprocess.run([sys.executable, "-m", "cli", "resume", summary["run_id"]], capture_output=True,
                             text=True, cwd=ROOT)  # refused before the embedded Prefect API starts
        assert cli.returncode == 2 and f"being driven by pid {holder.pid}" in cli.stderr, cli.stderr[-3000:]
        assert "Traceback" not in cli.stderr
    finally:
        holder.kill()
        holder.wait()
    after = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != "driver.lock"}
    assert after == before, "the refused driver touched the run"

    assert_records_complete(summary["run_id"], reference_sha)


@pytest.mark.parametrize("key,value,message", [
    ("tracking.registry_url", "postgresql://forgeflow:secret@127.0.0.1:9/registry", "run registry at .* unreachable"),
    ("tracking.mlflow_uri", "http://127.0.0.1:9", "MLflow tracking server at http://127.0.0.1:9 is unreachable"),
])
def test_unreachable_registry_or_mlflow_fails_before_any_worker_starts(tmp_path, key, value, message):
    recipe = yaml.safe_load((ROOT / "configs/grpo_math_tiny.yaml").read_text())
    trusting = tmp_path / "trusting.yaml"  # overrides may name only hosts the file trusts (infra/hosts.py)
    trusting.write_text(yaml.safe_dump({**recipe, "trusted_hosts": ["127.0.0.1:9"]}))
    existing = existing_runs()
    with pytest.raises(ValueError, match=message) as err:
        grpo_flow(str(trusting), overrides={**TINY, "steps": 2, key: value})
    assert "secret" not in str(err.value)  # the password is never shown
    for run in (p for p in runs_root().iterdir() if p.name not in existing):
        assert not (run / "workers").exists()  # no worker was started


@pytest.mark.parametrize("args,message", [
    (["resume", "no-such-run"], "cannot resume 'no-such-run': no run directory"),
    (["runs", "show", "no-such-run", "--json"], "no run 'no-such-run' in the registry"),
    (["lineage", "no-such-run"], "no run 'no-such-run' in the registry"),
    (["compare", "no-such-run"], "no run 'no-such-run' in the registry"),
    (["grpo", "--config", "configs/missing.yaml"], "config file configs/missing.yaml does not exist"),
    (["grpo", "--trainer.lrr", "1e-5"], "unknown key 'trainer.lrr'; did you mean 'lr'"),
    (["grpo", "--group_size", "1"], "group_size must be >= 2"),
])
def test_cli_errors_name_the_problem_without_a_traceback(args, message):
    out = subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 2, out.stderr[-3000:]
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert not (runs_root() / "no-such-run").exists()  # a bad id creates nothing
