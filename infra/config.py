"""Run configuration: dataclasses, YAML loading, dotted overrides (`--trainer.lr 3e-5`); the cross-field checks
are in infra/config_checks.py.

Every error names the file, the dotted key, the bad value and the fix.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from forge_core.data.config import DatasetConfig
from forge_core.distill import DistillConfig
from forge_core.envs.base import EnvConfig
from forge_core.generation.sampling import SamplingParams
from forge_core.losses import implied_advantage
from forge_core.recipes.config import EvalConfig, GRPOConfig
from forge_core.training.config import SFTConfig, TrainerConfig
from forge_core.training.correction import LEVELS, MODES, RolloutCorrection
from infra.hosts import hide_password, refuse_untrusted_hosts
from infra.plugins import check_sbatch_values, refuse_file_only_overrides


@dataclass
class ModelConfig:
    path: str = "tiny:qwen3-arith"  # a local HF dir, a hub id, or tiny:PRESET
    dtype: str = "float32"


@dataclass
class GeneratorConfig(SamplingParams):
    """The sampling knobs (temperature, top_p, top_k, max_new_tokens) are SamplingParams' own, declared there once."""

    backend: str = "torch"  # torch | vllm
    procs: int = 1
    num_replicas: int = 1
    cuda_graphs: bool = True  # torch backend on CUDA: the decode step as CUDA graphs (false: eager decode)
    # torch backend: the KV cache one generation chunk may take; batches are split to fit (0: on CUDA 80% of the
    # memory free at each call, on CPU no limit). vllm backend: the engine's KV cache (0: on CUDA 85% of the GPU's
    # memory, on CPU 1 GiB)
    kv_cache_gb: float = 0.0


@dataclass
class RefModelConfig:
    enabled: str = "auto"  # auto (= when loss.beta > 0) | true | false
    device: str = "cpu"
    procs: int = 1


@dataclass
class RewardConfig:
    num_replicas: int = 1  # reward workers, called round-robin
    timeout_s: float = 10.0  # per episode; longer scores reward.fallback and is counted (0: no limit, in-process)
    # a reward function that raises (or times out) on every episode of this many steps in a row ends the run with
    # its error (0: never)
    max_failed_steps: int = 3


@dataclass
class WeightSyncConfig:
    backend: str = "fs"  # fs | shared (one node, shared memory) | torchstore | broadcast
    # null: /dev/shm/forgeflow-<run_id> on this machine, FORGEFLOW_HOME/weights/<run_id> with launcher slurm (every
    # node must read FORGEFLOW_HOME); a path every node reads
    root: str | None = None
    keep: int = 2
    sync_every: int = 1  # publish to the generators every N steps (> 1 needs max_policy_age >= N)


@dataclass
class WorkersConfig:
    threads: int = 1  # torch threads per worker process (they share the cores)
    start_timeout_s: float = 600.0
    call_timeout_s: float = 900.0
    heartbeat_stale_s: float = 60.0  # a worker exits when the controller's heartbeat is older than this
    gpus: int = 0  # local launcher: GPUs of this machine handed out to workers (0 = all on CPU)


@dataclass
class CheckpointConfig:
    every: int = 10
    keep: int = 3


NODE_LOSS = ("move", "wait")
PLACED_ROLES = ("trainer", "generator", "reward", "reference", "teacher", "env")


@dataclass
class SlurmConfig:
    partition: str | None = None
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 2
    mem: str | None = None
    time: str = "04:00:00"
    account: str | None = None
    qos: str | None = None
    extra: dict = field(default_factory=dict)
    # with nodes > 1: the node (0 … nodes-1) each role's workers run on, or a list of nodes for a multi-rank role
    # whose ranks spread evenly over them (trainer: [0, 1]); roles left out take workers/plan.py's default
    # (trainer, reference and teacher on node 0, generators, rewards and environments on the others)
    placement: dict = field(default_factory=dict)
    # a node that stops answering: `move` its roles to the nodes still up (they share them), or `wait` for it to
    # come back (its replacements stay pending until Slurm returns the node to service)
    on_node_loss: str = "move"

    def check(self, where: str) -> None:
        """on_node_loss is a choice; placement names roles and nodes that exist."""
        if self.on_node_loss not in NODE_LOSS:
            raise ValueError(f"{where}: slurm.on_node_loss = {self.on_node_loss!r} is not one of {list(NODE_LOSS)} "
                             "(move: replace a lost node's roles on the nodes still up; wait: until it comes back)")
        for role, nodes in self.placement.items():
            if role not in PLACED_ROLES:
                raise ValueError(f"{where}: slurm.placement.{role}: no such role; place one of {list(PLACED_ROLES)}")
            listed = nodes if isinstance(nodes, list) else [nodes]
            if not listed or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < self.nodes
                                     for n in listed) or len(set(listed)) != len(listed):
                raise ValueError(f"{where}: slurm.placement.{role} = {nodes!r}: give a node index 0 … "
                                 f"{self.nodes - 1} (slurm.nodes = {self.nodes}), or a list of distinct ones for "
                                 "ranks spread over several nodes")


