"""Where the teacher of on-policy distillation (`distill.teacher`) lives: a model directory, a run (by id, or by name:
the newest completed run of that name) meaning that run's latest complete checkpoint, or a catalog name.

The controller resolves it once, when it loads the config, to a directory (or the catalog name): the run's
config.yaml records that directory, so a resumed run scores with the same teacher even if the teacher's run has
checkpointed since.
"""

from __future__ import annotations

import logging
from pathlib import Path

from infra import checkpoints as ckpt
from infra.paths import forgeflow_home

log = logging.getLogger(__name__)

def resolve_teacher(spec: str, registry_url: str | None = None) -> str:
    """The model directory (or catalog name, or tiny:PRESET) `spec` names; ValueError with the fix otherwise."""
    from forge_core.models.catalog import NAMED_MODELS

    if spec.startswith("tiny:") or spec in NAMED_MODELS:
        return spec
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"distill.teacher {spec!r} is a directory without config.json: point it at a model "
                             "directory (a checkpoint's hf/ folder), or name a run or a catalog model")
        return str(path.resolve())
    run_id = run_of(spec, registry_url)
    if run_id is None:
        raise ValueError(f"distill.teacher {spec!r} is neither a model directory, a run id or name (`forgeflow runs "
                         f"ls` lists them; runs live under {forgeflow_home() / 'runs'}), nor a catalog model "
                         f"({', '.join(NAMED_MODELS)}): fix the value")
    model_dir = latest_model_dir(forgeflow_home() / "runs" / run_id)
    if model_dir is None:
        raise ValueError(f"distill.teacher {spec!r}: run {run_id} has no complete checkpoint yet (nothing under "
                         f"{forgeflow_home() / 'runs' / run_id / 'checkpoints'} has a COMPLETE marker): wait for "
                         "its first checkpoint, or name a model directory")
    log.info("distill.teacher %s: run %s's latest checkpoint %s", spec, run_id, model_dir)
    return str(model_dir)


def run_of(spec: str, registry_url: str | None) -> str | None:
    """The run id `spec` names: a run directory's name, else the newest completed run the registry has by that name
    (None when neither)."""
    if (forgeflow_home() / "runs" / spec / "config.yaml").exists():
        return spec
    from sqlalchemy import select

    from infra.registry import session_scope
    from infra.registry.models import Run

    with session_scope(registry_url) as s:
        found = s.scalars(select(Run.id).where(Run.name == spec, Run.status == "completed", Run.recipe == "grpo")
                          .order_by(Run.created_at.desc())).first()
    return found


def latest_model_dir(run: Path) -> Path | None:
    """The HF weights of the run's newest complete checkpoint, else its final model (in-process runs), else None."""
    for checkpoint in reversed(ckpt.complete_checkpoints(run / "checkpoints")):
        if (checkpoint / ckpt.HF_DIR / "config.json").exists():
            return checkpoint / ckpt.HF_DIR
    final = run / ckpt.FINAL_DIR
    return final if (final / "config.json").exists() else None
