"""forgeflow against TRL's GRPOTrainer on the main job's work, measured in the same run on the same machine.

The same model (SmolLM2-135M-Instruct as forgeflow imports it), the same chat prompts (configs/grpo_smollm2.yaml:
word sums, system prompt), the same judge (forgeflow's reward, the last number must equal the sum), the same batch
geometry (8 prompts x 8 samples, 16 new tokens, T = 1), DAPO's token-level loss with clip 0.2 / 0.28, no KL,
AdamW at lr 5e-6 constant, max grad norm 1, bf16 autocast over fp32 weights, `threads` torch threads.

- TRL 1.16 `GRPOTrainer`, in a child process (TRL is not a forgeflow dependency: `pip install --no-deps
  trl==1.16.0`, or `--trl-path DIR` where it was installed with `pip install --no-deps --target DIR`).
- forgeflow through its Prefect flow and worker processes (`forgeflow grpo`, a fresh FORGEFLOW_HOME), first on
  identical work (`filter_groups: false`: every group trained, as TRL does), then with `--main-job` also the main
  job's own config (dynamic sampling with one refill round).

Seconds per step: TRL from one step's end to the next (generation, scoring and the update); forgeflow the flow's
`timing/step` less its held-out evaluations (TRL runs none; mid-run checkpoints are off in every run). Held-out:
greedy accuracy on the config's 200 held-out problems before and after, by forgeflow's evaluator with a bf16
generator. Last line: `RESULT speedup=<TRL s/step / forgeflow s/step, identical work> trl_gain=… forgeflow_gain=…`.

    .venv/bin/python bench/trl_peer.py [--steps 30] [--seed 0] [--main-job] [--trl-path DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

CONFIG = "configs/grpo_smollm2.yaml"
ROOT = Path(__file__).resolve().parent.parent


def held_out_accuracy(cfg, model, tok, splits) -> float:
    """Greedy held-out accuracy with a bf16 copy of `model` (what the flow's generator evaluates with)."""
    import copy

    import torch

    from forge_core.generation import TorchGenerator
    from forge_core.recipes.steps import evaluate

    gen = TorchGenerator(copy.deepcopy(model).to(torch.bfloat16).eval(), tok, cfg.generator)
    return evaluate(gen, splits.eval, splits.eval_prompts, cfg.generator.max_new_tokens)["eval/accuracy"]


def run_trl(args) -> dict:
    """TRL's GRPOTrainer on the main job's work, in this process."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from forge_core.models import load_model_and_tokenizer
    from infra import components as C
    from infra.config_checks import load_config

    cfg = load_config(CONFIG, {"seed": args.seed})
    threads = C.configure_threads(cfg)
    model, tok = load_model_and_tokenizer(cfg.model.path, seed=cfg.seed, dtype=torch.float32)
    splits = C.build_splits(cfg, tok)
    before = held_out_accuracy(cfg, model, tok, splits)
    reward = C.build_reward(cfg)

    def judge(prompts, completions, target, **_) -> list[float]:
        return [reward.score(p, c, t).total for p, c, t in zip(prompts, completions, target, strict=True)]

    data = Dataset.from_list([{"prompt": p, "target": prob.solution}
                              for p, prob in zip(splits.train_prompts, splits.train, strict=True)])
    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            ends.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            ends.append(time.perf_counter())

    batch = cfg.prompts_per_step * cfg.group_size
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-peer-"), max_steps=args.steps, seed=cfg.seed,
        per_device_train_batch_size=batch, num_generations=cfg.group_size, gradient_accumulation_steps=1,
        max_completion_length=cfg.generator.max_new_tokens, temperature=cfg.generator.temperature,
        top_p=cfg.generator.top_p, learning_rate=cfg.trainer.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=cfg.trainer.max_norm, loss_type="dapo", epsilon=cfg.loss.params["clip_low"],
        epsilon_high=cfg.loss.params["clip_high"], beta=0.0, num_iterations=1, bf16=True, use_cpu=True,
        save_strategy="no", report_to="none", logging_steps=1, dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, reward_funcs=judge, args=config, train_dataset=data, processing_class=tok,
                          callbacks=[StepClock()])
    start = time.perf_counter()
    trainer.train()
    minutes = (time.perf_counter() - start) / 60
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    after = held_out_accuracy(cfg, trainer.model, tok, splits)
    steps = [b - a for a, b in zip(ends, ends[1:])]
    return {"name": "TRL GRPOTrainer", "threads": threads, "step_s": steps, "before": before, "after": after,
            "minutes": minutes, "reward_last5": statistics.fmean(rewards[-5:]) if rewards else float("nan")}


def run_forgeflow(args, name: str, overrides: list[str]) -> dict:
    """`forgeflow grpo` through the flow and workers in a fresh FORGEFLOW_HOME; its RESULT and per-step timings."""
    from mlflow.tracking import MlflowClient

    home = Path(tempfile.mkdtemp(prefix="forgeflow-peer-"))
    models = Path(os.environ.get("FORGEFLOW_HOME", ".forgeflow")).resolve() / "models"
    if models.is_dir():  # the model imported once already (the import is not part of a step)
        (home / "models").symlink_to(models)
    cmd = [str(Path(sys.executable).with_name("forgeflow")), "grpo", "--config", CONFIG, "--seed", str(args.seed),
           "--steps", str(args.steps), "--eval.every", "0", "--checkpoint.every", "0", "--run-name", "trl-peer",
           *overrides]
    env = {**os.environ, "FORGEFLOW_HOME": str(home)}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = re.search(r"RESULT acc_before=(\S+) acc_after=(\S+) minutes=(\S+)", out.stdout + out.stderr)
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    history: dict[str, dict[int, float]] = {}
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id]):
            if "timing/step" in run.data.metrics:
                for key in ("timing/step", "timing/eval", "reward/mean"):
                    history[key] = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
    evals = history.get("timing/eval", {})
    steps = [v - evals.get(s, 0.0) for s, v in sorted(history["timing/step"].items())]
    rewards = [v for _, v in sorted(history["reward/mean"].items())]
    return {"name": name, "step_s": steps, "before": float(result[1]), "after": float(result[2]),
            "minutes": float(result[3]), "reward_last5": statistics.fmean(rewards[-5:])}


def show(rows: list[dict], args) -> None:
    print(f"\nSmolLM2-135M-Instruct, {args.steps} GRPO steps of 8 prompts x 8 samples, seed {args.seed}, this machine "
          f"({os.cpu_count()} cores)")
    print(f"{'run':<44} {'s/step mean':>11} {'median':>7} {'held-out greedy':>16} {'reward, last 5':>15} {'min':>5}")
    for r in rows:
        print(f"{r['name']:<44} {statistics.fmean(r['step_s']):>11.2f} {statistics.median(r['step_s']):>7.2f} "
              f"{r['before']:>7.3f} → {r['after']:.3f} {r['reward_last5']:>15.3f} {r['minutes']:>5.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--main-job", action="store_true", help="also run the main job's config (dynamic sampling)")
    parser.add_argument("--trl-path", help="a directory TRL was installed into with pip --target")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # TRL in its own process, so that its imports and threads touch nothing of the parent's
        print("BENCH " + json.dumps(run_trl(args)), flush=True)
        return 0
    env = dict(os.environ)
    if args.trl_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.trl_path, str(ROOT), env.get("PYTHONPATH")]))
    probe = subprocess.run([sys.executable, "-c", "import trl"], env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        raise SystemExit("TRL is not importable: pip install --no-deps trl==1.16.0 (or pass --trl-path DIR after "
                         "pip install --no-deps --target DIR trl==1.16.0)")
    print(f"TRL GRPOTrainer, {args.steps} steps…", flush=True)
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--seed", str(args.seed)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the TRL run failed:\n{out.stderr[-3000:]}")
    rows = [json.loads(next(x for x in out.stdout.splitlines() if x.startswith("BENCH "))[6:])]
    print("forgeflow through the flow, identical work…", flush=True)
    rows.append(run_forgeflow(args, "forgeflow flow, identical work (no filter)", ["--filter_groups", "false",
                                                                                   "--fill_rounds", "1"]))
    if args.main_job:
        print("forgeflow through the flow, the main job's config…", flush=True)
        rows.append(run_forgeflow(args, "forgeflow flow, main job (dynamic sampling)", []))
    show(rows, args)
    trl, ours = rows[0], rows[1]
    print(f"RESULT speedup={statistics.fmean(trl['step_s']) / statistics.fmean(ours['step_s']):.2f} "
          f"trl_gain={trl['after'] - trl['before']:.3f} forgeflow_gain={ours['after'] - ours['before']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
