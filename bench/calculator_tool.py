"""The calculator tool recipe (configs/grpo_calculator_tool.yaml) through the grpo flow, one run per seed: held-out
greedy accuracy with the tool before RL (the SFT model) and after, and the same models without the tool
(env.options.allow_tools false: a tool call ends the episode unrewarded), with the eval's standard error and the
run's minutes. Without the tool the model is shown neither the tool's schema nor the environment's `tool_prompt`.
Writes JSON and a PNG of the runs' curves under .forgeflow/bench-calculator-<id>/ and ends with `RESULT …`.

    .venv/bin/python bench/calculator_tool.py --seeds 0 1
    .venv/bin/python bench/calculator_tool.py --runs <run_id> <run_id>   # evaluate finished runs again, no training
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
from pathlib import Path

import yaml

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


def held_out_eval(model_dir: str, cfg, allow_tools: bool) -> dict[str, float]:
    """Greedy accuracy (eval/accuracy) and tool calls per episode (eval/tool_calls_mean: without the tool, the share
    of episodes that tried to call it) of a model on the config's held-out problems, with or without the tool."""
    env = cfg.env if allow_tools else dataclasses.replace(cfg.env, options={**cfg.env.options, "allow_tools": False})
    model, tok = load_model_and_tokenizer(model_dir, seed=cfg.seed)
    splits = C.build_splits(cfg, tok)
    generator = TorchGenerator(model.eval(), tok, cfg.generator)
    return evaluate(generator, splits.eval, splits.eval_prompts, cfg.generator.max_new_tokens, seed=cfg.seed,
                    env=env)


def standard_error(p: float, n: int) -> float:
    """The binomial standard error of an accuracy p over n problems (0 at p = 0 or 1)."""
    return math.sqrt(p * (1 - p) / n)


def run_seed(run_id: str) -> int:
    """The seed a finished run was trained with (its config.yaml)."""
    return int(yaml.safe_load((run_dir(run_id) / "config.yaml").read_text())["seed"])


def train(config: str, overrides: dict, seed: int) -> dict:
    """One run of the recipe through the grpo flow; its summary."""
    return grpo_flow(config=config, overrides={**overrides, "seed": seed}, run_name=f"calculator-s{seed}")


def measure(summary: dict, cfg) -> dict:
    """The table row of a finished run: its SFT and final models with the tool (as the run measured them) and
    without it."""
    sft_model, final_model = summary["init_model"], str(Path(summary["checkpoint"]) / "hf")
    alone_before, alone_after = held_out_eval(sft_model, cfg, False), held_out_eval(final_model, cfg, False)
    return {"seed": cfg.seed, "minutes": summary["minutes"], "tool_before": summary["acc_before"],
            "tool_after": summary["acc_after"], "alone_before": alone_before["eval/accuracy"],
            "alone_after": alone_after["eval/accuracy"], "alone_before_calls": alone_before["eval/tool_calls_mean"],
            "alone_after_calls": alone_after["eval/tool_calls_mean"], "run_id": summary["run_id"],
            "num_prompts": cfg.eval.num_prompts}


def describe(row: dict) -> str:
    """One line per run: each accuracy with its standard error."""
    n = row["num_prompts"]
    acc = {k: f"{row[k]:.3f} ±{standard_error(row[k], n):.3f}"
           for k in ("tool_before", "tool_after", "alone_before", "alone_after")}
    return (f"seed {row['seed']}: with the tool {acc['tool_before']} -> {acc['tool_after']}, without it "
            f"{acc['alone_before']} -> {acc['alone_after']} (tried to call it: {row['alone_before_calls']:.2f} -> "
            f"{row['alone_after_calls']:.2f} of episodes), {row['minutes']:.2f} min (run {row['run_id']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/grpo_calculator_tool.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--runs", nargs="+", default=[], metavar="RUN_ID",
                        help="measure these finished runs (their summary.json) instead of training; --seeds ignored")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    args = parser.parse_args()
    quiet_libraries()
    overrides = parse_overrides([f"--{item}" for item in args.set])
    out = run_dir("bench-calculator-" + new_run_id())
    results, curves = [], {}
    jobs = [(run_seed(r), r) for r in args.runs] if args.runs else [(s, None) for s in args.seeds]
    for seed, run_id in jobs:
        cfg = load_config(args.config, {**overrides, "seed": seed})
        C.configure_threads(cfg)
        summary = train(args.config, overrides, seed) if run_id is None else \
            json.loads((run_dir(run_id) / "summary.json").read_text())
        row = measure(summary, cfg)
        results.append(row)
        metrics = [json.loads(line) for line in (run_dir(summary["run_id"]) / "metrics.jsonl").read_text().splitlines()]
        curves[f"seed {seed}"] = [r for r in metrics if "eval/accuracy" in r]
        print(describe(row), flush=True)
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
