"""trainer.procs: 2 (two gloo ranks, FSDP2): each rank scores only its share of the batch's reference (LoRA: adapters
off) and proximal logprobs, and the gathered logprobs the step trains against equal a one-process run's."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROWS = 5  # uneven over two ranks: 3 and 2 rows, the second padded to 3 (equal forwards, or FSDP would hang)
SETTINGS = {"model.path": "tiny:qwen3-micro", "sft.steps": 0, "generator.max_new_tokens": 4, "loss.name": "grpo",
            "trainer.lr": 1e-3, "trainer.micro_batch_size": 1, "trainer.lora.rank": 4, "loss.beta": 0.04,
            "rollout_correction.mode": "tis", "trainer.mini_batches": 1, "workers.threads": 1}


def config(procs: int):
    from infra.config_checks import load_config

    return load_config("configs/grpo_math_tiny.yaml", {**SETTINGS, "trainer.procs": procs})


def make_groups(path: Path) -> None:
    """One prompt's group of ROWS sampled completions, rewards alternating (all informative), saved to `path`."""
    from forge_core.generation import TorchGenerator
    from forge_core.models import load_model_and_tokenizer
    from forge_core.recipes import steps
    from infra import components as C

    cfg = config(1)
    model, tok = load_model_and_tokenizer(cfg.model.path, seed=0)
    splits = C.build_splits(cfg, tok)
    groups = steps.rollout(TorchGenerator(model, tok), splits.train[:1], splits.train_prompts[:1], ROWS, seed=0)
    for i, e in enumerate(groups[0].episodes):
        e.reward = float(i % 2)
    torch.save(groups, path)


def record(worker) -> dict:
    """Wrap the worker's trainer: rows each outermost scoring call sees, and each train_step's targets."""
    trainer, seen = worker.trainer, {"proximal": [], "reference": [], "steps": []}
    depth = [0]

    def counting(name, method):
        def scored(inputs, mask):
            if depth[0] == 0:  # reference_logprobs scores through proximal_logprobs: count the outer call only
                seen[name].append([e["tokens"].tolist() for e in inputs])
            depth[0] += 1
            try:
                return method(inputs, mask)
            finally:
                depth[0] -= 1
        return scored

    trainer.proximal_logprobs = counting("proximal", trainer.proximal_logprobs)
    trainer.reference_logprobs = counting("reference", trainer.reference_logprobs)
    step = trainer.train_step

    def recorded_step(inputs, targets, *args, **kwargs):
        seen["steps"].append({"tokens": [e["tokens"].tolist() for e in inputs],
                              **{k: targets[k].clone() for k in ("ref_logprobs", "old_logprobs")}})
        return step(inputs, targets, *args, **kwargs)

    trainer.train_step = recorded_step
    return seen


def update_on(worker, groups) -> dict:
    from forge_core.recipes import steps

    seen = record(worker)
    episodes, _ = steps.compute_advantages(groups, worker.cfg.advantage.name)
    seen["metrics"] = worker._update_policy(episodes, 0)
    return seen


def run_rank(rank: int, address_file: str, groups_file: str, out: str) -> None:
    torch.set_num_threads(1)
    from infra.dist_store import close_job_process_group, init_job_process_group
    from workers.trainer import TrainerWorker

    init_job_process_group(rank, 2, "127.0.0.1", Path(address_file), timeout_s=120)
    try:
        seen = update_on(TrainerWorker(config(2)), torch.load(groups_file, weights_only=False))
        torch.save(seen, f"{out}.{rank}")
    finally:
        close_job_process_group()


def test_each_rank_scores_only_its_rows_and_the_result_equals_one_process():
    from workers.trainer import TrainerWorker

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with tempfile.TemporaryDirectory() as tmp:
        groups_file, out = Path(tmp) / "groups.pt", Path(tmp) / "seen"
        make_groups(groups_file)
        mp.start_processes(run_rank, args=(str(Path(tmp) / "store.json"), str(groups_file), str(out)), nprocs=2,
                           start_method="spawn")
        ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
        one = update_on(TrainerWorker(config(1)), torch.load(groups_file, weights_only=False))
    (full,) = one["steps"]
    rows = full["tokens"]
    assert len(rows) == ROWS and one["proximal"] == [rows] and one["reference"] == [rows]
    for r, seen in enumerate(ranks):
        mine = rows[r::2]
        padded = mine + [rows[0]] * (3 - len(mine))  # every rank scores ceil(5 / 2) = 3 rows
        assert seen["proximal"] == [padded], r  # one call, on this rank's rows only
        assert seen["reference"] == [padded], r
        (step,) = seen["steps"]
        assert step["tokens"] == padded
        for key in ("ref_logprobs", "old_logprobs"):  # the gathered batch's rows, as one process scored them
            torch.testing.assert_close(step[key][:len(mine)], full[key][r::2], rtol=0, atol=1e-6)
    for key in ("loss/loss", "rollout/behaviour_kl_k3"):
        assert ranks[0]["metrics"][key] == ranks[1]["metrics"][key]
        assert abs(ranks[0]["metrics"][key] - one["metrics"][key]) < 1e-6, key
