"""Registry database: engine per URL (SQLite in FORGEFLOW_HOME by default, PostgreSQL by URL), migrations applied
automatically on first use, sessions for the repository functions (callers commit)."""

from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).parent / "migrations"
_ENGINES: dict[str, Engine] = {}
_LOCK = threading.Lock()


def default_registry_url() -> str:
    """FORGEFLOW_REGISTRY_URL, else SQLite at FORGEFLOW_HOME/registry.db."""
    from infra.paths import forgeflow_home

    return os.environ.get("FORGEFLOW_REGISTRY_URL") or f"sqlite:///{forgeflow_home() / 'registry.db'}"


def get_engine(url: str | None = None) -> Engine:
    """The (cached) engine for `url`, migrated to the latest schema."""
    url = url or default_registry_url()
    with _LOCK:
        if url not in _ENGINES:
            engine = _make_engine(url)
            try:
                migrate(engine)
            except OperationalError as exc:
                shown = engine.url.render_as_string(hide_password=True)
                reason = str(exc.orig or exc).strip().splitlines()[0][:300]
                raise ValueError(f"the run registry at {shown} is unreachable ({reason}); start the database "
                                 "(PostgreSQL: infra/postgres/start_postgres.sh) or set tracking.registry_url / "
                                 "FORGEFLOW_REGISTRY_URL to a reachable one (default: SQLite under FORGEFLOW_HOME)"
                                 ) from exc
            _ENGINES[url] = engine
        return _ENGINES[url]


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
            cur.execute("PRAGMA busy_timeout=30000")  # concurrent writers wait instead of failing
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if url.startswith("postgresql"):
        if "+" not in url.split("://")[0]:
            url = url.replace("postgresql://", "postgresql+psycopg://", 1)
        # fail within seconds, not minutes, when the server is down
        return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 10})
    return create_engine(url, pool_pre_ping=True)


def migrate(engine: Engine) -> None:
    """Upgrade the schema to head (idempotent; serialised across processes by the database's own locking)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # configparser interpolates '%': escape it (URL-encoded options and passwords contain it)
    cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":  # two processes migrating at once: one waits for the other
            from sqlalchemy import text

            conn.execute(text("SELECT pg_advisory_xact_lock(724011)"))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


@contextmanager
def session_scope(url: str | None = None):
    """A session that commits on success and rolls back on error."""
    session = sessionmaker(get_engine(url), expire_on_commit=False)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def open_session(url: str | None = None) -> Session:
    """A plain session (the caller commits and closes)."""
    return sessionmaker(get_engine(url), expire_on_commit=False)()
