"""Spaced weight syncs: the same GRPO flow (tiny:qwen3-arith, local workers, fs store) with weightsync.sync_every 1
and N. With N the trainer gathers and writes only every N-th version (plus eval/checkpoint/last steps) and the
generators load only those.

Prints seconds/step for train (which includes the publish) and sync, and ends with
`RESULT ratio=… every_step_s=… spaced_s=…` where ratio = (train + sync) s/step with sync_every 1 ÷ with N
(> 1 means spacing the syncs saves time). Worker start-up and evaluations are excluded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from flows.grpo import grpo_flow  # noqa: E402
from infra.paths import run_dir  # noqa: E402
from runtime.progress import quiet_libraries  # noqa: E402


def mean_seconds(run_id: str, skip: int) -> dict[str, float]:
    """Mean train and sync seconds per step of a finished run (first `skip` steps left out)."""
    rows = [json.loads(x) for x in (run_dir(run_id) / "metrics.jsonl").read_text().splitlines()][skip:]
    return {"train": statistics.fmean(r["timing/train"] for r in rows),
            "sync": statistics.fmean(r.get("timing/sync", 0.0) for r in rows),
            "published": sum(r["weights/published"] for r in rows) / len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--every", type=int, default=4, help="weightsync.sync_every of the spaced run")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the averages")
    args = parser.parse_args()
    quiet_libraries()
    # a short rollout, so that publishing the weights is a visible share of the step
    common = {"model.path": "tiny:qwen3-arith", "steps": args.steps, "sft.steps": 0, "eval.every": 0,
              "checkpoint.every": 0, "prompts_per_step": 4, "group_size": 4, "generator.max_new_tokens": 8,
              "max_policy_age": args.every, "eval.num_prompts": 8, "workers.threads": 1}
    results = {}
    for every in (1, args.every):
        summary = grpo_flow(overrides={**common, "weightsync.sync_every": every}, run_name=f"bench-sync-every-{every}")
        results[every] = mean_seconds(summary["run_id"], args.skip)
    print(f"\nseconds per GRPO step (mean over steps {args.skip + 1}..{args.steps})")
    print(f"{'sync_every':>10}{'train+publish':>15}{'sync':>10}{'published':>11}")
    for every, r in results.items():
        print(f"{every:>10}{r['train']:>15.4f}{r['sync']:>10.4f}{r['published']:>11.2f}")
    base, spaced = (sum((r["train"], r["sync"])) for r in (results[1], results[args.every]))
    print(f"RESULT ratio={base / spaced:.2f} every_step_s={base:.4f} spaced_s={spaced:.4f}")


if __name__ == "__main__":
    main()
