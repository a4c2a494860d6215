"""FSDP2 helpers for a multi-rank trainer: shard a HF causal LM, gather its full state dict."""

from __future__ import annotations

import torch
import torch.distributed as dist


def shard_model(model: torch.nn.Module, bf16: bool = False) -> torch.nn.Module:
    """`fully_shard` each decoder layer, then the root; gradients are summed across ranks (not averaged) because
    every rank's loss is already divided by the whole batch's token count. `bf16` (CUDA with model.dtype
    bfloat16): FSDP2's MixedPrecisionPolicy gathers bf16 parameters over the fp32 masters and reduces gradients in
    fp32 (on CPU the Trainer's autocast computes in bf16 instead)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    options = {"mp_policy": policy} if policy is not None else {}
    layers = getattr(getattr(model, "model", model), "layers", [])
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
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


def gather_pipeline_state(model: torch.nn.Module, group) -> dict[str, torch.Tensor]:
    """Collective over all ranks: the whole model's state on the first stage of each pipeline `group` (on CPU);
    the other stages get their own stage's part."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # not cpu_offload: with it only global rank 0 would get its (FSDP-gathered) stage, the other stages nothing
    state = {k: v.cpu() for k, v in get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)).items()}
    first = dist.get_global_rank(group, 0)
    parts = [None] * dist.get_world_size(group) if dist.get_rank() == first else None
    dist.gather_object(state, parts, dst=first, group=group)
    return {k: v for part in parts for k, v in part.items()} if parts else state


def titan_parallelism(procs: int, tensor_parallel: int, pipeline_parallel: int = 1):
    """torchtitan ParallelismConfig for `procs` ranks: PP outermost, TP inside, FSDP over the rest (config
    validation checked that TP × PP divides procs)."""
    from torchtitan.config import ParallelismConfig

    assert procs % (tensor_parallel * pipeline_parallel) == 0, (procs, tensor_parallel, pipeline_parallel)
    return ParallelismConfig(data_parallel_shard_degree=procs // (tensor_parallel * pipeline_parallel),
                             tensor_parallel_degree=tensor_parallel, pipeline_parallel_degree=pipeline_parallel,
                             spmd_backend="partial_dtensor")


def build_titan_dims(parallelism):
    """torchtitan's ParallelDims with its device meshes built over this job's ranks."""
    import torchtitan.distributed.parallel_dims as titan_dims
    from torchtitan.distributed import ParallelDims

    # torchtitan assumes CUDA when it finds no accelerator; on a CPU machine its meshes must be CPU (gloo) meshes
    titan_dims.device_type = "cuda" if torch.cuda.is_available() else "cpu"
    dims = ParallelDims.from_config(parallelism, dist.get_world_size())
    dims.build_mesh()
    return dims


def split_titan_stage(model, dims) -> tuple[int, int]:
    """Keep only this rank's pipeline stage of a TitanCausalLM's decoder, in place: an even share of the layers,
    the embedding on the first stage, the final norm and LM head on the last. Returns (stage, stages)."""
    stages, stage = dims.pp, dims.get_mesh("pp").get_local_rank()
    decoder = model.decoder
    names = list(decoder.layers.keys())
    if len(names) < stages:
        raise ValueError(f"trainer.pipeline_parallel_degree {stages} exceeds the model's {len(names)} layers; "
                         "lower it")
    bounds = [round(i * len(names) / stages) for i in range(stages + 1)]
    for name in names[:bounds[stage]] + names[bounds[stage + 1]:]:
        del decoder.layers[name]  # layer names (and so checkpoint keys) stay those of the whole model
    if stage > 0:
        decoder.tok_embeddings = None
    if stage < stages - 1:
        decoder.norm = decoder.lm_head = None
    return stage, stages


def shard_titan_model(model, parallelism, dims, activation_checkpointing: str = "none", bf16: bool = False):
    """Apply torchtitan's TP/FSDP/activation checkpointing to a TitanCausalLM's decoder (or its pipeline stage).
    Gradients are summed across data-parallel ranks, as in `shard_model`."""
    import tempfile

    from torch.distributed.fsdp import FSDPModule
    from torchtitan.config import CompileConfig, TrainingConfig

    precision = "bfloat16" if bf16 else "float32"
    with tempfile.TemporaryDirectory() as dump_folder:
        model.architecture.load("parallelize")(
            model.decoder, parallel_dims=dims, training=TrainingConfig(mixed_precision_param=precision),
            parallelism=parallelism, compile_config=CompileConfig(),
            ac_config=activation_checkpointing_config(activation_checkpointing), dump_folder=dump_folder)
    embedding = model.decoder.tok_embeddings
    if embedding is not None and embedding.tp_group is not None and embedding.padding_idx is not None:
        # each TP rank holds rows [offset, offset + rows) and looks up local indices: localise the pad row
        rows = embedding.weight.to_local().shape[0] if hasattr(embedding.weight, "to_local") else embedding.weight.shape[0]
        offset = dist.get_rank(embedding.tp_group) * -(-embedding.num_embeddings // dist.get_world_size(embedding.tp_group))
        pad = model.hf_config.pad_token_id
        embedding.padding_idx = pad - offset if offset <= pad < offset + rows else None
    gloo = dist.get_backend() == "gloo"
    for module in model.decoder.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if gloo:  # gloo has no AVG/PREMUL_SUM reductions
                module.set_force_sum_reduction_for_comms(True)


def activation_checkpointing_config(mode: str):
    """torchtitan's activation-checkpointing config for trainer.activation_checkpointing (None for "none")."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    return {"none": None, "full": FullAC.Config(), "selective": SelectiveAC.Config()}[mode]


def apply_activation_checkpointing(model, mode: str) -> None:
    """Activation checkpointing on a TitanCausalLM's blocks without parallelizing it (one rank)."""
    import tempfile

    with tempfile.TemporaryDirectory() as dump_folder:
        activation_checkpointing_config(mode).build(dump_folder=dump_folder).apply(model.decoder)
