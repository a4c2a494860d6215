"""Addresses of a run in the two UIs, so each links to the other: the MLflow run page (from Prefect) and the Prefect
flow-run page (from MLflow).

MLflow 3 opens an experiment on its GenAI overview; `?workflowType=machine_learning` (and the experiment's
`mlflow.experimentKind` tag, set by infra.tracking) open the classic runs table instead.
"""

from __future__ import annotations

import os

# what `forgeflow ui` serves when runs record to the local SQLite store (no MLflow server of their own)
LOCAL_MLFLOW_UI = "http://127.0.0.1:5000"
TRAINING_VIEW = "workflowType=machine_learning"


def mlflow_ui_base(tracking_uri: str | None) -> str:
    """The MLflow UI serving `tracking_uri`: the server itself, or what `forgeflow ui` serves for a file store."""
    if tracking_uri and tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return LOCAL_MLFLOW_UI


def mlflow_runs_url(tracking_uri: str | None, experiment_id: str) -> str:
    """The experiment's runs table (the model-training view, not the GenAI overview)."""
    return f"{mlflow_ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs?{TRAINING_VIEW}"


def mlflow_run_url(tracking_uri: str | None, experiment_id: str, run_id: str) -> str:
    """One MLflow run's page."""
    return f"{mlflow_ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_VIEW}"


def prefect_ui_base() -> str | None:
    """The Prefect UI of the API this process talks to (PREFECT_UI_URL, else PREFECT_API_URL without /api);
    None for the embedded server, which has no UI that outlives the process."""
    ui = os.environ.get("PREFECT_UI_URL")
    if ui:
        return ui.rstrip("/")
    api = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    if not api:
        return None
    return api[: -len("/api")] if api.endswith("/api") else api


def prefect_flow_run_url(flow_run_id: str | None) -> str | None:
    """The flow-run page, when there is a Prefect UI to open it in."""
    base = prefect_ui_base()
    return f"{base}/runs/flow-run/{flow_run_id}" if base and flow_run_id else None


def flow_run_link_tags(flow_run_id: str | None) -> dict[str, str]:
    """MLflow run tags that lead to the Prefect flow run (shown on the run page as its description)."""
    url = prefect_flow_run_url(flow_run_id)
    if url is None:
        return {}
    return {"prefect.flow_run_url": url, "mlflow.note.content": f"Prefect flow run: [{url}]({url})"}