@dataclass
class NamedSection:
    """A component picked by name (a registered one, or a `module.path:attr`); every other key of the section is
    the component's own hyperparameter and passes through by name in `params`."""

    name: str
    params: dict = field(default_factory=dict)
    example: typing.ClassVar[str] = "grpo"  # a name for the error that says one is missing

    def to_dict(self) -> dict:
        """The section as written in YAML: its declared keys, then the component's own: {name: …, **params}."""
        declared = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "params"}
        return {**declared, **self.params}


@dataclass
class LossConfig(NamedSection):
    """loss: {name: grpo | dr_grpo | dapo | gspo | cispo | sapo | reinforce | pkg.mod:Class, clip_low: …, beta: …}"""

    name: str = "grpo"

    @property
    def beta(self) -> float:
        """The KL coefficient (0 when the loss has none)."""
        return float(self.params.get("beta", 0.0) or 0.0)


@dataclass
class AdvantageConfig(NamedSection):
    """advantage: {name: grpo | dr_grpo | rloo, …}"""

    name: str = "grpo"


@dataclass
class RewardFnConfig(NamedSection):
    """One entry of rewards: {name: math | digits | thinking | pkg.mod:fn, weight: 1.0, key: …, …}"""

    weight: float = 1.0
    example: typing.ClassVar[str] = "math"


@dataclass
class TrackingConfig:
    mlflow_uri: str | None = None
    registry_url: str | None = None
    experiment: str | None = None
    sample_prompts: int = 4  # prompts (with all their completions) recorded at each eval step; 0: none


