"""What a run shows on its Prefect flow-run page (Artifacts tab): progress, a table of per-step metrics, sampled
completions, and links to MLflow. Called from inside a flow run (artifacts attach to it); keyed per run, so the
Artifacts page keeps each one's history.

A long run makes thousands of task runs; these artifacts are the page's summary.
"""

from __future__ import annotations

import logging

from runtime.progress import PASS_KEY

log = logging.getLogger(__name__)

# (column, metric key) of the metrics table; a key a run does not log is left blank
TABLE_COLUMNS = (("step", "step"), ("reward", "reward/mean"), ("accuracy", "eval/accuracy"), ("loss", "loss/loss"),
                 ("kl", "loss/kl_mean"), ("reverse kl", "distill/reverse_kl"), ("clip high", "loss/clip_frac_high"),
                 ("clip low", "loss/clip_frac_low"), ("staleness", "rollout/policy_staleness"),
                 ("seconds", "timing/step"))


def artifact_key(run_id: str, kind: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) for one kind of artifact of a run."""
    raw = f"forgeflow-{run_id}-{kind}".lower()
    return "".join(c if c.isalnum() or c == "-" else "-" for c in raw)


def metrics_table(rows: list[dict]) -> list[dict]:
    """Step rows (metric dicts with 'step') as table rows with the TABLE_COLUMNS, numbers rounded for reading; runs
    whose evaluations sample (eval.samples = k) get pass@k and sampled-accuracy columns after the accuracy, runs that
    distill a reverse-KL column."""
    def cell(v):
        if isinstance(v, float):
            return round(v, 4)
        return "" if v is None else v

    sampled = sorted({key for r in rows for key in r if PASS_KEY.fullmatch(key)})
    if sampled:
        sampled.append("eval/sampled_accuracy")
    # the distillation column only for runs that distill
    columns = [c for c in TABLE_COLUMNS if c[1] != "distill/reverse_kl" or any(c[1] in r for r in rows)]
    at = next(i for i, (_, key) in enumerate(columns) if key == "eval/accuracy") + 1
    columns[at:at] = [(key.removeprefix("eval/").replace("pass_at_", "pass@").replace("_", " "), key)
                      for key in sampled]
    return [{name: cell(r.get(key)) for name, key in columns} for r in rows]


class RunArtifacts:
    """The artifacts of one run's flow run; `progress` each step, `table` and `samples` at evals/checkpoints."""

    def __init__(self, run_id: str, steps: int) -> None:
        self.run_id, self.steps = run_id, steps
        self.progress_id = None

    def progress(self, done: int) -> None:
        """Steps done of the run, as a progress bar."""
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        percent = 100.0 * done / max(1, self.steps)
        description = f"step {done}/{self.steps}"
        if self.progress_id is None:
            self.progress_id = create_progress_artifact(percent, key=artifact_key(self.run_id, "progress"),
                                                        description=description)
        else:
            update_progress_artifact(self.progress_id, percent, description=description)

    def table(self, rows: list[dict]) -> None:
        """Per-step metrics so far (reward, accuracy, loss, KL, clip fractions, staleness, seconds)."""
        from prefect.artifacts import create_table_artifact

        create_table_artifact(metrics_table(rows), key=artifact_key(self.run_id, "metrics"),
                              description=f"run {self.run_id}: per-step metrics through step "
                                          f"{rows[-1]['step'] if rows else 0}")

    def workers(self, rows: list[dict]) -> None:
        """Where each worker runs: its role, Slurm (or local) job, node and pid."""
        from prefect.artifacts import create_table_artifact

        create_table_artifact(rows, key=artifact_key(self.run_id, "workers"),
                              description=f"run {self.run_id}: workers and the nodes they run on")

    def samples(self, step: int, markdown: str) -> None:
        """Sampled prompts and completions (with rewards and advantages) of step `step`'s batch."""
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(f"### Rollout samples, step {step}\n\n{markdown}",
                                 key=artifact_key(self.run_id, "samples"),
                                 description=f"run {self.run_id}: sampled completions at step {step}")

    def links(self, mlflow_url: str, run_dir: str) -> None:
        """Where the run's MLflow page and files are."""
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(f"**MLflow run:** [{mlflow_url}]({mlflow_url})\n\n**Run directory:** `{run_dir}`"
                                 f"\n\n`forgeflow runs show {self.run_id}` · `forgeflow samples {self.run_id}`",
                                 key=artifact_key(self.run_id, "links"),
                                 description=f"run {self.run_id} in MLflow and on disk")
