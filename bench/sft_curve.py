"""Held-out greedy accuracy along an SFT schedule: shows whether an SFT model was trained until it stopped improving.

Trains `sft.steps` SFT steps of the config's model the way a run does (`sft.examples` labelled problems, 0: all,
and the teacher's demonstrations when `sft.drop_carry` is set), evaluates every `--every` steps (greedy, and with
`eval.samples` also sampled accuracy and pass@k), saves the final checkpoint, prints the curve, writes a PNG and ends
with `RESULT …`.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from forge_core.generation import TorchGenerator  # noqa: E402
from forge_core.losses import get_loss  # noqa: E402
from forge_core.models import load_model_and_tokenizer, save_model_and_tokenizer  # noqa: E402
from forge_core.recipes.steps import evaluate  # noqa: E402
from forge_core.training import Trainer  # noqa: E402
from infra import components as C  # noqa: E402
from infra.config import parse_overrides  # noqa: E402
from infra.config_checks import load_config  # noqa: E402
from infra.paths import new_run_id, run_dir  # noqa: E402
from runtime.plots import plot_curves  # noqa: E402
from runtime.progress import quiet_libraries  # noqa: E402
from runtime.sft import run_sft_steps  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/grpo_math_tiny.yaml")
    parser.add_argument("--every", type=int, default=100, help="evaluate every N SFT steps")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    args = parser.parse_args()
    quiet_libraries()
    cfg = load_config(args.config, parse_overrides([f"--{item}" for item in args.set]))
    C.configure_threads(cfg)
    out = run_dir("bench-sft-" + new_run_id())
    model, tok = load_model_and_tokenizer(cfg.model.path, seed=cfg.seed)
    splits = C.build_splits(cfg, tok)
    n = cfg.sft.examples or len(splits.train)
    config, options = C.trainer_arguments(cfg, sft=True)
    trainer = Trainer(model, get_loss("sft"), config, tok.pad_token_id, **options)
    generator = TorchGenerator(model, tok, cfg.generator)
    curve, t0 = [], time.perf_counter()

    def on_step(step, metrics):
        if (step + 1) % args.every == 0 or step + 1 == cfg.sft.steps:
            held_out = evaluate(generator, splits.eval, splits.eval_prompts, cfg.generator.max_new_tokens,
                                samples=cfg.eval.samples, temperature=cfg.generator.temperature, seed=cfg.seed,
                                env=cfg.env)
            model.train()
            held_out.pop("timing/eval")
            curve.append({"step": step + 1, **held_out, "loss/loss": metrics["loss"], "lr": metrics["lr"]})
            sampled = "".join(f"  {k.removeprefix('eval/')} {v:.3f}" for k, v in held_out.items() if k != "eval/accuracy")
            print(f"sft step {step + 1:>5}  loss {metrics['loss']:.4f}  lr {metrics['lr']:.2e}  held-out "
                  f"{held_out['eval/accuracy']:.3f}{sampled}  ({(time.perf_counter() - t0) / 60:.1f} min)", flush=True)

    run_sft_steps(cfg, trainer, tok, splits, show=False, report=on_step)  # the run's own SFT: teacher included
    path = save_model_and_tokenizer(model, tok, out / "sft")
    png = plot_curves({f"sft {n} examples": curve}, out / "sft_curve.png",
                      keys=("eval/accuracy", "eval/sampled_accuracy", "loss/loss"),
                      title=f"SFT on {n} labelled problems, seed {cfg.seed}")
    (out / "sft_curve.json").write_text(json.dumps(curve, indent=2))
    best = max(curve, key=lambda r: r["eval/accuracy"])
    print(f"checkpoint: {path}\nplot: {png}")
    print(f"RESULT final_acc={curve[-1]['eval/accuracy']:.3f} best_acc={best['eval/accuracy']:.3f} "
          f"best_step={best['step']} examples={n} seed={cfg.seed} checkpoint={path}")


if __name__ == "__main__":
    main()
