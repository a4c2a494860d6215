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
