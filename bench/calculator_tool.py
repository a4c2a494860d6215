"""The calculator tool recipe (configs/grpo_calculator_tool.yaml) through the grpo flow, one run per seed: held-out
greedy accuracy with the tool before RL (the SFT model) and after, and the same models without the tool
(env.options.allow_tools false: a tool call ends the episode unrewarded), with the eval's standard error and the
run's minutes. Writes JSON and a PNG of the runs' curves under .forgeflow/bench-calculator-<id>/ and ends with
`RESULT …`.

    .venv/bin/python bench/calculator_tool.py --seeds 0 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from flows.grpo import grpo_flow  # noqa: E402
from forge_core.generation import TorchGenerator  # noqa: E402
from forge_core.models import load_model_and_tokenizer  # noqa: E402
from forge_core.recipes.steps import evaluate  # noqa: E402
from infra import components as C  # noqa: E402
from infra.config import parse_overrides  # noqa: E402
from infra.config_checks import load_config  # noqa: E402
from infra.paths import new_run_id, run_dir  # noqa: E402
from runtime.plots import plot_curves  # noqa: E402
from runtime.progress import quiet_libraries  # noqa: E402


def held_out_accuracy(model_dir: str, cfg, allow_tools: bool) -> float:
    """Greedy accuracy of a model on the config's held-out problems, in its environment with or without the tool."""
    env = cfg.env if allow_tools else dataclasses.replace(cfg.env, options={**cfg.env.options, "allow_tools": False})
    model, tok = load_model_and_tokenizer(model_dir, seed=cfg.seed)
    splits = C.build_splits(cfg, tok)
    generator = TorchGenerator(model.eval(), tok, cfg.generator)
    return evaluate(generator, splits.eval, splits.eval_prompts, cfg.generator.max_new_tokens, seed=cfg.seed,
                    env=env)["eval/accuracy"]


def standard_error(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/grpo_calculator_tool.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    args = parser.parse_args()
    quiet_libraries()
    overrides = parse_overrides([f"--{item}" for item in args.set])
    out = run_dir("bench-calculator-" + new_run_id())
    results, curves = [], {}
    for seed in args.seeds:
        cfg = load_config(args.config, {**overrides, "seed": seed})
        C.configure_threads(cfg)
        summary = grpo_flow(config=args.config, overrides={**overrides, "seed": seed}, run_name=f"calculator-s{seed}")
        sft_model, final_model = summary["init_model"], str(Path(summary["checkpoint"]) / "hf")
        row = {"seed": seed, "minutes": summary["minutes"], "tool_before": summary["acc_before"],
               "tool_after": summary["acc_after"], "alone_before": held_out_accuracy(sft_model, cfg, False),
               "alone_after": held_out_accuracy(final_model, cfg, False), "run_id": summary["run_id"],
               "num_prompts": cfg.eval.num_prompts}
        results.append(row)
        metrics = [json.loads(line) for line in (run_dir(summary["run_id"]) / "metrics.jsonl").read_text().splitlines()]
        curves[f"seed {seed}"] = [r for r in metrics if "eval/accuracy" in r]
        n = row["num_prompts"]
        print(f"seed {seed}: with the tool {row['tool_before']:.3f} -> {row['tool_after']:.3f} "
              f"(±{standard_error(row['tool_after'], n):.3f}), without it {row['alone_before']:.3f} -> "
              f"{row['alone_after']:.3f}, {row['minutes']:.2f} min (run {row['run_id']})", flush=True)
        (out / "calculator_tool.json").write_text(json.dumps(results, indent=2))
    plot_curves(curves, out / "calculator_tool.png", keys=("eval/accuracy", "eval/tool_calls_mean"),
                title="calculator tool recipe: held-out greedy accuracy with the tool")
    gains = [r["tool_after"] - r["tool_before"] for r in results]
    print(f"json: {out / 'calculator_tool.json'}\nplot: {out / 'calculator_tool.png'}")
    print(f"RESULT gain_mean={statistics.fmean(gains):+.3f} gains={','.join(f'{g:+.3f}' for g in gains)} "
          f"minutes_max={max(r['minutes'] for r in results):.2f} "
          f"alone_after_max={max(r['alone_after'] for r in results):.3f}")


if __name__ == "__main__":
    main()
