"""A cache of SFT warm-ups: a GRPO run whose SFT would be the same as an earlier one's (the same SFT settings,
model, data and code) starts from that model instead of training it again; sweep children share it.

    FORGEFLOW_HOME/cache/sft/<key>/     the SFT model (an HF directory) and sft_cache.json, written last:
                                        the key's inputs, each file's sha256, the run that trained it

The key is a digest of everything SFT's result depends on (`sft_inputs`): the SFT and trainer settings, the
environment that writes the demonstrations (and an environment plugin's source), the starting weights by content,
the dataset, the seed, the code and the torch/transformers versions. A change to any of them gives another key, so
the run trains again. An entry whose files no longer match their checksums is never used: it is moved aside (named
in the log) and the run trains again.

Why not Prefect's cache policies (`INPUTS + TASK_SOURCE` on the `sft_train` task): INPUTS hashes the task's arguments,
which are a config *path* and overrides, not the file's contents, the weights or the dataset; TASK_SOURCE hashes the
task function's own lines, not the code it calls (runtime/, forge_core/). Prefect would also cache the task's return
value (a path into a run directory that may since be deleted), not the model, and only for the flow, while the
in-process path and bench/learning.py share this cache. So the key stays ours (`cache_key`), computed the same way on
every path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
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
    """What an SFT warm-up's result depends on: its settings and the trainer config it steps with, the environment
    that writes the demonstrations, the model, its dtype and its weights' digest, the dataset section and the training
    problems' fingerprint, the seed, and the code."""
    import torch
    import transformers

    sft = {k: v for k, v in dataclasses.asdict(cfg.sft).items() if k not in ("init", "cache")}
    return {"sft": sft, "trainer": dataclasses.asdict(cfg.sft.trainer_config(cfg.trainer)),
            "env": env_inputs(cfg.env), "model": dataclasses.asdict(cfg.model),
            "weights": weights_digest(cfg.model.path), "dataset": dataclasses.asdict(cfg.dataset),
            "dataset_fingerprint": dataset_fingerprint, "seed": cfg.seed, "source": source_digest(),
            "torch": torch.__version__, "transformers": transformers.__version__}


def env_inputs(env) -> dict | None:
    """The env section as the demonstrations read it (None without an environment: SFT on the teacher's answers).
    Every key counts but the two only RL reads, so that a key added later is never missed; a plugin environment
    (`module.path:Class`) adds its module file's digest, which source_digest does not cover."""
    if not env.enabled:
        return None
    section = {k: v for k, v in dataclasses.asdict(env).items() if k not in RL_ONLY_ENV_KEYS}
    if ":" in env.name:
        section["plugin_sha256"] = module_digest(env.name.split(":", 1)[0])
    return section


# read by RL only: how many env workers play episodes, and how rewards become advantages
RL_ONLY_ENV_KEYS = ("num_replicas", "credit", "step_threads")


def module_digest(module: str) -> str | None:
    """sha256 of a plugin module's file (None when it cannot be found: loading it will say why)."""
    spec = importlib.util.find_spec(module)
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    return file_sha256(origin) if origin is not None and origin.is_file() else None


def weights_digest(model_path: str) -> dict:
    """The starting weights by content: a local directory's (or a named model's import's) files, each file's
    sha256; a tiny preset is built from the seed and the code (both keyed already); a hub id is keyed by the
    revision in the local HF cache (a model not downloaded yet has none: its first run stores under `None`)."""
    from forge_core.models.catalog import MARKER, resolve_model_path
    from forge_core.models.loading import TINY_PREFIX

    if model_path.startswith(TINY_PREFIX):
        return {"preset": model_path}
    local = Path(resolve_model_path(model_path))  # a named model: imported now if absent or stale
    if local.is_dir():
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MARKER
                       and not any(part.startswith(".") for part in p.relative_to(local).parts))
        return {"files": {str(p.relative_to(local)): remembered_sha256(p) for p in files}}
    return {"hub_revision": hub_revision(model_path)}


def hub_revision(repo_id: str) -> str | None:
    """The commit of `repo_id`'s snapshot in the local HF cache, or None when it is not cached."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found).parent.name if isinstance(found, str) else None


RACY_NS = 2_000_000_000  # a file changed this recently is hashed again next time (coarse mtimes: NFS, Lustre)


def remembered_sha256(path: Path) -> str:
    """A file's sha256, remembered in FORGEFLOW_HOME/cache/file_digests.json under its path, size, inode, mtime and
    ctime: a model's weights are read once per change, not at every run's start (as git's index and DVC do)."""
    stat = path.stat()
    memo_file = forgeflow_home() / "cache" / "file_digests.json"
    memo = json.loads(memo_file.read_text()) if memo_file.is_file() else {}
    stamp = [stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns]
    entry = memo.get(str(path.resolve()))
    if entry is not None and entry[:-1] == stamp:
        return entry[-1]
    digest = file_sha256(path)
    if time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) < RACY_NS:
        return digest  # git's "racy" case: a same-size rewrite within the clock's granularity would look unchanged
    memo[str(path.resolve())] = [*stamp, digest]
    memo_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = memo_file.with_name(f".{memo_file.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(memo))
    tmp.replace(memo_file)  # a concurrent writer may win: its entries are as good, a lost one is recomputed
    return digest


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
