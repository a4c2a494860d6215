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
    ({"account": "lab\rid"}, "slurm.account"),
])
def test_a_value_that_would_end_its_sbatch_line_is_refused_even_from_the_file(tmp_path, slurm, key):
    with pytest.raises(ValueError, match=rf"{key}.*newline or control character"):
        load_config(written(tmp_path, slurm))


def test_an_override_of_a_plain_slurm_key_with_a_newline_is_refused():
    with pytest.raises(ValueError, match=r"slurm.time = .*newline or control character"):
        load_config(CALC, {"slurm.time": "01:00:00\nid"})
