"""Hosts in a config are where the cluster connects: only a config file on disk may add one.

An environment option that names a host (`env.options.url`, OpenEnv's server, or any option of a plugin environment
whose value is a URL or whose key names a host) makes the env workers connect there and train on what comes back.
Overrides reach a run from places that must not choose where it connects: a flow run's `overrides` parameter and a
deployment's parameters (anyone who can reach the Prefect API), a sweep grid, CLI flags. So, as `plugins:` does for
code (infra/plugins.py), a host that an override names must be one the config file trusts: listed under its
top-level `trusted_hosts: ['host:port', …]` (or `'host'`: any port), or named by the file's own `env` section. No
override may add to `trusted_hosts`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

URL = re.compile(r"^[A-Za-z][\w+.-]*://")
# option keys whose value is a host (with or without a scheme); any option whose value is a URL names one too
HOST_KEYS = ("url", "urls", "uri", "host", "hosts", "hostname", "endpoint", "address", "server")
HOST_SUFFIXES = ("_url", "_urls", "_uri", "_host", "_hosts", "_endpoint", "_address", "_server")
UNSAFE = re.compile(r"[\\\s\x00-\x1f\x7f]")
HOSTNAME = re.compile(r"^([A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?|[0-9A-Fa-f:.]+)$")  # a name, IPv4 or IPv6
DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


@dataclass(frozen=True)
class Host:
    """A host and its port (None: any port in a trusted entry, unknown in a named one)."""

    name: str
    port: int | None

    def __str__(self) -> str:
        name = f"[{self.name}]" if ":" in self.name else self.name
        return name if self.port is None else f"{name}:{self.port}"

    def covers(self, other: Host) -> bool:
        """Whether this trusted entry admits `other`: the same name, and the same port unless it names none."""
        return self.name == other.name and (self.port is None or self.port == other.port)


def parse_host(value: str, where: str) -> Host:
    """The host of a URL ('http://h:8000/x') or of a bare 'h:8000' / 'h'; ValueError naming `where` for anything
    else, and for what URL parsers read differently (backslashes, spaces, control characters: another parser may
    connect elsewhere than this one reads)."""
    try:
        if UNSAFE.search(value):
            raise ValueError("backslashes, spaces and control characters are not allowed")
        parts = urlsplit(value if URL.match(value) else "//" + value)
        port = parts.port if parts.port is not None else DEFAULT_PORTS.get(parts.scheme.lower())
        if not parts.hostname or not HOSTNAME.match(parts.hostname):
            raise ValueError("no plain host name in it")
    except ValueError as exc:
        raise ValueError(f"{where} = {value!r} is not a valid host or URL ({exc}); write e.g. "
                         "'http://127.0.0.1:8000' or '127.0.0.1:8000'") from exc
    return Host(parts.hostname.lower(), port)


def refuse_host_overrides(overrides: dict[str, Any], where: str) -> None:
    """Overrides (CLI flags, flow and deployment parameters, sweep grids) cannot list trusted hosts: only a file can."""
    for key in overrides:
        if key == "trusted_hosts" or key.startswith("trusted_hosts."):
            raise ValueError(f"{where}: override {key!r} is refused: trusted_hosts (the hosts environments may "
                             "connect to) can only be listed in the YAML config file on disk "
                             "(`trusted_hosts: ['127.0.0.1:8000']`); overrides may then name them")


def listed_hosts(data: dict, where: str) -> list[Host]:
    """The entries of a config file's top-level `trusted_hosts:` list, checked."""
    entries = data.get("trusted_hosts") or []
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ValueError(f"{where}: trusted_hosts must be a list of 'host:port' (or 'host') strings, got {entries!r}")
    return [parse_host(e, f"{where}: trusted_hosts entry") for e in entries]


def named_hosts(value: Any, key: str, host_key: bool = False) -> list[tuple[str, str]]:
    """(dotted key, value) of every string inside an `env` section that names a host: URLs anywhere, and any
    string under a host-naming key (url, host, base_url, …)."""
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in named_hosts(v, f"{key}.{k}", names_host(str(k)))]
    if isinstance(value, list):
        return [found for i, v in enumerate(value) for found in named_hosts(v, f"{key}[{i}]", host_key)]
    if isinstance(value, str) and value and (host_key or URL.match(value)):
        return [(key, value)]
    return []


def names_host(key: str) -> bool:
    """Whether an option key's value is a host (by its name)."""
    key = key.lower()
    return key in HOST_KEYS or key.endswith(HOST_SUFFIXES)


def file_hosts(file_data: dict) -> tuple[set[str], set[Host]]:
    """The host-naming values a config file's `env` section writes, and the hosts of those that parse (a value in
    the file is trusted as written, whatever it is)."""
    values = {value for _, value in named_hosts(file_data.get("env"), "env")}
    hosts = set()
    for value in values:
        try:
            hosts.add(parse_host(value, "env"))
        except ValueError:
            continue  # not a host this check can read: trusted only as written (the values set)
    return values, hosts


def refuse_untrusted_hosts(file_data: dict, data: dict, where: str, file: str | None) -> None:
    """Refuse a host that `data` (the file's data with overrides applied) names in its `env` section and the file
    (`file_data`, read from `file`; None: no file) does not trust, before anything connects to it."""
    listed = listed_hosts(file_data, str(file))
    values, in_file = file_hosts(file_data)
    for key, value in named_hosts(data.get("env"), "env"):
        if value in values:
            continue
        host = parse_host(value, f"{where}: {key}")
        if host not in in_file and not any(t.covers(host) for t in listed):
            trusting = f"the config file {file} does not trust" if file else "no config file trusts (none given)"
            raise ValueError(f"{where}: {key} = {value!r} names host {host}, which {trusting}. The environment "
                             "workers would connect there and train on what comes back, so a host given by an "
                             "override (CLI flag, flow or deployment parameter, sweep grid) must be listed in the "
                             f"YAML config file on disk: add `trusted_hosts: [{str(host)!r}]` to it (or write the "
                             "URL in its env section)")
