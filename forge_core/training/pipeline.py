"""PipelineTrainer: the Trainer's step for one pipeline stage of a model split over a process group.

Every stage runs the same GPipe schedule over the batch's micro-batches (torch.distributed.pipelining); the last
stage turns each micro-batch's logits into the policy loss with the same global normalisers as `Trainer`, so the
summed loss and gradients equal the unsplit model's. Gradient clipping uses the norm over all stages. The proximal
policy's logprobs (PPO mini-batches, stale batches, rollout correction) come from a forward-only pass over the stages.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from forge_core.training.batching import collate
from forge_core.training.logprobs import gather_logprobs, token_entropy
from forge_core.training.trainer import StepTotals, Trainer, loss_mask_of

LENGTH_BUCKET = 64  # a step's token length is padded up to a multiple of this (fewer distinct schedule shapes)
MAX_SCHEDULES = 8  # schedules kept per stage, oldest dropped first


class PipelineTrainer(Trainer):
    """`model` holds this rank's stage (its parameters are the ones optimised here); `stage_module` is the part of
    it the schedule runs: the first stage takes token ids [b, L], the last returns logits [b, L, V] — or, given the
    LM `head`, hidden states [b, L, D] that the loss sends through the head at the response positions only."""

    def __init__(self, model, stage_module, loss, config, pad_id: int, group, stage_index: int, num_stages: int,
                 device: torch.device, head: torch.nn.Module | None = None, **options) -> None:
        super().__init__(model, loss, config, pad_id, **options)  # options: Trainer's total_steps, temperature, …
        self.stage_module, self.group, self.device, self.head = stage_module, group, device, head
        self.stage_index, self.num_stages = stage_index, num_stages
        self.first, self.last = stage_index == 0, stage_index == num_stages - 1
        self._meta = None
        self._schedules: dict[tuple[int, int, int], object] = {}
        self._step_state: tuple = ()
        self.schedules_built = 0

    def train_step(self, inputs: list[dict], targets: dict, num_tokens: int | None = None,
                   num_seqs: int | None = None) -> float:
        """One optimizer step of this stage over the whole batch (collective over the pipeline group); every stage
        returns the loss. Arguments as `Trainer.train_step`; micro-batches hold micro_batch_size rows (at least
        one per stage, padded with empty rows to equal sizes)."""
        self.model.train()
        mask, kept = targets["padding_mask"].bool(), loss_mask_of(targets)
        num_tokens = kept.sum().item() if num_tokens is None else num_tokens
        if self.skips(num_tokens):  # the stages all see the same rows: they skip together
            return 0.0
        num_seqs = num_seqs or (kept.sum(-1) > 0).sum().clamp(min=1).item()
        batch = collate(inputs, mask, self.pad_id)
        rows = len(inputs)
        n_micro = min(rows, max(-(-rows // self.config.micro_batch_size), self.num_stages))
        extra = -rows % n_micro  # empty rows (no real token) so every micro-batch has the same shape
        # right-padded to a length bucket (causal: real positions see no padding), so the schedule of one
        # (rows, length) shape serves the later steps that have it
        length = -(-batch.tokens.shape[1] // LENGTH_BUCKET) * LENGTH_BUCKET
        tokens = torch.nn.functional.pad(batch.tokens, (0, length - batch.tokens.shape[1]), value=self.pad_id)
        data = {"tokens": pad_rows(tokens, extra, self.pad_id), "positions": pad_rows(batch.positions, extra, 0),
                "mask": pad_rows(mask, extra, False)}
        data.update({k: pad_rows(v, extra, 0) for k, v in targets.items()
                     if isinstance(v, torch.Tensor) and k != "padding_mask"})
        data = {k: v.to(self.device) for k, v in data.items()}
        totals = StepTotals()
        self._step_state = (data, totals, num_tokens, num_seqs)  # what the cached schedules' loss reads
        schedule = self._schedule((rows + extra) // n_micro, length, n_micro)
        self.optimizer.zero_grad(set_to_none=True)
        index = torch.arange(rows + extra, device=self.device)  # the loss looks each micro-batch's rows up by index
        args = (data["tokens"],) if self.first else ()
        schedule.step(*args, target=index if self.last else None, return_outputs=False)
        totals = self._from_last_stage(totals.read()[0])
        if not totals.finite:
            self.optimizer.zero_grad(set_to_none=True)
            raise RuntimeError(f"non-finite loss at step {self.step}; weights left unchanged — lower trainer.lr or "
                               "check the rewards/advantages")
        grad_norm = self._clip_gradients()
        lr = self.apply_lr()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.metrics = {"loss": totals.loss, "grad_norm": grad_norm, "lr": lr, "entropy": totals.entropy / num_tokens,
                        "num_tokens": float(num_tokens), "pipeline_schedules_built": float(self.schedules_built),
                        **totals.weighted}
        return totals.loss

    def _schedule(self, b: int, length: int, n_micro: int):
        """The GPipe schedule (and PipelineStage) for micro-batches of b rows × `length` tokens, built once per
        shape and kept (MAX_SCHEDULES at most): building them is a setup of its own each time."""
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        key = (b, length, n_micro)
        if key in self._schedules:
            return self._schedules[key]
        # shapes given up front: torch would otherwise infer them with a forward and backward on empty tensors,
        # which calls the loss on garbage and leaves their gradients in unsharded stages
        (in_dtype, in_dim), (out_dtype, out_dim) = self._boundary_meta()
        # hidden states carry gradients between stages (what tells torch to send and receive them)
        example_in = (torch.empty((b, length), dtype=in_dtype, device=self.device) if self.first else
                      torch.empty((b, length, in_dim), dtype=in_dtype, device=self.device, requires_grad=True))
        example_out = torch.empty((b, length, out_dim), dtype=out_dtype, device=self.device, requires_grad=True)
        stage = PipelineStage(self.stage_module, self.stage_index, self.num_stages, self.device, group=self.group,
                              input_args=example_in, output_args=example_out)

        def schedule_loss(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
            return self._loss(logits, index, *self._step_state)

        if len(self._schedules) >= MAX_SCHEDULES:
            self._schedules.pop(next(iter(self._schedules)))
        self._schedules[key] = ScheduleGPipe(stage, n_microbatches=n_micro, loss_fn=schedule_loss, scale_grads=False)
        self.schedules_built += 1
        return self._schedules[key]

    @torch.no_grad()
    def proximal_logprobs(self, inputs: list[dict], padding_mask: torch.Tensor) -> torch.Tensor:
        """Logprobs [B, T] of the response tokens under the weights of now, on every stage (collective over the
        pipeline group): the stages run their part on one micro-batch after another, passing hidden states on by
        send/recv (no schedule: nothing flows back), and the last stage broadcasts the result."""
        self.model.train()
        mask = padding_mask.bool()
        batch = collate(inputs, mask, self.pad_id)
        tokens, positions = batch.tokens.to(self.device), batch.positions.to(self.device)
        (in_dtype, in_dim), (out_dtype, _) = self._boundary_meta()
        prev, nxt, last = (dist.get_global_rank(self.group, s) if 0 <= s < self.num_stages else None
                           for s in (self.stage_index - 1, self.stage_index + 1, self.num_stages - 1))
        parts = []
        for start in range(0, len(inputs), self.config.micro_batch_size):
            sl = slice(start, start + self.config.micro_batch_size)
            x = tokens[sl]
            if not self.first:
                x = torch.empty((*x.shape, in_dim), dtype=in_dtype, device=self.device)
                dist.recv(x, src=prev, group=self.group)
            out = self.stage_module(x)
            out = out.to_local() if hasattr(out, "to_local") else out
            if self.last:
                parts.append(self._response_logprobs(out, positions[sl], tokens[sl]))
            else:
                dist.send(out.contiguous(), dst=nxt, group=self.group)
        lp = (torch.cat(parts) if self.last else
              torch.empty(mask.shape, dtype=torch.promote_types(out_dtype, torch.float32), device=self.device))
        dist.broadcast(lp, src=last, group=self.group)
        return torch.where(mask.to(lp.device), lp, torch.zeros((), dtype=lp.dtype, device=lp.device))

    def _response_logits(self, output: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [b, T, V] that predict the response tokens at `positions` [b, T], from the last stage's output."""
        picked = output.gather(1, (positions - 1).clamp(min=0)[..., None].expand(-1, -1, output.shape[-1]))
        return self.head(picked) if self.head is not None else picked  # hidden states: the head on these only

    def _response_logprobs(self, output, positions, tokens) -> torch.Tensor:
        """Logprobs [b, T] (at least float32: gather_logprobs upcasts) of the response tokens from the last stage's output."""
        logits = self._response_logits(output, positions)
        return gather_logprobs(logits, tokens.gather(1, positions), self.temperature)

    def _loss(self, output, index, data, totals: StepTotals, num_tokens, num_seqs) -> torch.Tensor:
        """The policy loss of one micro-batch (rows `index` of the padded batch) from the last stage's output."""
        positions = data["positions"][index]
        picked = self._response_logits(output, positions)
        lp = gather_logprobs(picked, data["tokens"][index].gather(1, positions), self.temperature)
        ent = token_entropy(picked if self.config.entropy_coef else picked.detach(), self.temperature)
        rows = lambda key: data[key][index] if key in data else None  # noqa: E731
        kept = data["mask"][index] & (rows("loss_mask").bool() if "loss_mask" in data else True)
        return self.micro_batch_loss(lp, ent, kept, rows("ref_logprobs"), rows("advantages"),
                                     rows("old_logprobs"), num_tokens, num_seqs, totals, rows("token_weights"),
                                     behaviour_logprobs=rows("behaviour_logprobs"))

    def _boundary_meta(self) -> tuple[tuple[torch.dtype, int], tuple[torch.dtype, int]]:
        """((dtype, last dim) of this stage's input, same of its output), found once by running each stage in
        order on one token (the output dtype depends on mixed precision, the input's on the previous stage)."""
        if self._meta is None:
            previous = (torch.long, 1)
            for s in range(self.num_stages):
                box = [None]
                if s == self.stage_index:
                    dtype, dim = previous
                    shape = (1, 1) if self.first else (1, 1, dim)
                    with torch.no_grad():
                        out = self.stage_module(torch.zeros(shape, dtype=dtype, device=self.device))
                    out = out.to_local() if hasattr(out, "to_local") else out
                    self._meta = (previous, (out.dtype, out.shape[-1]))
                    box = [self._meta[1]]
                dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, s), group=self.group)
                previous = box[0]
        return self._meta

    def _from_last_stage(self, totals: StepTotals) -> StepTotals:
        """The last stage's totals on every stage (they decide together whether the step is applied)."""
        box = [totals if self.last else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, self.num_stages - 1), group=self.group)
        return box[0]

    def _clip_gradients(self) -> float:
        """Clip to trainer.max_norm by the norm over every stage's gradients; returns that norm."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        local = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        local = local.full_tensor() if hasattr(local, "full_tensor") else local  # FSDP-sharded stage: global value
        squared = local.detach().double().square().reshape(1).to(self.device)
        dist.all_reduce(squared, group=self.group)
        norm = math.sqrt(squared.item())
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise RuntimeError(f"non-finite gradient norm at step {self.step}; weights left unchanged — lower trainer.lr")
        max_norm = self.config.max_norm if self.config.max_norm > 0 else float("inf")
        coef = max_norm / (norm + 1e-6)  # as torch.nn.utils.clip_grad_norm_
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
        return norm


def pad_rows(x: torch.Tensor, extra: int, value) -> torch.Tensor:
    """`x` [B, ...] with `extra` rows of `value` appended."""
    if extra == 0:
        return x
    return torch.cat([x, torch.full((extra, *x.shape[1:]), value, dtype=x.dtype, device=x.device)])
