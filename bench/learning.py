"""GRPO-family losses on- and off-policy from one shared, fully trained SFT checkpoint, with two seeds.

Tables (each loss × seed is one in-process GRPO run from the same SFT weights; --tables picks, default mini4):
  on-policy  one optimizer step per rollout batch (the baseline: ratio 1, no clip can engage)
  mini4      trainer.mini_batches 4 (PPO: four optimizer steps per batch, clipped against the proximal policy), the
             tiny recipe's own setting
  age2       mini4 plus max_policy_age 2 (two rollouts in flight) with token-level TIS

The SFT model is the recipe's cached one (sft.cache; trained and stored when the cache lacks it), so the sweep starts
from exactly the model `forgeflow grpo` would. Prints, per table, held-out greedy accuracy before/after (± the eval's
standard error), at the first two evals, clip fraction, IS-weight stats and minutes; the on-policy baseline's
accuracy at the same wall time; per loss, the means over seeds and which differences between losses exceed twice
their standard error; a PNG with the curves; and ends with `RESULT …`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from forge_core.generation import TorchGenerator  # noqa: E402
from forge_core.models import load_model_and_tokenizer  # noqa: E402
from forge_core.recipes.steps import evaluate  # noqa: E402
from infra import components as C  # noqa: E402
from infra import sft_cache  # noqa: E402
from infra.config import parse_overrides  # noqa: E402
from infra.config_checks import load_config  # noqa: E402
from infra.paths import new_run_id, run_dir  # noqa: E402
from runtime.inprocess import grpo_phase  # noqa: E402
from runtime.plots import plot_curves  # noqa: E402
from runtime.progress import quiet_libraries  # noqa: E402
from runtime.sft import sft_phase  # noqa: E402

LOSSES = ("grpo", "dapo", "gspo", "cispo", "sapo")
# every table pins all its off-policy keys: the config's own values (the tiny recipe trains with mini_batches 4) must not
# leak into the on-policy baseline
ON_POLICY = {"trainer.mini_batches": 1, "trainer.epochs": 1, "max_policy_age": 0, "rollout_correction.mode": "none"}
TABLES = {
    "on-policy": ON_POLICY,
    "mini4": {**ON_POLICY, "trainer.mini_batches": 4},
    "age2": {**ON_POLICY, "trainer.mini_batches": 4, "max_policy_age": 2, "rollout_correction.mode": "tis"},
}


def held_out(cfg, model, tok, splits) -> dict:
    gen = TorchGenerator(model, tok, cfg.generator)
    return evaluate(gen, splits.eval, splits.eval_prompts, cfg.generator.max_new_tokens, seed=cfg.seed)


def std_error(p: float, n: int) -> float:
    """Standard error of an accuracy p measured on n held-out prompts."""
    return math.sqrt(max(p * (1 - p), 0.0) / max(n, 1))


def mean_of(history: list[dict], *keys: str) -> float | None:
    """Mean over the rows of the sum of `keys` (None when no row has them; a key that is None counts as absent)."""
    values = [sum(r[k] for k in keys if r.get(k) is not None) for r in history
              if any(r.get(k) is not None for k in keys)]
    return statistics.fmean(values) if values else None


def accuracy_at(curve: list[dict], minutes: float) -> float:
    """Held-out accuracy of a run at `minutes` of its wall time (the last eval at or before it)."""
    points = [r for r in curve if "eval/accuracy" in r and r["minutes"] <= minutes + 1e-9]
    return points[-1]["eval/accuracy"]


def run_one(args, base, splits, sft_path: str, table: str, loss: str, seed: int) -> tuple[dict, list[dict]]:
    """One GRPO run from the shared SFT weights; (its table row, its curve with wall minutes per point)."""
    # loss.name alone, as `forgeflow sweep --grid loss.name=…` does: each loss keeps the config's other loss keys
    # (the tiny recipe sets only beta, so each keeps its published clip settings)
    overrides = {"steps": base.steps, "seed": seed, "loss.name": loss, **TABLES[table]}
    cfg = load_config(args.config, {**overrides, **args.overrides})  # --set wins (e.g. loss.clip_high, mini_batches)
    model, tok = load_model_and_tokenizer(sft_path, seed=cfg.seed)
    before = held_out(cfg, model, tok, splits)
    t0 = time.perf_counter()
    history = grpo_phase(cfg, model, tok, splits, show=False)
    minutes = (time.perf_counter() - t0) / 60
    after = held_out(cfg, model, tok, splits)
    seconds = 0.0
    for row in history:  # wall time of each step's end, from its timing
        seconds += row.get("timing/step", 0.0)
        row["minutes"] = seconds / 60
    curve = [{"step": 0, "minutes": 0.0, **before}] + history + [{"step": cfg.steps, "minutes": minutes, **after}]
    n = len(splits.eval)
    evals = evals_of(curve) + [after["eval/accuracy"]] * 2  # a run without evals during RL: its end
    row = {"table": table, "loss": loss, "seed": seed, "acc_before": before["eval/accuracy"],
           "acc_after": after["eval/accuracy"],
           "acc_first": evals[0], "acc_second": evals[1],
           "stderr": std_error(after["eval/accuracy"], n), "minutes": minutes,
           "clip_frac": mean_of(history, "loss/clip_frac_low", "loss/clip_frac_high"),
           "clip_frac_max": mean_of(history, "loss/clip_frac_low_max", "loss/clip_frac_high_max"),
           "is_weight_mean": mean_of(history, "rollout/is_weight_mean"),
           "is_weight_max": mean_of(history, "rollout/is_weight_max"),
           "behaviour_kl": mean_of(history, "rollout/behaviour_kl_k3"),
           "staleness": mean_of(history, "rollout/policy_staleness"), "n_eval": n}
    print(f"[{table} {loss} seed {seed}] {row['acc_before']:.3f} -> {row['acc_after']:.3f} "
          f"(±{row['stderr']:.3f}) in {minutes:.1f} min, clip {row['clip_frac'] or 0:.4f}", flush=True)
    return row, curve


def shared_sft(base, model, tok, splits, out) -> str:
    """The recipe's SFT model: from the SFT cache, or trained to the end of its schedule (the honest baseline) and
    stored there."""
    inputs, hit = sft_cache.find_cached_sft(base) if base.sft.cache else (None, None)
    if hit is not None:
        print(sft_cache.hit_message(hit), flush=True)
        return str(hit.path)
    t0 = time.perf_counter()
    path = sft_phase(base, model, tok, splits, out, show=True)
    if inputs is not None:
        sft_cache.store(path, inputs, out.name)
    print(f"shared SFT checkpoint {path} ({base.sft.steps} steps of a {base.sft.schedule_steps or base.sft.steps}"
          f"-step schedule) in {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
    return str(path)


def evals_of(curve: list[dict]) -> list[float]:
    """Held-out accuracies of a run's evals during RL, in step order (without the one before RL)."""
    return [r["eval/accuracy"] for r in curve[1:-1] if "eval/accuracy" in r]


