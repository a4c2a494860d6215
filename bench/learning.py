"""The same GRPO pipeline for each of grpo, dapo, gspo, cispo, sapo from one shared SFT checkpoint.

Prints a table (loss, held-out greedy accuracy before/after, minutes), writes a PNG with the curves, and ends with
`RESULT …` (each loss's accuracy gain; baseline = the shared SFT checkpoint measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from cli.inprocess import grpo_phase  # noqa: E402
from cli.main import quiet_libraries  # noqa: E402
from forge_core.generation import TorchGenerator  # noqa: E402
from forge_core.models import load_model_and_tokenizer  # noqa: E402
from forge_core.recipes.steps import evaluate  # noqa: E402
from infra import components as C  # noqa: E402
from infra.config_checks import load_config  # noqa: E402
from infra.paths import new_run_id, run_dir  # noqa: E402
from infra.plots import plot_curves  # noqa: E402
from infra.sft import sft_phase  # noqa: E402

LOSSES = ("grpo", "dapo", "gspo", "cispo", "sapo")
# each family with its published clip settings and the recipe's KL coefficient (SAPO has no KL term)
LOSS_SECTIONS = {
    "grpo": {"name": "grpo", "clip_low": 0.2, "clip_high": 0.2},
    "dapo": {"name": "dapo", "clip_low": 0.2, "clip_high": 0.28},
    "gspo": {"name": "gspo", "clip_low": 3e-4, "clip_high": 4e-4},
    "cispo": {"name": "cispo", "clip_high": 4.0},
    "sapo": {"name": "sapo"},
}


def loss_section(name: str, beta: float) -> dict:
    section = dict(LOSS_SECTIONS.get(name, {"name": name}))
    if name != "sapo":
        section["beta"] = beta
    return section


def held_out(cfg, model, tok, splits) -> dict:
    gen = TorchGenerator(model, tok, C.sampling_params(cfg))
    return evaluate(gen, splits.eval, splits.eval_prompts, cfg.generator.max_new_tokens,
                    samples=cfg.eval.samples, temperature=cfg.generator.temperature, seed=cfg.seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/grpo_math_tiny.yaml")
    parser.add_argument("--sft-init", default=None, help="reuse an SFT checkpoint instead of training one")
    parser.add_argument("--losses", default=",".join(LOSSES))
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per loss (default: the config's)")
    args = parser.parse_args()
    quiet_libraries()
    out = run_dir("bench-learning-" + new_run_id())
    base = load_config(args.config, {"steps": args.steps} if args.steps else None)
    C.configure_threads(base)
    model, tok = load_model_and_tokenizer(args.sft_init or base.model.path, seed=base.seed)
    splits = C.build_splits(base, tok)
    sft_path = args.sft_init
    if sft_path is None:
        t0 = time.perf_counter()
        sft_path = str(sft_phase(base, model, tok, splits, out, show=True))
        print(f"shared SFT checkpoint {sft_path} in {(time.perf_counter() - t0) / 60:.1f} min")
    rows, curves = [], {}
    for name in args.losses.split(","):
        cfg = load_config(args.config, {"steps": base.steps,
                                        "loss": loss_section(name, base.loss.beta)})
        model, tok = load_model_and_tokenizer(sft_path, seed=cfg.seed)
        before = held_out(cfg, model, tok, splits)
        t0 = time.perf_counter()
        history = grpo_phase(cfg, model, tok, splits, show=True)
        minutes = (time.perf_counter() - t0) / 60
        after = held_out(cfg, model, tok, splits)
        curves[name] = [{"step": 0, **before}] + history + [{"step": cfg.steps, **after}]
        rows.append({"loss": name, "acc_before": before["eval/accuracy"], "acc_after": after["eval/accuracy"],
                     "sampled_before": before.get("eval/sampled_accuracy"),
                     "sampled_after": after.get("eval/sampled_accuracy"), "minutes": minutes})
    png = plot_curves(curves, out / "learning.png", keys=("reward/mean", "eval/accuracy"),
                      title=f"GRPO-family losses from one SFT checkpoint ({base.steps} steps)")
    (out / "learning.json").write_text(json.dumps(rows, indent=2))
    print(f"\n{'loss':<8} {'acc before':>10} {'acc after':>10} {'gain':>7} {'minutes':>8}")
    for r in rows:
        gain = r["acc_after"] - r["acc_before"]
        print(f"{r['loss']:<8} {r['acc_before']:>10.3f} {r['acc_after']:>10.3f} {gain:>+7.3f} {r['minutes']:>8.1f}")
    print(f"plot: {png}")
    print("RESULT " + " ".join(f"{r['loss']}_gain={r['acc_after'] - r['acc_before']:+.3f}" for r in rows)
          + f" baseline_acc={rows[0]['acc_before']:.3f}")


if __name__ == "__main__":
    main()
