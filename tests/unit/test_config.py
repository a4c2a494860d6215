import pytest

from infra.config import flatten, parse_overrides
from infra.config_checks import load_config
from tests.plugin_config import write_plugin_config


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_shipped_configs_load():
    for name in ("configs/grpo_math_tiny.yaml", "configs/sft_math_tiny.yaml"):
        cfg = load_config(name)
        assert cfg.model.path == "tiny:qwen3-arith"
    assert load_config("configs/sft_math_tiny.yaml").steps == 0


def test_overrides_are_yaml_typed():
    cfg = load_config("configs/grpo_math_tiny.yaml",
                      ["--trainer.lr", "3e-5", "--loss.name=gspo", "--generator.procs", "2", "--filter_groups", "false"])
    assert cfg.trainer.lr == 3e-5 and cfg.loss.name == "gspo" and cfg.generator.procs == 2
    assert cfg.filter_groups is False
    assert cfg.loss.params == {"beta": 0.04}  # the rest of the section is kept


def test_dict_overrides():
    cfg = load_config(None, {"steps": 7, "loss.name": "gspo", "dataset.max_value": 9})
    assert (cfg.steps, cfg.loss.name, cfg.dataset.max_value) == (7, "gspo", 9)


def test_unknown_key_names_file_and_suggests(tmp_path):
    path = write(tmp_path, "trainer: {lrr: 1.0e-5}\n")
    with pytest.raises(ValueError, match=r"c.yaml: unknown key 'trainer.lrr'; did you mean 'lr'\?"):
        load_config(path)
    with pytest.raises(ValueError, match="unknown key 'stepz'"):
        load_config(None, {"stepz": 3})


def test_bad_values_are_named(tmp_path):
    with pytest.raises(ValueError, match="trainer.lr: expected a number, got 'fast'"):
        load_config(None, {"trainer.lr": "fast"})
    with pytest.raises(ValueError, match="launcher = 'cloud' is not one of"):
        load_config(None, {"launcher": "cloud"})
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        load_config(None, {"group_size": 1})
    with pytest.raises(ValueError, match="steps: expected an integer"):
        load_config(None, {"steps": 2.5})
    with pytest.raises(ValueError, match="dataset.kind 'gsm8k' needs dataset.path"):
        load_config(None, {"dataset.kind": "gsm8k"})
    with pytest.raises(ValueError, match="invalid YAML"):
        load_config(write(tmp_path, "a: [1,\n"))
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_bad_components_and_missing_files_fail_at_load(tmp_path):
    with pytest.raises(ValueError, match="defaults \\+ overrides: .*clip_low"):
        load_config(None, {"loss.name": "dapo", "loss.clip_low": -0.1})
    with pytest.raises(ValueError, match="unknown reward 'maths'"):
        load_config(None, {"rewards": [{"name": "maths"}]})
    with pytest.raises(ValueError, match="unknown advantage.name 'gpro'"):
        load_config(None, {"advantage.name": "gpro"})
    with pytest.raises(ValueError, match="generator.max_new_tokens must be >= 1"):
        load_config(None, {"generator.max_new_tokens": 0})
    with pytest.raises(ValueError, match="trainer.lr must be > 0"):
        load_config(None, {"trainer.lr": 0})
    with pytest.raises(ValueError, match="reward.timeout_s must be >= 0"):
        load_config(None, {"reward.timeout_s": -1})
    missing = tmp_path / "gsm8k.jsonl"
    with pytest.raises(ValueError, match=f"dataset.path = '{missing}' does not exist"):
        load_config(None, {"dataset.kind": "gsm8k", "dataset.path": str(missing)})
    with pytest.raises(ValueError, match="sft.init = './nowhere/ckpt' does not exist"):
        load_config(None, {"sft.init": "./nowhere/ckpt"})
    load_config(None, {"model.path": "Qwen/Qwen3-1.7B"})  # a hub id is not checked on disk


def test_parse_overrides_errors():
    with pytest.raises(ValueError, match="has no value"):
        parse_overrides(["--trainer.lr"])
    with pytest.raises(ValueError, match="must look like --section.key"):
        parse_overrides(["trainer.lr", "1"])


def test_flatten():
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": [1]}) == {"a.b": 1, "a.c.d": 2, "e": [1]}


def test_passwords_in_urls_are_redacted_for_records():
    from infra.config import redact_secrets

    cfg = {"tracking": {"registry_url": "postgresql+psycopg://forge:s3cr%40t@db:5432/reg",
                        "mlflow_uri": "http://127.0.0.1:5000"}, "rewards": [{"name": "math"}], "seed": 3}
    out = redact_secrets(cfg)
    assert out["tracking"]["registry_url"] == "postgresql+psycopg://forge:***@db:5432/reg"
    assert out["tracking"]["mlflow_uri"] == "http://127.0.0.1:5000" and out["seed"] == 3
    assert cfg["tracking"]["registry_url"].endswith("s3cr%40t@db:5432/reg")  # the original is untouched


