"""Hosts in a config are where the run connects: only a config file on disk may add one.

The rule: config values and flow parameters never point the system at a host that a trusted file on disk did not
name. Overrides reach a run from places that must not choose where it connects: a flow run's `overrides` parameter
and a deployment's parameters (anyone who can reach the Prefect API), a sweep grid, CLI flags. So, as `plugins:` does
for code (infra/plugins.py), a host that the config (the file with its overrides applied) names anywhere must be one
the file trusts: listed under its top-level `trusted_hosts: ['host:port', …]` (or `'host'`: any port), or named by a
value the file itself writes (in any section; such a value is trusted as written). No override may add to
`trusted_hosts`. Defaults are not overrides: a key left unset (tracking.mlflow_uri: null) takes its value from the
environment variables (MLFLOW_TRACKING_URI, FORGEFLOW_REGISTRY_URL), which whoever runs the process sets, as the file.

What names a host, in every section: a URL with a host (`scheme://[user[:password]@]host[:port]/…`) and the hosts
its query string names (PostgreSQL's `?host=`, any host-naming or URL parameter); a URL after `=` or `,` inside a
string (`slurm.extra.export: "ALL,HF_ENDPOINT=https://…"`); any string under a host-naming key (url, host, endpoint,
…, *_url, *_uri, *_host, …; a bare `host:port` or `host` there is a host). What names none: a URL with an empty
authority whose scheme reads it so (`sqlite:///path`, `file:///path`; not http(s)/ws(s)/ftp: WHATWG parsers read
`http:///h` as host h, so that is refused), a filesystem path (`/…`, `./…`, `../…`, `~…`), and under the tracking
URIs any value without a scheme (MLflow's local path), except MLflow's workspace names (databricks, databricks-uc,
uc), which connect to a workspace and are hosts here.

Security: the keys this covers (every section of infra/config.py's RunConfig was read for them), with what connects:
- `env.options.*` (url, host, server_url, … of any environment, plugins included): the environment workers connect
  there and train on what comes back.
- `tracking.mlflow_uri`: MLflow receives the run's metrics, parameters, config and samples, with the URL's
  credentials.
- `tracking.registry_url`: the run registry (runs, checkpoints, the config) is written there and read back, with the
  URL's credentials.
- `slurm.extra.*` (sbatch options; `export=` sets the jobs' environment, HF_ENDPOINT or MLFLOW_TRACKING_URI among
  it): the SLURM jobs connect there.
- `model.path`, `dataset.path`, `dataset.eval_path`, `sft.init`: a URL there is a download (hub ids and paths name
  no host; the hub's endpoint is the environment's HF_ENDPOINT).
- `loss.*`, `advantage.*`, `rewards[].*` (a plugin component's own parameters): the component connects there.
- Any other string, by the same rule. The other sections name no host: weightsync (root is a path; the broadcast
  group's store address is chosen by the trainer, not configured), workers, generator, trainer, ref_model, reward,
  checkpoint, eval (numbers and choices); slurm's partition, account, qos, mem and time are names, not hosts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

URL = re.compile(r"^[A-Za-z][\w+.-]*:[/\\]")  # a scheme and a slash (or what some parsers read as one)
SCHEME = re.compile(r"^[A-Za-z][\w+.-]+:")  # two letters at least: `C:\…` is a Windows path
EMBEDDED = re.compile(r"[=,]([A-Za-z][\w+.-]*://[^,\s]*)")  # `KEY=scheme://…` inside a string
PATH = re.compile(r"^(/(?!/)|\.\.?/|~)")  # not "//host": a scheme-relative URL names a host
# keys whose value is a host (with or without a scheme); any value that is a URL names one too
HOST_KEYS = ("url", "urls", "uri", "host", "hosts", "hostname", "hostaddr", "endpoint", "address", "server")
HOST_SUFFIXES = ("_url", "_urls", "_uri", "_host", "_hosts", "_endpoint", "_address", "_server")
PATH_URIS = ("tracking.mlflow_uri", "tracking.registry_url")  # without a scheme: a local path (MLflow's rule)
WORKSPACES = ("databricks", "databricks-uc", "uc")  # MLflow tracking URIs that connect to a workspace's host
SPECIAL_SCHEMES = ("http", "https", "ws", "wss", "ftp")  # WHATWG: an empty authority is skipped, not hostless
UNSAFE = re.compile(r"[\\\s\x00-\x1f\x7f]")
HOSTNAME = re.compile(r"^([A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?|[0-9A-Fa-f:.]+)$")  # a name, IPv4 or IPv6
DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
PASSWORD = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^:/@\s]+:)[^@\s]+(?P<at>@)")
# what connects to a host named under each key (the longest matching prefix); the refusal says it
CONNECTS = {
    "env": "The environment workers would connect there and train on what comes back",
    "tracking.mlflow_uri": "MLflow would send the run's metrics, parameters, config and samples there, with the "
                           "URL's credentials",
    "tracking.registry_url": "The run registry (runs, checkpoints, the config) would be written there and read "
                             "back, with the URL's credentials",
    "slurm": "The SLURM jobs would be submitted with it (sbatch options, their environment) and connect there",
    "model": "The model would be loaded (downloaded) from there",
    "dataset": "The training and eval problems would be loaded (downloaded) from there",
    "sft": "The model RL starts from would be loaded (downloaded) from there",
    "loss": "The loss plugin would connect there",
    "advantage": "The advantage plugin would connect there",
    "rewards": "The reward function would connect there with the model's completions",
    "": "The run would connect there",
}


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


@dataclass(frozen=True)
class Named:
    """A string of a config that may name hosts: its dotted key, its value, and whether its key names a host."""

    key: str
    value: str
    host_key: bool


def hide_password(value: str) -> str:
    """`value` with the password of a URL's user info as *** (errors reach logs and the Prefect UI)."""
    return PASSWORD.sub(r"\g<head>***\g<at>", value)


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
        raise ValueError(f"{where} = {hide_password(value)!r} is not a valid host or URL ({exc}); write e.g. "
                         "'http://127.0.0.1:8000' or '127.0.0.1:8000'") from exc
    return Host(parts.hostname.lower(), port)


