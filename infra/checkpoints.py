"""The checkpoint layout of a run, in one place:

    <run>/checkpoints/step-NNNNNN/
        trainer.pt            trainer state (model, optimizer, scheduler, RNG, step); sha256 in COMPLETE
        dcp/                  model and optimizer shards (several trainer ranks)
        hf/                   HF-format weights (generators, evaluation, `forgeflow eval`)
        worker_step.json      the run's step (it also counts steps whose batch was empty)
        inflight_rollout.pt   pipelined runs: the step's batch, sampled ahead with the previous version
        COMPLETE              JSON marker written last; a directory without it is ignored on resume
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

STATE = "trainer.pt"
SHARDS = "dcp"
MARKER = "COMPLETE"
INFLIGHT = "inflight_rollout.pt"
HF_DIR = "hf"
FINAL_DIR = "final"  # <run>/final: an in-process run's final model (HF format; runtime/inprocess.py)
WORKER_STEP = "worker_step.json"


def step_dir(checkpoint_dir: Path, step: int) -> Path:
    """The directory of the checkpoint after `step` optimizer steps."""
    return Path(checkpoint_dir) / f"step-{step:06d}"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_complete(path: Path) -> bool:
    return (Path(path) / MARKER).exists()


def read_marker(path: Path) -> dict:
    """The COMPLETE marker of a checkpoint directory ({} when it has none)."""
    marker = Path(path) / MARKER
    return json.loads(marker.read_text()) if marker.exists() else {}


def complete_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Every checkpoint directory with a COMPLETE marker, oldest first."""
    return sorted(p.parent for p in Path(checkpoint_dir).glob(f"step-*/{MARKER}"))


def mark_complete(path: Path, step: int, state_sha256: str | None, seed: int, file_digest: str | None = None) -> None:
    """Write the COMPLETE marker last (atomically): sha256 of the trainer state file (`file_digest` when the writer
    already took it: the file is then not read again), the canonical state digest (equal for equal training
    states) and the sampler position, a pure function of (seed, step)."""
    path = Path(path)
    state, inflight = path / STATE, path / INFLIGHT
    marker = {"step": step, "policy_version": step, "sha256": file_digest or file_sha256(state),
              "bytes": state.stat().st_size,
              "state_sha256": state_sha256, "sampler": {"seed": seed, "next_step": step},
              "inflight_sha256": file_sha256(inflight) if inflight.exists() else None}
    tmp = path / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(marker))
    tmp.replace(path / MARKER)


def prune_checkpoints(checkpoint_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints (the marker first: a crash mid-delete never leaves a
    "complete" partial checkpoint)."""
    for old in complete_checkpoints(checkpoint_dir)[:-keep]:
        (old / MARKER).unlink()
        shutil.rmtree(old)


def latest_good_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest complete checkpoint whose trainer state still matches the sha256 in its marker; a truncated or
    corrupted one is skipped (logged) in favour of the previous good one."""
    for path in reversed(complete_checkpoints(checkpoint_dir)):
        marker = read_marker(path)
        state = path / STATE
        if "sha256" not in marker:
            return path
        if state.exists() and file_sha256(state) == marker["sha256"]:
            return path
        log.error("checkpoint %s is corrupted or truncated (sha256 mismatch): using the previous one", path)
    return None


def load_inflight(checkpoint_dir: Path, step: int) -> list | None:
    """The batches of steps step, step+1, … saved with the checkpoint at `step` (sampled ahead, pipelined), or
    None when there are none or they do not match their marker's sha256."""
    path = step_dir(checkpoint_dir, step)
    saved = path / INFLIGHT
    if step <= 0 or not saved.exists():
        return None
    if read_marker(path).get("inflight_sha256") != file_sha256(saved):
        log.error("%s does not match its checkpoint's sha256: sampling step %d again", saved, step)
        return None
    import torch

    batches = torch.load(saved, weights_only=False)
    batches = [batches] if isinstance(batches, tuple) else batches  # a checkpoint from before max_policy_age > 1
    log.info("step %d: training on the %d batch(es) saved with its checkpoint (sampled ahead)", step, len(batches))
    return batches


def export_hf(checkpoint_dir: Path, out: Path, step: int | None = None) -> Path:
    """Copy the HF weights of a run's complete checkpoint (`step`, default the latest) to `out`: a plain model
    (LoRA adapters already merged when it was saved) that `from_pretrained` opens; written beside `out` and
    renamed, so `out` is absent or complete. ValueError naming the steps there are."""
    import shutil

    done = {int(p.name.split("-")[1]): p for p in complete_checkpoints(checkpoint_dir)}
    if not done:
        raise ValueError(f"no complete checkpoint under {checkpoint_dir}; a run writes one every checkpoint.every "
                         "steps and at its end")
    step = max(done) if step is None else step
    if step not in done:
        raise ValueError(f"no complete checkpoint at step {step} under {checkpoint_dir}; there are {sorted(done)}")
    source = done[step] / HF_DIR
    out = Path(out)
    if out.exists():
        raise ValueError(f"{out} already exists; choose a new --out directory")
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    tmp.rename(out)
    return out
