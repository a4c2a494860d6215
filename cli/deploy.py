"""`forgeflow deploy`: the work pool, the deployments of prefect.yaml and the crash-recovery Automation on the
Prefect server named by PREFECT_API_URL.

The Automation reschedules Crashed flow runs of forgeflow deployments (tag `forgeflow`): a killed flow-run process
gets the same flow run (same parameters), which resumes its own run (or sweep) from its latest checkpoint. The flows
count the attempts that did their work (runtime/flow_runs.py; the process worker can report one crash twice) and refuse
more than `MAX_FLOW_RUN_ATTEMPTS`, so a run that keeps crashing ends Failed instead of looping.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from runtime.prefect_env import MAX_FLOW_RUN_ATTEMPTS

log = logging.getLogger(__name__)

WORK_POOL = "forgeflow-local"
AUTOMATION = "forgeflow-reschedule-crashed-runs"


def require_server() -> str:
    url = os.environ.get("PREFECT_API_URL")
    if not url:
        raise ValueError("PREFECT_API_URL is not set: deployments live on a Prefect server. Start one with "
                         "`forgeflow server` and export PREFECT_API_URL=http://127.0.0.1:4200/api")
    return url


def ensure_work_pool(name: str = WORK_POOL) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))
            log.info("created work pool %s (process)", name)
        except ObjectAlreadyExists:
            log.info("work pool %s exists", name)


def apply_deployments(root: Path) -> None:
    """`prefect deploy --all` from the repository root (Prefect's own default pull step then points at it)."""
    prefect = Path(sys.executable).with_name("prefect")
    cmd = [str(prefect) if prefect.exists() else "prefect", "--no-prompt", "deploy", "--all"]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def ensure_crash_automation() -> str:
    """Create (once) the Automation that puts Crashed forgeflow flow runs back to Scheduled; returns its id."""
    from prefect.automations import Automation, ChangeFlowRunState, EventTrigger
    from prefect.client.schemas.objects import StateType
    from prefect.events.schemas.automations import Posture

    try:
        existing = Automation.read(name=AUTOMATION)
        if existing is not None:
            return str(existing.id)
    except ValueError:  # none with that name yet
        pass
    automation = Automation(
        name=AUTOMATION,
        description=f"Reschedule Crashed runs of forgeflow deployments; flows stop after {MAX_FLOW_RUN_ATTEMPTS} "
                    "attempts and resume from their latest checkpoint.",
        trigger=EventTrigger(
            expect={"prefect.flow-run.Crashed"},
            match_related={"prefect.resource.id": "prefect.tag.forgeflow"},
            posture=Posture.Reactive, threshold=1, within=0),
        actions=[ChangeFlowRunState(state=StateType.SCHEDULED, name="Rescheduled after crash",
                                    message="forgeflow: rescheduled after the flow-run process crashed")],
    ).create()
    return str(automation.id)


def deploy(root: Path | None = None) -> dict:
    """Work pool + deployments + Automation; returns what was set up."""
    url = require_server()
    root = (root or Path.cwd()).resolve()
    if not (root / "prefect.yaml").exists():
        raise ValueError(f"no prefect.yaml in {root}: run `forgeflow deploy` from the forgeflow checkout")
    ensure_work_pool()
    apply_deployments(root)
    automation_id = ensure_crash_automation()
    return {"api": url, "work_pool": WORK_POOL, "automation": automation_id, "root": str(root),
            "next": f"prefect worker start --pool {WORK_POOL}   # then: prefect deployment run 'grpo/grpo-math'"}
