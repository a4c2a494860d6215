"""Build, load and save causal LMs with their tokenizers (HF format on disk; tiny presets built locally)."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

# Tiny Qwen3-architecture presets: small enough to train on two CPU cores.
TINY_PRESETS: dict[str, dict] = {
    "qwen3-arith": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64, max_position_embeddings=512),
    "qwen3-micro": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, max_position_embeddings=256),
}
# untied embedding and head, as the 4B+ Qwen3 models: what tensor and pipeline parallelism need
TINY_PRESETS["qwen3-arith-untied"] = dict(TINY_PRESETS["qwen3-arith"], tie_word_embeddings=False)
TINY_PREFIX = "tiny:"
SOURCES_HINT = ("use a local HF directory, a reachable hub id, a named model such as smollm2-135m-instruct, or a tiny "
                "preset such as tiny:qwen3-arith")


def cache_keyword(module) -> str | None:
    """The name under which an HF model's (or decoder's) forward takes its key/value cache: `cache` in transformers
    5.x, `past_key_values` before; None when it takes none."""
    params = inspect.signature(module.forward).parameters
    return next((k for k in ("cache", "past_key_values") if k in params), None)


def check_tiny_preset(preset: str) -> None:
    """ValueError naming the known presets when `preset` is not one of them."""
    if preset not in TINY_PRESETS:
        raise ValueError(f"unknown tiny preset {preset!r}; choose one of {sorted(TINY_PRESETS)} (model.path: tiny:NAME)")


def build_tiny_model(preset: str, tokenizer, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A randomly initialised Qwen3ForCausalLM of a named preset, sized to `tokenizer`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    check_tiny_preset(preset)
    config = Qwen3Config(
        vocab_size=len(tokenizer), rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        **{"tie_word_embeddings": True, **TINY_PRESETS[preset]},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model.to(dtype)


def load_tokenizer(path: str):
    """The tokenizer of `tiny:PRESET`, a named model (imported once), a local HF directory, or a hub id, without
    loading the model's weights; a tokenizer without a pad token pads with its eos."""
    from transformers import AutoTokenizer

    from forge_core.models.catalog import resolve_model_path
    from forge_core.models.tokenizer import build_char_tokenizer

    path = resolve_model_path(path)
    if path.startswith(TINY_PREFIX):
        check_tiny_preset(path[len(TINY_PREFIX):])
        return build_char_tokenizer()
    local = Path(path)
    if local.exists() and not (local / "config.json").exists():
        raise ValueError(f"model.path {path!r} is a directory without config.json; point it at a HF model directory")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise ValueError(f"model.path {path!r}: no tokenizer could be loaded ({exc}); {SOURCES_HINT}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_model_and_tokenizer(path: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from `tiny:PRESET`, a named model (imported once), a local HF directory, or a hub id
    (needs network)."""
    from transformers import AutoModelForCausalLM

    from forge_core.models.catalog import resolve_model_path

    path = resolve_model_path(path)
    tokenizer = load_tokenizer(path)
    if path.startswith(TINY_PREFIX):
        return build_tiny_model(path[len(TINY_PREFIX):], tokenizer, seed=seed, dtype=dtype), tokenizer
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as exc:
        raise ValueError(f"model.path {path!r} could not be loaded ({exc}); {SOURCES_HINT}") from exc
    return model, tokenizer


def save_model_and_tokenizer(model, tokenizer, out: str | Path) -> Path:
    """Save in HF format (safetensors + config + tokenizer) so `transformers` opens the directory directly."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
