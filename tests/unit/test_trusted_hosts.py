"""Hosts a run connects to (an environment's server, MLflow, the registry, any section's URL): an override may name
one only when the config file on disk trusts it (infra/hosts.py), as only the file may list plugins."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cli.main import main
from infra.config import parse_overrides
from infra.config_checks import load_config
from infra.hosts import refuse_untrusted_hosts

CALC = "configs/grpo_calculator_tool.yaml"
EVIL = "http://attacker.example:8000"
OPENENV = {"name": "openenv", "options": {"url": EVIL, "observation_field": "prompt"}}


def write_config(tmp_path: Path, **top) -> str:
    """The calculator recipe with top-level keys (an env section, trusted_hosts) replaced, written under tmp_path."""
    data = {**yaml.safe_load(Path(CALC).read_text()), **top}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


# every way an override can set the URL: a dotted key (CLI flag), the options dict, the whole env section (flow and
# deployment parameters, sweep grid points are such dicts), a flag parsed as the CLI does
OVERRIDES = {
    "dotted": {"env.name": "openenv", "env.options.url": EVIL},
    "options": {"env.name": "openenv", "env.options": {"url": EVIL}},
    "env": {"env": OPENENV},
    "cli": parse_overrides(["--env.name", "openenv", "--env.options.url", EVIL]),
}
ODD = {  # options no environment here takes, refused before any environment is built
    "nested": {"env.name": "openenv", "env.options": {"url": "", "proxy": {"base_url": EVIL}}},
    "bare host": {"env.name": "openenv", "env.options.url": "", "env.options.host": "attacker.example:8000"},
}


@pytest.mark.parametrize("shape", [*OVERRIDES, *ODD])
def test_an_override_pointing_the_environment_at_an_untrusted_host_is_refused(shape):
    with pytest.raises(ValueError, match=r"env\.options\.(url|proxy\.base_url|host) = .* names host "
                                         r"attacker\.example:8000, which the config file .* does not trust.*"
                                         r"add `trusted_hosts: \['attacker\.example:8000'\]`"):
        load_config(CALC, {**OVERRIDES, **ODD}[shape])


@pytest.mark.parametrize("listed", ["attacker.example:8000", "attacker.example", "ATTACKER.example:8000"])
def test_the_same_override_is_accepted_when_the_file_lists_the_host(tmp_path, listed):
    config = write_config(tmp_path, trusted_hosts=[listed], env={"name": "openenv", "options": {}})
    for overrides in OVERRIDES.values():
        cfg = load_config(config, overrides)
        assert cfg.env.name == "openenv" and cfg.trusted_hosts == [listed]


def test_a_listed_host_admits_only_its_own_port(tmp_path):
    config = write_config(tmp_path, trusted_hosts=["attacker.example:8000"])
    with pytest.raises(ValueError, match=r"names host attacker\.example:9000"):
        load_config(config, {"env.name": "openenv", "env.options.url": "http://attacker.example:9000"})
    with pytest.raises(ValueError, match=r"names host attacker\.example:443"):  # https's default port
        load_config(config, {"env.name": "openenv", "env.options.url": "https://attacker.example"})


def test_a_url_written_in_the_file_is_trusted_and_overrides_may_name_it_again(tmp_path):
    config = write_config(tmp_path, env={**OPENENV, "options": {"url": "http://10.0.0.5:8000"}})
    assert load_config(config).env.options["url"] == "http://10.0.0.5:8000"
    cfg = load_config(config, {"env.options": {"url": "http://10.0.0.5:8000/other", "observation_field": "prompt"}})
    assert cfg.env.options["observation_field"] == "prompt"
    with pytest.raises(ValueError, match=r"env\.options\.url = 'http://10\.0\.0\.6:8000' names host 10\.0\.0\.6:8000"):
        load_config(config, {"env.options.url": "http://10.0.0.6:8000"})


@pytest.mark.parametrize("url", ["http://attacker.example\\@10.0.0.5:8000", "http://10.0.0.5:8000 @attacker.example",
                                 "http:///attacker.example", "http://attacker%2eexample:8000", "//attacker.example:8000"])
def test_an_override_url_that_parsers_could_read_differently_is_refused(tmp_path, url):
    """A backslash or a space is read as the end of the authority by some URL parsers and not by others: the host
    checked would not be the host connected to."""
    config = write_config(tmp_path, env={**OPENENV, "options": {"url": "http://10.0.0.5:8000"}})
    with pytest.raises(ValueError, match=r"env\.options\.url = .* is not a valid host or URL"):
        load_config(config, {"env.options.url": url})


def test_values_written_in_the_file_are_trusted_as_written():
    """A plugin environment's option that only looks like a host (a template) is the file's to write; an override
    that changes it is checked."""
    file = {"env": {"name": "mypkg.envs:Maze", "options": {"server_url": "http://{host}:{port}/x"}}}
    refuse_untrusted_hosts(file, file, "maze.yaml", "maze.yaml")
    moved = {"env": {"name": "mypkg.envs:Maze", "options": {"server_url": "http://attacker.example/x"}}}
    with pytest.raises(ValueError, match=r"env\.options\.server_url = .* names host attacker\.example:80"):
        refuse_untrusted_hosts(file, moved, "maze.yaml + overrides", "maze.yaml")


def test_overrides_cannot_list_trusted_hosts():
    for overrides in ({"trusted_hosts": ["attacker.example:8000"], **OVERRIDES["dotted"]},
                      parse_overrides(["--trusted_hosts", "[attacker.example:8000]", "--env.options.url", EVIL])):
        with pytest.raises(ValueError, match="override 'trusted_hosts' is refused.*only be listed in the YAML config"):
            load_config(CALC, overrides)


def test_a_malformed_trusted_hosts_entry_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"trusted_hosts must be a list of 'host:port'"):
        load_config(write_config(tmp_path, trusted_hosts="attacker.example"))
    with pytest.raises(ValueError, match=r"trusted_hosts entry = 'h:port' is not a valid host or URL"):
        load_config(write_config(tmp_path, trusted_hosts=["h:port"]))


def test_without_a_config_file_no_host_is_trusted():
    with pytest.raises(ValueError, match=r"names host attacker\.example:8000, which no config file trusts"):
        load_config(None, {"env": OPENENV})


def test_the_cli_exits_2_on_an_untrusted_host_and_runs_with_a_listed_one(tmp_path, capsys):
    flags = ["--env.options.url", EVIL]
    env = {"name": "openenv", "options": {}}
    assert main(["grpo", "--config", write_config(tmp_path, env=env), "--dry-run", *flags]) == 2
    err = capsys.readouterr().err
    assert "forgeflow: error:" in err and "env.options.url" in err and "add `trusted_hosts:" in err
    trusting = write_config(tmp_path, env=env, trusted_hosts=["attacker.example:8000"])
    assert main(["grpo", "--config", trusting, "--dry-run", *flags]) == 0
    assert "dry run: nothing started" in capsys.readouterr().out


# every section is checked, not only env: the tracking URIs send the run's metrics, config and credentials there
TRACKING = {"tracking.mlflow_uri": "http://ops:s3cr3t@attacker.example:5000",
            "tracking.registry_url": "postgresql+psycopg://forge:s3cr3t@attacker.example:5432/registry"}
CONNECTS = {"tracking.mlflow_uri": "MLflow would send the run's metrics, parameters, config and samples there",
            "tracking.registry_url": r"The run registry \(runs, checkpoints, the config\) would be written there"}


@pytest.mark.parametrize("key", TRACKING)
def test_an_override_pointing_tracking_at_an_untrusted_host_is_refused(key):
    port = TRACKING[key].rsplit(":", 1)[1].split("/")[0]
    with pytest.raises(ValueError, match=rf"{key} = .* names host attacker\.example:{port}, which the config file "
                                         rf".* does not trust\. {CONNECTS[key]}.*with the URL's credentials.*"
                                         rf"add `trusted_hosts: \['attacker\.example:{port}'\]`") as err:
        load_config(CALC, {key: TRACKING[key]})
    assert "s3cr3t" not in str(err.value)  # the refusal reaches logs and the Prefect UI


@pytest.mark.parametrize("key", TRACKING)
def test_the_cli_exits_2_on_an_untrusted_tracking_host(key, capsys):
    assert main(["grpo", "--config", CALC, "--dry-run", f"--{key}", TRACKING[key]]) == 2
    assert f"{key} = " in capsys.readouterr().err


def test_tracking_hosts_the_file_lists_are_accepted(tmp_path):
    config = write_config(tmp_path, trusted_hosts=["attacker.example:5000", "attacker.example:5432"])
    cfg = load_config(config, TRACKING)
    assert (cfg.tracking.mlflow_uri, cfg.tracking.registry_url) == tuple(TRACKING.values())
    with pytest.raises(ValueError, match=r"tracking\.mlflow_uri = .* names host attacker\.example:5001"):
        load_config(config, {"tracking.mlflow_uri": "http://attacker.example:5001"})


@pytest.mark.parametrize("uri", ["sqlite:////tmp/forge/mlflow.db", "sqlite:///relative.db", "file:///tmp/mlruns",
                                 "/tmp/mlruns", "./mlruns", "mlruns"])
def test_hostless_tracking_uris_name_no_host_and_pass(uri):
    cfg = load_config(CALC, {"tracking.mlflow_uri": uri, "tracking.registry_url": uri})
    assert cfg.tracking.mlflow_uri == uri and cfg.tracking.registry_url == uri


def test_the_default_tracking_uris_are_not_overrides():
    """Left unset, MLflow and the registry read MLFLOW_TRACKING_URI / FORGEFLOW_REGISTRY_URL, which whoever runs the
    process sets, like the file."""
    cfg = load_config(CALC, {"tracking.experiment": "x"})
    assert cfg.tracking.mlflow_uri is None and cfg.tracking.registry_url is None


def test_tracking_uris_written_in_the_file_are_trusted(tmp_path):
    config = write_config(tmp_path, tracking=dict(zip(("mlflow_uri", "registry_url"), TRACKING.values())))
    assert load_config(config).tracking.registry_url == TRACKING["tracking.registry_url"]
    cfg = load_config(config, {"tracking.mlflow_uri": "http://attacker.example:5000/other"})  # a host it names
    assert cfg.tracking.mlflow_uri == "http://attacker.example:5000/other"


@pytest.mark.parametrize("key,value,host", [
    ("tracking.registry_url", "postgresql:///registry?host=attacker.example", "attacker.example"),  # libpq's host
    ("tracking.mlflow_uri", "localhost:5000", "localhost:5000"),  # a scheme-less host, not a path
    ("tracking.mlflow_uri", "databricks", "databricks"),  # MLflow's name for a workspace's host
    ("dataset.path", "https://attacker.example/problems.jsonl", "attacker.example:443"),
    ("rewards", [{"name": "math", "judge_url": "http://attacker.example:8000"}], "attacker.example:8000"),
])
def test_hosts_named_in_other_sections_are_checked(key, value, host):
    with pytest.raises(ValueError, match=rf"names host {re.escape(host)}, which the config file"):
        load_config(CALC, {key: value})


def test_a_postgres_socket_directory_names_no_host():
    url = "postgresql:///registry?host=/var/run/postgresql"
    assert load_config(CALC, {"tracking.registry_url": url}).tracking.registry_url == url
