"""LoRA: low-rank adapters on a causal LM's linear layers (config section `trainer.lora`; rank 0 = full fine-tuning).

Our own layers rather than PEFT's: the wrapped model keeps running through forge_core's decoder and fused LM head
(the head stays a plain Linear), `merged_state_dict` gives generators plain HF keys in one pass without copying the
model, and `adapters_disabled` gives the reference policy from the same weights. No dependency is added.

One rule for the reference: it is the model a training phase starts from. `apply_lora` on a model that already has
adapters (SFT with LoRA, then RL on the same model in one process) merges them first and starts fresh ones, so that
"adapters off" is the SFT model, exactly what a process that reloads the saved (merged) SFT model gets. This is
option 2 of TRL's "Reference model considerations with PEFT" (docs/source/dpo_trainer.md): merge the adapter into
the base model, create another adapter on top, and let the adapter-less model be the reference.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field

import torch
from torch import nn

log = logging.getLogger(__name__)

# the attention and MLP projections of Llama/Qwen-style decoders (the LM head and embeddings stay frozen)
DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoRAConfig:
    """trainer.lora: {rank, alpha, dropout, target_modules}; rank 0 trains every weight (no adapters)."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def check(self, where: str = "trainer.lora") -> None:
        """ValueError naming the key and the fix for a value that cannot work."""
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"{where}.rank must be an integer >= 0 (0 = full fine-tuning, e.g. 8 for adapters); "
                             f"got {self.rank!r}")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"{where}.alpha must be a number > 0 (the adapters' scale is alpha / rank); "
                             f"got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{where}.dropout must be in [0, 1); got {self.dropout!r}")
        if self.enabled and (not self.target_modules or not all(isinstance(t, str) for t in self.target_modules)):
            raise ValueError(f"{where}.target_modules must list module names, e.g. {DEFAULT_TARGETS}; "
                             f"got {self.target_modules!r}")


class LoRALinear(nn.Module):
    """base(x) + (dropout(x) Aᵀ Bᵀ) · alpha / rank, with the base Linear frozen; B starts at zero, so the wrapped
    model starts as the base model. A: [rank, in], B: [out, rank]."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, dtype=base.weight.dtype,
                                               device=base.weight.device))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype,
                                               device=base.weight.device))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear initialises its weight
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.disabled = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        if self.disabled:
            return out
        return out + (self.dropout(x) @ self.lora_A.t().to(x.dtype)) @ (self.lora_B.t() * self.scale).to(x.dtype)


def apply_lora(model: nn.Module, cfg: LoRAConfig) -> nn.Module:
    """Wrap every nn.Linear whose name ends in one of cfg.target_modules in a LoRALinear and freeze every other
    parameter (in place; returns the model). Adapters the model already has are merged first (`merge_lora`): the
    new adapters start from the model as it is, which is then the reference. ValueError when no module matches."""
    cfg.check()
    if not cfg.enabled:
        return model
    if has_lora(model):  # SFT then RL on the same model: RL's reference is the SFT model, not the one before SFT
        log.info("merging the model's LoRA adapters into its weights before adding fresh ones")
        merge_lora(model)
    model.requires_grad_(False)
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in cfg.target_modules]
    if not targets:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(f"trainer.lora.target_modules {cfg.target_modules} matches no linear layer of this model; "
                         f"its linear layers are named {linear}")
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(module, cfg.rank, cfg.alpha, cfg.dropout))
    return model


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights with every adapter merged, under the plain model's keys (what an HF model, a generator
    or the weight store expects); tensors of unwrapped modules are the model's own (no copy)."""
    scales = {m.scale for m in model.modules() if isinstance(m, LoRALinear)}
    assert len(scales) <= 1, "apply_lora gives every adapter the same scale"
    return merge_lora_state(model.state_dict(), scales.pop() if scales else 1.0)


def merge_lora_state(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A state dict of a LoRA-wrapped model (`X.base.weight`, `X.lora_A`, `X.lora_B`, … full tensors, e.g. gathered
    from FSDP shards) as the plain model's (`X.weight = W + B A · scale`, in W's dtype); other entries unchanged."""
    adapted = {k[: -len(".lora_A")] for k in state if k.endswith(".lora_A")}
    merged: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        owner, _, leaf = key.rpartition(".")
        if owner in adapted and leaf in ("lora_A", "lora_B"):
            continue
        module, _, base = owner.rpartition(".")
        if base == "base" and module in adapted:  # X.base.weight / X.base.bias -> X.weight / X.bias
            if leaf == "weight":
                value = merged_weight(value, state[f"{module}.lora_A"], state[f"{module}.lora_B"], scale)
            merged[f"{module}.{leaf}"] = value
        else:
            merged[key] = value
    return merged


def merged_weight(weight: torch.Tensor, lora_A: torch.Tensor, lora_B: torch.Tensor, scale: float) -> torch.Tensor:
    """W + B A · scale in W's dtype (computed in fp32). weight: [out, in], lora_A: [rank, in], lora_B: [out, rank]."""
    return (weight.float() + (lora_B.float() @ lora_A.float()) * scale).to(weight.dtype)


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base Linear (the same arithmetic as `merged_state_dict`) and put the Linear back
    in its place, in place: the model becomes the plain model it computed, every parameter trainable as in a model
    loaded from disk. Returns the model (unchanged when it has no adapters)."""
    wrapped = [(name, m) for name, m in model.named_modules() if isinstance(m, LoRALinear)]
    for name, m in wrapped:
        m.base.weight.copy_(merged_weight(m.base.weight, m.lora_A, m.lora_B, m.scale))
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, m.base)
    return model.requires_grad_(True) if wrapped else model


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """Run the base model (every adapter off) inside the block: the reference policy of a LoRA run."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for m in layers:
        m.disabled = True
    try:
        yield model
    finally:
        for m in layers:
            m.disabled = False


def plain_model(model: nn.Module) -> nn.Module:
    """`model` itself when it has no adapters, else a new model of its class with the adapters merged (what
    `save_pretrained` writes and `from_pretrained` reads back without forgeflow)."""
    if not has_lora(model):
        return model
    plain = type(model)(model.config)
    plain.load_state_dict(merged_state_dict(model))
    return plain.to(next(model.parameters()).dtype)
