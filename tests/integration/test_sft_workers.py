"""SFT on a trainer worker (trainer.procs ranks: FSDP, or torchtitan pipeline stages) gives the weights that SFT in
the flow's own process gives."""

import pytest

from forge_core.models import load_model_and_tokenizer
from tasks.sft import sft_train

pytestmark = pytest.mark.integration

BASE = {"model.path": "tiny:qwen3-arith-untied", "sft.steps": 3, "sft.batch_size": 8, "sft.lr": 1e-3,
        "workers.threads": 1, "threads": 1, "workers.start_timeout_s": 180}


@pytest.mark.parametrize("layout", [{"trainer.procs": 2},
                                    {"trainer.procs": 2, "trainer.backend": "titan",
                                     "trainer.pipeline_parallel_degree": 2}], ids=["hf-fsdp2", "titan-pp2"])
def test_sft_on_trainer_ranks_equals_sft_in_process(tmp_path, layout):
    here = sft_train.fn("configs/grpo_math_tiny.yaml", BASE, str(tmp_path / "here"))
    workers = sft_train.fn("configs/grpo_math_tiny.yaml", {**BASE, **layout}, str(tmp_path / "workers"))
    assert (tmp_path / "workers" / "workers" / "authkey").exists()  # it did run on a worker pool
    a, _ = load_model_and_tokenizer(here)
    b, _ = load_model_and_tokenizer(workers)
    start, _ = load_model_and_tokenizer(BASE["model.path"])
    moved = max((a.state_dict()[k] - start.state_dict()[k]).abs().max().item() for k in start.state_dict())
    diff = max((a.state_dict()[k] - b.state_dict()[k]).abs().max().item() for k in a.state_dict())
    assert moved > 1e-4 and diff < moved / 100, (moved, diff)  # trained, and trained alike