@dataclass
class RunConfig(GRPOConfig):
    """A run's YAML: the run-level keys (GRPOConfig's) and one section per component, each declared by its owner."""

    threads: int = 0  # torch threads for this process; 0 = all cores
    model: ModelConfig = field(default_factory=ModelConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    rewards: list[RewardFnConfig] = field(default_factory=lambda: [RewardFnConfig("math")])
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    ref_model: RefModelConfig = field(default_factory=RefModelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    launcher: str = "local"  # local | slurm | inline
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    weightsync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    rollout_correction: RolloutCorrection = field(default_factory=RolloutCorrection)
    env: EnvConfig = field(default_factory=EnvConfig)  # multi-turn episodes in an environment (forge_core/envs)
    distill: DistillConfig = field(default_factory=DistillConfig)  # on-policy distillation (forge_core/distill.py)
    # import paths ('module.path:Name') that loss.name / rewards[].name may use: set only in a file (infra/plugins.py)
    plugins: list[str] = field(default_factory=list)
    # hosts ('host:port', or 'host': any port) that overrides may name in any section (env.options.url,
    # tracking.mlflow_uri, tracking.registry_url, …): set only in a file (infra/hosts.py)
    trusted_hosts: list[str] = field(default_factory=list)


CHOICES = {
    "generator.backend": ("torch", "vllm"),
    "ref_model.enabled": ("auto", "true", "false"),
    "launcher": ("local", "slurm", "inline"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "weightsync.backend": ("fs", "shared", "torchstore", "broadcast"),
    "rollout_correction.mode": MODES,
    "rollout_correction.level": LEVELS,
}
POSITIVE = ("generator.max_new_tokens", "generator.procs", "generator.num_replicas", "ref_model.procs",
            "reward.num_replicas", "workers.threads", "weightsync.keep", "weightsync.sync_every", "slurm.nodes")


def suggest(key: str, options) -> str:
    close = difflib.get_close_matches(key, list(options), n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {sorted(options)}"


def coerce(value: Any, annotation, where: str) -> Any:
    """Check/convert a YAML value to a field's annotated type."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        annotation = next(a for a in args if a is not type(None))
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{where}: expected true/false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"{where}: expected an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"{where}: expected a number, got {value!r}")
    if annotation is str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (str, int, float)):
            return str(value)
        raise ValueError(f"{where}: expected a string, got {value!r}")
    if annotation in (dict, list):
        if isinstance(value, annotation):
            return value
        raise ValueError(f"{where}: expected a {annotation.__name__}, got {value!r}")
    return value


def from_dict(cls, data: dict, where: str, prefix: str = ""):
    """Build dataclass `cls` from a mapping, rejecting unknown keys with a suggestion."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: section {prefix.rstrip('.') or '<top>'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    named = issubclass(cls, NamedSection)
    if named:
        names.discard("params")
        if "name" not in data:
            section = prefix.rstrip(".")
            raise ValueError(f"{where}: {section}.name is missing (e.g. {section}: {{name: {cls.example}}})")
    kwargs, params = {}, {}
    for key, value in data.items():
        dotted = prefix + str(key)
        if key not in names:
            if named:  # the component's own hyperparameter: checked when the component is built
                params[key] = value
                continue
            raise ValueError(f"{where}: unknown key {dotted!r}" + suggest(str(key), names))
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            kwargs[key] = from_dict(annotation, value or {}, where, dotted + ".")
        elif typing.get_origin(annotation) is list and dataclasses.is_dataclass(typing.get_args(annotation)[0]):
            item = typing.get_args(annotation)[0]
            if not isinstance(value, list):
                raise ValueError(f"{where}: {dotted} must be a list of mappings, got {value!r}")
            kwargs[key] = [from_dict(item, v, where, f"{dotted}[{i}].") for i, v in enumerate(value)]
        else:
            kwargs[key] = coerce(value, annotation, f"{where}: {dotted}")
    return cls(**kwargs, params=params) if named else cls(**kwargs)


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """['--trainer.lr', '3e-5', '--loss.name=dapo'] -> {'trainer.lr': 3e-05, 'loss.name': 'dapo'} (YAML-typed)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ValueError(f"override {arg!r} must look like --section.key VALUE (e.g. --trainer.lr 3e-5)")
        if "=" in arg:
            key, raw = arg[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ValueError(f"override {arg} has no value (e.g. {arg} 3e-5)")
            key, raw = arg[2:], args[i + 1]
            i += 2
        out[key] = yaml.safe_load(raw) if raw != "" else ""
    return out


def apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    """Set dotted keys in a nested dict (copy); lists of reward entries are replaced whole."""
    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            if node.get(part) is None:
                node[part] = {}
            if not isinstance(node[part], dict):
                raise ValueError(f"override {dotted!r}: {part!r} is not a section")
            node = node[part]
        node[parts[-1]] = value
    return data


def flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1} (lists kept whole): the form logged as MLflow params."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and v and k not in ("extra",):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def read_config(path: str | Path | None = None, overrides: dict[str, Any] | list[str] | None = None) -> RunConfig:
    """RunConfig from a YAML file (or the defaults) plus overrides (dict of dotted keys or CLI args), typed but not
    yet cross-checked: `infra.config_checks.load_config` is the one entry point that reads and checks."""
    data: dict = {}
    where = "defaults"
    if path is not None:
        path = Path(path)
        where = str(path)
        if not path.exists():
            raise ValueError(f"config file {where} does not exist; see configs/ for examples")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{where}: invalid YAML: {exc}") from exc
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    file_data, file = data, (where if path is not None else None)
    if overrides:
        refuse_file_only_overrides(overrides, where)
        data = apply_overrides(data, overrides)
        where += " + overrides"
    if isinstance(data, dict):  # (a file that is not a mapping is refused by from_dict)
        refuse_untrusted_hosts(file_data, data, where, file)
        check_sbatch_values(data.get("slurm"), where)
    return from_dict(RunConfig, imply_paired_names(data), where)


def imply_paired_names(data: dict) -> dict:
    """Names that follow from others when not set: a loss's implied advantage (Dr. GRPO's mean-only advantages:
    std-normalised ones would bring back the bias it removes) unless advantage.name says otherwise."""
    loss, advantage = data.get("loss"), data.get("advantage")
    implied = implied_advantage(loss.get("name")) if isinstance(loss, dict) else None
    if implied and not (isinstance(advantage, dict) and "name" in advantage):
        data = {**data, "advantage": {**(advantage or {}), "name": implied}}
    return data


def config_from_dict(data: dict, where: str = "config dict") -> RunConfig:
    """RunConfig from a plain nested dict written by config_to_dict of a config the controller already checked
    (workers receive it so; they do not check it again)."""
    return from_dict(RunConfig, data, where)


def redact_secrets(value: Any) -> Any:
    """A copy with passwords in URLs (scheme://user:PASSWORD@host) replaced by ***: what MLflow and the registry
    record. The run directory's own config.yaml keeps the real values (resume needs them); prefer environment
    variables (FORGEFLOW_REGISTRY_URL, MLFLOW_TRACKING_URI) for credentials."""
    if isinstance(value, dict):
        return {k: redact_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_secrets(v) for v in value]
    if isinstance(value, str):
        return hide_password(value)
    return value


def config_to_dict(cfg: RunConfig) -> dict:
    """Plain nested dict (YAML/JSON-serialisable) of a RunConfig, in the shape the YAML is written in (named
    sections flat: {name: …, **params})."""
    return to_plain(cfg)


def to_plain(value: Any) -> Any:
    if isinstance(value, NamedSection):
        return {k: to_plain(v) for k, v in value.to_dict().items()}
    if dataclasses.is_dataclass(value):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def dump_config(cfg: RunConfig, path: str | Path) -> Path:
    """Write the resolved config as YAML; mode 0600 when it holds a secret (a password in a URL), which resume needs
    and nothing else may read."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = config_to_dict(cfg)
    mode = 0o600 if redact_secrets(data) != data else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.fchmod(fd, mode)  # an existing file keeps its old mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(data, sort_keys=False))
    return path
