"""ReferenceWorker: the frozen reference policy; per-token logprobs of episodes for the KL term.

Place it on CPU (`ref_model.device: cpu`) when accelerators are short: it only runs forward passes.
"""

from __future__ import annotations

from forge_core.models import load_model_and_tokenizer
from forge_core.recipes import steps
from forge_core.types import Group
from infra.config import RunConfig
from workers.base import Worker, dtype_of, model_source


class ReferenceWorker(Worker):
    role = "reference"

    def __init__(self, cfg: RunConfig, store=None, init_path: str | None = None, threads: int | None = None):
        super().__init__(cfg, threads)
        model, tok = load_model_and_tokenizer(model_source(cfg, init_path), seed=cfg.seed, dtype=dtype_of(cfg))
        self.model = model.to(cfg.ref_model.device).eval().requires_grad_(False)
        self.pad_id = tok.pad_token_id

    def ref_logprobs(self, groups: list[Group]) -> list[list[list[float]]]:
        """Reference logprobs of every episode's response tokens, shaped like groups → episodes → tokens."""
        self.calls += 1
        steps.score_reference(self.model, groups, self.pad_id, self.cfg.generator.temperature,
                              micro_batch_size=self.cfg.trainer.micro_batch_size)
        return [[e.ref_logprobs for e in g.episodes] for g in groups]
