"""Orchestration overhead: the same tiny GRPO config (same steps, seed) in-process vs as the Prefect `grpo` flow on
local workers, plus the flow with pipelining (max_policy_age 1: rollout of v+1 overlaps training of v).

Prints seconds/step and a per-phase breakdown for each mode and ends with
`RESULT ratio=… ratio_pipelined=…` (flow seconds/step ÷ in-process seconds/step). Targets: ratio <= 1.10,
ratio_pipelined < 1.0. Worker start-up and the before/after evaluations are excluded: only the GRPO steps count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from flows.grpo import grpo_flow  # noqa: E402
from forge_core.models import load_model_and_tokenizer  # noqa: E402
from infra import components as C  # noqa: E402
from infra.config_checks import load_config  # noqa: E402
from infra.paths import run_dir  # noqa: E402
from runtime.inprocess import grpo_phase  # noqa: E402
from runtime.progress import quiet_libraries  # noqa: E402

PHASES = ("timing/rollout", "timing/reward", "timing/reference", "timing/train", "timing/sync")


def breakdown(rows: list[dict], skip: int) -> dict[str, float]:
    """Mean seconds per step of each phase, of the whole step, and of what is left (orchestration)."""
    rows = rows[skip:]
    out = {p.split("/")[1]: statistics.fmean(r.get(p, 0.0) for r in rows) for p in PHASES}
    out["step"] = statistics.fmean(r["timing/step"] for r in rows)
    out["orchestration"] = max(0.0, out["step"] - sum(out[p.split("/")[1]] for p in PHASES))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="configs/grpo_math_tiny.yaml")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the averages")
    parser.add_argument("--sft-init", default=None, help="start every mode from this checkpoint (default: "
                        "the config's model, untrained)")
    args = parser.parse_args()
    quiet_libraries()
    common = {"steps": args.steps, "sft.steps": 0, "eval.every": 0, "checkpoint.every": 0, "eval.num_prompts": 50}
    if args.sft_init:
        common["sft.init"] = args.sft_init
    cfg = load_config(args.config, common)
    C.configure_threads(cfg)
    model, tok = load_model_and_tokenizer(cfg.sft.init or cfg.model.path, seed=cfg.seed)
    rows_inproc = grpo_phase(cfg, model, tok, C.build_splits(cfg, tok), show=False)
    results = {"in-process": breakdown(rows_inproc, args.skip)}
    for name, extra in (("flow", {"max_policy_age": 0}),
                        ("flow pipelined", {"max_policy_age": 1})):
        summary = grpo_flow(config=args.config, overrides={**common, **extra}, run_name=f"bench-overhead-{name}")
        rows = [json.loads(x) for x in (run_dir(summary["run_id"]) / "metrics.jsonl").read_text().splitlines()]
        results[name] = breakdown(rows, args.skip)
    cols = ["step", "rollout", "reward", "reference", "train", "sync", "orchestration"]
    print(f"\nseconds per GRPO step (mean over steps {args.skip + 1}..{args.steps}; pipelined rollout time overlaps "
          "training)")
    print(f"{'mode':<16}" + "".join(f"{c:>14}" for c in cols))
    for name, r in results.items():
        print(f"{name:<16}" + "".join(f"{r[c]:>14.3f}" for c in cols))
    base = results["in-process"]["step"]
    print(f"RESULT ratio={results['flow']['step'] / base:.2f} "
          f"ratio_pipelined={results['flow pipelined']['step'] / base:.2f} inprocess_s_per_step={base:.3f}")


if __name__ == "__main__":
    main()
