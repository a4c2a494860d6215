"""One RL step's policy update: proximal logprobs, rollout correction, then `epochs` passes over `mini_batches`
shuffled mini-batches, each one optimizer step (made of micro-batches, normalised over its own tokens).

Three policies are kept apart: behaviour (the generator's logprobs in targets["old_logprobs"]), proximal (the
trainer's weights at the start of the step, computed once without gradient when it can differ from behaviour) and
current (what is being trained). PPO-style clipping is current / proximal; rollout correction is proximal / behaviour;
the unbiased KL's weight is current / behaviour (targets["behaviour_logprobs"], on every branch).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from forge_core.seeding import step_seed
from forge_core.training.batching import episodes_to_train_inputs
from forge_core.training.correction import RolloutCorrection, correct_rollout
from forge_core.training.trainer import Trainer, accepts_keyword, loss_mask_of
from forge_core.types import Episode

StepFn = Callable[[list[dict], dict], dict[str, float]]  # one optimizer step on (inputs, targets) -> its metrics
# scores a whole batch with one of the trainer's scoring methods (proximal_logprobs, reference_logprobs): (method,
# inputs, padding_mask [B, T]) -> logprobs [B, T]; a sharded trainer has each rank score its share and gathers
ScoreFn = Callable[[Callable, list[dict], torch.Tensor], torch.Tensor]
SUMMARISED_MAX = ("clip_frac", "ratio_", "kl", "entropy", "grad_norm")  # keys that also get a `_max` over steps


def accepts_token_weights(loss) -> bool:
    """Whether a loss module (or class) names `token_weights` in its forward (TIS needs it; `**kwargs` does not
    count: such a loss would drop the weights without a word)."""
    return accepts_keyword(loss, "token_weights")


def score_whole_batch(method: Callable, inputs: list[dict], padding_mask: torch.Tensor) -> torch.Tensor:
    """The one-process ScoreFn: `method` on every row."""
    return method(inputs, padding_mask)


def needs_proximal(mini_batches: int, epochs: int, stale: bool, correction: RolloutCorrection,
                   recompute: str = "auto") -> bool:
    """Whether the trainer computes the proximal policy's logprobs before the step (trainer.recompute_proximal):
    auto when it can differ from the current policy at the first optimizer step, always, or never."""
    if recompute != "auto":
        return recompute == "always"
    return mini_batches * epochs > 1 or stale or correction.enabled


def mini_batch_rows(num_rows: int, mini_batches: int, seed: int) -> list[torch.Tensor]:
    """Row indices of each mini-batch: a seeded shuffle split into min(mini_batches, rows) near-equal parts."""
    if mini_batches == 1:
        return [torch.arange(num_rows)]
    order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed))
    return [part for part in torch.tensor_split(order, min(mini_batches, num_rows)) if part.numel()]


def select_rows(inputs: list[dict], targets: dict, rows: torch.Tensor) -> tuple[list[dict], dict]:
    """The rows `rows` of a batch in the Trainer contract."""
    picked = {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in targets.items()}
    return [inputs[i] for i in rows.tolist()], picked


def summarise_steps(per_step: list[dict[str, float]], epochs: int) -> dict[str, float]:
    """Mean of each metric over the optimizer steps (and the max of ratio/clip/KL/entropy/grad-norm ones)."""
    made = [m for m in per_step if not m.get("skipped")]  # a step with every token masked is not made
    keys = sorted({k for m in made for k in m})
    out: dict[str, float] = {} if made else {"loss": 0.0}
    for k in keys:
        values = [m[k] for m in made if k in m]
        if k == "num_tokens":  # the batch's tokens: every epoch sees all of them once
            out[k] = sum(values) / epochs
            continue
        out[k] = sum(values) / len(values)
        if any(tag in k for tag in SUMMARISED_MAX):
            out[f"{k}_max"] = max(values)
    out["optimizer_steps"] = float(len(made))
    out["skipped"] = float(len(per_step) - len(made))
    return out


def update_policy(trainer, inputs: list[dict], targets: dict, *, seed: int, stale: bool = False,
                  correction: RolloutCorrection | None = None, step_fn: StepFn | None = None,
                  step: int | None = None, score_fn: ScoreFn | None = None) -> dict[str, float]:
    """All optimizer steps of RL step `step` on a batch (inputs/targets in the Trainer contract, targets'
    old_logprobs = behaviour [B, T]). Returns the steps' loss metrics (unprefixed) plus rollout/* correction metrics.
    `step_fn` runs one optimizer step (default: trainer.train_step; a sharded trainer all-reduces normalisers);
    `score_fn` computes the reference and proximal logprobs (default: every row here; a sharded trainer's ranks
    each score their share)."""
    s = trainer.config
    step_fn = step_fn or (lambda i, t: (trainer.train_step(i, t), dict(trainer.metrics))[1])
    targets, extra = policies_of_step(trainer, inputs, targets, correction or RolloutCorrection(), stale,
                                      score_fn or score_whole_batch)
    planned = s.mini_batches * s.epochs
    if s.mini_batches == 1 and s.epochs == 1:
        place(trainer, step, 0, planned)
        per_step = [step_fn(inputs, targets)]  # today's single step, untouched
    else:
        per_step = []
        for epoch in range(s.epochs):
            for i, rows in enumerate(mini_batch_rows(len(inputs), s.mini_batches, seed + 104_729 * epoch)):
                place(trainer, step, epoch * s.mini_batches + i, planned)
                per_step.append(step_fn(*select_rows(inputs, targets, rows)))
    return {**summarise_steps(per_step, s.epochs), **extra}


def policies_of_step(trainer, inputs: list[dict], targets: dict, correction: RolloutCorrection, stale: bool,
                     score: ScoreFn) -> tuple[dict, dict[str, float]]:
    """(targets with the reference (LoRA), proximal (old_logprobs) and behaviour logprobs the step trains
    against, and rollout correction's weights/mask; rollout/* metrics measured here)."""
    if getattr(trainer, "reference_from_base", False) and targets.get("ref_logprobs") is None:
        targets = {**targets, "ref_logprobs": score(trainer.reference_logprobs, inputs, targets["padding_mask"])}
    behaviour = targets.get("old_logprobs")
    if behaviour is None:
        return targets, {}
    check_kl_weight(trainer.loss_fn)
    recompute = trainer.config.recompute_proximal
    # every branch carries the sampler's logprobs: the unbiased KL weighs by them (not by a recomputed proximal)
    targets = {**targets, "behaviour_logprobs": behaviour}
    if recompute == "never":
        # the generator's logprobs stand in for the proximal policy's (no correction can be made without it); the
        # trainer still reports how far they are from its own
        if correction.enabled:
            raise ValueError("trainer.recompute_proximal: never leaves no proximal policy for rollout_correction to "
                             "compare with the behaviour one; use auto, or rollout_correction.mode: none")
        return targets, {}
    if not needs_proximal(trainer.config.mini_batches, trainer.config.epochs, stale, correction, recompute):
        # one on-policy optimizer step: the proximal policy is the current one at the start of the step, so the
        # ratio is π_θ / sg(π_θ) (value 1) and not π_θ / μ_generator, which a bf16 or another engine's generator
        # would make noise that clips tokens; the trainer still reports the behaviour/proximal mismatch
        return {**targets, "old_logprobs": None}, {}
    proximal = score(trainer.proximal_logprobs, inputs, targets["padding_mask"].bool()).to(behaviour.device)
    # inserted (environment) tokens have no behaviour logprob: they never enter the correction or its metrics
    fix = correct_rollout(proximal, behaviour, loss_mask_of(targets), correction)
    # the mismatch is measured here, against the proximal policy: the optimizer steps do not measure it again
    targets = {**targets, "old_logprobs": proximal, "proximal_recomputed": True}
    targets["loss_mask"] = fix.mask  # ⊆ the loss mask it was given; padding_mask still locates the response
    if fix.token_weights is not None:
        if not accepts_token_weights(trainer.loss_fn):
            raise ValueError(f"rollout_correction.mode {correction.mode} needs a loss whose forward takes "
                             f"token_weights; {type(trainer.loss_fn).__name__} does not — add the argument or "
                             "use mode: rejection")
        targets["token_weights"] = fix.token_weights
    return targets, fix.metrics


def check_kl_weight(loss) -> None:
    """Refuse loss.kl_gradient: unbiased with a KL term in a loss whose forward cannot take the behaviour logprobs
    its weight needs (it would weigh by the proximal policy, which did not sample the tokens)."""
    if getattr(loss, "kl_gradient", "standard") != "unbiased" or not getattr(loss, "beta", 0.0):
        return
    if not accepts_keyword(loss, "behaviour_logprobs"):
        raise ValueError(f"loss.kl_gradient: unbiased weighs the KL by the behaviour policy that sampled the tokens, "
                         f"and {type(loss).__name__}.forward takes no behaviour_logprobs — add the keyword and pass "
                         "it to add_kl, or set loss.kl_gradient: standard")


def place(trainer, step: int | None, index: int, planned: int) -> None:
    """Put optimizer step `index` of the `planned` ones of RL step `step` on the lr schedule at step + index /
    planned (None: leave the trainer's own count), so the schedule ends with the run whatever steps are skipped."""
    if step is not None:
        trainer.position = step + index / planned


def train_on_episodes(trainer: Trainer, episodes: list[Episode], pad_id: int, *, step: int = 0, seed: int = 0,
                      correction: RolloutCorrection | None = None, stale: bool | None = None,
                      step_fn: StepFn | None = None, score_fn: ScoreFn | None = None) -> dict[str, float]:
    """Step `step`'s policy update on the episodes (mini-batches × epochs optimizer steps, proximal logprobs and
    rollout correction when configured); loss/* and rollout/* metrics (empty batch: no step). `stale` defaults to
    whether any episode was sampled by a version older than `step` (the trainer's current one)."""
    if not episodes:
        return {"loss/skipped": 1.0}
    inputs, targets = episodes_to_train_inputs(episodes, pad_id)
    if stale is None:
        stale = any(e.completion.policy_version < step for e in episodes)
    metrics = update_policy(trainer, inputs, targets, seed=step_seed(seed, step, salt=2), stale=stale,
                            correction=correction, step_fn=step_fn, step=step, score_fn=score_fn)
    return {k if k.startswith("rollout/") else f"loss/{k}": v for k, v in metrics.items()}
