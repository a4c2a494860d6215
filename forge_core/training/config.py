"""The `trainer` and `sft` config sections, declared and checked here once: the trainer's backend and layout, its
optimizer and step knobs, and the SFT warm-up that steps the same trainer with its own lr and batch."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from forge_core.models.lora import LoRAConfig

BACKENDS = ("hf", "titan")
SCHEDULES = ("constant", "cosine", "linear")
CHECKPOINTING = ("none", "full", "selective")
SFT_RESPONSES = ("target", "solution")
PROXIMAL = ("auto", "always", "never")  # trainer.recompute_proximal


@dataclass
class TrainerConfig:
    """Config section `trainer`. warmup_steps and the schedule count RL steps; each RL step makes mini_batches ×
    epochs optimizer steps."""

    backend: str = "hf"  # hf | titan
    procs: int = 1
    # titan only: procs = data_parallel_shard_degree × tensor_parallel_degree × pipeline_parallel_degree
    data_parallel_shard_degree: int = -1  # -1: the ranks TP/PP leave
    tensor_parallel_degree: int = 1
    pipeline_parallel_degree: int = 1
    activation_checkpointing: str = "none"  # none | full | selective (titan only): recompute layers in backward
    compile: bool = False  # hf backend: torch.compile each decoder layer (the first steps pay the compilation)
    pack: bool = False  # hf backend: pack each micro-batch's sequences into as few rows as fit (no padding FLOPs)
    # hf backend: run each distinct prompt of a micro-batch once and its group's responses against its cached keys
    # and values (the same logprobs and gradients; 1.8-2x per train step on 8 x 8 SmolLM2 rows); pack takes precedence
    share_prompts: bool = True
    lr: float = 1.0e-5
    max_norm: float = 1.0  # gradient clipping (0: none)
    micro_batch_size: int = 32
    warmup_steps: int = 0
    schedule: str = "constant"  # constant | cosine | linear
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    entropy_coef: float = 0.0
    mini_batches: int = 1  # optimizer steps per rollout batch (PPO mini-batches; each normalised over its tokens)
    epochs: int = 1  # passes over the rollout batch
    # the proximal policy (PPO's "old", what the clip is taken against) is the trainer's own weights at the start of
    # the step. auto: recomputed by the trainer whenever it can differ from the current one (several optimizer
    # steps, a stale batch, rollout correction; one fresh on-policy step uses the current weights, ratio 1);
    # always: recomputed even then (one more forward pass); never: the generator's logprobs stand in (saves that
    # pass; right only when the generator is bit-identical to the trainer: same engine, dtype and weights)
    recompute_proximal: str = "auto"
    lora: LoRAConfig = field(default_factory=LoRAConfig)  # rank 0: full fine-tuning; rank > 0: adapters only

    @property
    def optimizer_steps_per_step(self) -> int:
        """Optimizer steps one RL step makes (what the lr schedule counts)."""
        return self.mini_batches * self.epochs

    def check(self, where: str = "trainer") -> None:
        """ValueError naming the key and the fix for a value, or a combination within the section, that cannot work."""
        for key, options in (("backend", BACKENDS), ("schedule", SCHEDULES),
                             ("activation_checkpointing", CHECKPOINTING), ("recompute_proximal", PROXIMAL)):
            if getattr(self, key) not in options:
                raise ValueError(f"{where}.{key} = {getattr(self, key)!r} is not one of {list(options)}")
        for key in ("procs", "micro_batch_size", "mini_batches", "epochs"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{where}.{key} must be >= 1, got {value!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"{where}.lr must be > 0 (e.g. 1e-5); got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"{where}.min_lr_ratio must be in [0, 1] (the schedule's floor); got {self.min_lr_ratio}")
        if self.warmup_steps < 0 or self.max_norm < 0 or self.weight_decay < 0:
            raise ValueError(f"{where}.warmup_steps, max_norm and weight_decay must be >= 0; got {self.warmup_steps}, "
                             f"{self.max_norm}, {self.weight_decay}")
        self.lora.check(f"{where}.lora")
        self.check_layout(where)

    def check_layout(self, where: str) -> None:
        """The parallel degrees and selective checkpointing need titan; compile, pack and LoRA need hf."""
        if self.backend == "hf":
            if (self.tensor_parallel_degree, self.pipeline_parallel_degree) != (1, 1):
                raise ValueError(f"{where}.tensor_parallel_degree / pipeline_parallel_degree need {where}.backend: "
                                 "titan (the hf backend is FSDP2 only)")
            if self.activation_checkpointing == "selective":
                raise ValueError(f"{where}.activation_checkpointing: selective needs {where}.backend: titan; the hf "
                                 "backend checkpoints whole layers (use full, or none)")
            if self.lora.enabled and self.compile:
                raise ValueError(f"{where}.lora with {where}.compile is not supported yet (compiled layers are built "
                                 f"before the adapters); set {where}.compile: false")
            return
        if self.compile or self.pack:
            raise ValueError(f"{where}.compile and {where}.pack apply to the hf backend; for {where}.backend: titan "
                             "leave them false")
        if self.lora.enabled:
            raise ValueError(f"{where}.lora.rank {self.lora.rank} needs {where}.backend: hf (the titan backend rebuilds "
                             "the model in torchtitan's own modules, which have no adapters yet); set "
                             f"{where}.lora.rank: 0 for titan")
        tp, pp, dp = self.tensor_parallel_degree, self.pipeline_parallel_degree, self.data_parallel_shard_degree
        if tp > 1 and pp > 1:
            raise ValueError(f"{where}.tensor_parallel_degree ({tp}) with pipeline_parallel_degree ({pp}) is not "
                             "supported yet; use one of them (with data_parallel_shard_degree for the rest)")
        if tp < 1 or pp < 1 or self.procs % (tp * pp) or (dp != -1 and dp * tp * pp != self.procs):
            raise ValueError(f"{where}.procs ({self.procs}) must equal data_parallel_shard_degree ({dp}) × "
                             f"tensor_parallel_degree ({tp}) × pipeline_parallel_degree ({pp}); set "
                             "data_parallel_shard_degree: -1 to use the rest")

    @property
    def data_parallel_degree(self) -> int:
        """How many slices a batch is split into (the other ranks repeat a slice: TP, PP)."""
        if self.backend != "titan":
            return self.procs
        return self.procs // (self.tensor_parallel_degree * self.pipeline_parallel_degree)


@dataclass
class SFTConfig:
    """Config section `sft`: supervised warm-up on the demonstrations before RL, on the same trainer."""

    steps: int = 0  # 0 = no SFT warm-up before GRPO
    batch_size: int = 64
    lr: float = 1.0e-3
    warmup_steps: int = 20
    schedule_steps: int = 0  # cosine horizon; > steps stops SFT before the lr reaches 0 (0 = steps)
    response: str = "target"  # target | solution
    examples: int = 0  # labelled examples SFT learns from: the first N training problems (0 = all of them)
    # an imperfect teacher (forge_core/data/teacher.py): sums that carry into the tens digit are demonstrated without
    # that carry with this probability (0: the true answers); held-out problems and rewards keep the true answers
    drop_carry: float = 0.0
    # with an environment (env.name): the share of demonstrated episodes that call tools (the rest answer alone)
    tool_use: float = 1.0
    init: str | None = None  # start GRPO from this checkpoint directory instead of running SFT
    # reuse the model of an earlier identical warm-up (same SFT settings, model, data and code) from the SFT cache
    cache: bool = True

    @property
    def total_steps(self) -> int:
        """The cosine schedule's horizon in optimizer steps."""
        return max(self.schedule_steps or self.steps, 1)

    def check(self, where: str = "sft") -> None:
        """ValueError naming the key and the fix."""
        if self.steps < 0 or self.examples < 0:
            raise ValueError(f"{where}.steps and {where}.examples must be >= 0 (steps 0 skips SFT; examples 0 uses "
                             f"every training problem); got {self.steps}, {self.examples}")
        if self.schedule_steps and self.schedule_steps < self.steps:
            raise ValueError(f"{where}.schedule_steps ({self.schedule_steps}) must be 0 or >= {where}.steps "
                             f"({self.steps})")
        if not 0.0 <= self.drop_carry <= 1.0:
            raise ValueError(f"{where}.drop_carry must be in [0, 1] (the teacher's chance to drop a tens carry); "
                             f"got {self.drop_carry}")
        if not 0.0 <= self.tool_use <= 1.0:
            raise ValueError(f"{where}.tool_use must be in [0, 1] (the share of demonstrations that call tools); "
                             f"got {self.tool_use}")
        if self.response not in SFT_RESPONSES:
            raise ValueError(f"{where}.response = {self.response!r} is not one of {list(SFT_RESPONSES)}")
        if self.batch_size < 1 or not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"{where}.batch_size must be >= 1 and {where}.lr > 0; got {self.batch_size}, {self.lr}")

    def trainer_config(self, trainer: TrainerConfig) -> TrainerConfig:
        """The trainer settings SFT steps with: its own lr, batch and cosine warm-up, one optimizer step per batch; the
        trainer section's clipping, packing and layout."""
        return dataclasses.replace(trainer, lr=self.lr, micro_batch_size=self.batch_size,
                                   warmup_steps=self.warmup_steps, schedule="cosine", min_lr_ratio=0.0,
                                   weight_decay=0.0, entropy_coef=0.0, mini_batches=1, epochs=1,
                                   share_prompts=False)  # one sample per prompt: nothing to share
