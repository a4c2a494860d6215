"""The `evaluate` flow: held-out greedy (and sampled) accuracy of one checkpoint, in this process.

    checkpoint (HF dir) ─▶ evaluate_checkpoint (TorchGenerator, greedy) ─▶ eval/accuracy (+ eval/sampled_accuracy)
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import flow

from tasks.evaluate import evaluate_checkpoint


@flow(name="evaluate", persist_result=False)
def evaluate_flow(checkpoint: str, config: str = "configs/grpo_math_tiny.yaml", overrides: dict | None = None) -> dict:
    """Accuracy of `checkpoint` on the config's held-out split; also written to <checkpoint>/eval.json."""
    path = Path(checkpoint)
    if not (path / "config.json").exists():
        raise ValueError(f"checkpoint {checkpoint} is not an HF model directory (no config.json); pass e.g. "
                         "<run>/checkpoints/step-000300/hf or <run>/sft")
    result = evaluate_checkpoint(checkpoint, config, overrides)
    (path / "eval.json").write_text(json.dumps(result, indent=2))
    print(f"{checkpoint}: accuracy {result['eval/accuracy']:.3f} on {result['num_prompts']} held-out prompts")
    return result
