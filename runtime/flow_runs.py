"""What forgeflow remembers per Prefect flow run (`FORGEFLOW_HOME/flow_runs/<flow run id>.json`), so a flow run the
crash Automation reschedules continues its own work instead of starting over: the id of the run or sweep it drives,
and how many attempts drove it (a flow that keeps crashing ends Failed after MAX_FLOW_RUN_ATTEMPTS instead of
looping). Outside a flow run (a plain function call) nothing is remembered."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from infra.paths import forgeflow_home
from runtime.prefect_env import MAX_FLOW_RUN_ATTEMPTS


def current_flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


def index_path(flow_run_id: str) -> Path:
    return forgeflow_home() / "flow_runs" / f"{flow_run_id}.json"


def read_index(flow_run_id: str) -> dict:
    path = index_path(flow_run_id)
    return json.loads(path.read_text()) if path.exists() else {"flow_run_id": flow_run_id}


def write_index(entry: dict) -> None:
    path = index_path(entry["flow_run_id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entry))
    tmp.replace(path)  # atomic: a crash never leaves half an index (the id it remembers would be lost)


def remembered_id(key: str, make: Callable[[], str]) -> str:
    """The id under `key` ("run_id", "sweep_id") this flow run drives: made once, the same in every later attempt."""
    flow_run_id = current_flow_run_id()
    if flow_run_id is None:
        return make()
    entry = read_index(flow_run_id)
    if key not in entry:
        entry[key] = make()
        write_index(entry)
    return entry[key]


def count_attempt(what: str) -> int:
    """Count one more attempt of this flow run at `what` (e.g. "run R"); RuntimeError past MAX_FLOW_RUN_ATTEMPTS.
    Count only attempts that do the work: an execution that waits for another one is not an attempt."""
    flow_run_id = current_flow_run_id()
    if flow_run_id is None:
        return 1
    entry = read_index(flow_run_id)
    entry["attempts"] = entry.get("attempts", 0) + 1
    write_index(entry)
    if entry["attempts"] > MAX_FLOW_RUN_ATTEMPTS:
        raise RuntimeError(f"flow run {flow_run_id} would start {what} for the {entry['attempts']}th time; "
                           f"forgeflow stops after {MAX_FLOW_RUN_ATTEMPTS} attempts (see the earlier crashes in "
                           "its logs); fix the cause, then run it again (`forgeflow resume RUN_ID` for a run)")
    return entry["attempts"]
