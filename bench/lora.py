"""LoRA against full fine-tuning on the main job's model and task (SmolLM2-135M-Instruct, configs/grpo_smollm2.yaml).

Each variant runs in its own process (peak memory is the process's): the same in-process GRPO steps from the same
weights and seed, held-out greedy accuracy before and after. Prints a table of trainable parameters, optimizer
bytes, peak RSS, train seconds per full step (per trained row × prompts_per_step × group_size: dynamic sampling
trains only informative groups, more of them as a variant learns), the bytes a weight sync moves (merged full weights, bf16, which is what
forgeflow publishes; and what an adapter-only sync would move) and the held-out gain, then
`RESULT step_ratio=… (full s/step ÷ lora s/step) mem_ratio=… gain_full=… gain_lora=…`.

    .venv/bin/python bench/lora.py [--steps 16] [--rank 8] [--lora-lr 5e-5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

CONFIG = "configs/grpo_smollm2.yaml"


def run_variant(args) -> dict:
    """One variant in this process: returns its measurements."""
    import torch

    from forge_core.generation import TorchGenerator
    from forge_core.models import load_model_and_tokenizer
    from forge_core.models.lora import has_lora
    from forge_core.recipes.steps import evaluate
    from infra import components as C
    from infra.config_checks import load_config
    from runtime.inprocess import grpo_phase

    overrides = {"steps": args.steps, "eval.every": 0, "trainer.lr": args.lr, "seed": args.seed}
    if args.variant == "lora":
        overrides.update({"trainer.lora.rank": args.rank, "trainer.lora.alpha": 2.0 * args.rank})
    cfg = load_config(CONFIG, overrides)
    C.configure_threads(cfg)
    torch.manual_seed(cfg.seed)
    model, tok = load_model_and_tokenizer(cfg.model.path, seed=cfg.seed, dtype=C.MASTER_DTYPE)
    splits = C.build_splits(cfg, tok)

    def held_out() -> float:
        gen = TorchGenerator(model, tok, cfg.generator)
        return evaluate(gen, splits.eval, splits.eval_prompts, cfg.generator.max_new_tokens)["eval/accuracy"]

    before = held_out()
    start = time.perf_counter()
    history = grpo_phase(cfg, model, tok, splits, show=False)
    minutes = (time.perf_counter() - start) / 60
    after = held_out()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    # dynamic sampling trains only the informative groups, so the rows per step vary (and grow as a variant
    # learns): time per trained row, scaled to a full step of prompts_per_step × group_size rows
    trained = [r for r in history if r.get("loss/optimizer_steps")]
    rows = sum(r["rollout/num_episodes"] for r in trained)
    per_step = sum(r["timing/train"] for r in trained) / rows * cfg.prompts_per_step * cfg.group_size if rows else 0
    return {"variant": args.variant, "trainable": trainable, "adam_bytes": 8 * trainable,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "train_s_per_step": per_step or float("nan"), "trained_rows": rows,
            "sync_bytes_merged": 2 * total, "sync_bytes_adapters": 2 * trainable if has_lora(model) else 2 * total,
            "before": before, "after": after, "gain": after - before, "minutes": minutes}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--full-lr", type=float, default=5e-6)
    parser.add_argument("--lora-lr", type=float, default=5e-5, help="LoRA wants about 10x the full lr")
    parser.add_argument("--variant", choices=["full", "lora"], help=argparse.SUPPRESS)
    parser.add_argument("--lr", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # a child: one variant, one JSON line
        print("BENCH " + json.dumps(run_variant(args)), flush=True)
        return 0
    rows = []
    for variant, lr in (("full", args.full_lr), ("lora", args.lora_lr)):
        cmd = [sys.executable, __file__, "--variant", variant, "--lr", str(lr), "--steps", str(args.steps),
               "--seed", str(args.seed), "--rank", str(args.rank)]
        print(f"running {variant} (lr {lr}, {args.steps} steps)…", flush=True)
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(next(x for x in out.splitlines() if x.startswith("BENCH "))[6:]))
    full, lora = rows
    print(f"\nSmolLM2-135M-Instruct, {args.steps} in-process GRPO steps of configs/grpo_smollm2.yaml, seed {args.seed}, "
          f"LoRA rank {args.rank} (alpha {2 * args.rank}) on the attention and MLP projections")
    print(f"{'':>10} {'trainable':>12} {'AdamW MB':>9} {'peak RSS GB':>12} {'train s/64 rows':>16} "
          f"{'sync MB (merged)':>17} {'sync MB (adapters)':>19} {'held-out':>15} {'min':>5}")
    for r in rows:
        print(f"{r['variant']:>10} {r['trainable']:>12,} {r['adam_bytes'] / 1e6:>9.1f} {r['peak_rss_gb']:>12.2f} "
              f"{r['train_s_per_step']:>16.2f} {r['sync_bytes_merged'] / 1e6:>17.1f} "
              f"{r['sync_bytes_adapters'] / 1e6:>19.1f} {r['before']:.3f} → {r['after']:.3f} {r['minutes']:>5.1f}")
    print(f"RESULT step_ratio={full['train_s_per_step'] / lora['train_s_per_step']:.2f} "
          f"mem_ratio={full['peak_rss_gb'] / lora['peak_rss_gb']:.2f} gain_full={full['gain']:.3f} "
          f"gain_lora={lora['gain']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
