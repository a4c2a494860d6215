"""What the vllm generator refuses before any engine starts (the engine itself: tests/integration/test_vllm_engine.py,
on vLLM's CPU build)."""

import pytest


def test_vllm_with_top_p_below_one_is_refused_at_load():
    from infra.config_checks import load_config

    with pytest.raises(ValueError, match=r"generator.backend vllm with generator.top_p = 0.9 .* set generator.top_p: "
                                         r"1.0 and generator.top_k: 0"):
        load_config("configs/grpo_qwen3_1_7b.yaml", {"generator.top_p": 0.9})


def test_on_cpu_the_kv_cache_is_given_in_bytes_never_as_a_share_of_host_memory(monkeypatch):
    """vLLM reads gpu_memory_utilization on CPU as a share of host memory and refuses to start when that much is
    not free (0.85 of 24 GB here)."""
    from forge_core.generation import vllm_generator as vg

    monkeypatch.setattr(vg, "on_cuda", lambda: False)
    assert vg.engine_memory(0.0, 0.85) == {"kv_cache_memory_bytes": int(vg.CPU_KV_CACHE_GB * vg.GiB)}
    assert vg.engine_memory(0.5, 0.85) == {"kv_cache_memory_bytes": vg.GiB // 2}
    monkeypatch.setattr(vg, "on_cuda", lambda: True)
    assert vg.engine_memory(0.0, 0.85) == {"gpu_memory_utilization": 0.85}


def test_a_tied_head_in_a_weight_file_is_the_embeddings_alias_and_anything_else_unknown_is_refused(tmp_path):
    """A trainer's state dict names `lm_head.weight` even when the head is tied; SmolLM2's checkpoint (tied) has no
    such tensor, and vLLM skips it on load."""
    import torch
    from safetensors.torch import save_file

    from forge_core.generation.vllm_generator import VLLMGenerator

    gen = VLLMGenerator.__new__(VLLMGenerator)
    gen.shapes, gen.policy_version = {"model.embed_tokens.weight": (10, 4), "model.norm.weight": (4,)}, 3
    save_file({"model.embed_tokens.weight": torch.zeros(10, 4), "lm_head.weight": torch.zeros(10, 4)},
              str(tmp_path / "tied.safetensors"))
    gen.check_tensors(tmp_path / "tied.safetensors", 4)
    save_file({"lm_head.weight": torch.zeros(11, 4)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match=r"policy version 5 .*lm_head.weight \(11, 4\).*still holds version 3"):
        gen.check_tensors(tmp_path / "bad.safetensors", 5)


def test_the_in_process_job_refuses_the_vllm_backend_rather_than_sampling_with_torch():
    from infra.config_checks import load_config
    from runtime.inprocess import run_main_job

    cfg = load_config("configs/grpo_math_tiny.yaml", {"generator.backend": "vllm"})
    with pytest.raises(ValueError, match=r"generator.backend 'vllm' runs in a generator worker; --in-process"):
        run_main_job(cfg, show=False)
