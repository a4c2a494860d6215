"""fp32 master weights with bf16 compute (model.dtype: bfloat16): at a small lr the weights move and follow an fp32
run, where AdamW on bf16 parameters (the path before) drops most updates below bf16's resolution."""

import pytest
import torch

from forge_core.losses import get_loss
from forge_core.models import load_model_and_tokenizer
from forge_core.training import Trainer, TrainerConfig
from infra import components as C
from infra.config_checks import load_config
from tests.mixed_precision_helpers import LOST, TRACKS, moved_fraction, relative_gap, train
from tests.unit.test_trainer import make_batch


def test_bf16_compute_with_fp32_masters_tracks_fp32_where_bf16_parameters_do_not():
    fp32 = train(torch.float32, None)
    mixed = train(torch.float32, torch.bfloat16)
    bf16_params = train(torch.bfloat16, None)
    assert moved_fraction(fp32) > 0.5
    assert moved_fraction(mixed) > 0.5
    gap_mixed, gap_bf16 = relative_gap(mixed, fp32), relative_gap(bf16_params, fp32)
    print(f"moved: fp32 {moved_fraction(fp32):.3f} mixed {moved_fraction(mixed):.3f} "
          f"bf16 params {moved_fraction(bf16_params):.3f}; gap to fp32: mixed {gap_mixed:.4f} bf16 {gap_bf16:.4f}")
    assert 0 < gap_mixed < TRACKS  # > 0: the bf16 compute did happen (an fp32 run would match exactly)
    assert gap_bf16 > LOST  # the test's premise: without fp32 masters the updates are lost


def test_compute_dtype_follows_model_dtype_and_the_trainer_keeps_fp32():
    cfg = load_config("configs/grpo_math_tiny.yaml", {"model.dtype": "bfloat16"})
    assert C.trainer_arguments(cfg)[1]["compute_dtype"] == torch.bfloat16
    assert C.trainer_arguments(cfg, sft=True)[1]["compute_dtype"] == torch.bfloat16
    assert C.trainer_arguments(load_config("configs/grpo_math_tiny.yaml"))[1]["compute_dtype"] is None
    model, tok = load_model_and_tokenizer("tiny:qwen3-micro", seed=0)
    trainer = Trainer(model, get_loss("reinforce"), TrainerConfig(), tok.pad_token_id, compute_dtype=torch.bfloat16)
    inputs, targets = make_batch(tok)
    head_out = []
    model.lm_head.register_forward_hook(lambda _m, _i, out: head_out.append(out.dtype))
    lp, _ = trainer.logprobs(inputs, targets["padding_mask"])
    assert head_out == [torch.bfloat16]  # the matmuls ran in bf16
    assert lp.dtype == torch.float32  # log-softmax in fp32 after them
    trainer.train_step(inputs, targets)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {s["exp_avg"].dtype for s in trainer.optimizer.state.values()} == {torch.float32}


def test_float16_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"model.dtype = 'float16'.*loss scaling.*bfloat16"):
        load_config("configs/grpo_math_tiny.yaml", {"model.dtype": "float16"})


def test_a_bf16_trainer_worker_keeps_fp32_masters_and_publishes_bf16(tmp_path):
    """The trainer worker of a model.dtype bfloat16 run: fp32 parameters and AdamW state, bf16 autocast, and the
    weights it hands the generators (the weight store) in bf16."""
    from infra.weightsync import FSWeightStore
    from workers.trainer import TrainerWorker

    cfg = load_config("configs/grpo_math_tiny.yaml", {"model.path": "tiny:qwen3-micro", "model.dtype": "bfloat16",
                                                      "workers.threads": 1})
    store = FSWeightStore(tmp_path / "weights", keep=2)
    worker = TrainerWorker(cfg, store, threads=1)
    assert {p.dtype for p in worker.trainer.model.parameters()} == {torch.float32}
    assert worker.trainer.compute_dtype == torch.bfloat16
    worker.publish_weights(1)
    version, state = store.fetch(1)
    assert version == 1 and {v.dtype for v in state.values() if v.is_floating_point()} == {torch.bfloat16}
    masters = worker.trainer.model.state_dict()
    assert all(torch.equal(state[k], v.to(torch.bfloat16)) for k, v in masters.items() if v.is_floating_point())
