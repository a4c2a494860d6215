"""Everything a run records, kept consistent: metrics.jsonl in the run directory, the SQL registry and MLflow.

A step is written to metrics.jsonl, the registry and MLflow when it completes (live curves). A rollback (recovery or
resume) supersedes later steps in the registry and drops them from metrics.jsonl; MLflow points cannot be retracted,
so MLflow keeps the first point of each redone step (the redo from the same checkpoint and seed computes the same
values) and the rollback is tagged on the run. Every store ends with each step exactly once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
from pathlib import Path

import yaml

from infra.checkpoints import HF_DIR, STATE, file_sha256, read_marker
from infra.config import RunConfig, config_to_dict, redact_secrets
from infra.registry import repo, session_scope
from infra.tracking import Tracker
from infra.ui_links import flow_run_link_tags, mlflow_run_url

log = logging.getLogger(__name__)

SFT_METRICS = ("loss", "lr", "grad_norm")
SAMPLES_TABLE = "rollout_samples.json"  # MLflow table artifact of sampled completions (all eval steps)


def code_version() -> str:
    """git commit of the checkout (with '+dirty' when modified), or 'unknown'."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha.stdout.strip()[:12] + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def save_json_atomically(data, path: Path) -> None:
    """JSON to `path` through a temporary file and a rename (a crash leaves the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def dataset_fingerprint(problems) -> str:
    """sha256 over the (question, solution) pairs a run trains on."""
    h = hashlib.sha256()
    for p in problems:
        h.update(p.question.encode())
        h.update(b"\0")
        h.update(str(p.solution).encode())
        h.update(b"\1")
    return h.hexdigest()[:16]


class RunRecords:
    """The records of one run: call `start`, then `step`/`rollback`/`checkpoint`, then `finish`."""

    def __init__(self, cfg: RunConfig, run_id: str, out: Path, recipe: str = "grpo"):
        self.cfg, self.run_id, self.out, self.recipe = cfg, run_id, out, recipe
        self.metrics_path = out / "metrics.jsonl"
        self.registry_url = cfg.tracking.registry_url
        self.tracker = Tracker(cfg.tracking.mlflow_uri, cfg.tracking.experiment)
        self.mlflow_run_id: str | None = None
        self.pending: list[tuple[int, dict]] = []  # (step, metrics) not yet sent to MLflow
        self.mlflow_through = 0  # redone steps up to this are not sent again (MLflow holds their first point)
        self.mlflow_sent = 0  # the last step sent to MLflow by this process
        self.rollbacks: list[str] = []

    # ---- lifecycle ----

    def start(self, name: str | None, flow_run_id: str | None, dataset: str | None, init_checkpoint: str | None = None,
              sweep_id: str | None = None, parent_mlflow_run_id: str | None = None,
              parent_run_id: str | None = None, mlflow_name: str | None = None) -> None:
        """Register the run (or reopen it on resume) and open its MLflow run (named `mlflow_name`, else `name`)."""
        config = redact_secrets(config_to_dict(self.cfg))
        with session_scope(self.registry_url) as s:
            existing = s.get(repo.Run, self.run_id)
            if existing is not None:  # resume: same registry run and MLflow run
                repo.update_run(s, self.run_id, status="running", status_message=None,
                                prefect_flow_run_id=flow_run_id or existing.prefect_flow_run_id)
                self.mlflow_run_id = existing.mlflow_run_id
                repo.mark_workers(s, self.run_id, "lost", "controller restarted")
            else:
                init = repo.find_checkpoint(s, init_checkpoint) if init_checkpoint else None
                tags = {"forgeflow.run_id": self.run_id, "forgeflow.recipe": self.recipe,
                        "forgeflow.code_version": code_version(), "prefect.flow_run_id": flow_run_id,
                        "forgeflow.sweep_id": sweep_id, "forgeflow.dataset": dataset,
                        "forgeflow.loss": self.cfg.loss.name, **flow_run_link_tags(flow_run_id)}
                # opened earlier (open_mlflow_run: the SFT warm-up nests under it), maybe by a process that died
                self.mlflow_run_id = self.mlflow_run_id or self.tracker.find_run(self.run_id)
                if self.mlflow_run_id is None:
                    self.mlflow_run_id = self.tracker.start_run(mlflow_name or name or self.run_id, config, tags,
                                                                parent_mlflow_run_id)
                else:
                    self.tracker.log_params(self.mlflow_run_id, config)
                    self.tracker.set_tags(self.mlflow_run_id, {k: v for k, v in tags.items() if v is not None})
                    self.tracker.client.update_run(self.mlflow_run_id, status="RUNNING")
                repo.create_run(s, self.run_id, self.recipe, config, name, code_version=tags["forgeflow.code_version"],
                                dataset_fingerprint=dataset, prefect_flow_run_id=flow_run_id,
                                mlflow_run_id=self.mlflow_run_id, sweep_id=sweep_id, parent_run_id=parent_run_id,
                                init_checkpoint_id=init.id if init else None)
        if existing is not None and self.mlflow_run_id:
            self.tracker.client.update_run(self.mlflow_run_id, status="RUNNING")
            if flow_run_id:  # a resume runs in another flow run: link that one
                self.tracker.set_tags(self.mlflow_run_id, {"prefect.flow_run_id": flow_run_id,
                                                           **flow_run_link_tags(flow_run_id)})

    def open_mlflow_run(self, name: str, parent_mlflow_run_id: str | None = None) -> str:
        """Create this run's MLflow run before `start` (which fills in its params and tags), so that runs made
        first — the SFT warm-up — can nest under it."""
        if self.mlflow_run_id is None:
            self.mlflow_run_id = self.tracker.find_run(self.run_id)  # a restart after its SFT failed
            if self.mlflow_run_id is None:
                self.mlflow_run_id = self.tracker.start_run(name, None, {"forgeflow.run_id": self.run_id},
                                                            parent_mlflow_run_id)
            else:
                self.tracker.client.update_run(self.mlflow_run_id, status="RUNNING")
        return self.mlflow_run_id

    def end_unstarted(self, status: str) -> None:
        """End the MLflow run opened by `open_mlflow_run` when the run stops before `start` (its SFT failed), so it
        does not stay RUNNING; a restart of the run reopens it."""
        if self.mlflow_run_id is not None:
            self.tracker.end_run(self.mlflow_run_id, status)
            self.mlflow_run_id = None

    @property
    def mlflow_url(self) -> str | None:
        """This run's page in the MLflow UI."""
        if self.mlflow_run_id is None:
            return None
        return mlflow_run_url(self.tracker.uri, self.tracker.experiment_id, self.mlflow_run_id)

    def finish(self, status: str, summary: dict | None = None, message: str | None = None) -> None:
        """Mark the run completed | failed | interrupted, close MLflow, attach artifacts."""
        with session_scope(self.registry_url) as s:
            repo.update_run(s, self.run_id, status=status, status_message=message)
            repo.mark_workers(s, self.run_id, "stopped", f"run {status}")
        if status == "completed":
            self.flush()
        if self.mlflow_run_id is None:
            return
        redacted = self.out / "artifacts" / "config.yaml"  # the run's config.yaml keeps what resume needs
        redacted.parent.mkdir(exist_ok=True)
        redacted.write_text(yaml.safe_dump(redact_secrets(config_to_dict(self.cfg)), sort_keys=False))
        self.tracker.log_artifact(self.mlflow_run_id, redacted)
        for name in ("summary.json", "curves.png", "eval.json"):
            self.tracker.log_artifact(self.mlflow_run_id, self.out / name)
        if summary and summary.get("checkpoint"):
            self.attach_checkpoint(Path(summary["checkpoint"]))
        if summary:
            self.tracker.log_step(self.mlflow_run_id, self.cfg.steps,
                                  {"final/acc_before": summary.get("acc_before", 0.0),
                                   "final/acc_after": summary.get("acc_after", 0.0),
                                   "final/minutes": summary.get("minutes", 0.0),
                                   **{f"final/{key}": value for key, value in summary.items()  # pass@k, sampled
                                      if key.startswith(("pass", "sampled_")) and value is not None}})
        mlflow_status = {"completed": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED")
        self.tracker.end_run(self.mlflow_run_id, mlflow_status)

    def attach_checkpoint(self, path: Path, max_artifact_mb: float = 50.0) -> None:
        """The final model as an MLflow artifact when small (HF dir), else by URI tag (big models stay put)."""
        hf = path / HF_DIR if (path / HF_DIR).is_dir() else path
        size_mb = sum(f.stat().st_size for f in hf.rglob("*") if f.is_file()) / 1e6
        self.tracker.set_tags(self.mlflow_run_id, {"forgeflow.checkpoint_uri": str(path),
                                                   "forgeflow.checkpoint_mb": f"{size_mb:.1f}"})
        if size_mb <= max_artifact_mb:
            self.tracker.log_artifact(self.mlflow_run_id, hf, "checkpoint")

    # ---- per step ----

    def step(self, step: int, metrics: dict) -> None:
        """Step `step` (1-based: the policy version it produced) completed with `metrics`."""
        row = {"step": step, **metrics}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        with session_scope(self.registry_url) as s:
            repo.record_iteration(s, self.run_id, step, metrics, policy_version=step)
        self.pending.append((step, metrics))
        self.flush()  # live curves: each step is sent as it is recorded

    def flush(self) -> None:
        """Send pending steps to MLflow (one batch call per step)."""
        if self.mlflow_run_id:
            for step, metrics in self.pending:
                if step <= self.mlflow_through:  # redone after a rollback below what MLflow has: keep one point
                    continue
                self.tracker.log_step(self.mlflow_run_id, step, metrics)
                self.mlflow_sent = max(self.mlflow_sent, step)
        self.pending.clear()

    def eval_point(self, step: int, metrics: dict) -> None:
        """Evaluation of the weights at `step` outside the schedule's evals (the initial and the final weights):
        into the registry, and to MLflow unless it already has `eval/accuracy` at that step (a resume)."""
        evals = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        with session_scope(self.registry_url) as s:
            repo.record_eval(s, self.run_id, step, evals)
        if self.mlflow_run_id and step not in {k for k, _ in self.tracker.history(self.mlflow_run_id,
                                                                                    "eval/accuracy")}:
            self.tracker.log_step(self.mlflow_run_id, step, evals)

    def samples(self, step: int, rows: list[dict]) -> Path:
        """Sampled completions of step `step` (forge_core.recipes.samples rows): samples/step-N.json in the run
        directory (rewritten when the step is redone) and appended to MLflow's rollout_samples.json table once."""
        path = self.out / "samples" / f"step-{step:06d}.json"
        save_json_atomically(rows, path)
        if self.mlflow_run_id and step > self.mlflow_through:  # a redone step is in MLflow already
            self.tracker.log_table(self.mlflow_run_id, rows, SAMPLES_TABLE)
        return path

    def sft_step(self, step: int, metrics: dict) -> None:
        """One SFT step's loss, lr and gradient norm to MLflow as sft/* (step 1-based)."""
        if self.mlflow_run_id:
            self.tracker.log_step(self.mlflow_run_id, step, {f"sft/{k}": metrics[k] for k in SFT_METRICS
                                                             if k in metrics})

    def rollback(self, step: int) -> None:
        """Steps after `step` will be redone: supersede them everywhere. MLflow cannot retract points, so it keeps
        the first value of each redone step (a redo from the same checkpoint and seed computes the same one) and the
        rollback is marked on the run (tag forgeflow.rollbacks)."""
        rows = self.rows()
        kept = [r for r in rows if r["step"] <= step]
        if len(kept) != len(rows):
            self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        with session_scope(self.registry_url) as s:
            repo.supersede_after(s, self.run_id, step)
        self.pending = [(k, m) for k, m in self.pending if k <= step]
        if self.mlflow_run_id and self.mlflow_sent > step:
            self.mlflow_through = max(self.mlflow_through, self.mlflow_sent)
            self.rollbacks.append(f"{self.mlflow_sent}->{step}")
            self.tracker.set_tags(self.mlflow_run_id, {"forgeflow.rollbacks": ", ".join(self.rollbacks)})

    def resume_at(self, step: int, checkpoint: Path | None = None) -> None:
        """The run continues from `checkpoint` at `step`: drop later steps, register the checkpoint if the registry
        never heard of it, and send MLflow any steps up to `step` it never received (a crash between writing a
        checkpoint and recording it)."""
        self.rollback(step)
        if checkpoint is not None:
            with session_scope(self.registry_url) as s:
                known = repo.find_checkpoint(s, str(checkpoint))
                known = known is not None and known.run_id == self.run_id
            if not known:
                log.warning("checkpoint %s was written but never registered (a crash right after it): "
                            "registering it now", checkpoint)
                self.checkpoint(step, str(checkpoint))
        if not self.mlflow_run_id:
            return
        sent = max((m.step for m in self.tracker.client.get_metric_history(self.mlflow_run_id, "timing/step")),
                   default=0)
        if sent > step:
            # the checkpoint after `step` was unusable; MLflow cannot retract points, so steps step+1..sent keep
            # the values already sent (a redo from the same seed computes the same ones)
            log.warning("MLflow already has steps up to %d; the redone steps %d..%d are not sent again",
                        sent, step + 1, sent)
            self.mlflow_through = sent
        self.pending = [(r["step"], {k: v for k, v in r.items() if k != "step"}) for r in self.rows()
                        if sent < r["step"] <= step]
        self.flush()

    def rows(self) -> list[dict]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(x) for x in self.metrics_path.read_text().splitlines() if x.strip()]

    def checkpoint(self, step: int, path: str, kind: str = "trainer") -> int:
        """Register a checkpoint directory (sha256 of its trainer state, or of its weights for HF-only ones)."""
        p = Path(path)
        main = p / STATE if (p / STATE).exists() else p / "model.safetensors"
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        marker = read_marker(p)  # its sha256 is trainer.pt's, taken once where it was written
        digest = marker.get("sha256") if main.name == STATE and marker.get("sha256") else file_sha256(main)
        with session_scope(self.registry_url) as s:
            ck = repo.record_checkpoint(s, self.run_id, step, str(p), digest, size, kind,
                                        state_sha256=marker.get("state_sha256"))
            ck_id = ck.id
        self.flush()  # steps up to here can no longer be rolled back
        return ck_id

    def workers(self, pool) -> list[dict]:
        """Record the pool's workers (role, job id, node, pid) in the registry and as MLflow tags `worker/NAME`;
        returns them as rows."""
        rows = []
        with session_scope(self.registry_url) as s:
            for role, members in pool.members.items():
                for m in members:
                    h = m.client.last_health if m.client else {}
                    node = h.get("node") or h.get("host")
                    repo.record_worker(s, self.run_id, m.spec.name, role, str(m.job.job_id), node,
                                       h.get("pid"), pool.startup_s.get(m.spec.name))
                    rows.append({"worker": m.spec.name, "role": role, "job": str(m.job.job_id), "node": node,
                                 "pid": h.get("pid")})
        if self.mlflow_run_id:
            self.tracker.set_tags(self.mlflow_run_id, {f"worker/{r['worker']}": f"{r['node']} (job {r['job']})"
                                                       for r in rows})
        return rows