def test_a_config_is_checked_once_per_process_and_workers_take_it_as_checked(monkeypatch):
    """The CLI, the flow and its tasks each load the run's config: the check runs once and never builds the loss
    (only the trainer does); the dict the workers receive is not checked again."""
    from infra import components as C
    from infra.config import config_from_dict, config_to_dict

    built, checked, real_get, real_check = [], [], C.get_loss, C.check_loss
    monkeypatch.setattr(C, "get_loss", lambda name, **kw: built.append(name) or real_get(name, **kw))
    monkeypatch.setattr(C, "check_loss", lambda name, **kw: checked.append(name) or real_check(name, **kw))
    overrides = {"loss.name": "dapo", "seed": 424242}  # a config no other test of this process loads
    cfg = load_config("configs/grpo_math_tiny.yaml", overrides)
    for _ in range(2):
        assert load_config("configs/grpo_math_tiny.yaml", overrides) == cfg
    assert (checked, built) == (["dapo"], [])
    assert config_from_dict(config_to_dict(cfg)) == cfg
    assert (checked, built) == (["dapo"], [])
    assert C.build_loss(cfg).__class__.__name__ == "DAPOLoss" and built == ["dapo"]
    with pytest.raises(ValueError, match="clip"):  # a bad value is still refused, every time it is loaded
        load_config("configs/grpo_math_tiny.yaml", {**overrides, "loss.clip_low": -1.0})


def test_named_sections_are_typed_and_round_trip_in_their_yaml_shape(tmp_path):
    """loss / advantage / rewards are typed sections: a name plus the component's own hyperparameters by name; the
    dumped config.yaml (what a resume and the workers read) has the shape the user wrote."""
    import yaml

    from infra.config import LossConfig, RewardFnConfig, config_from_dict, config_to_dict, dump_config

    cfg = load_config("configs/grpo_math_tiny.yaml", {"loss.name": "dapo", "loss.clip_high": 0.28})
    assert isinstance(cfg.loss, LossConfig) and cfg.loss.beta == 0.04
    assert cfg.loss.to_dict() == {"name": "dapo", "clip_high": 0.28, "beta": 0.04}
    assert [(r.name, r.weight) for r in cfg.rewards] == [("math", 1.0), ("digits", 0.5)]
    assert all(isinstance(r, RewardFnConfig) for r in cfg.rewards) and cfg.advantage.name == "grpo"
    written = yaml.safe_load(dump_config(cfg, tmp_path / "config.yaml").read_text())
    assert written["loss"] == {"name": "dapo", "clip_high": 0.28, "beta": 0.04}
    assert written["rewards"] == [{"name": "math", "weight": 1.0}, {"name": "digits", "weight": 0.5}]
    assert load_config(tmp_path / "config.yaml") == cfg == config_from_dict(config_to_dict(cfg))
    assert flatten(config_to_dict(cfg))["loss.clip_high"] == 0.28  # MLflow params keep their names
    with pytest.raises(ValueError, match=r"loss.name is missing \(e.g. loss: \{name: grpo\}\)"):
        load_config(write(tmp_path, "loss: {clip_low: 0.1}\n"))
    with pytest.raises(ValueError, match=r"rewards\[1\].name is missing"):
        load_config(None, {"rewards": [{"name": "math"}, {"weight": 2.0}]})


@pytest.mark.parametrize("overrides,match", [
    ({"trainer.mini_batches": 200}, r"trainer.mini_batches = 200 is larger than the 128 sequences .* set "
                                    r"trainer.mini_batches <= 128"),
    ({"trainer.epochs": 0}, r"trainer.epochs must be >= 1, got 0"),
    ({"rollout_correction.cap": 1.0}, r"rollout_correction.cap must be a number > 1 .* got 1.0"),
    ({"rollout_correction.mode": "is"}, r"rollout_correction.mode = 'is' is not one of \['none', 'tis', 'mis', 'rejection'\]"),
    ({"rollout_correction.level": "batch"}, r"rollout_correction.level = 'batch' is not one of"),
    ({"trainer.recompute_proximal": "sometimes"}, r"trainer.recompute_proximal = 'sometimes' is not one of"),
    ({"trainer.recompute_proximal": "never", "rollout_correction.mode": "mis"},
     r"rollout_correction.mode mis compares .* trainer.recompute_proximal: never computes none"),
    ({"reward.max_failed_steps": -1}, r"reward.max_failed_steps must be >= 0"),
    ({"weightsync.sync_every": 3, "max_policy_age": 2}, r"sync_every = 3 .* set max_policy_age >= 3"),
    ({"trainer.procs": 4, "trainer.mini_batches": 64}, r"larger than the 32 sequences each of the trainer's 4 "
                                                       r"data-parallel slice"),
    ({"fill_rounds": 3, "filter_groups": False}, r"fill_rounds = 3 refills the groups filter_groups drops; set filter_groups: true"),
    ({"rollout_correction.mode": "tis", "loss": {"name": "tests.unit.custom_loss_example:ScaledReinforceLoss"}},
     r"tis needs a loss whose forward takes token_weights, and loss.name .* does not: add `token_weights=None`"),
])
def test_policy_update_settings_are_refused_before_any_worker_starts(overrides, match, tmp_path):
    config = write_plugin_config(tmp_path, ["tests.unit.custom_loss_example:ScaledReinforceLoss"])
    with pytest.raises(ValueError, match=match):
        load_config(config, {"prompts_per_step": 16, "group_size": 8, **overrides})


