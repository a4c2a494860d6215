"""TrainerWorker: the policy being optimised. Advantages → optional dynamic filter → micro-batches → optimizer
step → publish the new weights to the weight store.

With `trainer.procs: N` the worker is N ranks of one job (FSDP2 over gloo on CPU, NCCL on GPU). Rank 0 serves the
controller's calls and broadcasts each one to the other ranks, which run the same method on their slice of the batch.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
import torch.distributed as dist

from forge_core.models import load_model_and_tokenizer, save_model_and_tokenizer
from forge_core.models.lora import merge_lora_state
from forge_core.recipes import steps
from forge_core.training import Trainer, state_sha256
from forge_core.training.trainer import loss_mask_of, save_atomically
from forge_core.training.update import select_rows, train_on_episodes
from forge_core.types import Group
from infra import components as C
from infra.checkpoints import HF_DIR, STATE, WORKER_STEP, file_sha256
from infra.config import RunConfig
from workers.base import Worker, dtype_of, model_source, worker_device
from workers.collective import collective, follow_calls
from workers.sharded_checkpoint import load_sharded, save_sharded
from workers.sharding import full_state_dict, gather_pipeline_state, shard_model

log = logging.getLogger(__name__)


def cast_floats(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`state` with its floating-point tensors in `dtype` (the generators' dtype: bf16 weights go out, the fp32
    masters stay here); other tensors unchanged."""
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


