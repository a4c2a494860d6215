"""Trainer: micro-batched policy-gradient (or SFT) steps with a global token normaliser, clipping and schedules."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from forge_core.models.lora import adapters_disabled
from forge_core.seeding import restore_rng_states, rng_states
from forge_core.training.batching import collate
from forge_core.training.config import TrainerConfig
from forge_core.training.correction import mismatch_tensors
from forge_core.training.logprobs import sequence_logprobs
from forge_core.training.shared_prompts import can_share_prompts, shared_prompt_logprobs, split_shared_prompts
from forge_core.training.state_hash import state_sha256

log = logging.getLogger(__name__)

# AdamW's moment decay rates and epsilon (PyTorch's defaults; not config keys)
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
COMPUTE_DTYPES = (None, torch.bfloat16, torch.float32)


@dataclass
class StepTotals:
    """What a step adds up over its micro-batches: 0-dim tensors where they are computed (or floats), turned into
    floats by `read` in one host synchronisation per optimizer step."""

    loss: torch.Tensor | float = 0.0
    entropy: torch.Tensor | float = 0.0
    finite: torch.Tensor | bool = True
    weighted: dict[str, torch.Tensor | float] = field(default_factory=dict)
    maxima: dict[str, torch.Tensor | float] = field(default_factory=dict)

    def read(self, *extra: torch.Tensor) -> tuple[StepTotals, list[float]]:
        """(these totals as floats, the `extra` 0-dim tensors as floats), read from the device at once."""
        names = ["loss", "entropy", "finite", *(f"w:{k}" for k in self.weighted), *(f"m:{k}" for k in self.maxima)]
        values = [self.loss, self.entropy, self.finite, *self.weighted.values(), *self.maxima.values(), *extra]
        device = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
        flat = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device).reshape(()) for v in values])
        floats = flat.tolist()  # the one synchronisation
        got = dict(zip(names, floats, strict=False))
        totals = StepTotals(got["loss"], got["entropy"], bool(got["finite"]),
                            {k: got[f"w:{k}"] for k in self.weighted}, {k: got[f"m:{k}"] for k in self.maxima})
        return totals, floats[len(names):]


def add_mismatch(totals: StepTotals, current: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor,
                 num_tokens: float) -> None:
    """Add one micro-batch's behaviour/proximal mismatch (current logprobs [b, T] are the proximal ones on an
    on-policy step) to `totals`: rollout/behaviour_kl_k3 (token mean) and rollout/behaviour_logprob_diff_max."""
    mask = mask.bool()
    share = mask.sum() / num_tokens
    found = mismatch_tensors(current, behaviour.to(current.device), mask)
    key, top = "rollout/behaviour_kl_k3", "rollout/behaviour_logprob_diff_max"
    totals.weighted[key] = totals.weighted.get(key, 0.0) + share * found[key]
    totals.maxima[top] = torch.maximum(torch.as_tensor(totals.maxima.get(top, 0.0), device=found[top].device,
                                                       dtype=found[top].dtype), found[top])


def lr_factor(step: float, config: TrainerConfig, total_steps: int) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based; fractional when placed by RL progress): linear
    warmup then constant/cosine/linear. config.warmup_steps and `total_steps` count RL steps, each
    config.optimizer_steps_per_step optimizer steps."""
    per_step = config.optimizer_steps_per_step
    warmup, total = config.warmup_steps * per_step, total_steps * per_step
    if warmup and step < warmup:
        return (step + 1) / warmup
    if config.schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if config.schedule == "cosine" else 1.0 - progress
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * shape


