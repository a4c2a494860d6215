"""GeneratorWorker: holds a policy copy and a TorchGenerator; rollouts, held-out eval, weight loads."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Sequence

from forge_core.data.problems import Problem
from forge_core.generation import TorchGenerator
from forge_core.models import load_model_and_tokenizer
from forge_core.models.tokenizer import end_token_ids
from forge_core.recipes import steps
from forge_core.types import Group
from infra.config import RunConfig
from infra.weightsync import load_into_model
from infra.weightsync.shared import OverwrittenWhileRead
from workers.base import Worker, dtype_of, model_source, worker_device

log = logging.getLogger(__name__)


def engine_model_dir(cfg: RunConfig, init_path: str | None) -> str:
    """An HF directory vLLM can open for the worker's starting weights: a named model's import, or a `tiny:` preset
    built with the run's seed (as the trainer builds it) and saved once under $FORGEFLOW_HOME/models."""
    from forge_core.models.catalog import resolve_model_path
    from forge_core.models.loading import TINY_PREFIX, TINY_PRESETS, save_model_and_tokenizer
    from infra.paths import forgeflow_home

    source = resolve_model_path(model_source(cfg, init_path))
    if not source.startswith(TINY_PREFIX):
        return source
    preset = source[len(TINY_PREFIX):]
    shape = hashlib.sha256(repr(sorted(TINY_PRESETS[preset].items())).encode()).hexdigest()[:8]  # a preset edited
    out = forgeflow_home() / "models" / f"tiny-{preset}-{shape}-seed{cfg.seed}"              # is another model
    if not (out / "config.json").is_file():
        model, tok = load_model_and_tokenizer(source, seed=cfg.seed)
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        save_model_and_tokenizer(model, tok, tmp)
        try:
            os.replace(tmp, out)
        except OSError:  # another worker saved it first (the same weights: same preset and seed)
            if not (out / "config.json").is_file():
                raise
            shutil.rmtree(tmp)
    return str(out)


def start_vllm(cfg: RunConfig, init_path: str | None, threads: int | None):
    """A VLLMGenerator for the run's model, its engine processes guarded against this worker's death."""
    from forge_core.generation.vllm_generator import VLLMGenerator
    from workers.engine_guard import start_engine_guard

    generator = VLLMGenerator.from_pretrained(engine_model_dir(cfg, init_path), cfg.generator,
                                              tensor_parallel_size=cfg.generator.procs, dtype=cfg.model.dtype,
                                              seed=cfg.seed, kv_cache_gb=cfg.generator.kv_cache_gb,
                                              threads=max(1, threads or cfg.threads or 1))
    start_engine_guard()
    return generator


