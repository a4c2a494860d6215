"""ReferenceWorker and TeacherWorker: frozen models that score the tokens the student sampled, the reference for
the KL term and the teacher for on-policy distillation (forge_core/distill.py).

Place them on CPU (`ref_model.device: cpu`, `distill.device: cpu`) when accelerators are short: they only run
forward passes.
"""

from __future__ import annotations

from forge_core.distill import load_teacher
from forge_core.models import load_model_and_tokenizer, load_tokenizer
from forge_core.recipes import steps
from forge_core.types import Group
from infra.config import RunConfig
from workers.base import Worker, dtype_of, model_source


class ReferenceWorker(Worker):
    role = "reference"

    def __init__(self, cfg: RunConfig, store=None, init_path: str | None = None, threads: int | None = None):
        super().__init__(cfg, threads)
        self.model, self.pad_id = self._load(cfg, model_source(cfg, init_path))

    def _load(self, cfg: RunConfig, student: str):
        """(the frozen model, the pad id): the model RL starts from."""
        model, tok = load_model_and_tokenizer(student, seed=cfg.seed, dtype=dtype_of(cfg))
        return model.to(cfg.ref_model.device).eval().requires_grad_(False), tok.pad_token_id

    def logprobs(self, groups: list[Group]) -> list[list[list[float]]]:
        """This model's logprobs of every episode's completion tokens, shaped groups → episodes → [T]."""
        self.calls += 1
        return steps.model_logprobs(self.model, groups, self.pad_id, self.cfg.generator.temperature,
                                    micro_batch_size=self.cfg.trainer.micro_batch_size)


class TeacherWorker(ReferenceWorker):
    """The teacher of on-policy distillation (distill section); refused at load when its tokenizer is not the
    student's."""

    role = "teacher"

    def _load(self, cfg: RunConfig, student: str):
        tok = load_tokenizer(student)
        return load_teacher(cfg.distill, tok, seed=cfg.seed), tok.pad_token_id
