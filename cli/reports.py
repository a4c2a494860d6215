"""`forgeflow runs ls|show`, `lineage`, `compare`, `samples`: read the registry and run directories. Each report
returns plain data (for --json) and has a text rendering."""

from __future__ import annotations

import json

from sqlalchemy import select

from infra.registry import Iteration, repo, session_scope


def list_runs(limit: int = 30, url: str | None = None) -> list[dict]:
    with session_scope(url) as s:
        rows = []
        for r in repo.list_runs(s, limit):
            rows.append({"run_id": r.id, "name": r.name, "recipe": r.recipe, "status": r.status,
                         "steps": steps_done(s, r)[0], "loss": (r.config.get("loss") or {}).get("name"),
                         "sweep_id": r.sweep_id, "created_at": r.created_at.isoformat()})
        return rows


def steps_done(s, run) -> tuple[int, int | None]:
    """(steps completed, steps configured) of a run: GRPO iterations, or for an SFT run (which records no
    iterations) the step of its SFT checkpoint and sft.steps."""
    if run.recipe == "sft":
        done = max((c.step for c in run.checkpoints if c.kind == "sft"), default=0)
        return done, (run.config.get("sft") or {}).get("steps")
    return len(repo.completed_steps(s, run.id)), run.config.get("steps")


def show_run(run_id: str, url: str | None = None) -> dict:
    """Everything about one run: fields, progress, last metrics, checkpoints (path + sha256), workers."""
    with session_scope(url) as s:
        r = repo.get_run(s, run_id)
        its = [i for i in r.iterations if i.status == "completed"]
        cks = r.checkpoints
        final = next((c for c in reversed(cks) if c.kind == "final"), cks[-1] if cks else None)
        done, total = steps_done(s, r)
        return {
            "run_id": r.id, "name": r.name, "recipe": r.recipe, "status": r.status, "message": r.status_message,
            "config_hash": r.config_hash, "code_version": r.code_version, "dataset": r.dataset_fingerprint,
            "prefect_flow_run_id": r.prefect_flow_run_id, "mlflow_run_id": r.mlflow_run_id, "sweep_id": r.sweep_id,
            "parent_run_id": r.parent_run_id, "created_at": r.created_at.isoformat(),
            "ended_at": r.ended_at.isoformat() if r.ended_at else None,
            "steps_completed": done, "steps_total": total,
            "superseded_attempts": sum(1 for i in r.iterations if i.status == "superseded"),
            "last_metrics": its[-1].metrics if its else {},
            "final_checkpoint": {"path": final.uri, "sha256": final.sha256, "state_sha256": final.state_sha256,
                                 "step": final.step} if final else None,
            "checkpoints": [{"id": c.id, "step": c.step, "kind": c.kind, "path": c.uri, "sha256": c.sha256,
                             "state_sha256": c.state_sha256, "bytes": c.size_bytes} for c in cks],
            "workers": [{"name": w.name, "role": w.role, "pid": w.pid, "host": w.host, "job_id": w.job_id,
                         "state": w.state, "restarts": w.restarts, "exit_reason": w.exit_reason} for w in r.workers],
        }


def show_lineage(ref: str, url: str | None = None) -> list[dict]:
    """Lineage of a run id or a checkpoint (id or path)."""
    with session_scope(url) as s:
        ck = repo.find_checkpoint(s, ref)
        if ck is not None:
            return repo.lineage(s, checkpoint=ck)
        return repo.lineage(s, run_id=ref)


def metric_history(s, run_id: str, key: str) -> list[tuple[int, float]]:
    its = s.scalars(select(Iteration).where(Iteration.run_id == run_id,  # eval: step 0's accuracy
                                            Iteration.status.in_(("completed", "eval")))
                    .order_by(Iteration.step)).all()
    return [(i.step, i.metrics[key]) for i in its if key in i.metrics]


def compare_runs(run_ids: list[str], metrics: list[str], out: str | None = None, url: str | None = None) -> dict:
    """Final and best value of each metric per run; overlaid curves written to `out` (PNG) when given."""
    if len(run_ids) < 1:
        raise ValueError("compare needs at least one run id (`forgeflow runs ls` lists them)")
    rows, curves = [], {}
    with session_scope(url) as s:
        for rid in run_ids:
            run = repo.get_run(s, rid)
            label = run.name or run.id
            row = {"run_id": run.id, "name": run.name, "loss": (run.config.get("loss") or {}).get("name"),
                   "teacher": (run.config.get("distill") or {}).get("teacher") or None, "status": run.status}
            curve_rows: dict[int, dict] = {}
            for key in metrics:
                hist = metric_history(s, run.id, key)
                row[f"{key} final"] = hist[-1][1] if hist else None
                row[f"{key} best"] = max(v for _, v in hist) if hist else None
                row[f"{key} points"] = len(hist)
                for step, v in hist:
                    curve_rows.setdefault(step, {"step": step})[key] = v
            rows.append(row)
            curves[label] = [curve_rows[k] for k in sorted(curve_rows)]
    result = {"metrics": metrics, "runs": rows}
    if out:
        from runtime.plots import panels_with_data, plot_curves

        result["plot"] = str(plot_curves(curves, out, keys=tuple(metrics), title="forgeflow compare"))
        result["panels"] = panels_with_data(curves, metrics)
    return result