@pytest.mark.parametrize("overrides,match", [
    ({"sft.drop_carry": 0.5, "dataset.ops": "-"}, r"sft.drop_carry = 0.5 drops carries in generated sums, and "
                                                  r"dataset.kind 'arith' with ops '-' has none: use .*'\+' in dataset.ops"),
    ({"dataset.solution": "columns", "dataset.ops": "+-"}, r"dataset.solution: columns writes out sums of "
                                                           r"non-negative terms; set dataset.ops: '\+'"),
    ({"dataset.solution": "columns", "dataset.ops": "+", "sft.steps": 10, "sft.response": "target"},
     r"dataset.solution columns is working for the model to write, .* set sft.response: solution"),
])
def test_the_teacher_and_the_column_working_are_refused_where_they_cannot_apply(overrides, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, overrides)


def test_policy_update_settings_reach_the_trainer():
    from infra import components as C

    cfg = load_config("configs/grpo_math_tiny.yaml", {"trainer.mini_batches": 4, "trainer.epochs": 2,
                                                      "trainer.warmup_steps": 3, "rollout_correction.mode": "mis"})
    config, options = C.trainer_arguments(cfg)
    assert (config.mini_batches, config.epochs, config.optimizer_steps_per_step) == (4, 2, 8)
    assert (config.warmup_steps, options["total_steps"]) == (3, cfg.steps)  # RL steps; lr_factor scales them by 8
    assert cfg.rollout_correction.mode == "mis" and cfg.rollout_correction.cap == 2.0


def test_dr_grpo_loss_implies_mean_only_advantages_unless_set():
    assert load_config(None, {"loss.name": "dr_grpo"}).advantage.name == "dr_grpo"
    assert load_config(None, {"loss.name": "dr_grpo", "advantage.name": "rloo"}).advantage.name == "rloo"
    assert load_config(None, {"loss.name": "grpo"}).advantage.name == "grpo"


def test_a_config_with_a_password_is_written_only_for_its_owner(tmp_path):
    from infra.config import dump_config

    plain = dump_config(load_config("configs/grpo_math_tiny.yaml"), tmp_path / "plain.yaml")
    with open("configs/grpo_math_tiny.yaml") as f:  # the registry's host is one the file trusts (infra/hosts.py)
        trusting = write(tmp_path, f.read() + "trusted_hosts: ['db:5432']\n")
    secret = dump_config(load_config(trusting, {
        "tracking.registry_url": "postgresql://forgeflow:hunter2@db:5432/registry"}), tmp_path / "secret.yaml")
    assert plain.stat().st_mode & 0o777 == 0o644
    assert secret.stat().st_mode & 0o777 == 0o600 and "hunter2" in secret.read_text()  # resume needs it


def test_the_env_section_is_checked_with_the_key_and_the_fix():
    calc = "configs/grpo_calculator_tool.yaml"
    cfg = load_config(calc, {"env.num_replicas": 2})
    assert cfg.env.name == "calculator" and cfg.env.num_replicas == 2 and cfg.sft.tool_use == 0.4
    with pytest.raises(ValueError, match=r"unknown env.name 'calculater'; choose one of \['calculator'"):
        load_config(calc, {"env.name": "calculater"})
    with pytest.raises(ValueError, match="env.max_turns must be >= 1"):
        load_config(calc, {"env.max_turns": 0})
    with pytest.raises(ValueError, match=r"env.options \['allow_tool'\] do not fit env.name 'calculator'"):
        load_config(calc, {"env.options": {"allow_tool": False}})
    with pytest.raises(ValueError, match="sft.tool_use must be in"):
        load_config(calc, {"sft.tool_use": 1.5})
    with pytest.raises(ValueError, match=r"env.name = 'mypkg.envs:Maze' is an import path that the config file does not list"):
        load_config(calc, {"env.name": "mypkg.envs:Maze"})
    with pytest.raises(ValueError, match=r"do not fit env.name 'openenv'.*missing a required argument: 'url'"):
        load_config(calc, {"env.name": "openenv", "env.options": {}})
    with pytest.raises(ValueError, match="env.options.url is empty"):
        load_config(calc, {"env.name": "openenv", "env.options": {"url": ""}})
