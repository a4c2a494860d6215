"""On-policy distillation: a teacher model scores every token the student sampled, and the per-token reverse KL
becomes a dense advantage (Agarwal et al. 2024, "On-Policy Distillation of Language Models", arXiv:2306.13649;
Thinking Machines, "On-Policy Distillation", 2025; the Qwen3 report, arXiv:2505.09388).

For each generated token y_t of a student sample (behaviour policy π_s, teacher π_t, both at the sampling
temperature):

    A_t = -coef · (log π_s(y_t) - log π_t(y_t))  +  reward_weight · A_group

with no discounting; tokens an environment inserted (loss_mask 0) get 0. The sum over t of
log π_s(y_t) - log π_t(y_t) is a one-sample estimate of KL(π_s ‖ π_t) (the reverse KL): pushing the policy up along
A_t lowers it. The advantage then goes through the configured loss and rollout correction unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from forge_core.types import Episode, Group

DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class DistillConfig:
    """Config section `distill`: the teacher and how its signal is mixed with the task reward (teacher empty: off)."""

    # a model directory, a run id or run name (that run's latest complete checkpoint), or a catalog name
    teacher: str = ""
    coef: float = 1.0  # weight of the per-token reverse-KL advantage
    reward_weight: float = 0.0  # weight of the task reward's group advantage (0: pure distillation)
    dtype: str = "float32"  # the teacher's weights and compute
    device: str = "cpu"  # cpu | cuda (the teacher only runs forward passes)
    num_replicas: int = 1  # teacher workers; a batch is split over them

    @property
    def enabled(self) -> bool:
        return bool(self.teacher)

    def check(self, where: str = "distill") -> None:
        """ValueError naming the key and the fix."""
        if not self.enabled:
            return
        if self.coef <= 0:
            raise ValueError(f"{where}.coef must be > 0 (the weight of the teacher's signal), got {self.coef}; "
                             "to train on the reward alone remove the distill section")
        if self.reward_weight < 0:
            raise ValueError(f"{where}.reward_weight must be >= 0 (0: pure distillation), got {self.reward_weight}")
        if self.dtype not in DTYPES:
            raise ValueError(f"{where}.dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"{where}.device {self.device!r}: choose cpu or cuda")
        if self.num_replicas < 1:
            raise ValueError(f"{where}.num_replicas must be >= 1, got {self.num_replicas}")


def generated_mask(episode: Episode) -> list[int]:
    """[T] 1 on the tokens the model generated, 0 on those an environment inserted."""
    return episode.completion.loss_mask or [1] * len(episode.completion.token_ids)


def distill_token_advantages(episode: Episode, coef: float) -> list[float]:
    """[T] -coef · (behaviour logprob - teacher logprob) on generated tokens, 0 on inserted ones."""
    if episode.teacher_logprobs is None:
        raise ValueError("an episode reached the distillation advantage without teacher logprobs: the teacher role "
                         "did not score this batch (distill.teacher is set, so every step must call it)")
    behaviour, teacher = episode.completion.logprobs, episode.teacher_logprobs
    return [-coef * (b - t) if keep else 0.0 for b, t, keep in zip(behaviour, teacher, generated_mask(episode),
                                                                     strict=True)]


def assign_distill_advantages(groups: list[Group], config: DistillConfig) -> None:
    """Make every episode's advantage the distillation one, in place: the reverse-KL term plus reward_weight times
    the group advantage already assigned (per token where it is per turn)."""
    for e in (e for g in groups for e in g.episodes):
        reward_part = e.token_advantages or [e.advantage] * len(e.completion.token_ids)
        dense = distill_token_advantages(e, config.coef)
        e.token_advantages = [config.reward_weight * r + d for r, d in zip(reward_part, dense, strict=True)]
        e.advantage = config.reward_weight * e.advantage


def distill_metrics(groups: list[Group]) -> dict[str, float]:
    """distill/reverse_kl (mean of log π_s - log π_t per generated token) and distill/teacher_logprob (the teacher's
    mean logprob of the generated tokens)."""
    gaps, scores = [], []
    for e in (e for g in groups for e in g.episodes):
        for b, t, keep in zip(e.completion.logprobs, e.teacher_logprobs, generated_mask(e), strict=True):
            if keep:
                gaps.append(b - t)
                scores.append(t)
    if not gaps:
        return {}
    return {"distill/reverse_kl": sum(gaps) / len(gaps), "distill/teacher_logprob": sum(scores) / len(scores)}


def load_teacher(config: DistillConfig, student_tokenizer, seed: int = 0):
    """The frozen teacher model named by `config.teacher` (a model directory, a catalog name or tiny:PRESET; a run
    id is resolved to its checkpoint before this), in config.dtype on config.device; refused (ValueError) when its
    tokenizer differs from the student's."""
    import torch

    from forge_core.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(config.teacher, seed=seed, dtype=getattr(torch, config.dtype))
    check_same_tokenizer(config.teacher, tokenizer, student_tokenizer)
    return model.to(config.device).eval().requires_grad_(False)


def check_same_tokenizer(teacher: str, teacher_tokenizer, student_tokenizer) -> None:
    """ValueError naming the difference when the teacher's tokenizer is not the student's."""
    from forge_core.models.tokenizer import tokenizer_difference

    difference = tokenizer_difference(student_tokenizer, teacher_tokenizer)
    if difference is not None:
        raise ValueError(f"distill.teacher {teacher!r} has another tokenizer than the student: {difference}. "
                         "The teacher scores the student's own token ids, so both must share one tokenizer: pick a "
                         "teacher of the student's family (or a checkpoint trained from the student's model)")
