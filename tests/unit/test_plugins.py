"""Import paths in a config run code: accepted only when a config file on disk lists them under `plugins:`."""

import pytest

from infra import components as C
from infra.config import config_from_dict, config_to_dict, parse_overrides
from infra.config_checks import load_config
from tests.plugin_config import write_plugin_config

TINY = "configs/grpo_math_tiny.yaml"
LOSS = "tests.unit.custom_loss_example:ScaledReinforceLoss"
REWARD = "tests.unit.reward_examples:raises_on_boom"


@pytest.mark.parametrize("section", ["loss", "rewards"])
def test_unlisted_import_path_in_an_override_is_refused_before_import(tmp_path, section):
    marker = tmp_path / "pwned"
    entry = {"name": "subprocess:Popen", "args": ["touch", str(marker)]}
    overrides = {"loss": entry} if section == "loss" else {"rewards": [entry]}
    key = "loss.name" if section == "loss" else r"rewards\[0\].name"
    with pytest.raises(ValueError, match=rf"{key} = 'subprocess:Popen' is an import path .* add `plugins: "):
        load_config(TINY, overrides)
    assert not marker.exists()


def test_overrides_cannot_list_plugins(tmp_path):
    marker = tmp_path / "pwned"
    for overrides in ({"plugins": ["subprocess:Popen"], "loss": {"name": "subprocess:Popen"}},
                      parse_overrides(["--plugins", "[subprocess:Popen]", "--loss.name", "subprocess:Popen"])):
        with pytest.raises(ValueError, match="override 'plugins' is refused.*only be listed in the YAML config"):
            load_config(TINY, overrides)
    assert not marker.exists()


def test_plugins_listed_in_the_file_can_be_named_by_overrides(tmp_path):
    config = write_plugin_config(tmp_path, [LOSS, REWARD])
    cfg = load_config(config, {"loss": {"name": LOSS, "scale": 2.0},
                               "rewards": [{"name": "math"}, {"name": REWARD, "key": "flaky", "weight": 0.0}]})
    assert cfg.loss.name == LOSS and cfg.plugins == [LOSS, REWARD]
    assert type(C.build_loss(cfg)).__name__ == "ScaledReinforceLoss"
    assert [key for key, _, _ in C.build_reward(cfg).functions] == ["math", "flaky"]
    assert load_config(config, {"loss.name": "dapo"}).loss.name == "dapo"  # registered names need no listing


def test_malformed_plugin_entry_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"plugins entry 'os.system\(1\)' is not 'module.path:Name'"):
        load_config(write_plugin_config(tmp_path, ["os.system(1)"]))


def test_a_config_that_skipped_the_check_still_cannot_build_unlisted_code(tmp_path):
    """Defence in depth: building a component refuses unlisted import paths whoever made the config."""
    data = config_to_dict(load_config(TINY))
    data["loss"] = {"name": "subprocess:Popen", "args": ["touch", str(tmp_path / "pwned")]}
    data["rewards"] = [{"name": "subprocess:Popen", "args": ["touch", str(tmp_path / "pwned")]}]
    cfg = config_from_dict(data)
    with pytest.raises(ValueError, match="loss.name = 'subprocess:Popen' is an import path"):
        C.build_loss(cfg)
    with pytest.raises(ValueError, match="is an import path"):
        C.build_reward(cfg)
    assert not (tmp_path / "pwned").exists()