def read_samples(run_id: str, step: int | None = None) -> dict:
    """The rollout samples a run recorded at `step` (default: its latest): {run_id, step, steps, rows}."""
    from infra.paths import run_dir

    out = run_dir(run_id)
    if not out.is_dir():
        raise ValueError(f"no run directory for {run_id!r} ({out}); `forgeflow runs ls` lists the runs")
    folder = out / "samples"
    files = {int(p.stem.split("-")[1]): p for p in folder.glob("step-*.json")} if folder.is_dir() else {}
    if not files:
        raise ValueError(f"run {run_id} recorded no samples: they are taken at each eval step and the last step "
                         "(tracking.sample_prompts > 0, eval.every)")
    step = max(files) if step is None else step
    if step not in files:
        raise ValueError(f"run {run_id} has no samples at step {step}; it has them at steps {sorted(files)}")
    return {"run_id": run_id, "step": step, "steps": sorted(files), "rows": json.loads(files[step].read_text())}


def render_samples(data: dict, width: int = 100) -> str:
    """Samples as text: each prompt once, then its completions with reward and advantage."""
    lines = [f"run {data['run_id']}, step {data['step']} (samples at steps {data['steps']})"]
    prompt = None
    for r in data["rows"]:
        if r["prompt"] != prompt:
            prompt = r["prompt"]
            question = r.get("question") or prompt
            lines += ["", f"question (target {r['target']!r}): {question}"]
            if question != prompt:  # the whole prompt (system turn, template) below the question it renders
                lines += ["as prompted:", *("  " + x for x in prompt.splitlines())]
        text = " ⏎ ".join(r["completion"].splitlines())
        text = text if len(text) <= width else text[:width - 1] + "…"
        lines.append(f"  reward {r['reward']:.3f}  adv {r['advantage']:+.3f}  v{r['policy_version']}  {text}")
    return "\n".join(lines)


def render_table(rows: list[dict], columns: list[str]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4f}"
        return "-" if v is None else str(v)

    widths = [max(len(c), *(len(cell(r.get(c))) for r in rows)) if rows else len(c) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(cell(r.get(c)).ljust(w) for c, w in zip(columns, widths)) for r in rows]
    return "\n".join(lines)


def render_run(info: dict) -> str:
    head = [f"run {info['run_id']} ({info['name'] or 'unnamed'}): {info['recipe']} {info['status']}"
            + (f" — {info['message']}" if info["message"] else ""),
            f"  steps {info['steps_completed']}/{info['steps_total']} completed"
            f" ({info['superseded_attempts']} superseded attempts)",
            f"  config {info['config_hash'][:12]}  code {info['code_version']}  dataset {info['dataset']}",
            f"  prefect flow run {info['prefect_flow_run_id']}  mlflow run {info['mlflow_run_id']}"
            + (f"  sweep {info['sweep_id']}" if info["sweep_id"] else "")]
    if info["final_checkpoint"]:
        f = info["final_checkpoint"]
        head.append(f"  final checkpoint step {f['step']}: {f['path']}\n    sha256 {f['sha256']} (file)"
                    + (f"\n    state  {f['state_sha256']} (weights, optimizer, RNG)" if f["state_sha256"] else ""))
    if info["last_metrics"]:
        keys = [k for k in ("reward/mean", "eval/accuracy", "loss/loss", "loss/kl_mean", "loss/entropy")
                if k in info["last_metrics"]]
        head.append("  last: " + "  ".join(f"{k} {info['last_metrics'][k]:.4f}" for k in keys))
    if info["workers"]:
        head.append(render_table(info["workers"], ["name", "role", "state", "pid", "host", "job_id", "restarts"]))
    return "\n".join(head)


def render_lineage(chain: list[dict]) -> str:
    return "\n".join(("  " * i) + ("└─ " if i else "") + (
        f"checkpoint {c['checkpoint']} step {c.get('step')} ({c.get('kind')}) of run {c['run']} [{c['recipe']}], "
        f"config {c['config_hash'][:12]}, dataset {c['dataset']}" if c.get("checkpoint") else
        f"run {c['run']} [{c['recipe']}] (no checkpoint yet)") for i, c in enumerate(chain))


def dumps(data) -> str:
    return json.dumps(data, indent=2, default=str)

