"""The SFT cache: an identical warm-up is reused, a changed SFT setting trains again, a corrupted entry is refused."""

import logging

from infra import sft_cache
from infra.checkpoints import file_sha256
from infra.config_checks import load_config

TINY = {"model.path": "tiny:qwen3-micro", "sft.steps": 3, "sft.batch_size": 8, "steps": 1, "prompts_per_step": 2,
        "group_size": 2, "eval.num_prompts": 4, "eval.samples": 0, "dataset.train_size": 64, "threads": 1}


def fake_checkpoint(tmp_path):
    folder = tmp_path / "sft"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    (folder / "model.safetensors").write_bytes(b"weights" * 100)
    return folder


def test_an_identical_warm_up_is_found_and_a_changed_sft_setting_misses(tmp_path):
    cfg = load_config("configs/grpo_math_tiny.yaml", TINY)
    inputs = sft_cache.sft_inputs(cfg, "fingerprint")
    assert sft_cache.lookup(inputs, tmp_path / "cache") is None
    entry = sft_cache.store(fake_checkpoint(tmp_path), inputs, "run-sft", tmp_path / "cache")
    hit = sft_cache.lookup(inputs, tmp_path / "cache")
    assert hit.path == entry and hit.source_run == "run-sft" and (entry / "model.safetensors").is_file()
    changed = sft_cache.sft_inputs(load_config("configs/grpo_math_tiny.yaml", {**TINY, "sft.lr": 1e-4}), "fingerprint")
    assert sft_cache.cache_key(changed) != sft_cache.cache_key(inputs)
    assert sft_cache.lookup(changed, tmp_path / "cache") is None
    other_data = sft_cache.sft_inputs(cfg, "another-fingerprint")
    assert sft_cache.lookup(other_data, tmp_path / "cache") is None
    # what only RL reads does not touch the warm-up
    rl_only = load_config("configs/grpo_math_tiny.yaml", {**TINY, "loss.name": "gspo", "trainer.lr": 3e-6})
    assert sft_cache.cache_key(sft_cache.sft_inputs(rl_only, "fingerprint")) == sft_cache.cache_key(inputs)


def test_a_corrupted_entry_is_not_used_and_is_moved_aside(tmp_path, caplog):
    cfg = load_config("configs/grpo_math_tiny.yaml", TINY)
    inputs = sft_cache.sft_inputs(cfg, "fingerprint")
    entry = sft_cache.store(fake_checkpoint(tmp_path), inputs, "run-sft", tmp_path / "cache")
    (entry / "model.safetensors").write_bytes(b"flipped" * 100)
    with caplog.at_level(logging.WARNING, logger="infra.sft_cache"):
        assert sft_cache.lookup(inputs, tmp_path / "cache") is None
    (aside,) = (tmp_path / "cache").glob(f"{entry.name}.corrupted-*")
    assert not entry.exists() and "model.safetensors" in caplog.text and str(aside) in caplog.text
    (tmp_path / "again").mkdir()
    again = sft_cache.store(fake_checkpoint(tmp_path / "again"), inputs, "run2-sft", tmp_path / "cache")
    assert sft_cache.lookup(inputs, tmp_path / "cache").path == again  # a fresh warm-up is cached in its place


def test_a_second_in_process_run_starts_from_the_cached_warm_up(tmp_path, monkeypatch, caplog):
    from runtime.inprocess import run_main_job

    monkeypatch.setenv("FORGEFLOW_HOME", str(tmp_path))
    cfg = load_config("configs/grpo_math_tiny.yaml", TINY)
    first = run_main_job(cfg, show=False)
    assert (tmp_path / "runs" / first["run_id"] / "sft" / "config.json").is_file()
    (entry,) = sft_cache.cache_root().iterdir()
    with caplog.at_level(logging.INFO, logger="runtime.inprocess"):
        second = run_main_job(cfg, show=False)
    assert "SFT cache hit" in caplog.text and str(entry) in caplog.text
    assert not (tmp_path / "runs" / second["run_id"] / "sft").exists()  # no SFT trained the second time
    trained = tmp_path / "runs" / first["run_id"] / "sft" / "model.safetensors"
    assert file_sha256(entry / "model.safetensors") == file_sha256(trained)  # the cache holds the first warm-up
    uncached = load_config("configs/grpo_math_tiny.yaml", {**TINY, "sft.cache": False})
    third = run_main_job(uncached, show=False)
    assert (tmp_path / "runs" / third["run_id"] / "sft" / "config.json").is_file()
