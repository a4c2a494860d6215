"""Loading a config means checking it: `load_config` reads a YAML recipe with overrides and runs the cross-field
checks (choices, positive counts, the trainer layout, paths and components) once, in the controller.

Every error names the file, the dotted key, the bad value and the fix.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

from forge_core.recipes.config import GRPOConfig
from infra.config import CHOICES, POSITIVE, RunConfig, config_to_dict, flatten, read_config
from infra.plugins import check_plugins

_CHECKED: set[str] = set()  # the configs this process has checked (the CLI, the flow and its tasks load one again)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | list[str] | None = None) -> RunConfig:
    """The checked RunConfig of a YAML file (or the defaults) plus overrides (dict of dotted keys or CLI args).
    A config this process already checked is not checked again (the check builds the loss once)."""
    cfg = read_config(path, overrides)
    where = ("defaults" if path is None else str(path)) + (" + overrides" if overrides else "")
    pin_teacher(cfg, where)
    key = json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)
    if key not in _CHECKED:
        validate(cfg, where)
        _CHECKED.add(key)
    return cfg


def validate(cfg: RunConfig, where: str) -> RunConfig:
    """Cross-field checks: listed plugins first (nothing is imported before), choices, positive counts, known loss
    and advantage names."""
    check_plugins(cfg, where)
    check_sections(cfg, where)
    flat = flatten(config_to_dict(cfg))
    for key, options in CHOICES.items():
        if str(flat[key]) not in options:
            raise ValueError(f"{where}: {key} = {flat[key]!r} is not one of {list(options)}")
    for key in POSITIVE:
        if flat[key] < 1:
            raise ValueError(f"{where}: {key} must be >= 1, got {flat[key]}")
    if cfg.model.dtype == "float16":
        raise ValueError(f"{where}: model.dtype = 'float16' trains without loss scaling, so small gradients underflow "
                         "to zero; use model.dtype: bfloat16 (fp32 master weights and optimizer state, bf16 compute, "
                         "bf16 weights for the generators) or float32")
    try:
        cfg.generator.validate()  # the sampling knobs' own checks (SamplingParams)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    if cfg.generator.temperature <= 0:
        raise ValueError(f"{where}: generator.temperature must be > 0 for RL sampling, got {cfg.generator.temperature}")
    if cfg.tracking.sample_prompts < 0:
        raise ValueError(f"{where}: tracking.sample_prompts must be >= 0 (0: record no samples), got "
                         f"{cfg.tracking.sample_prompts}")
    if cfg.reward.timeout_s < 0:
        raise ValueError(f"{where}: reward.timeout_s must be >= 0 (0: no limit), got {cfg.reward.timeout_s}")
    if cfg.reward.max_failed_steps < 0:
        raise ValueError(f"{where}: reward.max_failed_steps must be >= 0 (steps in a row a reward function may fail "
                         f"on every episode before the run ends; 0: never), got {cfg.reward.max_failed_steps}")
    check_trainer_environment(cfg, where)
    check_sft_batch(cfg, where)
    check_teacher(cfg, where)
    cfg.slurm.check(where)
    check_distill(cfg, where)
    g = cfg.generator
    if g.kv_cache_gb < 0:
        raise ValueError(f"{where}: generator.kv_cache_gb must be >= 0 (0: the backend's default, "
                         f"infra/config.py), got {g.kv_cache_gb}")
    if g.backend == "vllm" and g.temperature > 0 and (g.top_p < 1.0 or g.top_k > 0):
        # vLLM reports the sampled token's logprob after top-k/top-p renormalisation; the behaviour logprobs the
        # trainer compares with (and TorchGenerator reports) are before it: TIS/MIS and the mismatch metrics
        # would read the truncation as a policy difference
        raise ValueError(f"{where}: generator.backend vllm with generator.top_p = {g.top_p} / top_k = {g.top_k} "
                         "reports logprobs of the truncated distribution, which the trainer does not reproduce; "
                         "set generator.top_p: 1.0 and generator.top_k: 0 (RL samples the whole distribution), or "
                         "use generator.backend: torch")
    if cfg.generator.backend == "vllm" and cfg.weightsync.backend != "fs":
        raise ValueError(f"{where}: generator.backend vllm reads weights from files, so weightsync.backend "
                         f"{cfg.weightsync.backend!r} cannot feed it: set weightsync.backend: fs (weightsync.root on "
                         "a filesystem the generator nodes share)")
    if cfg.weightsync.backend == "shared" and cfg.launcher == "slurm" and cfg.slurm.nodes > 1:
        raise ValueError(f"{where}: weightsync.backend shared is one node's shared memory, and slurm.nodes is "
                         f"{cfg.slurm.nodes}: use weightsync.backend fs (weightsync.root on a shared filesystem) or "
                         "broadcast across nodes")
    every = cfg.weightsync.sync_every
    if every > 1 and cfg.max_policy_age < every:
        # N - 1 versions between syncs, plus one more: a step's rollout is sampled while the previous step trains
        raise ValueError(f"{where}: weightsync.sync_every = {every} lets rollouts lag up to {every} versions behind "
                         f"(sampled ahead while the previous step trains); set max_policy_age >= {every} to accept "
                         "that (the loss corrects with behaviour logprobs)")
    check_policy_update(cfg, where)
    check_paths(cfg, where)
    check_dataset(cfg, where)
    check_components(cfg, where)
    return cfg


def check_policy_update(cfg: RunConfig, where: str) -> None:
    """Mini-batches that fit the batch, a sane rollout correction."""
    t, rc = cfg.trainer, cfg.rollout_correction
    sequences = cfg.prompts_per_step * cfg.group_size
    dp = t.data_parallel_degree
    if t.mini_batches * dp > sequences:
        raise ValueError(f"{where}: trainer.mini_batches = {t.mini_batches} is larger than the "
                         f"{sequences // dp} sequences each of the trainer's {dp} data-parallel slice(s) gets "
                         f"(prompts_per_step × group_size = {sequences}); set trainer.mini_batches <= {sequences // dp}")
    try:
        rc.validate()
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def packed_masks_supported() -> bool:
    """Whether this transformers builds block-diagonal causal masks from packed position ids."""
    try:
        from transformers import masking_utils
    except ImportError:
        return False
    return hasattr(masking_utils, "find_packed_sequence_indices")


def check_trainer_environment(cfg: RunConfig, where: str) -> None:
    """What the trainer section's choices need installed: torchtitan for trainer.backend titan, a transformers that
    builds packed masks for trainer.pack (the section's own combinations are TrainerConfig.check's)."""
    t = cfg.trainer
    if t.backend == "titan" and importlib.util.find_spec("torchtitan") is None:
        raise ValueError(f"{where}: trainer.backend: titan needs torchtitan: pip install -e '.[titan]' "
                         "(or use trainer.backend: hf)")
    if t.backend == "hf" and t.pack and not packed_masks_supported():
        raise ValueError(f"{where}: trainer.pack needs transformers >= 4.54 (block-diagonal masks from packed "
                         "position ids); upgrade transformers or set trainer.pack: false")


def check_sections(cfg: RunConfig, where: str) -> None:
    """The run-level keys' checks (GRPOConfig's) and each section's own (a section that declares its keys declares
    their checks: `check(where)`)."""
    try:
        GRPOConfig.check(cfg)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    for f in dataclasses.fields(cfg):
        section = getattr(cfg, f.name)
        if hasattr(section, "check"):
            try:
                section.check(f.name)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from exc


def check_sft_batch(cfg: RunConfig, where: str) -> None:
    """Every data-parallel slice of the trainer needs at least one SFT example per step."""
    dp = cfg.trainer.data_parallel_degree
    if cfg.sft.steps > 0 and cfg.sft.batch_size < dp:
        raise ValueError(f"{where}: sft.batch_size ({cfg.sft.batch_size}) is smaller than the trainer's "
                         f"{dp} data-parallel slices (trainer.procs); set sft.batch_size >= {dp}")


def check_teacher(cfg: RunConfig, where: str) -> None:
    """The imperfect teacher (sft.drop_carry) re-solves generated sums; column working is what SFT must train on."""
    if cfg.sft.drop_carry > 0 and (cfg.dataset.kind != "arith" or "+" not in cfg.dataset.ops):
        raise ValueError(f"{where}: sft.drop_carry = {cfg.sft.drop_carry} drops carries in generated sums, and "
                         f"dataset.kind {cfg.dataset.kind!r} with ops {cfg.dataset.ops!r} has none: use dataset.kind "
                         "arith with '+' in dataset.ops, or sft.drop_carry: 0")
    columns = cfg.dataset.kind == "arith" and cfg.dataset.solution == "columns"
    if columns and cfg.sft.steps > 0 and cfg.sft.response != "solution":
        raise ValueError(f"{where}: dataset.solution columns is working for the model to write, and sft.response is "
                         f"{cfg.sft.response!r} (the final answer alone): set sft.response: solution")


def pin_teacher(cfg: RunConfig, where: str) -> None:
    """distill.teacher resolved, in place, to the model directory it names (a run: its latest complete checkpoint),
    so that the run's recorded config keeps scoring with that teacher (infra/teacher.py)."""
    if not cfg.distill.enabled:
        return
    from infra.teacher import resolve_teacher

    try:
        cfg.distill.teacher = resolve_teacher(cfg.distill.teacher, cfg.tracking.registry_url)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def check_distill(cfg: RunConfig, where: str) -> None:
    """On-policy distillation trains on every group: dynamic sampling would drop the groups whose rewards are
    equal, and with them the teacher's signal. The teacher's tokenizer must be the student's (checked here, before
    any worker starts, and again by the teacher when it loads)."""
    if not cfg.distill.enabled:
        return
    if cfg.filter_groups and cfg.distill.reward_weight == 0:
        raise ValueError(f"{where}: filter_groups drops the groups whose rewards are all equal, and distill."
                         "reward_weight 0 trains on the teacher's per-token signal alone, which every group carries: "
                         "set filter_groups: false (and fill_rounds: 1)")
    from forge_core.distill import check_same_tokenizer
    from forge_core.models import load_tokenizer

    try:
        check_same_tokenizer(cfg.distill.teacher, load_tokenizer(cfg.distill.teacher),
                             load_tokenizer(cfg.sft.init or cfg.model.path))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def check_correction_fits_loss(cfg: RunConfig) -> None:
    """TIS and MIS hand the loss per-token weights: a loss whose forward does not name token_weights would drop
    them."""
    from forge_core.losses import resolve_loss
    from forge_core.training.update import accepts_token_weights

    rc = cfg.rollout_correction
    if rc.enabled and cfg.trainer.recompute_proximal == "never":
        raise ValueError(f"rollout_correction.mode {rc.mode} compares the trainer's proximal policy with the "
                         "generator's, and trainer.recompute_proximal: never computes none; use auto (or always)")
    if rc.weighted and not accepts_token_weights(resolve_loss(cfg.loss.name)):
        raise ValueError(f"rollout_correction.mode {rc.mode} needs a loss whose forward takes token_weights, and "
                         f"loss.name {cfg.loss.name!r} does not: add `token_weights=None` to its forward (multiply "
                         "each token's policy-gradient term by it) or use rollout_correction.mode: rejection")


def looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id ('org/name') or a tiny preset."""
    return path.startswith(("/", "./", "../", "~")) or Path(path).suffix in (".jsonl", ".json", ".parquet")


def check_paths(cfg: RunConfig, where: str) -> None:
    """Missing local files are named before any worker starts."""
    checks = [("model.path", cfg.model.path), ("sft.init", cfg.sft.init)]
    if cfg.dataset.kind in ("gsm8k", "math"):
        checks.append(("dataset.path", cfg.dataset.path))
    for key, value in checks:
        if value and looks_local(value) and not Path(value).expanduser().exists():
            raise ValueError(f"{where}: {key} = {value!r} does not exist; fix the path (relative paths are "
                             f"resolved from {Path.cwd()})")
    prepare_named_model(cfg, where)


def prepare_named_model(cfg: RunConfig, where: str) -> None:
    """A named model (model.path: smollm2-135m-instruct): a missing wheel or package is refused with the command
    that installs it, and a corrupted import with what to delete, before anything starts. The import itself runs
    once, at the run's first load in the controller (so the run's minutes count it), before any worker starts."""
    from forge_core.models.catalog import NAMED_MODELS, check_named_model

    if cfg.model.path not in NAMED_MODELS:
        return
    try:
        check_named_model(cfg.model.path)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def check_dataset(cfg: RunConfig, where: str) -> None:
    """Read a dataset on disk once, so a malformed row is named (file:line and the fix) before Prefect or any worker
    starts rather than inside a flow. Hub datasets are read where they are used (no download while checking)."""
    if cfg.dataset.kind not in ("gsm8k", "math"):
        return
    from infra import components as C

    try:
        C.load_splits(cfg)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def check_components(cfg: RunConfig, where: str) -> None:
    """Check the loss (without building it) and build the rewards, so a bad hyperparameter fails before any worker
    starts."""
    from forge_core.advantages import ADVANTAGES
    from infra import components as C

    try:
        C.check_loss_config(cfg)
        check_correction_fits_loss(cfg)
        C.build_reward(cfg)
        if cfg.env.enabled:
            check_environment(cfg.env)
            check_env_fits_run(cfg)
        if cfg.advantage.name not in ADVANTAGES:
            raise ValueError(f"unknown advantage.name {cfg.advantage.name!r}; choose one of {sorted(ADVANTAGES)}")
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def check_env_fits_run(cfg: RunConfig) -> None:
    """With env.name set the environment rewards the episodes, so a `rewards:` section would be ignored; and
    env.credit: turn gives each turn's tokens their own advantage, which a sequence-level loss (a loss class with
    `sequence_level = True`, as GSPO) would average away."""
    from forge_core.losses import resolve_loss

    # the default (math) is what a config without `rewards:` holds, and what a saved run's config.yaml repeats
    # (resume loads it again); anything else was written to be used
    if cfg.rewards != RunConfig().rewards:
        names = [r.name for r in cfg.rewards]
        raise ValueError(f"rewards: {names} would be ignored: with env.name {cfg.env.name!r} the environment "
                         "rewards its episodes itself (StepResult.reward and final_reward). Remove rewards: from "
                         "the config, or leave env.name empty to score single-turn completions with it")
    if cfg.env.credit == "turn" and getattr(resolve_loss(cfg.loss.name), "sequence_level", False):
        raise ValueError(f"env.credit: turn gives each turn's tokens their own advantage, and loss.name "
                         f"{cfg.loss.name!r} is sequence-level (one advantage per sequence): use a token-level "
                         "loss (e.g. loss.name: gspo_token) or env.credit: episode")


def check_environment(env) -> None:
    """env.name names an environment and env.options fit its constructor (one is built and closed at once)."""
    from forge_core.envs import environment_factory, make_environment

    environment_factory(env.name)
    make_environment(env).close()  # nothing connects before reset (an OpenEnv client opens its session there)
