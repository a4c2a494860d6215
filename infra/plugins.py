"""Import paths in a config are code: only a config file on disk may name them.

`loss.name` and `rewards[].name` accept a registered name or an import path (`module.path:Name`) that is imported and
called with the section's keys. Overrides reach a run from places that must not run code: a flow run's `overrides`
parameter (anyone who can reach the Prefect API), a sweep grid. So an import path is accepted only when the config
file lists it under `plugins:`, and no override may add to `plugins`. Overrides may still pick registered names and
listed plugins.
"""

from __future__ import annotations

import re
from typing import Any

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def is_import_path(name: str) -> bool:
    """Whether a component name is an import path (`module:attr`) rather than a registered name."""
    return ":" in name


CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# keys only the config file on disk may write, and why: overrides (CLI flags, flow and deployment parameters, sweep
# grids) reach a run from places that must not run code or choose where it connects
FILE_ONLY = {
    "plugins": "plugins (import paths of custom losses and rewards) run code, so they can only be listed in the YAML "
               "config file on disk (`plugins: ['mypkg.losses:MyLoss']`); overrides may then name them",
    "trusted_hosts": "trusted_hosts (the hosts a run may be pointed at) can only be listed in the YAML config file on "
                     "disk (`trusted_hosts: ['127.0.0.1:8000']`); overrides may then name them",
    "slurm.extra": "slurm.extra holds raw sbatch options (`export=LD_PRELOAD=…`, `chdir`, `wrap`), which choose what "
                   "runs on the cluster, so only the YAML config file on disk may write them "
                   "(`slurm: {extra: {constraint: a100}}`)",
}


def sets_key(override: str, value: Any, key: str) -> bool:
    """Whether the override `override: value` sets dotted `key` or something inside it (`slurm: {extra: …}` too)."""
    if override == key or override.startswith(key + "."):
        return True
    rest = key[len(override) + 1:].split(".") if key.startswith(override + ".") else None
    for part in rest or ():
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return rest is not None


def refuse_file_only_overrides(overrides: dict[str, Any], where: str) -> None:
    """ValueError for an override of a key in FILE_ONLY (plugins, trusted_hosts, slurm.extra), naming the fix."""
    for override, value in overrides.items():
        for key, why in FILE_ONLY.items():
            if sets_key(override, value, key):
                raise ValueError(f"{where}: override {override!r} is refused: {why}")


SBATCH_WORD = re.compile(r"^[A-Za-z0-9_.,:+@%-]+$")  # a partition, account, qos, mem or time: one word, no space


def check_sbatch_values(slurm: Any, where: str) -> None:
    """The slurm values submitit and the sbatch plan write as `#SBATCH --key=value` lines stay one option each:
    partition, account, qos, mem and time are single words (sbatch reads every option on an #SBATCH line, so a
    space would add one: `gpu --export=LD_PRELOAD=…`), and no `extra` key or value holds a newline or control
    character (it would end the line and run the rest as shell)."""
    if not isinstance(slurm, dict):
        return
    for key, value in slurm.items():
        if key != "extra" and isinstance(value, str) and not SBATCH_WORD.match(value):
            raise ValueError(f"{where}: slurm.{key} = {value!r} is not one word (letters, digits and _.,:+@%- only): "
                             "a space or line break would add sbatch options; write e.g. slurm.partition: gpu")
    extra = slurm.get("extra") or {}
    pairs = [(f"slurm.extra.{k}", v) for k, v in extra.items()] + [(f"slurm.extra key {k!r}", k) for k in extra] \
        if isinstance(extra, dict) else []
    for key, value in pairs:
        if isinstance(value, str) and CONTROL.search(value):
            raise ValueError(f"{where}: {key} = {value!r} holds a newline or control character, which would end its "
                             "#SBATCH line and run the rest as shell; write it on one line")


def check_plugin_list(plugins: list, where: str) -> None:
    """Every `plugins:` entry is a `module.path:Name` string."""
    if not isinstance(plugins, list):
        raise ValueError(f"{where}: plugins must be a list of 'module.path:Name' strings, got {plugins!r}")
    for entry in plugins:
        if not isinstance(entry, str) or not IMPORT_PATH.match(entry):
            raise ValueError(f"{where}: plugins entry {entry!r} is not 'module.path:Name' (e.g. "
                             "'mypkg.losses:MyLoss')")


def named_components(cfg) -> list[tuple[str, str]]:
    """(config key, name) of every component the config names: the loss, each reward and the environment."""
    env = [("env.name", cfg.env.name)] if cfg.env.name else []
    return [("loss.name", cfg.loss.name)] + [(f"rewards[{i}].name", r.name) for i, r in enumerate(cfg.rewards)] + env


def check_plugins(cfg, where: str) -> None:
    """Refuse any import path that the config's `plugins:` list does not name, before anything is imported."""
    check_plugin_list(cfg.plugins, where)
    listed = set(cfg.plugins)
    for key, name in named_components(cfg):
        if is_import_path(name) and name not in listed:
            raise ValueError(f"{where}: {key} = {name!r} is an import path that the config file does not list under "
                             f"`plugins:`. Import paths run code, so they are accepted only from a config file on "
                             f"disk: add `plugins: [{name!r}]` to the YAML file (then overrides and deployment "
                             "parameters may name it), or use a registered name")