class Trainer:
    """Owns the policy model, its AdamW optimizer and schedule; `train_step(inputs, targets) -> loss`.

    `config` is the trainer section; the rest comes from other sections: `total_steps` (RL steps, the schedule's
    horizon), `temperature` (the generator's, which the logprobs are taken at) and `compute_dtype` (mixed
    precision: forward/backward under autocast to it while the parameters, gradients and AdamW state stay in the
    model's own dtype; None computes in the parameters' dtype)."""

    def __init__(self, model, loss: torch.nn.Module, config: TrainerConfig, pad_id: int, *, total_steps: int = 0,
                 temperature: float = 1.0, compute_dtype: torch.dtype | None = None) -> None:
        config.check()
        if config.schedule != "constant" and total_steps <= 0:
            raise ValueError(f"trainer.schedule {config.schedule!r} needs a positive number of steps; got {total_steps}")
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute dtype {compute_dtype} is not supported: bfloat16 (fp32 master weights) or "
                             "float32; float16 would need loss scaling")
        if temperature <= 0:
            raise ValueError(f"the sampling temperature must be > 0 (generator.temperature); got {temperature}")
        self.model, self.loss_fn, self.config, self.pad_id = model, loss, config, pad_id
        self.total_steps, self.temperature, self.compute_dtype = total_steps, temperature, compute_dtype
        params = [p for p in model.parameters() if p.requires_grad]
        # the fused kernel on CUDA and on CPU: one pass over each tensor (on CPU 0.15 s instead of 0.7 s per step
        # for 135M parameters); other devices keep the default (foreach) implementation
        fused = True if params and all(p.device.type in ("cuda", "cpu") for p in params) else None
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, betas=ADAM_BETAS, eps=ADAM_EPS,
                                           weight_decay=config.weight_decay, fused=fused)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(step, config, total_steps))
        # where the next optimizer step falls in the run, in RL steps (update_policy sets it for each step it plans):
        # the schedule then follows the run's progress, not a count of optimizer steps that skipped or smaller
        # batches make fall short; None: the scheduler's count (SFT, direct callers)
        self.position: float | None = None
        self.step = 0
        self.metrics: dict[str, float] = {}
        # LoRA runs with a KL term: the reference policy is this model with its adapters off (no reference copy)
        self.reference_from_base = False

    def logprobs(self, inputs: list[dict], padding_mask: torch.Tensor, with_entropy: bool = False):
        """(logprobs [B, T], entropy or None) of the response tokens under the current weights."""
        entropy_grad = self.config.entropy_coef != 0
        if self.config.share_prompts and not self.config.pack and can_share_prompts(self.model):
            shared = split_shared_prompts(inputs, padding_mask, self.pad_id)
            with compute_precision(self.model, self.compute_dtype):
                return shared_prompt_logprobs(self.model, shared, self.temperature, with_entropy, entropy_grad)
        batch = collate(inputs, padding_mask, self.pad_id)
        with compute_precision(self.model, self.compute_dtype):
            return sequence_logprobs(self.model, batch.tokens, batch.attention_mask, batch.positions,
                                     self.temperature, with_entropy,
                                     entropy_grad=entropy_grad,
                                     pack_pad_id=self.pad_id if self.config.pack else None,
                                     response_mask=batch.response_mask)

    @torch.no_grad()
    def proximal_logprobs(self, inputs: list[dict], padding_mask: torch.Tensor) -> torch.Tensor:
        """Logprobs [B, T] of the response tokens under the weights of now (the proximal policy), micro-batched."""
        self.model.train()  # the same mode as the steps that follow (no dropout in these models either way)
        mb = self.config.micro_batch_size
        mask = padding_mask.bool()
        parts = [self.logprobs(inputs[i:i + mb], mask[i:i + mb])[0] for i in range(0, len(inputs), mb)]
        lp = torch.cat(parts, 0)
        return torch.where(mask.to(lp.device), lp, torch.zeros((), dtype=lp.dtype, device=lp.device))

    @torch.no_grad()
    def reference_logprobs(self, inputs: list[dict], padding_mask: torch.Tensor) -> torch.Tensor:
        """Logprobs [B, T] of the response tokens under the base model, every LoRA adapter off (the reference
        policy of a LoRA run), micro-batched."""
        with adapters_disabled(self.model):
            return self.proximal_logprobs(inputs, padding_mask)

    def train_step(self, inputs: list[dict], targets: dict, num_tokens: int | None = None,
                   num_seqs: int | None = None) -> float:
        """One optimizer step over the whole batch; returns the loss. targets: response/padding_mask [B, T],
        advantages [B] (or [B, T]), ref_logprobs/old_logprobs [B, T] or None; optional loss_mask [B, T] (tokens the
        loss keeps, padding_mask still locates the response), token_weights [B, T] (rollout correction) and
        behaviour_logprobs [B, T] (the sampler's: the unbiased KL's weight, and the behaviour/proximal mismatch this
        step reports unless proximal_recomputed says update_policy measured it).
        num_tokens/num_seqs override the normalisers when this batch is one rank's share of a larger one."""
        self.model.train()
        device = next(self.model.parameters()).device
        mask = targets["padding_mask"].bool()  # stays on the host: collate reads its row lengths there
        targets = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in targets.items()}
        loss_mask = loss_mask_of(targets)
        if num_tokens is None or num_seqs is None:  # this batch's own normalisers, read in one synchronisation
            kept, seqs = torch.stack([loss_mask.sum(), (loss_mask.sum(-1) > 0).sum()]).tolist()
            num_tokens, num_seqs = num_tokens if num_tokens is not None else kept, num_seqs or max(seqs, 1)
        if self.skips(num_tokens):
            return 0.0
        mb = self.config.micro_batch_size
        self.optimizer.zero_grad(set_to_none=True)
        totals = StepTotals()
        measure = not targets.get("proximal_recomputed", False)
        for start in range(0, len(inputs), mb):
            sl = slice(start, start + mb)
            lp, ent = self.logprobs(inputs[sl], mask[sl], with_entropy=True)
            behaviour = pick(targets, "behaviour_logprobs", sl)
            loss = self.micro_batch_loss(lp, ent, loss_mask[sl], pick(targets, "ref_logprobs", sl),
                                         pick(targets, "advantages", sl), pick(targets, "old_logprobs", sl),
                                         num_tokens, num_seqs, totals, pick(targets, "token_weights", sl),
                                         behaviour_logprobs=behaviour)
            if behaviour is not None and measure:
                add_mismatch(totals, lp.detach(), behaviour, loss_mask[sl], num_tokens)
            loss.backward()  # a non-finite loss is refused below, before the optimizer step
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.config.max_norm if self.config.max_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.zeros((), device=device)
        # sharded (DTensor) parameters give a DTensor norm; its full value is the global norm
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        # every metric of the step, and whether every rank's loss was finite, in one host synchronisation
        totals, (grad_norm, finite_everywhere) = totals.read(grad_norm, all_ranks_min(totals.finite, device))
        if not finite_everywhere:
            self.optimizer.zero_grad(set_to_none=True)
            raise RuntimeError(f"non-finite loss ({totals.loss}) at step {self.step}"
                               f"{'' if totals.finite else ' on this rank'}; weights left unchanged — lower "
                               "trainer.lr or check the rewards/advantages")
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise RuntimeError(f"non-finite gradient norm at step {self.step}; weights left unchanged — lower trainer.lr")
        lr = self.apply_lr()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.metrics = {"loss": totals.loss, "grad_norm": grad_norm, "lr": lr, "entropy": totals.entropy / num_tokens,
                        "num_tokens": float(num_tokens), **totals.weighted, **totals.maxima}
        return totals.loss

    def skips(self, num_tokens: float) -> bool:
        """Whether this optimizer step has no token to learn from (`num_tokens` kept in the whole batch is 0: every
        one masked): then it is not made, as AdamW's momentum alone would still move the weights; metrics say
        `skipped`."""
        if num_tokens > 0:
            return False
        self.metrics = {"loss": 0.0, "num_tokens": 0.0, "skipped": 1.0}
        return True

    def apply_lr(self) -> float:
        """Set the lr of the optimizer step about to be made (at self.position when set) and return it."""
        if self.position is not None:
            factor = lr_factor(self.position * self.config.optimizer_steps_per_step, self.config, self.total_steps)
            for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
                group["lr"] = base * factor
        return self.optimizer.param_groups[0]["lr"]

    def micro_batch_loss(self, logprobs, entropy, mask, ref_logprobs, advantages, old_logprobs, num_tokens: float,
                         num_seqs: float, totals: StepTotals, token_weights=None, *,
                         behaviour_logprobs=None) -> torch.Tensor:
        """The loss of one micro-batch from its logprobs/entropy [b, T] (global normalisers, entropy bonus); adds its
        loss, entropy and the loss's diagnostics (weighted by its share of the tokens) to `totals`. token_weights
        [b, T] reach the loss only when given: losses written before rollout correction never see the keyword;
        behaviour_logprobs [b, T] reach a loss whose forward names them (the unbiased KL's weight)."""
        extra = {} if token_weights is None else {"token_weights": token_weights}
        if behaviour_logprobs is not None and accepts_keyword(self.loss_fn, "behaviour_logprobs"):
            extra["behaviour_logprobs"] = behaviour_logprobs
        loss = self.loss_fn(logprobs, ref_logprobs, advantages, mask, old_logprobs=old_logprobs,
                            num_tokens=num_tokens, num_seqs=num_seqs, **extra)
        ent_tokens = torch.where(mask, entropy, torch.zeros_like(entropy)).sum()
        if self.config.entropy_coef:
            loss = loss - self.config.entropy_coef * ent_tokens / num_tokens
        totals.finite = torch.isfinite(loss.detach()) & totals.finite
        totals.loss = totals.loss + loss.detach()
        totals.entropy = totals.entropy + ent_tokens.detach()
        share = mask.sum() / num_tokens
        for k, v in getattr(self.loss_fn, "metrics", {}).items():
            totals.weighted[k] = totals.weighted.get(k, 0.0) + share * v
        return loss

    def state_dict(self) -> dict:
        """Model, optimizer, scheduler, step and RNG states: enough to resume exactly."""
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "step": self.step,
            "rng": rng_states(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore everything `state_dict` saved."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        restore_rng_states(state["rng"])

    def save(self, path) -> str:
        """Write `state_dict()` atomically to `path`; returns its canonical `state_sha256`."""
        state = self.state_dict()
        save_atomically(state, path)
        return state_sha256(state)

    def load(self, path) -> None:
        device = next(self.model.parameters()).device
        self.load_state_dict(torch.load(path, weights_only=False, map_location=device))


def compute_precision(model, dtype: torch.dtype | None):
    """Autocast to `dtype` on the model's device when it is lower than the parameters' (the matmuls run in bf16,
    the weights they read stay fp32 and get fp32 gradients); a no-op otherwise. logprobs promote to fp32 after."""
    param = next(model.parameters())
    if dtype is None or dtype == param.dtype:
        return contextlib.nullcontext()
    return torch.autocast(param.device.type, dtype=dtype)


def save_atomically(obj, path) -> None:
    """torch.save to a temporary name, fsync, rename: `path` is either the old file or the complete new one; a
    failed write (disk full…) removes the partial file and raises."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with tmp.open("wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it visible
    except (OSError, RuntimeError) as exc:  # torch reports a full disk as a RuntimeError from its zip writer
        tmp.unlink(missing_ok=True)
        raise OSError(f"could not write {path} ({exc}); the previous file is unchanged — free space on "
                      f"{path.parent} (or point FORGEFLOW_HOME elsewhere) and resume") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def accepts_keyword(loss, name: str) -> bool:
    """Whether a loss module (or class) names `name` in its forward (`**kwargs` does not count: such a loss would
    drop the value without a word)."""
    forward = loss.forward if hasattr(loss, "forward") else loss
    return name in inspect.signature(forward).parameters


def loss_mask_of(targets: dict) -> torch.Tensor:
    """The tokens the loss keeps [B, T]: padding_mask, narrowed by loss_mask when rollout correction masks some."""
    mask = targets["padding_mask"].bool()
    extra = targets.get("loss_mask")
    return mask if extra is None else mask & extra.bool().to(mask.device)


def all_ranks_min(flag: torch.Tensor | bool, device: torch.device) -> torch.Tensor:
    """`flag` (a 0-dim tensor or bool) as a float tensor, all-reduced with MIN over the ranks of a multi-rank
    trainer (no host synchronisation): all ranks then raise together instead of one raising while the others wait
    in the next collective."""
    value = torch.as_tensor(flag, dtype=torch.float32, device=device).reshape(1)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return value.reshape(())


def pick(targets: dict, key: str, sl: slice):
    """targets[key][sl], or None when absent."""
    value = targets.get(key)
    return None if value is None else value[sl]
