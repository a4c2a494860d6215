"""FSDP2 helpers for a multi-rank trainer: shard a HF causal LM, gather its full state dict."""

from __future__ import annotations

import torch
import torch.distributed as dist


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """`fully_shard` each decoder layer, then the root; gradients are summed across ranks (not averaged) because
    every rank's loss is already divided by the whole batch's token count."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", model), "layers", [])
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    gloo = dist.get_backend() == "gloo"
    for module in [*layers, model]:
        module.set_gradient_divide_factor(1.0)
        if gloo:  # gloo has no AVG/PREMUL_SUM reductions
            module.set_force_sum_reduction_for_comms(True)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on CPU (collective: every rank must call it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
