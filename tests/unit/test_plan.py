"""Worker layouts planned from configs alone: GPU recipes, multi-node jobs, capacity errors, the sbatch script."""

import subprocess
import sys
from pathlib import Path

import pytest

from infra import components as C
from infra.config_checks import load_config
from workers.plan import check_capacity, plan_jobs, render_plan, sbatch_script

ROOT = Path(__file__).resolve().parents[2]


def jobs_for(path, **overrides):
    cfg = load_config(path, overrides)
    return cfg, plan_jobs(cfg, C.needs_reference(cfg))


@pytest.mark.parametrize("path,gpus", [("configs/grpo_qwen3_1_7b.yaml", 3), ("configs/grpo_qwen3_1_7b_gsm8k.yaml", 3),
                                       ("configs/distributed.yaml", 16), ("configs/grpo_math_tiny.yaml", 0)])
def test_shipped_recipes_plan_within_their_gpus(path, gpus):
    cfg, jobs = jobs_for(path)
    check_capacity(cfg, jobs)
    assert sum(j.gpus for j in jobs) == gpus
    assert all(j.gpus == 0 for j in jobs if j.role == "reward")


def test_three_gpu_machine_gets_one_device_per_model():
    _, jobs = jobs_for("configs/grpo_qwen3_1_7b.yaml")
    devices = {j.role: j.devices for j in jobs}
    assert sorted(devices["trainer"] + devices["generator"] + devices["reference"]) == [0, 1, 2]
    assert devices["reward"] == ()


def test_trainer_larger_than_a_node_spans_nodes():
    cfg, jobs = jobs_for("configs/grpo_qwen3_1_7b_gsm8k.yaml", **{"slurm.nodes": 3, "slurm.gpus_per_node": 8,
                                                                  "trainer.procs": 16})
    trainer = next(j for j in jobs if j.role == "trainer")
    assert (trainer.nodes, trainer.tasks_per_node, trainer.gpus_per_node) == (2, 8, 8)
    check_capacity(cfg, jobs)
    assert "trainer-0     trainer        16      2          8    16" in render_plan(cfg, jobs, "x.yaml")


def test_impossible_layouts_name_the_fix():
    cfg, jobs = jobs_for("configs/grpo_qwen3_1_7b_gsm8k.yaml", **{"slurm.gpus_per_node": 2})
    with pytest.raises(ValueError, match=r"needs 3 GPUs .* = 2; put the reference model on CPU \(ref_model.device"):
        check_capacity(cfg, jobs)
    cfg, jobs = jobs_for("configs/grpo_qwen3_1_7b_gsm8k.yaml", **{"ref_model.device": "cpu", "slurm.gpus_per_node": 2})
    check_capacity(cfg, jobs)  # the reference on CPU frees a GPU
    with pytest.raises(ValueError, match="10 ranks do not split evenly over 3 nodes of 4 GPUs"):
        jobs_for("configs/grpo_qwen3_1_7b_gsm8k.yaml", **{"slurm.gpus_per_node": 4, "trainer.procs": 10})
    with pytest.raises(ValueError, match="lag up to 4 versions behind .* set max_policy_age >= 4"):
        load_config("configs/grpo_math_tiny.yaml", {"weightsync.sync_every": 4, "max_policy_age": 3})
    assert load_config("configs/grpo_math_tiny.yaml", {"weightsync.sync_every": 4, "max_policy_age": 4})
    with pytest.raises(ValueError, match="weightsync.backend 'broadcast' cannot feed it: set weightsync.backend: fs"):
        load_config("configs/grpo_qwen3_1_7b_gsm8k.yaml", {"weightsync.backend": "broadcast"})
    with pytest.raises(ValueError, match=r"weightsync.backend = 'nccl' is not one of \['fs', 'shared', 'torchstore', 'broadc"):
        load_config("configs/grpo_math_tiny.yaml", {"weightsync.backend": "nccl"})


def test_sbatch_script_runs_the_controller_with_the_same_recipe():
    cfg = load_config("configs/grpo_qwen3_1_7b_gsm8k.yaml")
    script = sbatch_script(cfg, "configs/grpo_qwen3_1_7b_gsm8k.yaml", ["--trainer.lr", "2e-6"])
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=forgeflow-controller")
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --time=24:00:00" in script
    assert ".venv/bin/forgeflow grpo --config configs/grpo_qwen3_1_7b_gsm8k.yaml --trainer.lr 2e-6" in script


@pytest.mark.parametrize("module,config,expect", [
    ("flows.grpo", "configs/grpo_qwen3_1_7b.yaml", "reference-0 sees CUDA devices 2"),
    ("flows.sft", "configs/sft_llama3_8b.yaml", "trainer-0     trainer         8      1          8     8"),
    ("flows.sft", "configs/sft_qwen3_8b.yaml", "trainer backend titan (FSDP 8 x TP 1, activation checkpointing selec"),
])
def test_reference_recipes_dry_run_on_cpu(module, config, expect, tmp_path):
    sbatch = tmp_path / "run.sbatch"
    out = subprocess.run([sys.executable, "-m", module, "--config", config, "--dry-run", "--sbatch", str(sbatch)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert expect in out.stdout and "dry run: nothing started" in out.stdout
    assert f"forgeflow {module.split('.')[1]} --config {config}" in sbatch.read_text()


def test_cli_scale_out_flags_reach_the_plan():
    out = subprocess.run([sys.executable, "-m", "cli", "grpo", "--config", "configs/grpo_qwen3_1_7b_gsm8k.yaml",
                          "--dry-run", "--slurm.nodes", "2", "--slurm.gpus_per_node", "8", "--trainer.procs", "16"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2  # 16 + generator + reference > 16 GPUs
    assert "needs 18 GPUs" in out.stderr and "raise slurm.nodes" in out.stderr


def test_titan_recipe_plan_shows_its_parallel_layout():
    cfg, jobs = jobs_for("configs/distributed.yaml")
    text = render_plan(cfg, jobs, "configs/distributed.yaml")
    assert "trainer backend titan (FSDP 4 x TP 2, activation checkpointing selective)" in text
    cfg, jobs = jobs_for("configs/distributed.yaml", **{"trainer.tensor_parallel_degree": 8})
    assert "FSDP 1 x TP 8" in render_plan(cfg, jobs, "configs/distributed.yaml")
