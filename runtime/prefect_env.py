"""Prefect settings for forgeflow processes: state under FORGEFLOW_HOME, telemetry off, patient start-up.

Must run before `prefect` is imported (flows/ and tasks/ call it from their package __init__).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from infra.paths import forgeflow_home

REPO_ROOT = str(Path(__file__).resolve().parents[1])

# a flow run rescheduled after crashes (the Automation `forgeflow deploy` creates) stops at this attempt
MAX_FLOW_RUN_ATTEMPTS = 3


def configure_prefect() -> None:
    """Set Prefect's environment defaults (existing values win, so users can point at a server)."""
    home = forgeflow_home()
    defaults = {
        "PREFECT_HOME": str(home / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        # the embedded (ephemeral) API starts a server in a subprocess: give a busy 2-core machine time
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        # INFO reaches the Prefect UI (step lines, SFT progress); the terminal drops Prefect's own INFO chatter
        "PREFECT_LOGGING_LEVEL": "INFO",
        "PREFECT_LOGGING_SETTINGS_PATH": str(Path(__file__).with_name("prefect_logging.yml")),
        "PREFECT_TASKS_REFRESH_CACHE": "false",
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def stop_retrying_embedded_api() -> None:
    """After Ctrl-C: the embedded Prefect server got the same SIGINT and is stopping, so the calls that end the flow
    run (its Crashed state) fail at once instead of retrying with backoff for ~75 s before the CLI can exit. A server
    named by PREFECT_API_URL keeps running, and the calls to it keep their retries."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if not settings.api.url:
        settings.client.max_retries = 0


CONSOLE_FORMAT = "%(asctime)s %(levelname)s %(source)s: %(message)s"  # the CLI's terminal lines


class ConsoleFilter(logging.Filter):
    """Terminal lines (prefect_logging.yml's console handler, the CLI's handler): every warning and error, and INFO
    only from forgeflow's code — not Prefect's per-task-run state lines, which the UI shows anyway. Sets
    `record.source` (CONSOLE_FORMAT): the flow or task run a line belongs to, else the logger's name, so a sweep's
    children are told apart."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.source = (getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None)
                         or record.name)
        return (record.levelno >= logging.WARNING or not record.name.startswith("prefect")
                or (record.pathname.startswith(REPO_ROOT) and "site-packages" not in record.pathname))


def configure_terminal_logging(level: int) -> None:
    """The CLI's logging: CONSOLE_FORMAT lines on stderr, filtered by ConsoleFilter (Prefect keeps a handler the
    process already has on the root logger instead of its own)."""
    logging.basicConfig(level=level, format=CONSOLE_FORMAT)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, ConsoleFilter) for f in handler.filters):
            handler.addFilter(ConsoleFilter())


def read_task_runs(client, flow_run_id: str) -> list:
    """Every task run of a flow run, paging through the API."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs, page = [], 200
    while True:
        batch = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                                      limit=page, offset=len(runs))
        runs.extend(batch)
        if len(batch) < page:
            return runs


def wait_for_task_runs(flow_run_id: str, expected: int, timeout_s: float = 60.0) -> int:
    """Block until the Prefect API shows `expected` finished task runs for the flow run (the embedded server records
    them asynchronously and would drop late ones when the process exits); returns the count seen."""
    import time

    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    done = 0
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            done = sum(1 for r in read_task_runs(client, flow_run_id) if r.state is not None and r.state.is_final())
            if done >= expected:
                return done
            time.sleep(0.5)
    return done


def fail_for_user_error(exc: ValueError):
    """The final state of a flow run refused for an expected user error (bad config, dataset row, run id): Failed
    with the error's message (which names the file, key and fix), logged as one line instead of a traceback."""
    from prefect import get_run_logger
    from prefect.states import Failed

    get_run_logger().error("%s", exc)
    return Failed(message=str(exc)[:4000])


def label_flow_run(name: str, tags: list[str]) -> None:
    """Rename the current flow run (Prefect would call it e.g. vermilion-sidewinder) and add `tags`, so a sweep's
    children are told apart in the UI's lists."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return
    from prefect.context import FlowRunContext

    with get_client(sync_client=True) as client:
        current = client.read_flow_run(flow_run.id).tags
        client.update_flow_run(flow_run.id, name=name, tags=list(dict.fromkeys([*current, *tags])))
    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None:  # later run-logger lines carry the new name
        context.flow_run.name = name