class GeneratorWorker(Worker):
    role = "generator"

    def __init__(self, cfg: RunConfig, store=None, init_path: str | None = None, threads: int | None = None):
        super().__init__(cfg, threads)
        if cfg.generator.backend == "vllm":
            self.generator = start_vllm(cfg, init_path, threads)
        else:
            model, tok = load_model_and_tokenizer(model_source(cfg, init_path), seed=cfg.seed, dtype=dtype_of(cfg))
            self.generator = TorchGenerator(model.to(worker_device(cfg, self.role)).eval(), tok,
                                            cfg.generator,
                                            cuda_graphs=None if cfg.generator.cuda_graphs else False,
                                            kv_cache_gb=cfg.generator.kv_cache_gb)
        self.store = store
        self.pinned_version_misses = 0

    def shutdown(self) -> bool:
        """Stop a vLLM engine's processes before the server stops (the engine guard covers a killed worker)."""
        close = getattr(self.generator, "close", None)
        if close is not None:
            close()
        return super().shutdown()

    def rollout(self, problems: Sequence[Problem], prompts: Sequence[str], group_size: int, seed: int,
                version: int | None = None, prompt_keys: Sequence[int] | None = None) -> list[Group]:
        """`group_size` samples for each prompt (completions stamped with the version); with `version`, sample with
        exactly that policy version (loaded from the store when this generator holds another one). Prompt i is
        seeded with seed + prompt_keys[i] (default i): its index in the step's whole batch, whichever replica
        samples it."""
        self.calls += 1
        missed = self.pin_version(version)
        groups = steps.rollout(self.generator, problems, prompts, group_size, seed, self.cfg.generator,
                               prompt_keys)
        if missed is not None:
            for group in groups:
                for episode in group.episodes:
                    episode.completion.metadata["pinned_version_missed"] = missed
        return groups

    def pin_version(self, version: int | None) -> int | None:
        """Hold policy `version` (loaded from the store when another is held); the version that could not be
        loaded, or None."""
        if version is None or version == self.policy_version:
            return None
        log.info("rollout asks for policy version %d, this generator holds %d: loading it", version,
                 self.policy_version)
        try:
            self.load_weights(version)
        except KeyError as exc:  # e.g. a resume on a node whose weight store was emptied: continue, not exact
            self.pinned_version_misses += 1
            log.error("ROLLOUT NOT PINNED: policy version %d is not in the weight store (%s); sampling with "
                      "version %d instead, so this run is no longer bit-exact with an uninterrupted one "
                      "(counted as rollout/pinned_version_misses; %d so far)", version, exc, self.policy_version,
                      self.pinned_version_misses)
            return version
        return None

    def health(self) -> dict:
        return {**super().health(), "pinned_version_misses": self.pinned_version_misses}

    def generate(self, prompts: list[str], n: int = 1, seed: int | None = None, params=None,
                 prompt_keys: list[int] | None = None, prompt_ids: list[list[int]] | None = None,
                 version: int | None = None) -> list[list]:
        """Raw TorchGenerator.generate: n Completions per prompt (from `prompt_ids` when given: token-in), with
        policy `version` when given (one turn of multi-turn episodes, workers/episodes.py)."""
        self.calls += 1
        missed = self.pin_version(version)
        out = self.generator.generate(prompts, n=n, seed=seed, params=params, prompt_keys=prompt_keys,
                                      prompt_ids=prompt_ids if prompt_ids and prompt_ids[0] is not None else None)
        if missed is not None:
            for completion in (c for row in out for c in row):
                completion.metadata["pinned_version_missed"] = missed
        return out

    def end_ids(self) -> list[int]:
        """The ids that end a turn for this generator (the token layer of multi-turn episodes needs them)."""
        found = getattr(self.generator, "end_ids", None)  # vLLM stops on its own end ids: the template's and eos
        return list(found) if found else end_token_ids(self.generator.tokenizer, None)

    def evaluate(self, problems: Sequence[Problem], prompts: Sequence[str], samples: int = 0,
                 prompt_keys: Sequence[int] | None = None) -> dict[str, float]:
        """Held-out greedy (and sampled) accuracy of the current weights on these prompts (keys: see rollout)."""
        g = self.cfg.generator
        return steps.evaluate(self.generator, problems, prompts, g.max_new_tokens, samples=samples,
                              temperature=g.temperature, seed=self.cfg.seed, prompt_keys=prompt_keys)

    def join_weight_group(self, address: str, rank: int, world: int, device: str = "cpu") -> None:
        """weightsync.backend broadcast: join the trainer's weight-broadcast group at `address` as `rank`
        (replacing the previous group); versions then arrive in the background."""
        from infra.weightsync.broadcast import BroadcastWeightSync

        if self.store is not None:
            self.store.retire()
        self.store = BroadcastWeightSync(address, rank, world, keep=self.cfg.weightsync.keep,
                                         timeout_s=self.cfg.workers.call_timeout_s, device=device)

    def load_weights(self, version: int | None = None) -> int:
        """Fetch `version` (None = latest) from the weight store and sample from it; returns the version."""
        if self.store is None:
            raise ValueError("generator worker has no weight store: start it through WorkerPool")
        if hasattr(self.generator, "load_weights_file"):  # vLLM: its workers read the file themselves
            version = self.store.latest() if version is None else version
            path = self.store.path_for(version)
            if not path.exists():
                raise KeyError(f"weight version {version} is not in {path.parent} (have {self.store.versions()})")
            self.generator.load_weights_file(path, version)
        else:
            try:
                version = load_into_model(self.store, version, self.generator.model)
            except OverwrittenWhileRead as exc:  # the model holds another version, whole: say which
                self.generator.policy_version = self.policy_version = exc.held
                raise
            self.generator.policy_version = version
        self.policy_version = version
        return version
