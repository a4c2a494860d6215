"""sbatch options are code on the cluster: overrides cannot add them, and no value may break out of its #SBATCH line."""

from __future__ import annotations

import pytest
import yaml

from infra.config_checks import load_config

CALC = "configs/grpo_calculator_tool.yaml"


def written(tmp_path, slurm: dict) -> str:
    """A copy of the calculator recipe whose file writes `slurm`."""
    data = yaml.safe_load(open(CALC)) | {"slurm": slurm}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("key,value", [
    ("slurm.extra", {"export": "ALL,LD_PRELOAD=/tmp/x.so"}),
    ("slurm.extra.chdir", "/tmp/elsewhere"),
    ("slurm", {"nodes": 1, "extra": {"wrap": "id"}}),
])
def test_an_override_cannot_add_sbatch_options(key, value):
    with pytest.raises(ValueError, match=r"slurm.extra holds raw sbatch options.*only the YAML config file"):
        load_config(CALC, {key: value})


def test_other_slurm_keys_stay_overridable_and_the_file_may_write_extra(tmp_path):
    cfg = load_config(written(tmp_path, {"extra": {"constraint": "a100"}}), {"slurm.partition": "gpu"})
    assert cfg.slurm.partition == "gpu" and cfg.slurm.extra == {"constraint": "a100"}


@pytest.mark.parametrize("slurm,key", [
    ({"extra": {"comment": "x\ntouch /tmp/pwned #"}}, "slurm.extra.comment"),
    ({"extra": {"comment\nid": "x"}}, "slurm.extra key"),
])
def test_a_value_that_would_end_its_sbatch_line_is_refused_even_from_the_file(tmp_path, slurm, key):
    with pytest.raises(ValueError, match=rf"{key}.*newline or control character"):
        load_config(written(tmp_path, slurm))


@pytest.mark.parametrize("key,value", [
    ("slurm.time", "01:00:00\nid"),  # a line break: the rest would run as shell
    ("slurm.partition", "gpu --export=ALL,LD_PRELOAD=/tmp/x.so"),  # a space: sbatch reads a second option
    ("slurm.mem", "4G --chdir=/tmp"),
    ("slurm.account", "lab\rid"),
])
def test_a_plain_slurm_value_that_is_not_one_word_is_refused(key, value):
    with pytest.raises(ValueError, match=rf"{key} = .* is not one word"):
        load_config(CALC, {key: value})


def test_usual_slurm_values_are_one_word():
    cfg = load_config(CALC, {"slurm.partition": "gpu,cpu", "slurm.time": "1-00:00:00", "slurm.mem": "512G",
                             "slurm.qos": "high-prio", "slurm.account": "lab_rl"})
    assert (cfg.slurm.partition, cfg.slurm.time, cfg.slurm.mem) == ("gpu,cpu", "1-00:00:00", "512G")
