"""Causal LMs and tokenizers: tiny local presets, HF loading and saving."""

from forge_core.models.loading import (
    TINY_PRESETS,
    build_tiny_model,
    load_model_and_tokenizer,
    load_tokenizer,
    save_model_and_tokenizer,
)
from forge_core.models.tokenizer import build_char_tokenizer

__all__ = ["TINY_PRESETS", "build_char_tokenizer", "build_tiny_model", "load_model_and_tokenizer",
           "load_tokenizer", "save_model_and_tokenizer"]