class TrainerWorker(Worker):
    role = "trainer"

    def __init__(self, cfg: RunConfig, store=None, init_path: str | None = None, threads: int | None = None):
        super().__init__(cfg, threads)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        model, self.tokenizer = load_model_and_tokenizer(model_source(cfg, init_path), seed=cfg.seed,
                                                         dtype=C.MASTER_DTYPE)
        model = model.to(worker_device(cfg, self.role))
        self.tp = self.pp = 1  # tensor / pipeline parallel degrees: their ranks share one slice of the batch
        self.pp_group = None
        if cfg.trainer.backend == "titan":
            model = self._build_titan(model)
        else:
            C.prepare_trained_model(cfg, model)  # checkpointing and compile before FSDP wraps the layers
            if self.world > 1:
                shard_model(model, bf16=next(model.parameters()).is_cuda and C.compute_dtype(cfg) == torch.bfloat16)
        self.trainer = self._make_trainer(model, C.build_loss(cfg), *C.trainer_arguments(cfg))
        self.trainer.reference_from_base = C.reference_from_base(cfg)  # LoRA: the base model is the reference
        self.sft_trainer: Trainer | None = None  # built by the first sft_step (its own optimizer and schedule)
        self.store = store
        self.schedule = C.run_schedule(cfg)
        self.last_metrics: dict[str, float] = {}

    # ---- calls (rank 0 receives them and fans them out) ----

    @collective
    def train(self, step: int, groups: list[Group]) -> dict[str, float]:
        """Advantages + the step's policy update (trainer.mini_batches × epochs optimizer steps) on `groups`;
        publishes version step+1 when the generators sync to it (`Schedule.syncs_at`). Returns loss/* metrics."""
        self.calls += 1
        adv = self.cfg.advantage
        episodes, metrics = steps.compute_advantages(groups, adv.name, self.cfg.filter_groups, self.cfg.distill,
                                                     **adv.params)
        metrics.update(self._update_policy(episodes, step))
        self.step = step + 1
        self._publish_after_step(self.step, metrics)
        self.last_metrics = metrics
        return metrics

    @collective
    def sft_step(self, inputs: list[dict], targets: dict) -> dict[str, float]:
        """One SFT optimizer step (masked cross-entropy, sft.* settings) on a whole batch in the Trainer contract;
        every data-parallel slice trains on its rows. Returns the Trainer's metrics (loss, grad_norm, lr…)."""
        self.calls += 1
        if self.sft_trainer is None:
            from forge_core.losses import get_loss

            self.sft_trainer = self._make_trainer(self.trainer.model, get_loss("sft"),
                                                  *C.trainer_arguments(self.cfg, sft=True))
        if self.world == 1:
            self.sft_trainer.train_step(inputs, targets)
            return dict(self.sft_trainer.metrics)
        dp_rank, dp_size = self._data_parallel_slice()
        rows = slice(dp_rank, None, dp_size)
        mine = {k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in targets.items()}
        return self._step_sharded(self.sft_trainer, inputs[rows], mine)

    @collective
    def save_pretrained(self, path: str) -> str:
        """The current weights as a transformers checkpoint (with the tokenizer) at `path`; returns it."""
        state = self._full_state()  # collective when sharded
        if self.rank == 0:
            save_model_and_tokenizer(self._hf_model(state), self.tokenizer, Path(path))
        return path

    @collective
    def publish_weights(self, version: int) -> int:
        """Put the current weights into the weight store as `version`; returns it."""
        return self._publish(version)

    def open_weight_group(self, host: str, world: int, device: str = "cpu") -> str:
        """weightsync.backend broadcast: host a new weight-broadcast group of `world` members (this trainer is rank 0,
        the generators join); replaces the previous group. Returns its HOST:PORT."""
        from infra.weightsync.broadcast import BroadcastWeightSync

        if self.store is not None:
            self.store.retire()
        self.store = BroadcastWeightSync(f"{host}:0", 0, world, keep=self.cfg.weightsync.keep,
                                         timeout_s=self.cfg.workers.call_timeout_s, device=device)
        return self.store.address

    def _build_titan(self, hf_model):
        """The torchtitan twin of `hf_model`, parallelized over this job's ranks (TP inside, FSDP over the rest)."""
        from forge_core.models.titan import titan_from_hf
        from workers.sharding import (
            apply_activation_checkpointing,
            build_titan_dims,
            shard_titan_model,
            split_titan_stage,
            titan_parallelism,
        )

        t = self.cfg.trainer
        self.tp, self.pp = t.tensor_parallel_degree, t.pipeline_parallel_degree
        if (self.tp > 1 or self.pp > 1) and hf_model.config.tie_word_embeddings:
            # TP, measured: tied embedding/head weights get wrong gradients under torchtitan's plan; PP: the
            # embedding and the head live on different stages
            raise ValueError(f"trainer.tensor_parallel_degree {self.tp} / pipeline_parallel_degree {self.pp} need a "
                             f"model with untied embeddings, and {self.cfg.model.path} ties them; set both to 1 "
                             "(FSDP over all trainer.procs) for it")
        parallelism = titan_parallelism(self.world, self.tp, self.pp)
        model = titan_from_hf(hf_model, parallelism)
        if self.world > 1:
            dims = build_titan_dims(parallelism)
            if self.pp > 1:
                self.stage, _ = split_titan_stage(model, dims)
                self.pp_group = dims.get_mesh("pp").get_group()
            # FSDP2's MixedPrecisionPolicy (param bf16, reduce fp32) over the fp32 masters on GPUs; on CPU (gloo)
            # the Trainer's autocast computes in bf16 instead
            bf16 = next(model.parameters()).is_cuda and C.compute_dtype(self.cfg) == torch.bfloat16
            shard_titan_model(model, parallelism, dims, t.activation_checkpointing, bf16=bf16)
        elif t.activation_checkpointing != "none":
            apply_activation_checkpointing(model, t.activation_checkpointing)
        return model

    def _full_state(self) -> dict[str, torch.Tensor]:
        """The unsharded model state (collective when sharded), in the backend's own layout; with pipeline stages,
        the first stage of each pipeline gathers the whole model (the others return their stage's part)."""
        if self.world == 1:
            return self.trainer.model.state_dict()
        if self.pp > 1:
            return gather_pipeline_state(self.trainer.model, self.pp_group)
        return full_state_dict(self.trainer.model)

    def _hf_state(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`state` in HF layout (what generators and the reference load): LoRA adapters merged into plain keys."""
        if self.cfg.trainer.backend == "titan":
            return self.trainer.model.to_hf_state_dict(state)
        lora = self.cfg.trainer.lora
        return merge_lora_state(state, lora.alpha / lora.rank) if lora.enabled else state

    def _publish(self, version: int) -> int:
        # collective when sharded: every rank gathers, rank 0 writes
        state = self._full_state()
        if self.rank == 0 and self.store is not None:
            self.store.publish(version, cast_floats(self._hf_state(state), dtype_of(self.cfg)))
        self.policy_version = version
        return version

    def _publish_after_step(self, version: int, metrics: dict[str, float]) -> None:
        """Publish the step's weights when the generators will load them (`Schedule.syncs_at`: weightsync.sync_every spaces
        out the gathers, writes and broadcasts, not only the loads). A broadcast to a group that lost a generator
        fails here, yet the step is done and consistent: keep it, say so in the metrics; the next call to that
        generator raises WorkerLost, and the recovery re-forms the group and republishes this version."""
        metrics["policy_version"] = float(version)
        metrics["weights/published"] = float(self.schedule.syncs_at(version))
        if not metrics["weights/published"]:  # every rank decides alike: the gather below is collective
            return
        try:
            self._publish(version)
        except RuntimeError as exc:
            if self.cfg.weightsync.backend != "broadcast":
                raise
            log.error("step %d trained, but publishing version %d failed: %s", self.step, version, exc)
            metrics["weights/publish_failed"] = 1.0
            self.policy_version = version

    @collective
    def save_checkpoint(self, path: str) -> dict | None:
        """Trainer state (model, optimizer, scheduler, RNG, step) to path/trainer.pt — with several ranks, model and
        optimizer shards to path/dcp and the gathered model to trainer.pt — and HF weights to path/hf; returns (rank 0)
        the state's canonical `state_sha256` and the trainer.pt file's `sha256`."""
        out = Path(path)
        small_state = save_sharded(self.trainer, out) if self.world > 1 else None  # collective
        state = self._full_state()  # collective when sharded
        if self.rank != 0:
            return None
        out.mkdir(parents=True, exist_ok=True)
        if self.world == 1:
            digest = self.trainer.save(out / STATE)
        else:
            save_atomically({"model": state, **small_state}, out / STATE)
            digest = state_sha256({"model": state, "step": self.trainer.step})
        save_model_and_tokenizer(self._hf_model(state), self.tokenizer, out / HF_DIR)
        (out / WORKER_STEP).write_text(json.dumps({"step": self.step}))
        # the file's digest is taken here, where the file was just written (page cache), so the controller never
        # reads the checkpoint back over a shared filesystem
        return {"state_sha256": digest, "sha256": file_sha256(out / STATE)}

    @collective
    def load_checkpoint(self, path: str) -> int:
        """Restore what save_checkpoint wrote (any number of ranks reads a sharded one); returns the restored step."""
        if self.world > 1:
            load_sharded(self.trainer, Path(path))
        else:
            self.trainer.load(Path(path) / STATE)
        # the run's step also counts steps whose batch was empty (no optimizer step)
        self.step = self.policy_version = json.loads((Path(path) / WORKER_STEP).read_text())["step"]
        return self.step

    def _hf_model(self, state: dict[str, torch.Tensor]):
        """A transformers model with the full weights `state` (for save_pretrained)."""
        if self.cfg.trainer.backend == "titan":
            return self.trainer.model.to_hf_model(state)
        if self.world == 1 and not self.cfg.trainer.lora.enabled:
            return self.trainer.model
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(self.trainer.model.config)
        model.load_state_dict(self._hf_state(state))  # LoRA: a plain model with the adapters merged
        return model

    @collective
    def shutdown(self) -> bool:
        if self.rank == 0 and self.store is not None:
            try:  # broadcast: tells the generators' receivers the group ends here
                self.store.close()
            except (RuntimeError, TimeoutError) as exc:  # a member is already gone; stopping anyway
                log.warning("closing the weight store on shutdown: %s", exc)
        return True

    # ---- internals ----

    def _update_policy(self, episodes, step: int) -> dict[str, float]:
        """The step's policy update on the whole batch: every rank shuffles it alike into the same global
        mini-batches and trains on its data-parallel slice of each (so any number of ranks makes the steps one
        process would); the reference and proximal logprobs are scored slice by slice and gathered."""
        step_fn = score_fn = None
        if self.world > 1:
            dp_rank, dp_size = self._data_parallel_slice()
            slices = [self._data_parallel_slice(r)[0] for r in range(self.world)]

            def step_fn(inputs, targets):
                return self._step_sharded(self.trainer, *rank_slice(inputs, targets, dp_rank, dp_size))

            def score_fn(method, inputs, padding_mask):
                return score_shares(method, inputs, padding_mask, slices, dp_rank, dp_size)
        return train_on_episodes(self.trainer, episodes, self.tokenizer.pad_token_id, step=step,
                                 seed=self.cfg.seed, correction=self.cfg.rollout_correction, step_fn=step_fn,
                                 score_fn=score_fn)

    def _step_sharded(self, trainer: Trainer, inputs: list[dict], targets: dict) -> dict[str, float]:
        """One optimizer step of a multi-rank trainer on this rank's slice of the batch; the batch's metrics."""
        # global normalisers: every rank divides by the whole batch's token/sequence count, gradients are summed;
        # the tp × pp ranks of one slice hold the same rows, so sums over all ranks count it tp × pp times
        kept = loss_mask_of(targets)  # rollout correction (MIS) may drop tokens from the loss
        counts = torch.tensor([kept.sum().item(), float((kept.sum(-1) > 0).sum())], dtype=torch.float64)
        dist.all_reduce(counts)
        counts /= self.tp * self.pp
        trainer.train_step(inputs, targets, num_tokens=int(counts[0]), num_seqs=int(counts[1]))
        # loss, entropy and the loss's diagnostics are this slice's share of the batch's value (global normalisers):
        # sum them over the slices; every rank of a slice reports its slice (pipeline stages: the last stage's)
        metrics = dict(trainer.metrics)
        shared = sorted(k for k in metrics if k not in ("grad_norm", "lr", "num_tokens", "pipeline_schedules_built"))
        sums = torch.tensor([metrics[k] for k in shared], dtype=torch.float64)
        dist.all_reduce(sums)
        metrics.update(zip(shared, (sums / (self.tp * self.pp)).tolist(), strict=True))
        return metrics

    def _data_parallel_slice(self, rank: int | None = None) -> tuple[int, int]:
        """(index, count) of the batch slice of `rank` (None: this one): shared by the ranks of one tensor-parallel
        group (adjacent ranks) and by the pipeline stages (the outermost dimension) of that group."""
        dp_size = self.world // (self.tp * self.pp)
        return ((self.rank if rank is None else rank) // self.tp) % dp_size, dp_size

    def _make_trainer(self, model, loss, config, options: dict) -> Trainer:
        """A Trainer for `model`, or a PipelineTrainer for this rank's stage when pipeline stages are configured."""
        if self.pp == 1:
            return Trainer(model, loss, config, self.tokenizer.pad_token_id, **options)
        from forge_core.training.pipeline import PipelineTrainer

        head = model.decoder.lm_head  # on the last stage: applied by the loss to the response positions only
        if head is not None:
            model.decoder._skip_lm_head = True
        return PipelineTrainer(model, model.decoder, loss, config, self.tokenizer.pad_token_id, self.pp_group,
                               self.stage, self.pp, next(model.parameters()).device, head=head, **options)

    def follow(self) -> None:
        """Ranks > 0: run every call rank 0 broadcasts until shutdown."""
        follow_calls(self)