def url_hosts(url: str, where: str) -> list[Host]:
    """The hosts a URL names: its own (none for an empty authority that its scheme reads as local: sqlite:///path,
    file:///path) and those of its query (PostgreSQL's ?host=…, which libpq prefers to the URL's own)."""
    if UNSAFE.search(url):
        parse_host(url, where)  # raises, naming what is unsafe
    parts = urlsplit(url)
    hostless = not parts.netloc and parts.scheme.lower() not in SPECIAL_SCHEMES
    own = [] if hostless else [parse_host(url, where)]
    return own + [host for key, value in parse_qsl(parts.query)
                  for host in value_hosts(Named(f"{where}?{key}", value, names_host(key)), where=f"{where}?{key}")]


def value_hosts(named: Named, where: str) -> list[Host]:
    """The hosts a config string names ([] for a hostless URI, a path, a string that is neither URL nor host);
    ValueError naming `where` for one that this check cannot read."""
    if URL.match(named.value):
        return url_hosts(named.value, where)
    embedded = [host for found in EMBEDDED.findall(named.value) for host in url_hosts(found, where)]
    if not named.host_key or PATH.match(named.value) or is_local_path(named):
        return embedded
    return [parse_host(named.value, where)]


def is_local_path(named: Named) -> bool:
    """A tracking URI without a scheme: MLflow opens it as a local path (a workspace name connects to a host)."""
    return (named.key in PATH_URIS and not SCHEME.match(named.value)
            and named.value.lower() not in WORKSPACES)


def listed_hosts(data: dict, where: str) -> list[Host]:
    """The entries of a config file's top-level `trusted_hosts:` list, checked."""
    entries = data.get("trusted_hosts") or []
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ValueError(f"{where}: trusted_hosts must be a list of 'host:port' (or 'host') strings, got {entries!r}")
    return [parse_host(e, f"{where}: trusted_hosts entry") for e in entries]


def named_values(value: Any, key: str = "", host_key: bool = False) -> list[Named]:
    """Every string of a config (any section; trusted_hosts aside) that may name a host: URLs, strings holding one
    after `=` or `,`, and any string under a host-naming key (url, host, base_url, …)."""
    if isinstance(value, dict):
        return [found for k, v in value.items() if key or k != "trusted_hosts"
                for found in named_values(v, f"{key}.{k}" if key else str(k), names_host(str(k)))]
    if isinstance(value, list):
        return [found for i, v in enumerate(value) for found in named_values(v, f"{key}[{i}]", host_key)]
    if isinstance(value, str) and value and (host_key or URL.match(value) or EMBEDDED.search(value)):
        return [Named(key, value, host_key)]
    return []


def names_host(key: str) -> bool:
    """Whether a key's value is a host (by its name)."""
    key = key.lower()
    return key in HOST_KEYS or key.endswith(HOST_SUFFIXES)


def file_hosts(file_data: dict) -> tuple[set[str], set[Host]]:
    """The host-naming values a config file writes (any section), and the hosts of those that parse (a value in
    the file is trusted as written, whatever it is)."""
    named = named_values(file_data)
    hosts = set()
    for found in named:
        try:
            hosts.update(value_hosts(found, found.key))
        except ValueError:
            continue  # not a host this check can read: trusted only as written (the values set)
    return {found.value for found in named}, hosts


def refuse_untrusted_hosts(file_data: dict, data: dict, where: str, file: str | None) -> None:
    """Refuse a host that `data` (the file's data with overrides applied) names in any section and the file
    (`file_data`, read from `file`; None: no file) does not trust, before anything connects to it."""
    listed = listed_hosts(file_data, str(file))
    values, in_file = file_hosts(file_data)
    for named in named_values(data):
        if named.value in values:
            continue
        for host in value_hosts(named, f"{where}: {named.key}"):
            if host not in in_file and not any(t.covers(host) for t in listed):
                raise ValueError(untrusted_message(named, host, where, file))


def untrusted_message(named: Named, host: Host, where: str, file: str | None) -> str:
    """The refusal: the key and its value, the host, what would connect there, and the fix."""
    trusting = f"the config file {file} does not trust" if file else "no config file trusts (none given)"
    connects = next(text for prefix, text in sorted(CONNECTS.items(), key=lambda item: -len(item[0]))
                    if named.key == prefix or named.key.startswith((f"{prefix}.", f"{prefix}[")) or not prefix)
    return (f"{where}: {named.key} = {hide_password(named.value)!r} names host {host}, which {trusting}. "
            f"{connects}, so a host given by an override (CLI flag, flow or deployment parameter, sweep grid) must "
            f"be listed in the YAML config file on disk: add `trusted_hosts: [{str(host)!r}]` to it (or write "
            f"{named.key} in the file itself)")
