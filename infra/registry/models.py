"""Run registry tables (SQLAlchemy 2 ORM): runs, iterations, checkpoints, workers, sweeps, and lineage links."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    grid: Mapped[dict] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(20), default="running")
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    runs: Mapped[list[Run]] = relationship(back_populates="sweep")


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    recipe: Mapped[str] = mapped_column(String(40))  # grpo | sft | evaluate
    config: Mapped[dict] = mapped_column(JSON)
    config_hash: Mapped[str] = mapped_column(String(64), index=True)
    code_version: Mapped[str | None] = mapped_column(String(64))
    dataset_fingerprint: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(20), default="running", index=True)
    status_message: Mapped[str | None] = mapped_column(Text)
    prefect_flow_run_id: Mapped[str | None] = mapped_column(String(64))
    mlflow_run_id: Mapped[str | None] = mapped_column(String(64))
    sweep_id: Mapped[str | None] = mapped_column(ForeignKey("sweeps.id"))
    parent_run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id"))
    # the checkpoint this run started from (SFT → GRPO lineage); a plain id: the two tables reference each other
    init_checkpoint_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    sweep: Mapped[Sweep | None] = relationship(back_populates="runs")
    iterations: Mapped[list[Iteration]] = relationship(back_populates="run", order_by="Iteration.step")
    checkpoints: Mapped[list[Checkpoint]] = relationship(back_populates="run", foreign_keys="Checkpoint.run_id",
                                                         order_by="Checkpoint.step")
    workers: Mapped[list[Worker]] = relationship(back_populates="run")


class Iteration(Base):
    """One attempt at one step; a step redone after a rollback gets attempt + 1 and the old row is 'superseded'."""

    __tablename__ = "iterations"
    __table_args__ = (UniqueConstraint("run_id", "step", "attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[str] = mapped_column(String(20), default="completed")  # completed | superseded | eval (step 0)
    policy_version: Mapped[int | None] = mapped_column(Integer)
    metrics: Mapped[dict] = mapped_column(JSON, default=dict)
    timings: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    run: Mapped[Run] = relationship(back_populates="iterations")


class Checkpoint(Base):
    __tablename__ = "checkpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    uri: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))  # of the file: integrity, verified on load
    state_sha256: Mapped[str | None] = mapped_column(String(64))  # of the values: equal states hash equal
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(20), default="trainer")  # trainer | sft | final
    parent_checkpoint_id: Mapped[int | None] = mapped_column(ForeignKey("checkpoints.id"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    run: Mapped[Run] = relationship(back_populates="checkpoints", foreign_keys=[run_id])
    parent: Mapped[Checkpoint | None] = relationship(remote_side=[id])


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(20))
    job_id: Mapped[str] = mapped_column(String(64))
    host: Mapped[str | None] = mapped_column(String(200))
    pid: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(20), default="running")  # running | lost | stopped
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    exit_reason: Mapped[str | None] = mapped_column(Text)
    started_s: Mapped[float | None] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    run: Mapped[Run] = relationship(back_populates="workers")
