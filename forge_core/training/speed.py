"""Speed knobs on an HF causal LM before it is trained: activation checkpointing and torch.compile per layer."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def prepare_for_training(model, activation_checkpointing: str = "none", compile_layers: bool = False):
    """Recompute each decoder layer in the backward (`full`: activations of one layer at a time, for longer
    sequences or larger micro-batches at ~1/3 more compute) and/or torch.compile each decoder layer in place.
    Returns the model (the same object)."""
    if activation_checkpointing not in ("none", "full"):
        raise ValueError(f"activation_checkpointing {activation_checkpointing!r}: an HF model supports none or "
                         "full (selective needs trainer.backend: titan)")
    layers = decoder_layers(model)
    if activation_checkpointing == "full":
        # non-reentrant: works with FSDP2 and with inputs that do not require grad; transformers 5 renamed the call
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if compile_layers:
        for layer in layers:
            layer.compile()
        log.info("torch.compile on %d decoder layers (compiled on first use)", len(layers))
    return model


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layers of an HF causal LM (model.model.layers for the Llama/Qwen family)."""
    decoder = getattr(model, "get_decoder", lambda: None)()
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no decoder layers where an HF causal LM keeps them "
                         "(model.model.layers); leave trainer.compile false for it")
    return layers
