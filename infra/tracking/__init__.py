"""MLflow tracking: one MLflow run per training run, metrics in one batch call per step, params, tags, artifacts."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

MAX_PARAMS_PER_BATCH = 100  # MLflow's limit per log_batch call
# MLflow 3 opens an experiment without this tag on its GenAI overview; training runs belong in the runs table
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"


def default_tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else a SQLite store under FORGEFLOW_HOME."""
    from infra.paths import forgeflow_home

    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{forgeflow_home() / 'mlflow.db'}"


def flatten(data: dict, prefix: str = "") -> dict[str, str]:
    """Nested config → {'trainer.lr': '1e-05', …} (lists as their repr)."""
    out: dict[str, str] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:6000]
    return out


def check_server(uri: str, timeout_s: float = 10.0) -> None:
    """Fail at once with the fix when an MLflow server does not answer (its client would retry for minutes)."""
    import httpx

    try:
        httpx.get(uri.rstrip("/") + "/health", timeout=timeout_s).raise_for_status()
    except httpx.HTTPError as exc:
        raise ValueError(f"the MLflow tracking server at {uri} is unreachable ({exc}); start it (`forgeflow ui` or "
                         "`mlflow server`), or unset tracking.mlflow_uri / MLFLOW_TRACKING_URI to record to the "
                         "local SQLite store under FORGEFLOW_HOME") from exc


class Tracker:
    """Thin wrapper over MlflowClient bound to one experiment (explicit run ids: safe from any thread)."""

    def __init__(self, uri: str | None = None, experiment: str | None = None):
        from mlflow.tracking import MlflowClient

        # log_table reads its table back before appending, which MLflow shows as a "Downloading artifacts" bar in
        # the run's terminal at every eval; a user who wants MLflow's bars sets the variable to true
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

        from infra.paths import forgeflow_home

        self.uri = uri or default_tracking_uri()
        if self.uri.startswith(("http://", "https://")):
            check_server(self.uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self._open_experiment(experiment or "forgeflow",
                                                   None if self.uri.startswith("http")
                                                   else (forgeflow_home() / "mlartifacts").as_uri())

    def _open_experiment(self, name: str, artifacts: str | None) -> str:
        """The id of experiment `name`, made (tagged as model training) when it does not exist yet."""
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                return self.client.create_experiment(name, artifact_location=artifacts,
                                                     tags={EXPERIMENT_KIND: MODEL_TRAINING})
            except MlflowException as exc:
                # two runs starting at once both found no experiment; the other one made it first
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                exp = self.client.get_experiment_by_name(name)
                assert exp is not None, f"MLflow says experiment {name!r} exists but cannot find it"
        if exp.tags.get(EXPERIMENT_KIND) is None:  # made before forgeflow set it
            self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
        return exp.experiment_id

    def start_run(self, run_name: str, params: dict | None = None, tags: dict | None = None,
                  parent_run_id: str | None = None) -> str:
        """Create an MLflow run (nested under parent_run_id when given); returns its id."""
        tags = {k: str(v) for k, v in (tags or {}).items() if v is not None}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        if params:
            self.log_params(run.info.run_id, params)
        return run.info.run_id

    def find_run(self, forgeflow_run_id: str) -> str | None:
        """The MLflow run of a forgeflow run (tag forgeflow.run_id), if one was made already (a restart)."""
        found = self.client.search_runs([self.experiment_id], f"tags.`forgeflow.run_id` = '{forgeflow_run_id}'",
                                        max_results=1)
        return found[0].info.run_id if found else None

    def log_params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in flatten(params).items()]
        for start in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=items[start:start + MAX_PARAMS_PER_BATCH])

    def log_step(self, run_id: str, step: int, metrics: dict) -> None:
        """All numeric metrics of a step in one call."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()
                 if isinstance(v, int | float) and not isinstance(v, bool)]
        if batch:
            self.client.log_batch(run_id, metrics=batch)

    def set_tags(self, run_id: str, tags: dict) -> None:
        for k, v in tags.items():
            self.client.set_tag(run_id, k, str(v))

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path)
        elif path.exists():
            self.client.log_artifact(run_id, str(path), artifact_path)

    def log_table(self, run_id: str, rows: list[dict], artifact_file: str) -> None:
        """Rows (dicts with the same keys) appended to a table artifact (MLflow's artifact and evaluation views)."""
        if rows:
            self.client.log_table(run_id, {k: [r[k] for r in rows] for k in rows[0]}, artifact_file)

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        """status: FINISHED | FAILED | KILLED."""
        self.client.set_terminated(run_id, status=status)

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in self.client.get_metric_history(run_id, key)]