def print_loss_summary(rows: list[dict]) -> None:
    """Per loss (recipe tables only), the means over seeds; then which pairs differ by more than twice the standard
    error of their difference (binomial, on n_eval × seeds prompts), at the first eval and at the end."""
    by_loss: dict[str, list[dict]] = {}
    for r in rows:
        if r["table"] != "on-policy":
            by_loss.setdefault(r["loss"], []).append(r)
    if not by_loss:
        return
    print(f"\n## per loss, mean over seeds\n{'loss':<6} {'before':>7} {'first':>7} {'second':>7} {'after':>7} "
          f"{'gain':>7} {'clip':>7} {'w max':>7} {'min':>5}")
    means = {}
    for loss, rs in by_loss.items():
        m = {k: statistics.fmean(r[k] for r in rs) for k in ("acc_before", "acc_first", "acc_second", "acc_after",
                                                              "minutes")}
        m["n"] = sum(r["n_eval"] for r in rs)
        means[loss] = m
        clip = mean_of(rs, "clip_frac")
        wmax = mean_of(rs, "is_weight_max")
        print(f"{loss:<6} {m['acc_before']:>7.3f} {m['acc_first']:>7.3f} {m['acc_second']:>7.3f} "
              f"{m['acc_after']:>7.3f} {m['acc_after'] - m['acc_before']:>+7.3f} {fmt(clip, '>7.4f')} "
              f"{fmt(wmax, '>7.3f')} {m['minutes']:>5.1f}")
    print("\ndifferences beyond 2 standard errors (first eval / end):")
    names = list(means)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            verdicts = []
            for key in ("acc_first", "acc_after"):
                pa, pb = means[a][key], means[b][key]
                se = math.hypot(std_error(pa, means[a]["n"]), std_error(pb, means[b]["n"]))
                verdicts.append(f"{pa - pb:+.3f} ({'beyond' if abs(pa - pb) > 2 * se else 'within'} 2se={2 * se:.3f})")
            print(f"  {a} - {b}: " + " / ".join(verdicts))


