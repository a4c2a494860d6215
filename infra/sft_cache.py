"""A cache of SFT warm-ups: a GRPO run whose SFT would be the same as an earlier one's (the same SFT settings,
model, data and code) starts from that model instead of training it again; sweep children share it.

    FORGEFLOW_HOME/cache/sft/<key>/     the SFT model (an HF directory) and sft_cache.json, written last:
                                        the key's inputs, each file's sha256, the run that trained it

The key is a digest of everything SFT's result depends on (`sft_inputs`); a changed SFT setting, model, dataset or
source file gives another key, so the run trains again. An entry whose files no longer match their checksums is
never used: it is moved aside (named in the log) and the run trains again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from infra.checkpoints import file_sha256
from infra.paths import forgeflow_home

log = logging.getLogger(__name__)

MANIFEST = "sft_cache.json"
ROOT = Path(__file__).resolve().parents[1]
# the code a warm-up runs through: a changed file here may change what SFT learns (cli/, bench/, tests/ cannot)
SOURCE_DIRS = ("forge_core", "infra", "workers", "runtime", "tasks", "flows")


@dataclass
class CachedSFT:
    """A cache entry: where the model is, and the SFT run (and its checkpoint) that trained it."""

    path: Path
    source_run: str | None
    source_checkpoint: str | None


def cache_root() -> Path:
    return forgeflow_home() / "cache" / "sft"


def source_digest() -> str:
    """sha256 over the project's Python sources that SFT runs through (names and contents)."""
    h = hashlib.sha256()
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\1")
    return h.hexdigest()


def sft_inputs(cfg, dataset_fingerprint: str) -> dict:
    """What an SFT warm-up's result depends on: its settings and the trainer config it steps with, the model and
    its dtype, the dataset section and the training problems' fingerprint, the seed, and the code."""
    import torch
    import transformers

    sft = {k: v for k, v in dataclasses.asdict(cfg.sft).items() if k not in ("init", "cache")}
    return {"sft": sft, "trainer": dataclasses.asdict(cfg.sft.trainer_config(cfg.trainer)),
            "model": dataclasses.asdict(cfg.model), "dataset": dataclasses.asdict(cfg.dataset),
            "dataset_fingerprint": dataset_fingerprint, "seed": cfg.seed, "source": source_digest(),
            "torch": torch.__version__, "transformers": transformers.__version__}


def cache_key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:20]


def lookup(inputs: dict, root: Path | None = None) -> CachedSFT | None:
    """The cached SFT model for `inputs`, or None (a miss, an unfinished entry, or a corrupted one, which is moved
    aside so that the run trains a fresh one)."""
    entry = (root or cache_root()) / cache_key(inputs)
    if not (entry / MANIFEST).is_file():
        return None
    manifest = json.loads((entry / MANIFEST).read_text())
    changed = sorted(name for name, digest in manifest["sha256"].items()
                     if not (entry / name).is_file() or file_sha256(entry / name) != digest)
    if changed:
        aside = entry.with_name(f"{entry.name}.corrupted-{time.strftime('%Y%m%d-%H%M%S')}")
        entry.rename(aside)
        log.warning("SFT cache entry %s does not match its checksums (%s): not using it, moved to %s (delete it); "
                    "training SFT again", entry, ", ".join(changed), aside)
        return None
    return CachedSFT(entry, manifest.get("source_run"), manifest.get("source_checkpoint"))


def store(checkpoint: Path, inputs: dict, source_run: str | None, root: Path | None = None) -> Path:
    """Copy the SFT model at `checkpoint` into the cache under `inputs`' key (through a temporary sibling and a
    rename: an entry is complete or absent); an entry another run stored first is kept. Returns the entry."""
    entry = (root or cache_root()) / cache_key(inputs)
    if (entry / MANIFEST).is_file():
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_name(f".{entry.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(checkpoint, tmp)
        files = sorted(p.name for p in tmp.iterdir() if p.is_file())
        manifest = {"inputs": inputs, "sha256": {name: file_sha256(tmp / name) for name in files},
                    "source_run": source_run, "source_checkpoint": str(checkpoint),
                    "created": time.strftime("%Y-%m-%d %H:%M:%S")}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
        try:
            tmp.rename(entry)
        except OSError:  # another run stored the same key first: keep its entry
            if not (entry / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def find_cached_sft(cfg) -> tuple[dict, CachedSFT | None]:
    """(this run's SFT inputs, the cached warm-up made from the same inputs or None)."""
    from infra import components as C
    from infra.records import dataset_fingerprint

    inputs = sft_inputs(cfg, dataset_fingerprint(C.load_splits(cfg)[0]))
    return inputs, lookup(inputs)


def hit_message(hit: CachedSFT) -> str:
    """What a run says when it starts from a cached warm-up."""
    return (f"SFT cache hit: {hit.path} (trained by run {hit.source_run or 'unknown'}) has this run's SFT settings, "
            "model, data and code; GRPO starts from it without training SFT again (sft.cache: false trains anew)")
