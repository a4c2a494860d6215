"""The run registry on real SQLite and a real PostgreSQL server (started by infra/postgres/start_postgres.sh)."""

import multiprocessing as mp
import socket
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import inspect, select

from infra.registry import Checkpoint, Iteration, Run, get_engine, repo, session_scope

pytestmark = pytest.mark.integration
SCRIPT = Path(__file__).resolve().parents[2] / "infra" / "postgres" / "start_postgres.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    import os
    import shutil
    import tempfile

    parent = tempfile.mkdtemp(prefix="forgeflow-pg-")
    os.chmod(parent, 0o755)  # the server runs as the postgres user: it must reach its data directory
    data = Path(parent) / "data"
    out = subprocess.run([str(SCRIPT), str(data), str(free_port())], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"could not start PostgreSQL with {SCRIPT}:\n{out.stdout}\n{out.stderr}")
    yield out.stdout.strip()
    subprocess.run([str(SCRIPT), "stop", str(data)], check=False)
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    base = request.getfixturevalue("postgres_url")
    # a fresh schema per test keeps tests independent on one server
    from sqlalchemy import create_engine, text

    schema = f"t{tmp_path.name.replace('-', '_').lower()[-40:]}"
    with create_engine(base.replace("postgresql://", "postgresql+psycopg://")).begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    return f"{base}?options=-csearch_path%3D{schema}"


def test_migrations_create_every_table_once(url):
    engine = get_engine(url)
    tables = set(inspect(engine).get_table_names())
    assert {"runs", "iterations", "checkpoints", "workers", "sweeps", "alembic_version"} <= tables
    assert "state_sha256" in {c["name"] for c in inspect(engine).get_columns("checkpoints")}  # migration 0002
    from infra.registry.db import migrate

    migrate(engine)  # idempotent


def test_runs_iterations_checkpoints_and_lineage(url):
    with session_scope(url) as s:
        repo.create_sweep(s, "sw1", {"loss.name": ["dapo", "gspo"]})
        repo.create_run(s, "sft1", "sft", {"sft": {"steps": 10}}, dataset_fingerprint="d1")
        sft_ck = repo.record_checkpoint(s, "sft1", 10, "/runs/sft1/sft", "a" * 64, 100, kind="sft")
        repo.create_run(s, "g1", "grpo", {"loss": {"name": "dapo"}}, name="dapo", sweep_id="sw1",
                        parent_run_id="sft1", init_checkpoint_id=sft_ck.id, dataset_fingerprint="d1")
        for step in (1, 2, 3):
            repo.record_iteration(s, "g1", step, {"reward/mean": step / 10, "timing/step": 0.5}, policy_version=step)
        repo.record_checkpoint(s, "g1", 2, "/runs/g1/checkpoints/step-2", "b" * 64, 200)
        repo.supersede_after(s, "g1", 2)  # rolled back to the step-2 checkpoint
        repo.record_iteration(s, "g1", 3, {"reward/mean": 0.33})
        repo.record_checkpoint(s, "g1", 4, "/runs/g1/checkpoints/step-4", "c" * 64, 200)
        w = repo.record_worker(s, "g1", "trainer-0", "trainer", "123", "vm", 42)
        w2 = repo.record_worker(s, "g1", "trainer-0", "trainer", "124", "vm", 43)
        assert repo.record_worker(s, "g1", "trainer-0", "trainer", "124", "vm", 43) is w2  # recorded again: one row
    with session_scope(url) as s:
        assert repo.completed_steps(s, "g1") == [1, 2, 3]
        attempts = s.scalars(select(Iteration).where(Iteration.run_id == "g1", Iteration.step == 3)
                             .order_by(Iteration.attempt)).all()
        assert [(i.attempt, i.status) for i in attempts] == [(1, "superseded"), (2, "completed")]
        assert attempts[0].timings == {"timing/step": 0.5} and attempts[1].metrics == {"reward/mean": 0.33}
        chain = repo.lineage(s, "g1")
        assert [(c["run"], c["step"], c["kind"]) for c in chain] == [("g1", 4, "trainer"), ("g1", 2, "trainer"),
                                                                      ("sft1", 10, "sft")]
        assert chain[-1]["recipe"] == "sft" and chain[0]["dataset"] == "d1"
        run = repo.get_run(s, "g1")
        assert run.sweep_id == "sw1" and run.sweep.grid == {"loss.name": ["dapo", "gspo"]}
        assert [x.restarts for x in run.workers] == [0, 1] and run.workers[0].state == "lost"
        assert w.id != w2.id
        repo.update_run(s, "g1", status="completed")
        assert run.ended_at is not None
        assert repo.get_run(s, "sft").id == "sft1"  # unique prefix


def test_unknown_run_and_bad_status_are_clear_errors(url):
    with session_scope(url) as s:
        repo.create_run(s, "r1", "grpo", {})
    with session_scope(url) as s:
        with pytest.raises(ValueError, match="no run 'nope'.*forgeflow runs ls"):
            repo.get_run(s, "nope")
        with pytest.raises(ValueError, match="not one of"):
            repo.update_run(s, "r1", status="exploded")


def _write_runs(url: str, worker: int, n: int) -> None:
    for i in range(n):
        with session_scope(url) as s:
            run_id = f"w{worker}-r{i}"
            repo.create_run(s, run_id, "grpo", {"i": i})
            for step in range(1, 4):
                repo.record_iteration(s, run_id, step, {"reward/mean": 0.1 * step})
            repo.record_checkpoint(s, run_id, 3, f"/ck/{run_id}", "d" * 64, 1)


def test_four_processes_writing_concurrently_lose_nothing(url):
    get_engine(url)  # migrate once up front, as the first flow of a deployment would
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_runs, args=(url, w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    with session_scope(url) as s:
        assert len(s.scalars(select(Run)).all()) == 60
        assert len(s.scalars(select(Iteration)).all()) == 180
        assert len(s.scalars(select(Checkpoint)).all()) == 60