def fmt(value, spec: str) -> str:
    """`value` formatted by `spec` ('>7.3f'); None as a '-' of the same width."""
    return format("-", spec.split(".")[0]) if value is None else format(value, spec)


def print_tables(rows: list[dict], baseline: dict[int, list[dict]]) -> None:
    for table in dict.fromkeys(r["table"] for r in rows):
        print(f"\n## {table}")
        print(f"{'loss':<6} {'seed':>4} {'before':>7} {'after':>7} {'±se':>6} {'gain':>7} {'base@t':>7} "
              f"{'clip':>7} {'clipmax':>7} {'w mean':>7} {'w max':>7} {'kl b/p':>8} {'age':>4} {'min':>5}")
        for r in (r for r in rows if r["table"] == table):
            at = accuracy_at(baseline[r["seed"]], r["minutes"]) if r["seed"] in baseline else None
            r["baseline_at_same_time"] = at
            print(f"{r['loss']:<6} {r['seed']:>4} {r['acc_before']:>7.3f} {r['acc_after']:>7.3f} {r['stderr']:>6.3f} "
                  f"{r['acc_after'] - r['acc_before']:>+7.3f} {fmt(at, '>7.3f')} {fmt(r['clip_frac'], '>7.4f')} "
                  f"{fmt(r['clip_frac_max'], '>7.4f')} {fmt(r['is_weight_mean'], '>7.3f')} "
                  f"{fmt(r['is_weight_max'], '>7.3f')} {fmt(r['behaviour_kl'], '>8.2e')} "
                  f"{fmt(r['staleness'], '>4.1f')} {r['minutes']:>5.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/grpo_math_tiny.yaml")
    parser.add_argument("--sft-init", default=None, help="reuse an SFT checkpoint instead of training one")
    parser.add_argument("--losses", default=",".join(LOSSES))
    parser.add_argument("--baseline-losses", default="grpo", help="losses of the on-policy table")
    parser.add_argument("--tables", default="mini4", help="comma-separated, of " + ",".join(TABLES))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: the config's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every run (YAML-typed; wins over the table and loss settings), "
                             "e.g. --set trainer.lr=2e-5")
    args = parser.parse_args()
    quiet_libraries()
    args.overrides = parse_overrides([f"--{item}" for item in args.set])
    out = run_dir("bench-learning-" + new_run_id())
    base = load_config(args.config, {**args.overrides, **({"steps": args.steps} if args.steps else {})})
    C.configure_threads(base)
    model, tok = load_model_and_tokenizer(args.sft_init or base.model.path, seed=base.seed)
    splits = C.build_splits(base, tok)
    sft_path = args.sft_init or shared_sft(base, model, tok, splits, out)
    rows, curves, baseline = [], {}, {}
    seeds = [int(s) for s in args.seeds.split(",")]
    for table in args.tables.split(","):
        losses = args.baseline_losses if table == "on-policy" else args.losses
        for loss in losses.split(","):
            for seed in seeds:
                row, curve = run_one(args, base, splits, sft_path, table, loss, seed)
                rows.append(row)
                curves[f"{table} {loss} s{seed}"] = curve
                if table == "on-policy" and loss == args.baseline_losses.split(",")[0]:
                    baseline[seed] = curve
    png = plot_curves(curves, out / "learning.png", keys=("reward/mean", "eval/accuracy", "loss/clip_frac_high"),
                      title=f"GRPO-family losses on/off-policy from one SFT checkpoint ({base.steps} steps)")
    accuracy = {label: [(r["step"], round(r["minutes"], 2), r["eval/accuracy"]) for r in curve if "eval/accuracy" in r]
                for label, curve in curves.items()}  # (step, minutes, held-out accuracy) per run
    (out / "learning.json").write_text(json.dumps({"rows": rows, "sft": sft_path, "accuracy": accuracy}, indent=2))
    print(f"plot: {png}\nrows: {out / 'learning.json'}")
    print_tables(rows, baseline)
    print_loss_summary(rows)
    best = max((r for r in rows if r["table"] != "on-policy"), key=lambda r: r["acc_after"], default=None)
    base_rows = [r for r in rows if r["table"] == "on-policy"]
    parts = [f"sft_acc={rows[0]['acc_before']:.3f}"]
    if base_rows:
        parts.append(f"on_policy_after={statistics.fmean(r['acc_after'] for r in base_rows):.3f}")
    if best:
        parts.append(f"best={best['table']}:{best['loss']}:s{best['seed']} best_after={best['acc_after']:.3f}")
    print("RESULT " + " ".join(parts))


if __name__ == "__main__":
    main()