def padded_rows(num_rows: int, rank: int, ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, padded): slice `rank`'s rows of `num_rows` (every ranks-th), and the same padded to
    ceil(num_rows / ranks) rows with row 0, so every slice has as many."""
    rows = torch.arange(rank, num_rows, ranks)
    pad = -(-num_rows // ranks) - len(rows)
    return rows, torch.cat([rows, torch.zeros(pad, dtype=torch.long)])


def score_shares(method, inputs: list[dict], padding_mask: torch.Tensor, slices: list[int], rank: int,
                 ranks: int) -> torch.Tensor:
    """The whole batch's logprobs [B, T] from `method` (a Trainer's proximal_logprobs or reference_logprobs) with
    each data-parallel slice scoring its rows only, then all-gathered; `slices`: each world rank's slice index.
    Every rank scores the same number of rows (padded as rank_slice pads) so FSDP's collectives pair up."""
    _, mine = padded_rows(len(inputs), rank, ranks)
    scored = method([inputs[i] for i in mine.tolist()], padding_mask[mine]).contiguous()
    parts = [torch.empty_like(scored) for _ in slices]
    dist.all_gather(parts, scored)
    out = torch.zeros(padding_mask.shape, dtype=scored.dtype, device=scored.device)
    for index, part in zip(slices, parts, strict=True):  # tensor-parallel peers and stages repeat a slice
        rows, _ = padded_rows(len(inputs), index, ranks)
        out[rows.to(out.device)] = part[:len(rows)]
    return out


def rank_slice(inputs: list[dict], targets: dict, rank: int, ranks: int) -> tuple[list[dict], dict]:
    """Rank `rank`'s rows of a mini-batch (every ranks-th), padded to ceil(rows / ranks) with copies of row 0 that
    the loss ignores (loss_mask 0): every rank then runs the same number of micro-batches, forwards and
    backwards, so FSDP's collectives pair up however filtering and mini-batches split the batch (an uneven split
    would hang the job)."""
    rows, padded = padded_rows(len(inputs), rank, ranks)
    picked_inputs, picked = select_rows(inputs, targets, padded)
    if len(padded) > len(rows):
        keep = loss_mask_of(picked).clone()
        keep[len(rows):] = False
        picked["loss_mask"] = keep
    return picked_inputs, picked
